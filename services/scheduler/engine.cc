#include "engine.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/rpc/convert.h"
#include "tandem/rpc/service_convert.h"
#include "tandem/rpc/status.h"

namespace tandem::scheduler {
namespace {

// One step in this many has its SchedulerOutput serialized a second time to
// time it (gRPC's own serialization happens inside Write()).
constexpr uint64_t kSerializeSampleEvery = 8;

}  // namespace

// SchedulerConfig's messages name its fields; the user set them by flags.
static std::string FlagNames(absl::string_view message) {
  std::string out(message);
  for (auto [field, flag] :
       {std::pair{"SchedulerConfig.max_num_batched_tokens", "--max-num-batched-tokens"},
        std::pair{"SchedulerConfig.max_num_seqs", "--max-num-seqs"},
        std::pair{"SchedulerConfig.max_model_len", "--max-model-len"},
        std::pair{"SchedulerConfig.max_waiting_requests", "--max-waiting"},
        std::pair{"SchedulerConfig.max_step_failures", "--max-step-failures"},
        std::pair{"SchedulerConfig.long_prefill_token_threshold", "--long-prefill-token-threshold"},
        std::pair{"SchedulerConfig.max_logprobs", "--max-logprobs"},
        std::pair{"enable_chunked_prefill", "--enable-chunked-prefill"},
        std::pair{"max_model_len (", "--max-model-len ("}}) {
    out = absl::StrReplaceAll(out, {{field, flag}});
  }
  return out;
}

absl::Status EngineOptions::Validate() const {
  // A day at most: the grace becomes int64 nanoseconds (inf overflowed to a
  // deadline in the past, failing every request at the first loss).
  if (!(core.worker_loss_grace_s >= 0 && core.worker_loss_grace_s <= 86400)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--worker-loss-grace-s must be in [0, 86400], got ", core.worker_loss_grace_s));
  }
  if (!(core.step_timeout_s >= 0 && core.step_timeout_s <= 86400)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--step-timeout-s must be in [0, 86400], got ", core.step_timeout_s));
  }
  if (core.worker_address.empty()) return absl::InvalidArgumentError("--worker is empty");
  if (core.max_model_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-model-len must be >= 0, got ", core.max_model_len));
  }
  if (debug_submit_delay_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--debug-submit-delay-ms must be >= 0, got ", debug_submit_delay_ms));
  }
  if (!kvstore_target.empty() && kvstore_lookup_deadline_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kvstore-lookup-deadline-ms must be > 0, got ", kvstore_lookup_deadline_ms));
  }
  if (!kvstore_target.empty()) {
    TANDEM_RETURN_IF_ERROR(kvconnector::KvStoreConnectorOptions::ValidateBulkLoad(
        kvstore_bulk_port, "--kvstore-bulk-port"));
  }
  // Fill the fields the worker provides with placeholders to check the rest.
  // max_model_len is the flag's when given; else the model's, unknown until
  // the worker connects (then the whole config is checked again), so the
  // budget stands in for it: the check that needs it passes.
  sched::SchedulerConfig probe = core.scheduler;
  probe.num_gpu_blocks = 2;
  probe.block_size = 16;
  probe.hash_root.block_size = 16;
  probe.max_model_len =
      core.max_model_len > 0 ? core.max_model_len : core.scheduler.max_num_batched_tokens;
  if (core.scheduler.max_logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-logprobs must be >= 0, got ", core.scheduler.max_logprobs,
                     " (vLLM's -1, no cap, is not supported: give the vocabulary size)"));
  }
  if (absl::Status s = probe.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(FlagNames(s.message()));
  }
  // vLLM's rule: a budget below max_num_seqs caps the running requests at it.
  if (core.scheduler.max_num_batched_tokens < core.scheduler.max_num_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-num-batched-tokens (", core.scheduler.max_num_batched_tokens,
                     ") must be >= --max-num-seqs (", core.scheduler.max_num_seqs,
                     "): every running request needs a token of the step's budget"));
  }
  return absl::OkStatus();
}

// ---- GenerateCall's RequestSink: back to the engine (its thread) ----

