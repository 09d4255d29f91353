#include "completion_job.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "tandem/common/logging.h"
#include "tandem/frontend/stop_strings.h"
#include "tandem/rpc/convert.h"
#include "tandem/tokenizer/incremental_detokenizer.h"

namespace tandem::frontend {
namespace {

using Clock = std::chrono::steady_clock;

ApiError ContextLengthError(const std::string& message, const std::string& param) {
  ApiError e = BadRequest(message, param);
  e.code = "context_length_exceeded";
  return e;
}

// An output token's logprobs waiting for its text to go out: [start, end)
// is where that text lies in the choice's detokenized output. `end` is set
// when the detokenizer lets the text out; a token it holds back (a byte of an
// unfinished character) ends with the token that completes the text.
struct PendingLogprobs {
  PositionLogprobs position;
  int64_t start = 0;
  std::optional<int64_t> end;
};

struct ChoiceState {
  int32_t index = 0;
  int32_t prompt = 0;  // which prompt
  v1::GenerateRequest request;
  std::vector<std::string> tried;                // replicas, in order
  std::shared_ptr<grpc::ClientContext> context;  // of the call running, if any
  int32_t attempt = 0;
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  std::unique_ptr<StopStringMatcher> stops;
  std::vector<int32_t> token_ids;
  std::string text;       // the whole text (non-streaming responses)
  bool produced = false;  // a token arrived: no retry elsewhere after this
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
};

PositionLogprobs ToPosition(const Frontend& frontend, const v1::TokenLogprobs& lp) {
  PositionLogprobs p{.token = {.token_id = lp.token_id(),
                               .bytes = frontend.TokenBytes(lp.token_id()),
                               .logprob = lp.logprob()},
                     .rank = lp.rank()};
  const int num_top = std::min(lp.top_token_ids_size(), lp.top_logprobs_size());
  for (int i = 0; i < num_top; ++i) {
    p.top.push_back({.token_id = lp.top_token_ids(i),
                     .bytes = frontend.TokenBytes(lp.top_token_ids(i)),
                     .logprob = lp.top_logprobs(i)});
  }
  return p;
}

// An unscored position: the prompt's first token, or one the scheduler sent
// no logprobs for.
PositionLogprobs Unscored(const Frontend& frontend, int32_t token_id) {
  return {.token = {.token_id = token_id, .bytes = frontend.TokenBytes(token_id)}, .scored = false};
}

// The prompt's positions, scored from `msg` (GenerateResponse
// .prompt_logprobs: positions 1 .. P-1) when it has them.
std::vector<PositionLogprobs> PromptPositions(const Frontend& frontend,
                                              const std::vector<int32_t>& prompt,
                                              const v1::GenerateResponse* msg) {
  std::vector<PositionLogprobs> out;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i > 0 && msg != nullptr && static_cast<int>(i) - 1 < msg->prompt_logprobs_size()) {
      out.push_back(ToPosition(frontend, msg->prompt_logprobs(static_cast<int>(i) - 1)));
    } else {
      out.push_back(Unscored(frontend, prompt[i]));
    }
  }
  return out;
}

class Job;

