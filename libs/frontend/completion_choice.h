// One choice of a CompletionJob (completion_job.h): its Generate request,
// the call running it, and the text its tokens make. Private to
// libs/frontend; the job holds the lock around every call.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/common/generate.h"
#include "tandem/frontend/completion_job.h"
#include "tandem/frontend/openai.h"
#include "tandem/frontend/prompts.h"
#include "tandem/frontend/reasoning.h"
#include "tandem/frontend/stop_strings.h"
#include "tandem/frontend/tool_calls.h"
#include "tandem/tokenizer/incremental_detokenizer.h"

namespace tandem::frontend {

// An output token's logprobs waiting for its text to go out: [start, end)
// is where that text lies in the choice's detokenized output. `end` is set
// when the detokenizer lets the text out; a token it holds back (a byte of an
// unfinished character) ends with the token that completes the text.
struct PendingLogprobs {
  PositionLogprobs position;
  int64_t start = 0;
  std::optional<int64_t> end;
};

// What one message added to a choice.
struct ChoiceDelta {
  std::string text;          // may be empty
  std::vector<int32_t> ids;  // the message's tokens the choice took
  bool stopped = false;      // a stop string ended the choice: cancel its call
};

struct ChoiceState {
  int32_t index = 0;
  int32_t prompt = 0;                  // which prompt
  GenerateRequest call_request;        // what its calls ask
  std::vector<std::string> tried;      // replicas, in order
  std::shared_ptr<GenerateCall> call;  // the call running, if any
  int32_t attempt = 0;
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  std::unique_ptr<StopStringMatcher> stops;
  // Streams with CompletionRequest::tool_parser: what holds a tool call's
  // text back until the end.
  std::unique_ptr<ToolCallStream> tool_stream;
  // Streams with CompletionRequest::reasoning_parser: what splits the
  // thinking out of the text (before the tool-call stream sees it).
  std::unique_ptr<ReasoningStream> reasoning_stream;
  std::vector<int32_t> token_ids;
  std::string text;       // the whole text (non-streaming responses)
  bool produced = false;  // a token arrived: a stream retries nowhere after this
  bool done = false;
  bool chunk_sent = false;
  FinishReason finish = FinishReason::kNone;
  std::string stop_reason;
  std::optional<int32_t> stop_token;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  // Logprobs, when asked. A token's logprobs go out with the chunk that
  // carries its text (non-streaming: all of them, in order).
  std::deque<PendingLogprobs> pending_logprobs;
  std::vector<PositionLogprobs> logprobs;         // text out, not yet written
  std::vector<PositionLogprobs> prompt_logprobs;  // positions 0 .. P-1
  bool has_prompt_logprobs = false;
  int64_t detok_bytes = 0;  // the text the detokenizer produced
  int64_t out_bytes = 0;    // of which the stop-string matcher let out
  int64_t text_offset = 0;  // of the next streamed token (completions)

  // Takes `msg`'s tokens (the choice is not done): token ids, text through
  // the detokenizer and the stop strings, logprobs, and at the end (a stop
  // string, or msg's finish reason) finish, usage and the held-back text.
  [[nodiscard]] ChoiceDelta Take(const GenerateResponse& msg, const CompletionRequest& request,
                                 const ServedTokenizer& served);
  // The logprobs of the released tokens (after echo's prompt positions in the
  // choice's first chunk, or the whole choice), rendered; null when not asked.
  [[nodiscard]] nlohmann::ordered_json RenderLogprobs(const CompletionRequest& request,
                                                      const ServedTokenizer& served, bool first);
  // The prompt's positions, unscored unless the scheduler sent them.
  const std::vector<PositionLogprobs>& PromptPositions(const ServedTokenizer& served);

 private:
  void Detokenized(size_t bytes);
  void ReleaseLogprobs();
};

}  // namespace tandem::frontend