void GenerateCall::OnTokens(const sched::RequestOutput& out) { engine_->CallTokens(*this, out); }
void GenerateCall::OnFinished(FinishReason reason, const sched::RequestOutput* out,
                              const absl::Status& status) {
  engine_->CallFinished(*this, reason, out, status);
}
void GenerateCall::OnRejected(const absl::Status& status) { engine_->CallRejected(*this, status); }

Engine::Engine(EngineOptions options, prometheus::Registry* registry)
    : options_(std::move(options)), registry_(registry) {
  if (registry_ != nullptr && !options_.core.served_model_name.empty()) {
    metrics_ = std::make_unique<EngineMetrics>(*registry_, options_.core.served_model_name);
  }
  engine::EngineCoreOptions core = options_.core;
  core.make_kv_connector = [this](const engine::WorkerDescription& worker) {
    return MakeKvConnector(worker);
  };
  core.on_schedule_duration = [this](double seconds) {
    if (metrics_ != nullptr) metrics_->schedule_duration.Observe(seconds);
  };
  core.on_step_sent = [this](int32_t num_tokens) {
    if (vllm_metrics_ != nullptr) vllm_metrics_->ObserveStep(num_tokens);
  };
  core.on_worker_lost = [this](const std::string&) { OnWorkerLost(); };
  core_ = std::make_unique<engine::EngineCore>(std::move(core));
  stats_.engine = core_->stats();
  connector_ = std::make_unique<WorkerConnector>(
      options_.core.worker_address,
      [this](uint64_t generation, std::unique_ptr<v1::ModelRunnerOutput> out) {
        Event e{.kind = Event::kOutput};
        e.generation = generation;
        e.output = std::move(out);
        Post(std::move(e));
      },
      [this](uint64_t generation, std::string reason) {
        Event e{.kind = Event::kBroken};
        e.generation = generation;
        e.reason = std::move(reason);
        Post(std::move(e));
      },
      [this](std::unique_ptr<WorkerStream> stream) {
        Event e{.kind = Event::kConnected};
        e.stream = std::move(stream);
        Post(std::move(e));
      });
}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  last_loop_ns_.store(MonotonicNanos());
  loop_ = std::thread([this] { Loop(); });
  connector_->Start();
}

void Engine::Stop() {
  if (connector_) connector_->Stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  writer_.Stop();  // after the loop: its last finishes go out first
}

void Engine::Post(Event event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void Engine::Submit(std::shared_ptr<GenerateCall> call, sched::RequestSpec spec) {
  // A grammar compiled here, on the caller's gRPC thread, and kept: the
  // engine loop's admission then finds it (a pattern at the bounds takes
  // about 0.1 s, which every running request's next step would wait).
  if (spec.sampling.HasGrammar()) (void)grammar::CompileGrammarKept(spec.sampling);
  Event e{.kind = Event::kSubmit};
  e.call = std::move(call);
  e.spec = std::move(spec);
  Post(std::move(e));
}

bool Engine::TryAccept() {
  // Count first, then look at the flag (both seq_cst): a call that saw
  // draining_ == false is already counted when SetDraining()'s caller reads
  // num_calls_open().
  num_calls_open_.fetch_add(1);
  if (draining_.load()) {
    num_calls_open_.fetch_sub(1);
    return false;
  }
  return true;
}

void Engine::Cancel(std::shared_ptr<GenerateCall> call, CancelCause cause) {
  Event e{.kind = Event::kCancel};
  e.call = std::move(call);
  e.cancel_cause = cause;
  Post(std::move(e));
}

void Engine::Abort(std::string request_id, std::function<void(bool)> done, bool stop_string) {
  Event e{.kind = Event::kAbort};
  e.request_id = std::move(request_id);
  e.abort_done = std::move(done);
  e.abort_reason = stop_string ? FinishReason::kStop : FinishReason::kAbort;
  Post(std::move(e));
}

ModelInfo Engine::model_info() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_info_;
}

ServiceStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::SetDraining() {
  draining_.store(true);
  Post(Event{.kind = Event::kWake});
}

void Engine::TrimHeapWhenIdle() {
  const auto now = std::chrono::steady_clock::now();
  if (core_->num_requests() > 0) {
    busy_since_trim_ = true;
    return;
  }
  if (!busy_since_trim_ || now - last_trim_ < kTrimPeriod) return;
  busy_since_trim_ = false;
  last_trim_ = now;
  malloc_trim(0);
}