// One Generate call. Its callbacks run on gRPC's threads: a message goes
// straight to the job (under its lock, and from there to the client's
// socket); the call's end is posted to the connection's strand, after every
// message. Deletes itself after OnDone.
class CallReactor final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  CallReactor(std::shared_ptr<Job> job, std::shared_ptr<HttpExchange> exchange, Router* router,
              int32_t choice, int32_t attempt, std::shared_ptr<Replica> replica,
              std::shared_ptr<grpc::ClientContext> context, const v1::GenerateRequest& request)
      : job_(std::move(job)),
        exchange_(std::move(exchange)),
        router_(router),
        choice_(choice),
        attempt_(attempt),
        replica_(std::move(replica)),
        context_(std::move(context)),
        request_(request) {}

  void Start() {
    replica_->stub()->async()->Generate(context_.get(), &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  std::shared_ptr<Job> job_;
  std::shared_ptr<HttpExchange> exchange_;
  Router* router_;
  int32_t choice_;
  int32_t attempt_;
  std::shared_ptr<Replica> replica_;
  std::shared_ptr<grpc::ClientContext> context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
};

class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(Frontend* frontend, std::shared_ptr<HttpExchange> exchange, CompletionRequest request,
      std::string endpoint)
      : frontend_(frontend),
        exchange_(std::move(exchange)),
        request_(std::move(request)),
        endpoint_(std::move(endpoint)),
        start_(Clock::now()) {
    frontend_->JobStarted();
  }
  ~Job() {
    frontend_->JobFinished();
    frontend_->metrics().duration.Observe(
        std::chrono::duration<double>(Clock::now() - start_).count());
    // Every prompt whose choices were sent, finished or not (vLLM counts
    // aborted requests among the finished).
    for (size_t p = 0; p < prompts_.ids.size() && sent_; ++p) {
      frontend_->metrics().ObserveRequestParamsN(head_.model, request_.n);
    }
  }

  // Each takes the job's lock; any thread.
  void Start();
  void OnMessage(int32_t choice, int32_t attempt, const v1::GenerateResponse& msg);
  void OnCallDone(int32_t choice, int32_t attempt, const std::string& replica,
                  const grpc::Status& status);
  void ClientGone();

 private:
  // Holds the job's lock; on leaving, lets it go and only then cancels the
  // calls queued in to_cancel_: OnMessage takes the lock, and a cancel may
  // run gRPC's callbacks inline (a callback completion queue runs them at
  // the end of the API call; gRPC 1.51 here hands them to its nexting
  // threads instead, so no test can make one run inline).
  class Locked {
   public:
    explicit Locked(Job* job) : job_(job), lock_(job->mu_) {}
    ~Locked() {
      std::vector<std::shared_ptr<grpc::ClientContext>> cancel;
      cancel.swap(job_->to_cancel_);
      lock_.unlock();
      for (const auto& context : cancel) context->TryCancel();
    }

   private:
    Job* job_;
    std::unique_lock<std::mutex> lock_;
  };

  bool StartCall(ChoiceState& c);
  void ReleaseLogprobs(ChoiceState& c);
  nlohmann::ordered_json RenderLogprobs(ChoiceState& c, bool first);
  void Emit(ChoiceState& c, std::string delta, std::vector<int32_t> ids);
  void StartStream();
  void MaybeComplete();
  void Fail(const ApiError& error);
  void CancelAll();
  void Count(int http_status) { frontend_->CountResponse(endpoint_, http_status); }

  std::mutex mu_;  // every member below, once Start runs
  std::vector<std::shared_ptr<grpc::ClientContext>> to_cancel_;
  Frontend* frontend_;
  std::shared_ptr<HttpExchange> exchange_;
  CompletionRequest request_;
  std::string endpoint_;
  Clock::time_point start_;
  ResponseHead head_;
  PreparedPrompts prompts_;
  std::vector<ChoiceState> choices_;
  bool sent_ = false;  // the choices went to the schedulers (request accepted)
  bool stream_started_ = false;
  bool first_token_ = false;
  bool finished_ = false;  // the response is complete or failed
};

void CallReactor::OnReadDone(bool ok) {
  if (!ok) return;
  job_->OnMessage(choice_, attempt_, response_);
  response_.Clear();
  StartRead(&response_);
}

void CallReactor::OnDone(const grpc::Status& status) {
  router_->Release(replica_.get());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    router_->MarkUnavailable(replica_.get());
  }
  exchange_->Post([job = job_, choice = choice_, attempt = attempt_, name = replica_->name(),
                   status] { job->OnCallDone(choice, attempt, name, status); });
  delete this;
}

