#include "tandem/frontend/completion_job.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "completion_choice.h"
#include "tandem/common/logging.h"

namespace tandem::frontend {

// Holds the job's lock; on leaving, lets it go and only then cancels the
// calls queued in to_cancel_: OnCallMessage takes the lock, and a cancel may
// run the transport's callbacks inline (a gRPC callback completion queue
// runs them at the end of the API call; gRPC 1.51 here hands them to its
// nexting threads instead, so no end-to-end test can make one run inline).
class CompletionJob::Locked {
 public:
  explicit Locked(CompletionJob* job) : job_(job), lock_(job->mu_) {}
  ~Locked() {
    std::vector<std::shared_ptr<GenerateCall>> cancel, stop;
    cancel.swap(job_->to_cancel_);
    stop.swap(job_->to_stop_);
    lock_.unlock();
    for (const auto& call : cancel) call->Cancel();
    for (const auto& call : stop) call->StopAtString();
  }

 private:
  CompletionJob* job_;
  std::unique_lock<std::mutex> lock_;
};

CompletionJob::CompletionJob(const ServedTokenizer& served,
                             std::unique_ptr<GenerateTransport> transport,
                             std::unique_ptr<CompletionSink> sink,
                             std::unique_ptr<CompletionJobMetrics> metrics,
                             CompletionRequest request)
    : served_(served),
      transport_(std::move(transport)),
      sink_(std::move(sink)),
      metrics_(metrics ? std::move(metrics) : std::make_unique<CompletionJobMetrics>()),
      request_(std::move(request)) {}

CompletionJob::~CompletionJob() = default;

void CompletionJob::Start(const std::optional<ModelInfo>& model,
                          const std::optional<std::vector<std::string>>& names) {
  Locked locked(this);
  if (!model || !names) {
    Fail(FromStatus(14, "no scheduler replica has described its model yet"));
    return;
  }
  if (!request_.model.empty() &&
      std::find(names->begin(), names->end(), request_.model) == names->end()) {
    Fail({.http_status = 404,
          .message =
              absl::StrCat("The model '", request_.model, "' does not exist; this server serves '",
                           absl::StrJoin(*names, "', '"), "'"),
          .param = "model",
          .code = "model_not_found"});
    return;
  }
  if (auto e = CheckLogprobsLimit(request_, model->max_logprobs)) {
    Fail(*e);
    return;
  }
  if (auto e = PreparePrompts(served_, request_, *model, &prompts_)) {
    Fail(*e);
    return;
  }
  const char* id_prefix = request_.endpoint == Endpoint::kChat        ? "chatcmpl-"
                          : request_.endpoint == Endpoint::kResponses ? "resp_"
                                                                      : "cmpl-";
  // The scheduler's ids are ours (random, so no client aborts another's
  // request by guessing it); the response's may be the client's.
  call_id_ = NewResponseId(id_prefix);
  head_ = {.id = request_.request_id ? absl::StrCat(id_prefix, *request_.request_id) : call_id_,
           .created = static_cast<int64_t>(std::time(nullptr)),
           .model = request_.model.empty() ? names->front() : request_.model};
  if (!BuildChoices(*model)) return;
  if (request_.endpoint == Endpoint::kResponses && request_.stream) {
    responses_ = std::make_unique<ResponsesEvents>(request_, head_, responses_run_);
  }
  for (ChoiceState& c : choices_) {
    metrics_->OnPromptTokens(static_cast<int64_t>(c.call_request.prompt_token_ids.size()));
  }
  metrics_->OnSent(head_.model, prompts_.ids.size(), request_.n);
  std::weak_ptr<CompletionJob> weak = weak_from_this();
  sink_->WatchClientGone([weak] {
    if (auto job = weak.lock()) job->ClientGone();
  });
  for (ChoiceState& c : choices_) {
    if (!StartCall(c)) {
      Fail(FromStatus(14, "no scheduler replica is serving"));
      return;
    }
  }
}

// Each choice's request, detokenizer and stop strings; false after failing
// the request (a prompt plus max_tokens over the context).
bool CompletionJob::BuildChoices(const ModelInfo& model) {
  const RequestSampling sampling = EffectiveSampling(request_, model.generation);
  const std::optional<int32_t> prompt_logprobs = PromptLogprobsToAsk(request_);
  const int32_t n = request_.n;
  // Structured outputs of a model that thinks start where the thinking ends,
  // as vLLM's reasoner holds the grammar until then: the worker needs the
  // end tag as one token (vLLM's parsers refuse a tokenizer without it).
  std::optional<int32_t> thinking_end;
  if (request_.reasoning_parser && request_.HasGrammar()) {
    thinking_end = served_.tokenizer().PieceToId(kReasoningEnd);
    if (!thinking_end) {
      Fail(BadRequest(absl::StrCat("structured outputs under --reasoning-parser start where the "
                                   "thinking ends, and this model's tokenizer has no '",
                                   std::string(kReasoningEnd), "' token to mark it"),
                      request_.json_schema_field));
      return false;
    }
  }
  choices_.resize(prompts_.ids.size() * n);
  for (size_t p = 0; p < prompts_.ids.size(); ++p) {
    const int32_t prompt_len = static_cast<int32_t>(prompts_.ids[p].size());
    int32_t max_tokens = model.max_model_len - prompt_len;
    if (request_.endpoint == Endpoint::kCompletions && !request_.max_tokens) {
      max_tokens = std::min(max_tokens, kDefaultCompletionsMaxTokens);
    }
    // A request without max_tokens: at most the model's generation_config
    // max_new_tokens, as vLLM's default max_tokens.
    const std::optional<int32_t> max_new = model.generation.max_new_tokens;
    if (!request_.max_tokens && max_new) max_tokens = std::min(max_tokens, *max_new);
    if (request_.max_tokens) {
      const int64_t total = static_cast<int64_t>(prompt_len) + *request_.max_tokens;
      if (total > model.max_model_len) {
        Fail(ContextLengthError(
            absl::StrCat("This model's maximum context length is ", model.max_model_len,
                         " tokens. However, you requested ", total, " tokens (", prompt_len,
                         " in the prompt, ", *request_.max_tokens, " in the completion)."),
            "max_tokens"));
        return false;
      }
      // Echo without generation: the engine computes one token, as vLLM's
      // does, and OnCallMessage hides it.
      max_tokens = std::max(*request_.max_tokens, 1);
    } else if (request_.min_tokens > max_tokens) {
      // Parse checked min_tokens against a max_tokens the request gave (or
      // the completions default); this one is what the context leaves.
      Fail(BadRequest(
          absl::StrCat(
              "'min_tokens' (", request_.min_tokens, ") must not exceed the default ",
              "max_tokens ", max_tokens, ": what the context leaves after the ", prompt_len,
              "-token prompt (max_model_len ", model.max_model_len, ")",
              max_new ? absl::StrCat(", at most the model's max_new_tokens ", *max_new) : ""),
          "min_tokens"));
      return false;
    }
    for (int32_t j = 0; j < n; ++j) {
      ChoiceState& c = choices_[p * n + j];
      c.index = static_cast<int32_t>(p) * n + j;
      c.prompt = static_cast<int32_t>(p);
      c.call_request = {.request_id = absl::StrCat(call_id_, "-", c.index),
                        .prompt_token_ids = prompts_.ids[p],
                        .sampling = {.temperature = sampling.temperature,
                                     .top_k = sampling.top_k,
                                     .top_p = sampling.top_p,
                                     .min_p = sampling.min_p,
                                     .presence_penalty = sampling.presence_penalty,
                                     .frequency_penalty = sampling.frequency_penalty,
                                     .repetition_penalty = sampling.repetition_penalty,
                                     .logit_bias = request_.logit_bias,
                                     .bad_words = prompts_.bad_words,
                                     .allowed_token_ids = request_.allowed_token_ids,
                                     .json_schema = request_.json_schema,
                                     .choice = request_.choice,
                                     .regex = request_.regex,
                                     .grammar = request_.grammar,
                                     .disable_any_whitespace = request_.disable_any_whitespace,
                                     .max_tokens = max_tokens,
                                     .min_tokens = request_.min_tokens,
                                     .ignore_eos = request_.ignore_eos,
                                     .stop_token_ids = request_.stop_token_ids,
                                     .logprobs = request_.logprobs.value_or(-1),
                                     .prompt_logprobs = prompt_logprobs.value_or(-1)},
                        .priority = request_.priority,
                        .cache_salt = request_.cache_salt};
      if (thinking_end && StartsInReasoning(c)) {
        c.call_request.sampling.json_schema_after_token = thinking_end;
      }
      if (request_.seed) {
        c.call_request.sampling.seed =
            static_cast<uint64_t>(*request_.seed) + static_cast<uint64_t>(j);
      }
      StartOutput(c);
    }
  }
  if (request_.endpoint == Endpoint::kResponses) {
    responses_run_ = {.message_id = NewResponseId("msg_"),
                      .reasoning_id = NewResponseId("rs_"),
                      .temperature = sampling.temperature,
                      .top_p = sampling.top_p,
                      .max_output_tokens = choices_.front().call_request.sampling.max_tokens};
  }
  return true;
}

void CompletionJob::StartOutput(ChoiceState& c) {
  // Never clean_up_tokenization_spaces: vLLM's detokenizer (the Rust
  // DecodeStream) does not, and it would rewrite what the model wrote
  // ("Quoi ?", "x .y" in code) where tokenizer_config.json asks for it
  // (Llama 3's does).
  const tokenizer::DecodeOptions decode{.skip_special_tokens = request_.skip_special_tokens,
                                        .clean_up_tokenization_spaces = false};
  c.detok = std::make_unique<tokenizer::IncrementalDetokenizer>(served_.tokenizer(), decode,
                                                                prompts_.ids[c.prompt]);
  c.stops = std::make_unique<StopStringMatcher>(request_.stop);
  if (request_.forced_tool && request_.stream) {
    c.tool_stream = std::make_unique<ToolCallStream>(*request_.forced_tool);
  } else if (request_.tool_parser && request_.stream) {
    c.tool_stream = std::make_unique<ToolCallStream>(*request_.tool_parser);
  }
  if (request_.reasoning_parser && request_.stream) {
    c.reasoning_stream = std::make_unique<ReasoningStream>(StartsInReasoning(c));
  }
  if (request_.echo) c.text = prompts_.texts[c.prompt];
}

ReasoningSplit CompletionJob::SplitWhole(ChoiceState& c) const {
  if (!request_.reasoning_parser) return {.content = std::move(c.text)};
  ReasoningSplit split = SplitReasoning(c.text, StartsInReasoning(c));
  if (!request_.include_reasoning) split.reasoning.reset();
  return split;
}

ExtractedToolCalls CompletionJob::TakeToolCalls(ReasoningSplit* split) const {
  ExtractedToolCalls tools;
  if (request_.forced_tool) {
    tools = ExtractForcedToolCalls(*request_.forced_tool, split->content.value_or(""));
  } else if (request_.tool_parser) {
    tools = ExtractToolCalls(*request_.tool_parser, split->content.value_or(""));
  } else {
    return tools;
  }
  if (!tools.calls.empty()) split->content = tools.content;
  KeepParallelToolCalls(&tools);
  return tools;
}

ExtractedToolCalls CompletionJob::FinishToolStream(ChoiceState& c) const {
  ExtractedToolCalls tools = c.tool_stream->Finish();
  KeepParallelToolCalls(&tools);
  return tools;
}

void CompletionJob::KeepParallelToolCalls(ExtractedToolCalls* tools) const {
  if (!request_.parallel_tool_calls && tools->calls.size() > 1) tools->calls.resize(1);
}

bool CompletionJob::StartsInReasoning(const ChoiceState& c) const {
  return frontend::StartsInReasoning(*request_.reasoning_parser, prompts_.texts[c.prompt],
                                     request_.chat_template_kwargs);
}

ReasoningStream::Piece CompletionJob::SplitStreamed(ChoiceState& c, const std::string& delta) {
  if (!c.reasoning_stream) return {.content = delta};
  ReasoningStream::Piece piece = c.reasoning_stream->Push(delta);
  if (c.done) piece.reasoning += c.reasoning_stream->Finish().reasoning;
  if (!request_.include_reasoning) piece.reasoning.clear();
  return piece;
}

void CompletionJob::RestartOutput(ChoiceState& c) {
  ChoiceState fresh;
  fresh.index = c.index;
  fresh.prompt = c.prompt;
  fresh.call_request = std::move(c.call_request);
  fresh.tried = std::move(c.tried);
  fresh.attempt = c.attempt;
  c = std::move(fresh);
  StartOutput(c);
}

bool CompletionJob::StartCall(ChoiceState& c) {
  std::optional<GenerateTransport::Started> started = transport_->StartCall(
      shared_from_this(), {.choice = c.index, .attempt = c.attempt + 1}, c.call_request, c.tried);
  if (!started) return false;
  c.tried.push_back(std::move(started->replica));
  ++c.attempt;
  c.call = std::move(started->call);
  return true;
}

void CompletionJob::OnCallMessage(CallId id, const GenerateResponse& call_msg) {
  Locked locked(this);
  ChoiceState& c = choices_[id.choice];
  if (finished_ || c.done || id.attempt != c.attempt) return;
  if (!first_token_ && !call_msg.token_ids.empty()) {
    first_token_ = true;
    metrics_->OnFirstToken();
  }
  // Echo without generation (max_tokens 0): the token computed is neither
  // shown nor counted; the finish reason stays (vLLM's shows it too).
  GenerateResponse echo_only;
  if (request_.max_tokens == 0) {
    echo_only = call_msg;
    echo_only.token_ids.clear();
    echo_only.logprobs.clear();
    echo_only.last_token_stops = false;
    if (echo_only.usage) echo_only.usage->output_tokens = 0;
  }
  const GenerateResponse& msg = request_.max_tokens == 0 ? echo_only : call_msg;
  ChoiceDelta delta = c.Take(msg, request_, served_);
  if (delta.stopped && c.call) to_stop_.push_back(c.call);
  metrics_->OnGeneratedTokens(static_cast<int64_t>(delta.ids.size()));
  Emit(c, std::move(delta.text), std::move(delta.ids));
  if (c.done) MaybeComplete();
}

void CompletionJob::Emit(ChoiceState& c, std::string delta, std::vector<int32_t> ids) {
  if (!request_.stream) {
    c.text += delta;
    return;
  }
  if (responses_) {
    EmitResponses(c, delta);
    return;
  }
  const bool first = !c.chunk_sent;
  // Echo's prompt logprobs come with the first tokens: its first chunk waits.
  if (first && !c.done && request_.echo && request_.logprobs && !c.has_prompt_logprobs &&
      delta.empty() && ids.empty()) {
    return;
  }
  if (first && request_.echo) delta = c.text + delta;  // c.text holds the prompt
  ReasoningStream::Piece split = SplitStreamed(c, delta);
  delta = std::move(split.content);
  ExtractedToolCalls tools;
  if (c.tool_stream) {
    delta = c.tool_stream->Push(delta);
    if (c.done) {
      tools = FinishToolStream(c);
      delta += tools.content.value_or("");
    }
  }
  if (first && request_.chat_echo) delta = *request_.chat_echo + delta;
  if (!first && !c.done && delta.empty() && split.reasoning.empty() &&
      (!request_.return_token_ids || ids.empty()) && c.logprobs.empty()) {
    return;
  }
  StartStream();
  ChunkDelta chunk{
      .index = c.index,
      .text = std::move(delta),
      .first = first && request_.endpoint == Endpoint::kChat,
      .finish_reason = c.done ? c.finish : FinishReason::kNone,
      .stop_reason = c.done ? c.stop_reason : std::string(),
      .stop_token = c.done ? c.stop_token : std::nullopt,
      .token_ids = std::move(ids),
      .reasoning = std::move(split.reasoning),
      .prompt_token_ids = first && request_.return_token_ids ? &prompts_.ids[c.prompt] : nullptr,
      .logprobs = c.RenderLogprobs(request_, served_, first)};
  if (!tools.calls.empty()) chunk.tool_calls = RenderToolCalls(tools.calls, /*with_index=*/true);
  if (request_.continuous_usage) {
    chunk.usage = Usage{.prompt_tokens = std::ssize(prompts_.ids[c.prompt]),
                        .completion_tokens = c.completion_tokens,
                        .cached_tokens = c.cached_tokens};
  }
  sink_->Write(StreamChunk(request_, head_, chunk));
  c.chunk_sent = true;
}

void CompletionJob::EmitResponses(ChoiceState& c, const std::string& delta) {
  StartStream();
  if (!c.chunk_sent) {
    sink_->Write(responses_->Start());
    c.chunk_sent = true;
  }
  ReasoningStream::Piece split = SplitStreamed(c, delta);
  std::string event = responses_->ReasoningDelta(split.reasoning);
  event += responses_->Delta(c.tool_stream ? c.tool_stream->Push(split.content) : split.content,
                             c.RenderLogprobs(request_, served_, /*first=*/false));
  if (!event.empty()) sink_->Write(event);
}

void CompletionJob::CompleteResponses(ChoiceState& c, const Usage& usage) {
  if (responses_) {
    EmitResponses(c, "");
    ExtractedToolCalls tools;
    if (c.tool_stream) {
      tools = FinishToolStream(c);
      std::string rest = responses_->Delta(tools.content.value_or(""));
      if (!rest.empty()) sink_->Write(rest);
    }
    sink_->Write(responses_->Finish(c.finish, usage, tools.calls));
    sink_->End();
    return;
  }
  ReasoningSplit split = SplitWhole(c);
  ExtractedToolCalls tools = TakeToolCalls(&split);
  const ResponsesOutput output{.text = split.content.value_or(""),
                               .calls = std::move(tools.calls),
                               .finish = c.finish,
                               .usage = usage,
                               .logprobs = c.RenderLogprobs(request_, served_, /*first=*/false),
                               .reasoning = std::move(split.reasoning)};
  sink_->Respond(ResponsesObject(request_, head_, responses_run_, &output)
                     .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

void CompletionJob::StartStream() {
  if (stream_started_) return;
  stream_started_ = true;
  sink_->StartStream();
}

void CompletionJob::OnCallDone(CallId id, const std::string& replica, const absl::Status& status) {
  Locked locked(this);
  ChoiceState& c = choices_[id.choice];
  if (id.attempt != c.attempt) return;
  c.call.reset();
  if (finished_ || c.done) return;
  // Before the client has seen any of the choice, another replica runs it
  // again: before its first token, or any time for a response not streamed
  // (whose tokens so far are dropped; a seeded sample comes out the same).
  if (absl::IsUnavailable(status) && (!c.produced || !request_.stream)) {
    TANDEM_LOG(WARNING) << "request " << c.call_request.request_id << ": replica " << replica
                        << " is unavailable (" << status.message() << ")"
                        << (c.produced ? " after some tokens; running it again" : "")
                        << "; trying another";
    metrics_->OnRetry();
    if (c.produced) RestartOutput(c);
    if (StartCall(c)) return;
    Fail(FromStatus(14, absl::StrCat("no scheduler replica is serving (last: ", replica, ": ",
                                     std::string(status.message()), ")")));
    return;
  }
  if (status.ok()) {
    Fail(FromStatus(13, "the scheduler ended the stream without a finish reason"));
    return;
  }
  Fail(FromStatus(static_cast<int>(status.code()), std::string(status.message())));
}

void CompletionJob::MaybeComplete() {
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
  metrics_->OnResponse(200);
  if (request_.endpoint == Endpoint::kResponses) {
    CompleteResponses(choices_.front(), usage);
    return;
  }
  if (request_.stream) {
    StartStream();
    if (request_.include_usage) sink_->Write(StreamUsageChunk(request_, head_, usage));
    sink_->Write(std::string(kStreamDone));
    sink_->End();
    return;
  }
  std::vector<Choice> choices;
  for (ChoiceState& c : choices_) {
    nlohmann::ordered_json prompt_logprobs;
    if (request_.prompt_logprobs) {
      prompt_logprobs = PromptLogprobs(c.PromptPositions(served_), *request_.prompt_logprobs);
    }
    nlohmann::ordered_json logprobs = c.RenderLogprobs(request_, served_, /*first=*/true);
    ReasoningSplit split = SplitWhole(c);
    ExtractedToolCalls tools = TakeToolCalls(&split);
    // Chat echo goes before the content whatever the parsers took out of
    // it (vLLM's).
    if (request_.chat_echo) split.content = *request_.chat_echo + split.content.value_or("");
    choices.push_back({.index = c.index,
                       .text = split.content.value_or(""),
                       .content_null = !split.content,
                       .tool_calls = std::move(tools.calls),
                       .reasoning = std::move(split.reasoning),
                       .finish_reason = c.finish,
                       .stop_reason = c.stop_reason,
                       .stop_token = c.stop_token,
                       .token_ids = c.token_ids,
                       .logprobs = std::move(logprobs),
                       .prompt_logprobs = std::move(prompt_logprobs)});
  }
  sink_->Respond(CompletionResponse(request_, head_, choices, usage, prompts_.ids)
                     .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

void CompletionJob::Fail(const ApiError& error) {
  if (finished_) return;
  finished_ = true;
  CancelAll();
  metrics_->OnResponse(error.http_status);
  if (!stream_started_) {
    sink_->RespondError(error);
    return;
  }
  if (responses_) {
    sink_->Write(responses_->Error(error));
    sink_->End();
    return;
  }
  sink_->Write(StreamErrorEvent(error));
  sink_->Write(std::string(kStreamDone));
  sink_->End();
}

void CompletionJob::CancelAll() {
  for (ChoiceState& c : choices_) {
    if (c.call) to_cancel_.push_back(c.call);
  }
}

void CompletionJob::Cut(const ApiError& error) {
  Locked locked(this);
  Fail(error);
}

void CompletionJob::ClientGone() {
  Locked locked(this);
  if (finished_) return;
  finished_ = true;
  metrics_->OnClientGone();
  metrics_->OnResponse(499);  // nginx's "client closed request"
  CancelAll();
}

}  // namespace tandem::frontend