void Engine::Loop() {
  std::deque<Event> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Bounded by the heartbeat, so that an idle loop still beats
      // (last_loop_ns()).
      const auto now = std::chrono::steady_clock::now();
      const auto deadline =
          std::min(core_->NextDeadline().value_or(now + kIdleHeartbeat), now + kIdleHeartbeat);
      if (deadline > now) {
        cv_.wait_until(lock, deadline, [&] { return stopping_ || !events_.empty(); });
      }
      if (stopping_) break;
      batch.swap(events_);
    }
    last_loop_ns_.store(MonotonicNanos());
    for (Event& e : batch) Handle(e);
    batch.clear();
    HandOffWrites();  // the tokens of the outputs just handled go out now
    core_->Tick(std::chrono::steady_clock::now());
    core_->Step();
    HandOffWrites();
    PublishStats();
    TrimHeapWhenIdle();
  }
  // Shutting down: answer everything still pending.
  std::deque<Event> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(events_);
  }
  // Only reached when the drain timed out (or without a drain).
  const absl::Status shutting_down = absl::UnavailableError("the scheduler is shutting down");
  for (Event& e : rest) {
    if (e.kind == Event::kSubmit) {
      e.call->OnRejected(shutting_down);
    } else if (e.kind == Event::kAbort) {
      e.abort_done(false);
    }
  }
  core_->FailAll(shutting_down);
  core_.reset();
  worker_.reset();
  HandOffWrites();
}

void Engine::Handle(Event& e) {
  switch (e.kind) {
    case Event::kSubmit:
      if (options_.debug_submit_delay_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.debug_submit_delay_ms));
      }
      // No draining check here: TryAccept() let this call in before the
      // drain began, so it runs to the end.
      core_->AddRequest(std::move(e.spec), e.call, e.call->times.arrival_ns);
      return;
    case Event::kCancel:
      core_->Abort(e.call->request_id, e.call.get(),
                   e.cancel_cause == CancelCause::kDeadline
                       ? absl::DeadlineExceededError("the client's deadline passed")
                       : absl::CancelledError("cancelled by the client"));
      return;
    case Event::kAbort:
      e.abort_done(core_->Abort(e.request_id, nullptr, absl::OkStatus(), e.abort_reason));
      return;
    case Event::kOutput: {
      if (worker_ == nullptr || e.generation != worker_->generation()) return;
      sched::ModelRunnerOutput output;
      if (absl::Status s = rpc::FromProto(*e.output, &output); !s.ok()) {
        core_->DropWorker(absl::StrCat("bad ModelRunnerOutput: ", s.message()));
        return;
      }
      const int64_t start_ns = MonotonicNanos();
      core_->ProcessOutput(output);
      if (metrics_ != nullptr) {
        metrics_->output_duration.Observe((MonotonicNanos() - start_ns) * 1e-9);
      }
      return;
    }
    case Event::kBroken:
      max_broken_generation_ = std::max(max_broken_generation_, e.generation);
      if (worker_ == nullptr || e.generation != worker_->generation()) return;
      core_->DropWorker(e.reason);
      return;
    case Event::kConnected:
      Connect(std::move(e.stream));
      return;
    case Event::kWake:  // a lookup's answer arrived, or the drain began
      core_->Wake();
      return;
  }
}

void Engine::Connect(std::unique_ptr<WorkerStream> stream) {
  if (stream->generation() <= max_broken_generation_) {
    // It broke before we saw it come up.
    stream.reset();
    connector_->RequestReconnect();
    return;
  }
  const engine::WorkerDescription worker = rpc::FromProto(stream->description());
  if (metrics_ == nullptr && registry_ != nullptr) {
    metrics_ = std::make_unique<EngineMetrics>(*registry_, worker.model_name);
  }
  if (vllm_metrics_ == nullptr && registry_ != nullptr) {
    vllm_metrics_ = std::make_unique<VllmMetrics>(
        *registry_,
        options_.core.served_model_name.empty() ? worker.model_name
                                                : options_.core.served_model_name,
        options_.core.max_model_len > 0 ? options_.core.max_model_len : worker.max_model_len);
  }
  // The core's transport is this class, writing to worker_: set it first.
  std::unique_ptr<WorkerStream> previous = std::exchange(worker_, std::move(stream));
  if (absl::Status s = core_->ConnectWorker(worker, this); !s.ok()) {
    const std::string why =
        absl::StrCat("the worker at ", options_.core.worker_address,
                     " described a configuration this scheduler cannot use: ", s.message());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (why != refused_worker_) TANDEM_LOG(ERROR) << why << "; retrying every 2 s";
      refused_worker_ = why;
    }
    worker_ = std::move(previous);
    // It would describe the same configuration at once: ask again later (a
    // restarted worker may describe another).
    connector_->RequestReconnect(kRefusedWorkerRetry);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    refused_worker_.clear();
  }
  previous.reset();
  if (vllm_metrics_ != nullptr) {
    vllm_metrics_->SetCacheConfig(worker.block_size, worker.num_kv_blocks,
                                  options_.core.scheduler.enable_prefix_caching);
  }
  if (on_serving_changed_) on_serving_changed_(!draining_.load());
}