void Job::Start() {
  Locked locked(this);
  const std::optional<ModelInfo> model = frontend_->router().model();
  const std::optional<std::vector<std::string>> names = frontend_->ModelNames();
  if (!model || !names) {
    Fail(FromStatus(14, "no scheduler replica has described its model yet"));
    return;
  }
  if (!request_.model.empty() &&
      std::find(names->begin(), names->end(), request_.model) == names->end()) {
    ApiError e{.http_status = 404,
               .message = absl::StrCat("The model '", request_.model,
                                       "' does not exist; this server serves '",
                                       absl::StrJoin(*names, "', '"), "'"),
               .param = "model",
               .code = "model_not_found"};
    Fail(e);
    return;
  }
  if (auto e = CheckLogprobsLimit(request_, model->max_logprobs)) {
    Fail(*e);
    return;
  }
  if (auto e = PreparePrompts(*frontend_, request_, *model, &prompts_)) {
    Fail(*e);
    return;
  }
  head_ = {.id = NewResponseId(request_.endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-"),
           .created = static_cast<int64_t>(std::time(nullptr)),
           .model = request_.model.empty() ? names->front() : request_.model};
  tokenizer::DecodeOptions decode{.skip_special_tokens = request_.skip_special_tokens};
  const RequestSampling sampling = EffectiveSampling(request_, model->generation);
  const int32_t n = request_.n;
  choices_.resize(prompts_.ids.size() * n);
  for (size_t p = 0; p < prompts_.ids.size(); ++p) {
    const int32_t prompt_len = static_cast<int32_t>(prompts_.ids[p].size());
    int32_t max_tokens = model->max_model_len - prompt_len;
    if (request_.endpoint == Endpoint::kCompletions && !request_.max_tokens) {
      max_tokens = std::min(max_tokens, kDefaultCompletionsMaxTokens);
    }
    if (request_.max_tokens) {
      if (static_cast<int64_t>(prompt_len) + *request_.max_tokens > model->max_model_len) {
        Fail(ContextLengthError(
            absl::StrCat("This model's maximum context length is ", model->max_model_len,
                         " tokens. However, you requested ",
                         static_cast<int64_t>(prompt_len) + *request_.max_tokens, " tokens (",
                         prompt_len, " in the prompt, ", *request_.max_tokens,
                         " in the completion)."),
            "max_tokens"));
        return;
      }
      max_tokens = *request_.max_tokens;
    }
    for (int32_t j = 0; j < n; ++j) {
      ChoiceState& c = choices_[p * n + j];
      c.index = static_cast<int32_t>(p) * n + j;
      c.prompt = static_cast<int32_t>(p);
      v1::GenerateRequest& r = c.request;
      r.set_request_id(absl::StrCat(head_.id, "-", c.index));
      r.set_cache_salt(request_.cache_salt);
      r.set_priority(request_.priority);
      r.mutable_prompt_token_ids()->Assign(prompts_.ids[p].begin(), prompts_.ids[p].end());
      v1::SamplingParams* s = r.mutable_sampling();
      s->set_temperature(sampling.temperature);
      s->set_top_k(sampling.top_k);
      s->set_top_p(sampling.top_p);
      s->set_min_p(sampling.min_p);
      if (request_.seed) {
        s->set_seed(static_cast<uint64_t>(*request_.seed) + static_cast<uint64_t>(j));
        s->set_has_seed(true);
      }
      s->set_max_tokens(max_tokens);
      s->set_min_tokens(std::min(request_.min_tokens, max_tokens));
      s->set_ignore_eos(request_.ignore_eos);
      s->mutable_stop_token_ids()->Assign(request_.stop_token_ids.begin(),
                                          request_.stop_token_ids.end());
      if (request_.logprobs) {
        s->set_logprobs(*request_.logprobs);
        s->set_has_logprobs(true);
      }
      if (const std::optional<int32_t> prompt_logprobs = PromptLogprobsToAsk(request_)) {
        s->set_prompt_logprobs(*prompt_logprobs);
        s->set_has_prompt_logprobs(true);
      }
      // Primed with the prompt: the text is Decode(prompt + output) minus
      // Decode(prompt), so the first word keeps its leading space (vLLM).
      c.detok = std::make_unique<tokenizer::IncrementalDetokenizer>(frontend_->tokenizer(), decode,
                                                                    prompts_.ids[p]);
      c.stops = std::make_unique<StopStringMatcher>(request_.stop);
      if (request_.echo) c.text = prompts_.texts[p];
    }
  }
  for (ChoiceState& c : choices_) {
    frontend_->metrics().prompt_tokens.Increment(
        static_cast<double>(c.request.prompt_token_ids_size()));
  }
  sent_ = true;
  std::weak_ptr<Job> weak = weak_from_this();
  exchange_->SetOnClientGone([weak] {
    if (auto job = weak.lock()) job->ClientGone();
  });
  for (ChoiceState& c : choices_) {
    if (!StartCall(c)) {
      Fail(FromStatus(14, "no scheduler replica is serving"));
      return;
    }
  }
}

bool Job::StartCall(ChoiceState& c) {
  const auto& prompt = prompts_.ids[c.prompt];
  std::shared_ptr<Replica> replica = frontend_->router().Pick(prompt, c.tried);
  if (replica == nullptr) return false;
  c.tried.push_back(replica->name());
  ++c.attempt;
  c.context = std::make_shared<grpc::ClientContext>();
  (new CallReactor(shared_from_this(), exchange_, &frontend_->router(), c.index, c.attempt,
                   std::move(replica), c.context, c.request))
      ->Start();
  return true;
}

void Job::OnMessage(int32_t choice, int32_t attempt, const v1::GenerateResponse& msg) {
  Locked locked(this);
  ChoiceState& c = choices_[choice];
  if (finished_ || c.done || attempt != c.attempt) return;
  if (!first_token_ && msg.token_ids_size() > 0) {
    first_token_ = true;
    frontend_->metrics().ttft.Observe(std::chrono::duration<double>(Clock::now() - start_).count());
  }
  std::string delta;
  std::vector<int32_t> ids;
  const bool final = msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  if (PromptLogprobsToAsk(request_) && !c.has_prompt_logprobs &&
      (msg.token_ids_size() > 0 || msg.prompt_logprobs_size() > 0)) {
    c.prompt_logprobs = PromptPositions(*frontend_, prompts_.ids[c.prompt], &msg);
    c.has_prompt_logprobs = true;
  }
  // The detokenizer let out `bytes` more: every token still waiting for its
  // text has it now.
  auto detokenized = [&c](size_t bytes) {
    c.detok_bytes += static_cast<int64_t>(bytes);
    if (bytes == 0) return;
    for (auto it = c.pending_logprobs.rbegin(); it != c.pending_logprobs.rend() && !it->end; ++it) {
      it->end = c.detok_bytes;
    }
  };
  for (int k = 0; k < msg.token_ids_size() && !c.done; ++k) {
    const int32_t t = msg.token_ids(k);
    c.produced = true;
    c.token_ids.push_back(t);
    ids.push_back(t);
    ++c.completion_tokens;
    if (request_.logprobs) {
      c.pending_logprobs.push_back({.position = k < msg.logprobs_size()
                                                    ? ToPosition(*frontend_, msg.logprobs(k))
                                                    : Unscored(*frontend_, t),
                                    .start = c.detok_bytes});
    }
    const bool last = k + 1 == msg.token_ids_size();
    if (final && last && msg.finish_reason() == v1::FINISH_REASON_STOP &&
        std::find(request_.stop_token_ids.begin(), request_.stop_token_ids.end(), t) !=
            request_.stop_token_ids.end()) {
      c.stop_token = t;  // counted and returned, its text left out
      if (!request_.include_stop_str_in_output) continue;
    }
    absl::StatusOr<std::string> piece = c.detok->Push(t);
    if (!piece.ok()) continue;  // outside the tokenizer's vocabulary: no text
    detokenized(piece->size());
    StopStringMatcher::Step step = c.stops->Push(*piece);
    delta += step.text;
    if (step.stopped && request_.include_stop_str_in_output) delta += step.matched;
    if (step.stopped) {
      c.finish = FinishReason::kStop;
      c.stop_reason = step.matched;
      c.stop_token.reset();
      c.done = true;
      if (c.context) to_cancel_.push_back(c.context);  // the scheduler frees its blocks
    }
  }
  if (final && !c.done) {
    const std::string rest = c.detok->Finish();
    detokenized(rest.size());
    StopStringMatcher::Step step = c.stops->Push(rest);
    delta += step.text;
    if (step.stopped && request_.include_stop_str_in_output) delta += step.matched;
    if (step.stopped) {
      c.finish = FinishReason::kStop;
      c.stop_reason = step.matched;
      c.stop_token.reset();
    } else {
      delta += c.stops->Finish();
      c.finish = rpc::FromProto(msg.finish_reason());
    }
    c.done = true;
    c.completion_tokens = msg.usage().output_tokens();
    c.cached_tokens = msg.usage().cached_tokens_local() + msg.usage().cached_tokens_external();
  }
  c.out_bytes += static_cast<int64_t>(delta.size());
  if (request_.logprobs) ReleaseLogprobs(c);
  frontend_->metrics().generation_tokens.Increment(static_cast<double>(ids.size()));
  Emit(c, std::move(delta), std::move(ids));
  if (c.done) MaybeComplete();
}

// A token's logprobs are released once the stop-string matcher has let out
// its text. When a stop string ends the choice, the tokens whose text starts
// before the cut are reported (the one that holds the stop string's start
// too: its text is partly out; with include_stop_str_in_output the cut is
// after the stop string) and those after it are not, as their text is not.
// EOS, a stop token and length report every token (EOS and a stop token
// with their empty text), as vLLM does.
void Job::ReleaseLogprobs(ChoiceState& c) {
  const bool cut = c.done && c.finish == FinishReason::kStop && !c.stop_reason.empty();
  while (!c.pending_logprobs.empty()) {
    PendingLogprobs& p = c.pending_logprobs.front();
    if (!c.done && (!p.end || *p.end > c.out_bytes)) break;
    if (!cut || p.start < c.out_bytes) c.logprobs.push_back(std::move(p.position));
    c.pending_logprobs.pop_front();
  }
}

// The logprobs of the released tokens (after echo's prompt positions in the
// choice's first chunk, or the whole choice), rendered; null when not asked.
nlohmann::ordered_json Job::RenderLogprobs(ChoiceState& c, bool first) {
  if (!request_.logprobs) return nullptr;
  std::vector<PositionLogprobs> positions;
  if (first && request_.echo) {
    if (!c.has_prompt_logprobs) {
      c.prompt_logprobs = PromptPositions(*frontend_, prompts_.ids[c.prompt], nullptr);
    }
    positions = std::move(c.prompt_logprobs);
  }
  positions.insert(positions.end(), std::make_move_iterator(c.logprobs.begin()),
                   std::make_move_iterator(c.logprobs.end()));
  c.logprobs.clear();
  if (request_.endpoint == Endpoint::kChat) return ChatLogprobs(positions, *request_.logprobs);
  return CompletionLogprobs(positions, *request_.logprobs, &c.text_offset);
}

void Job::Emit(ChoiceState& c, std::string delta, std::vector<int32_t> ids) {
  if (!request_.stream) {
    c.text += delta;
    return;
  }
  const bool first = !c.chunk_sent;
  // Echo's prompt logprobs come with the first tokens: its first chunk waits.
  if (first && !c.done && request_.echo && request_.logprobs && !c.has_prompt_logprobs &&
      delta.empty() && ids.empty()) {
    return;
  }
  if (first && request_.echo) delta = c.text + delta;  // c.text holds the prompt
  if (!first && !c.done && delta.empty() && (!request_.return_token_ids || ids.empty()) &&
      c.logprobs.empty()) {
    return;
  }
  StartStream();
  ChunkDelta chunk{.index = c.index,
                   .text = std::move(delta),
                   .first = first && request_.endpoint == Endpoint::kChat,
                   .finish_reason = c.done ? c.finish : FinishReason::kNone,
                   .stop_reason = c.done ? c.stop_reason : std::string(),
                   .stop_token = c.done ? c.stop_token : std::nullopt,
                   .token_ids = std::move(ids),
                   .logprobs = RenderLogprobs(c, first)};
  exchange_->Write(StreamChunk(request_, head_, chunk));
  c.chunk_sent = true;
}

void Job::StartStream() {
  if (stream_started_) return;
  stream_started_ = true;
  exchange_->StartStream(200, "text/event-stream; charset=utf-8");
}

void Job::OnCallDone(int32_t choice, int32_t attempt, const std::string& replica,
                     const grpc::Status& status) {
  Locked locked(this);
  ChoiceState& c = choices_[choice];
  if (attempt != c.attempt) return;
  c.context.reset();
  if (finished_ || c.done) return;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !c.produced) {
    TANDEM_LOG(WARNING) << "request " << c.request.request_id() << ": replica " << replica
                        << " is unavailable (" << status.error_message() << "); trying another";
    frontend_->metrics().retries.Increment();
    if (StartCall(c)) return;
    Fail(FromStatus(14, absl::StrCat("no scheduler replica is serving (last: ", replica, ": ",
                                     status.error_message(), ")")));
    return;
  }
  if (status.ok()) {
    Fail(FromStatus(13, "the scheduler ended the stream without a finish reason"));
    return;
  }
  Fail(FromStatus(static_cast<int>(status.error_code()), status.error_message()));
}

