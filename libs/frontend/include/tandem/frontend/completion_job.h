// One /v1/completions, /v1/chat/completions or /v1/responses request, from
// parsed body to
// the last byte of the response, behind two narrow interfaces: a
// GenerateTransport that starts (and cancels) Generate calls on the
// schedulers' replicas, and a CompletionSink that takes the response. No
// sockets, no gRPC: tandem-frontend's gRPC reactor and HTTP exchange
// implement them (services/frontend/completion_job.h), the unit tests fake
// them (tests/frontend/completion_job_test.cc).
//
// Each choice (prompt i, sample j of n: index i * n + j) is one Generate
// call. Sample j's seed is the request's seed + j.
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
// The client going away cancels every call.
//
// Threading: every public method takes the job's lock and may be called
// from any thread; the transport and the sink are called under it, except
// GenerateCall::Cancel, which runs after the lock is let go (a cancel may run
// the transport's callbacks inline, and they take the lock). In
// tandem-frontend a call's messages arrive on gRPC's threads, so a token's
// SSE chunk is written to the client's socket from that thread (no wake-up
// of an HTTP I/O thread); a call's end is posted to the connection's strand.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tandem/common/generate.h"
#include "tandem/common/model_info.h"
#include "tandem/frontend/openai.h"
#include "tandem/frontend/openai_responses.h"
#include "tandem/frontend/prompts.h"

namespace tandem::frontend {

class CompletionJob;
struct ChoiceState;

// Which call a report is about: the choice's index and its attempt (1, 2,
// ...: the job ignores reports of an attempt it has left).
struct CallId {
  int32_t choice = 0;
  int32_t attempt = 0;
};

// A started Generate call.
class GenerateCall {
 public:
  virtual ~GenerateCall() = default;
  // Asks the call to end (it then ends CANCELLED, or as it was going to).
  // Any thread, any number of times, also after the call ended; never
  // under the job's lock.
  virtual void Cancel() = 0;
  // The job matched a stop string: the call should end as "stop" (the
  // scheduler counts it so, as vLLM does), not as a cancel. By default a
  // cancel.
  virtual void StopAtString() { Cancel(); }
};

class GenerateTransport {
 public:
  virtual ~GenerateTransport() = default;
  struct Started {
    std::string replica;  // its name, for the retry's exclusions and errors
    std::shared_ptr<GenerateCall> call;
  };
  // Starts `request` on a replica not named in `exclude`; nullopt when none
  // serves. Called under `job`'s lock: report nothing before returning.
  // Then report each message in order with job->OnCallMessage(id, ...) and
  // the call's end once, after its last message, with
  // job->OnCallDone(id, ...), from any thread.
  [[nodiscard]] virtual std::optional<Started> StartCall(
      std::shared_ptr<CompletionJob> job, CallId id, const GenerateRequest& request,
      const std::vector<std::string>& exclude) = 0;
};

// Where the response goes; called under the job's lock.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // The whole response, 200 application/json.
  virtual void Respond(const std::string& json) = 0;
  // The OpenAI error object with its status (no stream started).
  virtual void RespondError(const ApiError& error) = 0;
  // 200 text/event-stream (once), then SSE events, then End.
  virtual void StartStream() = 0;
  virtual void Write(const std::string& event) = 0;
  virtual void End() = 0;
  // `gone` is to run once if the client goes away before the response is
  // complete. Set once, by Start, before the first call starts.
  virtual void WatchClientGone(std::function<void()> gone) = 0;
};

// What the job counts for tandem-frontend's metrics; each does nothing
// unless overridden. Called under the job's lock; destroyed with the job.
class CompletionJobMetrics {
 public:
  virtual ~CompletionJobMetrics() = default;
  // Once per request: 200, the error's status, or 499 (client gone).
  virtual void OnResponse(int /*http_status*/) {}
  // The choices went to the schedulers: `num_prompts` x `n` of them.
  virtual void OnSent(const std::string& /*model*/, size_t /*num_prompts*/, int32_t /*n*/) {}
  virtual void OnPromptTokens(int64_t /*n*/) {}  // per choice sent
  virtual void OnFirstToken() {}                 // the request's first
  virtual void OnGeneratedTokens(int64_t /*n*/) {}
  virtual void OnRetry() {}
  virtual void OnClientGone() {}
};

