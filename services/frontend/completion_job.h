// One /v1/completions or /v1/chat/completions request, from parsed body to
// the last byte of the response.
//
// Each choice (prompt i, sample j of n: index i * n + j) is one Generate
// call to a replica the Router picks. The calls' callbacks run on gRPC's
// threads: a message is handled there, under the job's lock, and its SSE
// chunk written to the client's socket from that thread (HttpExchange), so
// a token costs no wake-up of an HTTP I/O thread; a call's end is posted to
// the HTTP connection's strand. Cancels wait until the lock is let go (they
// may run gRPC callbacks inline).
//
// Text: generated ids go through an IncrementalDetokenizer primed with the
// prompt (deltas are whole UTF-8 characters; the text is Decode(prompt +
// output) minus Decode(prompt), so the first word keeps its leading space, as
// vLLM's) and a StopStringMatcher; a matched stop string ends the
// choice with finish_reason "stop" and cancels its call (the scheduler frees
// its blocks). A stop token from stop_token_ids is counted and returned in
// token_ids but its text is left out, as a stop string's is.
//
// Failures: a call that ends UNAVAILABLE before its choice produced a token
// (a replica dead, draining or without a worker) is sent to another replica,
// once per replica; so a replica that dies loses no request that had not
// started streaming. A stream already started ends with an error event.
// A streaming response sends its HTTP status with the first token, so that
// errors before it (400 from the scheduler, 429, 503) keep their status.
// The client closing the connection cancels every call.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "frontend.h"
#include "tandem/frontend/openai.h"

namespace tandem::frontend {

// The token ids of each prompt of `request` (one for chat: the rendered
// conversation), the prompt texts for echo, and the checks every path
// shares: non-empty, ids inside the vocabulary, shorter than max_model_len.
struct PreparedPrompts {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> texts;
};
[[nodiscard]] std::optional<ApiError> PreparePrompts(const Frontend& frontend,
                                                     const CompletionRequest& request,
                                                     const ModelInfo& model,
                                                     PreparedPrompts* out);

// Runs the request to completion; the job keeps itself alive until the
// response is done.
void StartCompletionJob(Frontend* frontend, std::shared_ptr<HttpExchange> exchange,
                        CompletionRequest request, std::string endpoint);

}  // namespace tandem::frontend