void Job::MaybeComplete() {
  if (finished_) return;
  for (const ChoiceState& c : choices_) {
    if (!c.done) return;
  }
  finished_ = true;
  Usage usage;
  for (size_t p = 0; p < prompts_.ids.size(); ++p) {
    usage.prompt_tokens += static_cast<int64_t>(prompts_.ids[p].size());
    int64_t cached = 0;
    for (int32_t j = 0; j < request_.n; ++j) {
      cached = std::max(cached, choices_[p * request_.n + j].cached_tokens);
    }
    usage.cached_tokens += cached;
  }
  for (const ChoiceState& c : choices_) usage.completion_tokens += c.completion_tokens;
  Count(200);
  if (request_.stream) {
    StartStream();
    if (request_.include_usage) exchange_->Write(StreamUsageChunk(request_, head_, usage));
    exchange_->Write(std::string(kStreamDone));
    exchange_->End();
    return;
  }
  std::vector<Choice> choices;
  for (ChoiceState& c : choices_) {
    nlohmann::ordered_json prompt_logprobs;
    if (request_.prompt_logprobs) {
      if (!c.has_prompt_logprobs) {
        c.prompt_logprobs = PromptPositions(*frontend_, prompts_.ids[c.prompt], nullptr);
      }
      prompt_logprobs = PromptLogprobs(c.prompt_logprobs, *request_.prompt_logprobs);
    }
    nlohmann::ordered_json logprobs = RenderLogprobs(c, /*first=*/true);
    choices.push_back({.index = c.index,
                       .text = std::move(c.text),
                       .finish_reason = c.finish,
                       .stop_reason = c.stop_reason,
                       .stop_token = c.stop_token,
                       .token_ids = c.token_ids,
                       .logprobs = std::move(logprobs),
                       .prompt_logprobs = std::move(prompt_logprobs)});
  }
  exchange_->Respond(200, "application/json",
                     CompletionResponse(request_, head_, choices, usage, prompts_.ids)
                         .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

void Job::Fail(const ApiError& error) {
  if (finished_) return;
  finished_ = true;
  CancelAll();
  if (!stream_started_) {
    RespondError(*exchange_, error);
    Count(error.http_status);
    return;
  }
  Count(error.http_status);
  exchange_->Write(StreamErrorEvent(error));
  exchange_->Write(std::string(kStreamDone));
  exchange_->End();
}

void Job::CancelAll() {
  for (ChoiceState& c : choices_) {
    if (c.context) to_cancel_.push_back(c.context);
  }
}

void Job::ClientGone() {
  Locked locked(this);
  if (finished_) return;
  finished_ = true;
  frontend_->metrics().client_disconnects.Increment();
  Count(499);  // nginx's "client closed request"
  CancelAll();
}

// Strips a leading BOS text a chat template wrote, for tokenizers that
// cannot read special tokens from text (llama2.c, SentencePiece): the
// tokenizer adds the BOS id instead.
bool StripBosText(const tokenizer::Tokenizer& tok, std::string* text) {
  const std::string& bos = tok.bos_token();
  if (bos.empty() || tok.kind() == tokenizer::TokenizerKind::kHuggingFace ||
      !absl::StartsWith(*text, bos)) {
    return false;
  }
  text->erase(0, bos.size());
  return true;
}

// A prompt of `bytes` is refused when it is longer than any prompt the
// model can take (Frontend::PromptByteLimit): before the tokenizer sees it.
std::optional<ApiError> CheckPromptBytes(const Frontend& frontend, const ModelInfo& model,
                                         uint64_t bytes, const char* param) {
  const int64_t limit = frontend.PromptByteLimit(model);
  if (bytes <= static_cast<uint64_t>(limit)) return std::nullopt;
  return BadRequest(
      absl::StrCat("the prompt is ", bytes, " bytes, more than any prompt this model can take: ",
                   "at most ", limit, " bytes (max_model_len ", model.max_model_len, " tokens x ",
                   frontend.max_token_bytes(),
                   " bytes, the longest token of the vocabulary); it was not tokenized"),
      param);
}

// The chat template's variables beyond messages and tokens: the tools
// (tool_choice "none"), then chat_template_kwargs over them, as vLLM merges
// them.
nlohmann::ordered_json TemplateVariables(const CompletionRequest& request) {
  nlohmann::ordered_json vars = request.chat_template_kwargs;
  if (request.tools.is_null()) return vars;
  if (vars.is_null()) vars = nlohmann::ordered_json::object();
  if (!vars.contains("tools")) vars["tools"] = request.tools;
  return vars;
}

}  // namespace

std::optional<ApiError> PreparePrompts(const Frontend& frontend, const CompletionRequest& request,
                                       const ModelInfo& model, PreparedPrompts* out) {
  const tokenizer::Tokenizer& tok = frontend.tokenizer();
  const char* param = request.endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (request.endpoint == Endpoint::kChat) {
    uint64_t content_bytes = 0;
    for (const auto& m : request.messages) {
      auto content = m.find("content");
      if (content != m.end() && content->is_string()) {
        content_bytes += content->get_ref<const std::string&>().size();
      }
    }
    if (auto e = CheckPromptBytes(frontend, model, content_bytes, "messages")) return e;
    if (!frontend.chat_template()) {
      return BadRequest(
          "this server has no chat template for its model; start tandem-frontend "
          "with --chat-template",
          "messages");
    }
    tokenizer::ChatTemplateInputs inputs{.messages = request.messages,
                                         .add_generation_prompt = request.add_generation_prompt,
                                         .bos_token = tok.bos_token(),
                                         .eos_token = tok.eos_token(),
                                         .extra_context = TemplateVariables(request)};
    absl::StatusOr<std::string> rendered = frontend.chat_template()->Render(inputs);
    if (!rendered.ok()) {
      return BadRequest(absl::StrCat("chat template: ", rendered.status().message()), "messages");
    }
    std::string text = *std::move(rendered);
    if (auto e = CheckPromptBytes(frontend, model, text.size(), "messages")) return e;
    bool add_special = request.add_special_tokens.value_or(false);
    if (StripBosText(tok, &text)) add_special = true;
    absl::StatusOr<std::vector<int32_t>> ids =
        tok.Encode(text, {.add_special_tokens = add_special});
    if (!ids.ok()) return BadRequest(std::string(ids.status().message()), "messages");
    out->ids.push_back(*std::move(ids));
    out->texts.push_back(std::move(text));
  } else {
    for (const PromptInput& p : request.prompts) {
      if (p.text) {
        if (auto e = CheckPromptBytes(frontend, model, p.text->size(), "prompt")) return e;
        absl::StatusOr<std::vector<int32_t>> ids =
            tok.Encode(*p.text, {.add_special_tokens = request.add_special_tokens.value_or(true)});
        if (!ids.ok()) return BadRequest(std::string(ids.status().message()), "prompt");
        out->ids.push_back(*std::move(ids));
        out->texts.push_back(*p.text);
        continue;
      }
      for (size_t i = 0; i < p.token_ids.size(); ++i) {
        if (p.token_ids[i] >= model.vocab_size) {
          return BadRequest(
              absl::StrCat("prompt token id ", p.token_ids[i], " at position ", i,
                           " is outside the vocabulary (size ", model.vocab_size, ")"),
              "prompt");
        }
      }
      out->ids.push_back(p.token_ids);
      std::string text;
      if (request.echo) {
        absl::StatusOr<std::string> decoded = tok.Decode(p.token_ids);
        if (decoded.ok()) text = *std::move(decoded);
      }
      out->texts.push_back(std::move(text));
    }
  }
  if (request.truncate_prompt_tokens) {
    // As vLLM: the last N tokens of each prompt (BOS included in the count,
    // so a long prompt loses it); -1 means max_model_len.
    const int64_t keep =
        *request.truncate_prompt_tokens < 0 ? model.max_model_len : *request.truncate_prompt_tokens;
    if (keep > model.max_model_len) {
      return BadRequest(absl::StrCat("'truncate_prompt_tokens' (", keep,
                                     ") is greater than the model's context (max_model_len ",
                                     model.max_model_len, ")"),
                        "truncate_prompt_tokens");
    }
    for (size_t p = 0; p < out->ids.size(); ++p) {
      std::vector<int32_t>& ids = out->ids[p];
      if (static_cast<int64_t>(ids.size()) <= keep) continue;
      ids.erase(ids.begin(), ids.end() - keep);
      // echo shows the prompt the model saw.
      absl::StatusOr<std::string> text =
          tok.Decode(ids, {.skip_special_tokens = request.skip_special_tokens});
      out->texts[p] = text.ok() ? *std::move(text) : std::string();
    }
  }
  for (const std::vector<int32_t>& ids : out->ids) {
    if (ids.empty()) return BadRequest("the prompt is empty (it has no tokens)", param);
    if (static_cast<int64_t>(ids.size()) >= model.max_model_len) {
      return ContextLengthError(
          absl::StrCat("This model's maximum context length is ", model.max_model_len,
                       " tokens. However, your prompt has ", ids.size(),
                       " tokens, which leaves no room for a completion."),
          param);
    }
  }
  return std::nullopt;
}

void StartCompletionJob(Frontend* frontend, std::shared_ptr<HttpExchange> exchange,
                        CompletionRequest request, std::string endpoint) {
  auto job =
      std::make_shared<Job>(frontend, std::move(exchange), std::move(request), std::move(endpoint));
  job->Start();
}

}  // namespace tandem::frontend