std::unique_ptr<sched::KvConnectorScheduler> Engine::MakeKvConnector(
    const engine::WorkerDescription& worker) {
  if (options_.kvstore_target.empty()) return nullptr;
  auto kvc = kvconnector::KvStoreConnectorScheduler::Create(
      kvconnector::KvStoreConnectorOptions{
          .target = options_.kvstore_target,
          .lookup_deadline_ms = options_.kvstore_lookup_deadline_ms,
          .on_lookup_answer = [this] { Post(Event{.kind = Event::kWake}); },
          .on_lookup_latency =
              [this](double seconds) {
                if (metrics_ != nullptr) metrics_->kv_lookup_duration.Observe(seconds);
              },
          .bulk_load = options_.kvstore_bulk_port},
      worker.model_fingerprint, worker.kv_layout, worker.block_bytes, worker.block_size);
  if (!kvc.ok()) {
    TANDEM_LOG(ERROR) << "KV-store connector disabled: " << kvc.status();
    return nullptr;
  }
  return std::move(kvc).value();
}

bool Engine::Send(const sched::SchedulerOutput& step) {
  const int64_t t0 = MonotonicNanos();
  step_proto_.Clear();
  rpc::ToProto(step, &step_proto_);
  wire_.step_to_proto_ns_sum += MonotonicNanos() - t0;
  wire_.step_message_bytes_sum += step_proto_.ByteSizeLong();
  if (step.step_id % kSerializeSampleEvery == 0) {
    const int64_t s0 = MonotonicNanos();
    serialize_scratch_.clear();
    step_proto_.SerializeToString(&serialize_scratch_);
    wire_.step_serialize_ns_sum += MonotonicNanos() - s0;
    ++wire_.step_serialize_samples;
  }
  return worker_->Write(step_proto_);
}

void Engine::OnWorkerLost() {
  if (worker_ != nullptr) {
    max_broken_generation_ = std::max(max_broken_generation_, worker_->generation());
  }
  worker_.reset();
  if (on_serving_changed_) on_serving_changed_(false);
  connector_->RequestReconnect();
}

namespace {

// An output's tokens, logprobs, prompt logprobs and counts so far as a
// response.
GenerateResponse ResponseOf(const sched::RequestOutput& out) {
  return GenerateResponse{
      .token_ids = out.new_token_ids,
      .logprobs = out.new_logprobs,
      .prompt_logprobs = out.prompt_logprobs,
      .last_token_stops = out.stopped_on_token,
      .usage = GenerateUsage{.prompt_tokens = out.num_prompt_tokens,
                             .output_tokens = out.num_output_tokens,
                             .cached_tokens_local = out.num_cached_tokens_local,
                             .cached_tokens_external = out.num_cached_tokens_external}};
}

}  // namespace

void Engine::CallTokens(GenerateCall& call, const sched::RequestOutput& out) {
  NoteTokens(call, out.new_token_ids.size());
  v1::GenerateResponse msg;
  msg.set_request_id(call.request_id);
  rpc::ToProto(ResponseOf(out), &msg);
  if (call.Queue(std::move(msg))) writes_.push_back(call.shared_from_this());
}