class CompletionJob : public std::enable_shared_from_this<CompletionJob> {
 public:
  // `served` outlives the job; the job owns its transport, sink and metrics
  // (metrics may be null).
  CompletionJob(const ServedTokenizer& served, std::unique_ptr<GenerateTransport> transport,
                std::unique_ptr<CompletionSink> sink, std::unique_ptr<CompletionJobMetrics> metrics,
                CompletionRequest request);
  ~CompletionJob();

  // Checks the request against the served model (`model` as the replicas
  // describe it, `names` the names it is served under; nullopt while no
  // replica has described it), tokenizes the prompts, builds each choice's
  // request and starts its call; or answers the error. Once; on a job held
  // by a shared_ptr.
  void Start(const std::optional<ModelInfo>& model,
             const std::optional<std::vector<std::string>>& names);

  // The transport's reports (GenerateTransport::StartCall).
  void OnCallMessage(CallId id, const GenerateResponse& msg);
  void OnCallDone(CallId id, const std::string& replica, const absl::Status& status);
  // The client went away: cancels every call.
  void ClientGone();
  // Ends the request now with `error` (a started stream: an error event and
  // [DONE]) and cancels its calls; nothing when it is over.
  void Cut(const ApiError& error);

 private:
  class Locked;

  [[nodiscard]] bool BuildChoices(const ModelInfo& model);
  // The choice's detokenizer, stop strings, tool-call stream and echo.
  void StartOutput(ChoiceState& c);
  // With a reasoning parser: whether the choice's output starts as thinking,
  // the split of a delta (the held-back rest too once the choice is done),
  // and of the whole text (which it takes).
  [[nodiscard]] bool StartsInReasoning(const ChoiceState& c) const;
  [[nodiscard]] ReasoningStream::Piece SplitStreamed(ChoiceState& c, const std::string& delta);
  [[nodiscard]] ReasoningSplit SplitWhole(ChoiceState& c) const;
  // With a tool parser: the calls in a whole answer's content, which then
  // keeps only its text beside them (null when none).
  [[nodiscard]] ExtractedToolCalls TakeToolCalls(ReasoningSplit* split) const;
  // The end of a streamed choice's tool calls (ToolCallStream::Finish).
  [[nodiscard]] ExtractedToolCalls FinishToolStream(ChoiceState& c) const;
  // parallel_tool_calls false: the first call only.
  void KeepParallelToolCalls(ExtractedToolCalls* tools) const;
  // Drops what the choice took from a call (it is run again elsewhere).
  void RestartOutput(ChoiceState& c);
  [[nodiscard]] bool StartCall(ChoiceState& c);
  void Emit(ChoiceState& c, std::string delta, std::vector<int32_t> ids);
  void StartStream();
  // /v1/responses: the choice's text as the stream's events.
  void EmitResponses(ChoiceState& c, const std::string& delta);
  void MaybeComplete();
  // /v1/responses: the response object, or the stream's last events.
  void CompleteResponses(ChoiceState& c, const Usage& usage);
  void Fail(const ApiError& error);
  void CancelAll();

  const ServedTokenizer& served_;
  std::unique_ptr<GenerateTransport> transport_;
  std::mutex mu_;                                         // every member below, once Start runs
  std::vector<std::shared_ptr<GenerateCall>> to_cancel_;  // when the lock goes
  std::vector<std::shared_ptr<GenerateCall>> to_stop_;    // StopAtString, likewise
  std::unique_ptr<CompletionSink> sink_;
  std::unique_ptr<CompletionJobMetrics> metrics_;
  CompletionRequest request_;
  ResponseHead head_;
  std::string call_id_;  // the scheduler's ids: call_id_ + "-" + choice index
  PreparedPrompts prompts_;
  std::vector<ChoiceState> choices_;
  ResponsesRun responses_run_;                  // /v1/responses
  std::unique_ptr<ResponsesEvents> responses_;  // its stream
  bool stream_started_ = false;
  bool first_token_ = false;
  bool finished_ = false;  // the response is complete or failed
};

}  // namespace tandem::frontend