void Engine::CallFinished(GenerateCall& call, FinishReason reason, const sched::RequestOutput* out,
                          const absl::Status& status) {
  num_calls_open_.fetch_sub(1);
  if (out != nullptr && !out->new_token_ids.empty()) NoteTokens(call, out->new_token_ids.size());
  const int64_t now_ns = MonotonicNanos();
  const double latency_ms = (now_ns - call.times.arrival_ns) * 1e-6;
  if (vllm_metrics_ != nullptr) {
    vllm_metrics_->ObserveFinished(reason, call.times, now_ns,
                                   out ? out->num_prompt_tokens : call.num_prompt_tokens,
                                   out ? out->num_output_tokens : 0);
  }
  if (metrics_ != nullptr) {
    metrics_->requests_finished.Add({{"reason", FinishReasonName(reason)}}).Increment();
    metrics_->request_latency.Observe(latency_ms * 1e-3);
    if (out != nullptr) {
      metrics_->prompt_tokens.Increment(out->num_prompt_tokens);
      if (out->num_output_tokens > 1 && call.times.first_token_ns > 0) {
        metrics_->time_per_output_token.Observe(
            (call.times.last_token_ns - call.times.first_token_ns) * 1e-9 /
            (out->num_output_tokens - 1));
      }
    }
  }
  const grpc::Status grpc_status = rpc::ToGrpcStatus(status);
  if (status.ok()) {
    GenerateResponse last = out != nullptr ? ResponseOf(*out) : GenerateResponse{};
    last.finish_reason = reason;
    v1::GenerateResponse msg;
    msg.set_request_id(call.request_id);
    rpc::ToProto(last, &msg);
    if (call.Queue(std::move(msg))) writes_.push_back(call.shared_from_this());
  }
  if (call.QueueFinish(grpc_status)) writes_.push_back(call.shared_from_this());
  if (!options_.log_requests) return;
  TANDEM_LOG(INFO) << "request " << call.request_id
                   << " finished: reason=" << FinishReasonName(reason)
                   << " status=" << rpc::StatusCodeName(grpc_status)
                   << " prompt_tokens=" << (out ? out->num_prompt_tokens : call.num_prompt_tokens)
                   << " output_tokens=" << (out ? out->num_output_tokens : 0)
                   << " cached_local=" << (out ? out->num_cached_tokens_local : 0)
                   << " cached_external=" << (out ? out->num_cached_tokens_external : 0)
                   << " latency_ms=" << latency_ms;
}

void Engine::CallRejected(GenerateCall& call, const absl::Status& status) {
  num_calls_open_.fetch_sub(1);
  const grpc::Status grpc_status = rpc::ToGrpcStatus(status);
  if (options_.log_requests) {
    TANDEM_LOG(INFO) << "request " << call.request_id
                     << " rejected: status=" << rpc::StatusCodeName(grpc_status) << " "
                     << grpc_status.error_message();
  }
  if (call.QueueFinish(grpc_status)) writes_.push_back(call.shared_from_this());
}

void Engine::HandOffWrites() {
  if (!writes_.empty()) writer_.Submit(writes_);
}

void Engine::NoteTokens(GenerateCall& call, size_t num_tokens) {
  const int64_t now = MonotonicNanos();
  RequestTimeline& t = call.times;
  if (t.first_token_ns == 0) {
    t.first_token_ns = now;
    if (vllm_metrics_ != nullptr) {
      vllm_metrics_->ObserveFirstTokens(t, now, call.num_prompt_tokens, num_tokens);
    }
    if (metrics_ != nullptr) metrics_->time_to_first_token.Observe((now - t.arrival_ns) * 1e-9);
  } else {
    if (vllm_metrics_ != nullptr) {
      vllm_metrics_->ObserveMoreTokens((now - t.last_token_ns) * 1e-9, num_tokens);
    }
    if (metrics_ != nullptr) metrics_->inter_token_latency.Observe((now - t.last_token_ns) * 1e-9);
  }
  if (metrics_ != nullptr) metrics_->generation_tokens.Increment(static_cast<double>(num_tokens));
  t.last_token_ns = now;
}

void Engine::PublishStats() {
  ServiceStats s = wire_;
  s.engine = core_->stats();
  s.draining = draining_.load();
  if (metrics_ != nullptr) metrics_->Update(s.engine);
  if (vllm_metrics_ != nullptr) vllm_metrics_->Update(s.engine);
  std::lock_guard<std::mutex> lock(mu_);
  model_info_ = core_->model_info();
  stats_ = std::move(s);
}

}  // namespace tandem::scheduler
