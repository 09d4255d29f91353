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
#include "tandem/rpc/convert.h"
#include "tandem/rpc/status.h"

namespace tandem::scheduler {
namespace {

v1::FinishReason ToFinishReason(sched::RequestState state) {
  switch (state) {
    case sched::RequestState::kFinishedStopped:
      return v1::FINISH_REASON_STOP;
    case sched::RequestState::kFinishedLength:
      return v1::FINISH_REASON_LENGTH;
    case sched::RequestState::kFinishedAborted:
      return v1::FINISH_REASON_ABORT;
    case sched::RequestState::kFinishedError:
      return v1::FINISH_REASON_ERROR;
    case sched::RequestState::kWaiting:
    case sched::RequestState::kWaitingForRemoteKv:
    case sched::RequestState::kRunning:
    case sched::RequestState::kPreempted:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// One step in this many has its SchedulerOutput serialized a second time to
// time it (gRPC's own serialization happens inside Write()).
constexpr uint64_t kSerializeSampleEvery = 8;

const char* ReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "none";
  }
}

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
        std::pair{"enable_chunked_prefill", "--enable-chunked-prefill"},
        std::pair{"max_model_len (", "--max-model-len ("}}) {
    out = absl::StrReplaceAll(out, {{field, flag}});
  }
  return out;
}

absl::Status EngineOptions::Validate() const {
  if (!(worker_loss_grace_s >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker-loss-grace-s must be >= 0, got ", worker_loss_grace_s));
  }
  if (worker_address.empty()) return absl::InvalidArgumentError("--worker is empty");
  if (max_model_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-model-len must be >= 0, got ", max_model_len));
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
  sched::SchedulerConfig probe = scheduler;
  probe.num_gpu_blocks = 2;
  probe.block_size = 16;
  probe.hash_root.block_size = 16;
  probe.max_model_len = max_model_len > 0 ? max_model_len : scheduler.max_num_batched_tokens;
  if (absl::Status s = probe.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(FlagNames(s.message()));
  }
  return absl::OkStatus();
}

// Single-series families labelled with the model, and labelled children.
struct SeriesMaker {
  prometheus::Registry& r;
  std::map<std::string, std::string> labels;

  prometheus::Gauge& Gauge(const std::string& name, const std::string& help) {
    return prometheus::BuildGauge().Name(name).Help(help).Labels(labels).Register(r).Add({});
  }
  prometheus::Counter& Counter(const std::string& name, const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(r).Add({});
  }
  prometheus::Histogram& Histogram(const std::string& name, const std::string& help,
                                   const prometheus::Histogram::BucketBoundaries& buckets) {
    return prometheus::BuildHistogram().Name(name).Help(help).Labels(labels).Register(r).Add(
        {}, buckets);
  }
  // One counter per value of `label`, mirrored from cumulative values.
  template <typename NameOf>
  std::vector<metrics::MirroredCounter> Mirrored(const std::string& name, const std::string& help,
                                                 const std::string& label, int n, NameOf name_of) {
    auto& family = prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(r);
    std::vector<metrics::MirroredCounter> out;
    for (int i = 0; i < n; ++i) out.emplace_back(&family.Add({{label, name_of(i)}}));
    return out;
  }
};

namespace {

// Schedule() takes microseconds: 10 us .. 250 ms.
prometheus::Histogram::BucketBoundaries ScheduleBuckets() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.25};
}

}  // namespace

EngineMetrics::EngineMetrics(prometheus::Registry& r, const std::string& model_name)
    : EngineMetrics(SeriesMaker{r, {{"model_name", model_name}}}) {}

EngineMetrics::EngineMetrics(SeriesMaker m)
    : num_requests_running(m.Gauge("tandem_scheduler_num_requests_running",
                                   "Requests running (scheduled in steps).")),
      num_requests_waiting(
          m.Gauge("tandem_scheduler_num_requests_waiting", "Requests waiting for admission.")),
      num_requests_waiting_by_reason{},
      kv_cache_usage(
          m.Gauge("tandem_scheduler_kv_cache_usage_ratio", "Fraction of KV blocks in use (0-1).")),
      kv_blocks_free(m.Gauge("tandem_scheduler_kv_blocks_free",
                             "Free KV blocks (cached-but-unused blocks count as free).")),
      worker_connected(m.Gauge("tandem_scheduler_worker_connected",
                               "1 while a worker is connected and serving.")),
      num_steps_in_flight(m.Gauge("tandem_scheduler_num_steps_in_flight",
                                  "Steps sent to the worker whose output has not arrived.")),
      num_async_loads_in_flight(
          m.Gauge("tandem_scheduler_num_async_loads_in_flight",
                  "Requests whose prompt prefix is being loaded from the KV-store.")),
      num_lookups_pending(m.Gauge("tandem_scheduler_num_lookups_pending",
                                  "KV-store lookups sent and not yet answered.")),
      preemptions(m.Mirrored(
          "tandem_scheduler_preemptions_total", "Requests preempted for recompute, by cause.",
          "cause", sched::kNumPreemptionReasons,
          [](int i) {
            return sched::PreemptionReasonName(static_cast<sched::PreemptionReason>(i));
          })),
      admission_blocked_steps(m.Mirrored(
          "tandem_scheduler_admission_blocked_steps_total",
          "Steps in which admission stopped with requests waiting, by the limit that stopped it.",
          "limit", sched::kNumAdmissionLimits,
          [](int i) { return sched::AdmissionLimitName(static_cast<sched::AdmissionLimit>(i)); })),
      requests_admitted(&m.Counter(
          "tandem_scheduler_requests_admitted_total",
          "Waiting requests that started running (new, resumed, or after their KV load).")),
      recomputed_tokens(&m.Counter("tandem_scheduler_recomputed_tokens_total",
                                   "Computed tokens that preemptions threw away.")),
      prefix_cache_queries(&m.Counter("tandem_scheduler_prefix_cache_queries_tokens_total",
                                      "Prompt tokens looked up in the local prefix cache.")),
      prefix_cache_hits(&m.Counter("tandem_scheduler_prefix_cache_hits_tokens_total",
                                   "Prompt tokens found in the local prefix cache.")),
      external_cache_queries(&m.Counter("tandem_scheduler_external_cache_queries_tokens_total",
                                        "Tokens looked up in the external KV-store.")),
      external_cache_hits(&m.Counter("tandem_scheduler_external_cache_hits_tokens_total",
                                     "Tokens found in the external KV-store.")),
      steps(&m.Counter("tandem_scheduler_steps_total", "Steps scheduled.")),
      requests_finished(prometheus::BuildCounter()
                            .Name("tandem_scheduler_requests_finished_total")
                            .Help("Requests finished, by reason (stop, length, abort, error).")
                            .Labels(m.labels)
                            .Register(m.r)),
      prompt_tokens(
          m.Counter("tandem_scheduler_prompt_tokens_total", "Prompt tokens of finished requests.")),
      generation_tokens(m.Counter("tandem_scheduler_generation_tokens_total",
                                  "Output tokens streamed to clients.")),
      request_latency(m.Histogram("tandem_scheduler_request_latency_seconds",
                                  "Time from arrival to the end of a request.",
                                  metrics::RequestLatencyBuckets())),
      time_to_first_token(m.Histogram("tandem_scheduler_time_to_first_token_seconds",
                                      "Time from arrival to the first output token.",
                                      metrics::TimeToFirstTokenBuckets())),
      inter_token_latency(m.Histogram("tandem_scheduler_inter_token_latency_seconds",
                                      "Time between successive outputs of a request.",
                                      metrics::InterTokenLatencyBuckets())),
      time_per_output_token(
          m.Histogram("tandem_scheduler_time_per_output_token_seconds",
                      "Per request: (latency - time to first token) / (output tokens - 1).",
                      metrics::InterTokenLatencyBuckets())),
      schedule_duration(m.Histogram("tandem_scheduler_schedule_duration_seconds",
                                    "Time one Schedule() call takes.", ScheduleBuckets())),
      kv_lookup_duration(m.Histogram("tandem_scheduler_kv_lookup_duration_seconds",
                                     "KV-store lookup latency (sent to answered or given up).",
                                     metrics::LatencyBuckets())) {
  static const char* kWaitingReasons[] = {"capacity", "lookup", "load"};
  auto& by_reason = prometheus::BuildGauge()
                        .Name("tandem_scheduler_num_requests_waiting_by_reason")
                        .Help(
                            "Waiting requests by what they wait for: capacity (budgets, "
                            "blocks or queue order), lookup (a KV-store lookup), load (a "
                            "KV-store load).")
                        .Labels(m.labels)
                        .Register(m.r);
  for (int i = 0; i < 3; ++i) {
    num_requests_waiting_by_reason[i] = &by_reason.Add({{"reason", kWaitingReasons[i]}});
  }
}

Engine::Engine(EngineOptions options, prometheus::Registry* registry)
    : options_(std::move(options)), registry_(registry) {
  if (registry_ != nullptr && !options_.served_model_name.empty()) {
    metrics_ = std::make_unique<EngineMetrics>(*registry_, options_.served_model_name);
  }
  stats_.set_async_scheduling(options_.scheduler.async_scheduling);
  connector_ = std::make_unique<WorkerConnector>(
      options_.worker_address,
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
}

void Engine::Post(Event event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void Engine::Submit(std::shared_ptr<GenerateCall> call, sched::RequestSpec spec) {
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

void Engine::Abort(std::string request_id, std::function<void(bool)> done) {
  Event e{.kind = Event::kAbort};
  e.request_id = std::move(request_id);
  e.abort_done = std::move(done);
  Post(std::move(e));
}

ModelInfo Engine::model_info() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_info_;
}

v1::GetStatsResponse Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::SetDraining() {
  draining_.store(true);
  Post(Event{.kind = Event::kWake});
}

void Engine::TrimHeapWhenIdle() {
  const auto now = std::chrono::steady_clock::now();
  if (!calls_.empty()) {
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
  bool flush_stores = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const size_t max_in_flight = options_.scheduler.async_scheduling ? 2 : 1;
      const bool can_schedule = scheduler_ != nullptr && worker_ != nullptr && schedule_wanted_ &&
                                in_flight_.size() < max_in_flight &&
                                scheduler_->HasUnfinishedRequests();
      const bool paced = std::chrono::steady_clock::now() < pace_until_;
      if (!can_schedule || paced) {
        const auto woken = [&] { return stopping_ || !events_.empty(); };
        if (can_schedule) {
          cv_.wait_until(lock, pace_until_, woken);  // see kEmptyStepPace
        } else if (worker_lost_at_) {
          cv_.wait_until(lock, WorkerLossDeadline(), woken);  // the grace's end
        } else if (StoresToCollectWhileIdle()) {
          // finished_sending only comes back with a step: while idle, send
          // an empty one now and then so stores_in_flight settles at zero.
          flush_stores = !cv_.wait_for(lock, kIdleStoreFlushPeriod, woken);
        } else {
          // Bounded, so that an idle loop still beats (last_loop_ns()).
          cv_.wait_for(lock, kIdleHeartbeat, woken);
        }
      }
      if (stopping_) break;
      batch.swap(events_);
    }
    last_loop_ns_.store(MonotonicNanos());
    for (Event& e : batch) Handle(e);
    batch.clear();
    ExpireWorkerLossGrace();
    // Nothing to schedule: the step carries no request; its output brings
    // back the store entries the worker finished since the last step.
    if (flush_stores && StoresToCollectWhileIdle()) SendStep(scheduler_->Schedule());
    flush_stores = false;
    ScheduleAndSend();
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
  for (Event& e : rest) {
    if (e.kind == Event::kSubmit) {
      e.call->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is shutting down"));
      num_calls_open_.fetch_sub(1);
    } else if (e.kind == Event::kAbort) {
      e.abort_done(false);
    }
  }
  for (auto& [id, call] : calls_) {
    call->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is shutting down"));
    num_calls_open_.fetch_sub(1);
  }
  calls_.clear();
  worker_.reset();
  scheduler_.reset();
  kv_connector_.reset();
}

void Engine::Handle(Event& e) {
  switch (e.kind) {
    case Event::kSubmit: {
      pace_until_ = {};  // new work: schedule now
      if (options_.debug_submit_delay_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.debug_submit_delay_ms));
      }
      schedule_wanted_ = true;
      const std::string id = e.spec.request_id;
      // No draining check here: TryAccept() let this call in before the
      // drain began, so it runs to the end.
      grpc::Status rejected;
      // Kept to resume the request if the worker is lost.
      if (options_.worker_loss_grace_s > 0) e.call->spec = e.spec;
      if (worker_lost_at_ && !calls_.contains(id)) {
        // Within the grace after a worker loss: it waits with the others.
        calls_.emplace(id, std::move(e.call));
        return;
      }
      if (scheduler_ == nullptr || worker_ == nullptr) {
        rejected = grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            absl::StrCat("no worker is connected (worker address ", options_.worker_address, ")"));
      } else if (calls_.contains(id)) {
        rejected = grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                absl::StrCat("request id '", id, "' is already running"));
      } else if (absl::Status s = scheduler_->AddRequest(std::move(e.spec), MonotonicNanos());
                 !s.ok()) {
        rejected = grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
      }
      if (!rejected.ok()) {
        TANDEM_LOG(INFO) << "request " << id
                         << " rejected: status=" << rpc::StatusCodeName(rejected) << " "
                         << rejected.error_message();
        e.call->Finish(std::move(rejected));
        num_calls_open_.fetch_sub(1);
        return;
      }
      calls_.emplace(id, std::move(e.call));
      return;
    }
    case Event::kCancel: {
      pace_until_ = {};  // new work: schedule now
      auto it = calls_.find(e.call->request_id);
      if (it == calls_.end() || it->second != e.call) return;
      schedule_wanted_ = true;
      std::optional<sched::RequestOutput> out;
      if (scheduler_ != nullptr) out = scheduler_->AbortRequest(e.call->request_id);
      FinishCall(
          e.call->request_id, e.call, v1::FINISH_REASON_ABORT, out ? &*out : nullptr,
          e.cancel_cause == CancelCause::kDeadline
              ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the client's deadline passed")
              : grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
      return;
    }
    case Event::kAbort: {
      pace_until_ = {};  // new work: schedule now
      auto it = calls_.find(e.request_id);
      if (it == calls_.end()) {
        e.abort_done(false);
        return;
      }
      schedule_wanted_ = true;
      std::shared_ptr<GenerateCall> call = it->second;
      std::optional<sched::RequestOutput> out;
      if (scheduler_ != nullptr) out = scheduler_->AbortRequest(e.request_id);
      FinishCall(e.request_id, call, v1::FINISH_REASON_ABORT, out ? &*out : nullptr,
                 grpc::Status::OK);
      e.abort_done(true);
      return;
    }
    case Event::kOutput:
      if (worker_ == nullptr || e.generation != worker_->generation()) return;
      schedule_wanted_ = true;
      HandleOutput(*e.output);
      return;
    case Event::kBroken:
      max_broken_generation_ = std::max(max_broken_generation_, e.generation);
      if (worker_ == nullptr || e.generation != worker_->generation()) return;
      DropWorker(e.reason);
      return;
    case Event::kConnected: {
      if (e.stream->generation() <= max_broken_generation_) {
        // It broke before we saw it come up.
        e.stream.reset();
        connector_->RequestReconnect();
        return;
      }
      const v1::DescribeResponse& d = e.stream->description();
      if (metrics_ == nullptr && registry_ != nullptr) {
        metrics_ = std::make_unique<EngineMetrics>(*registry_, d.model_name());
      }
      sched::SchedulerConfig config = options_.scheduler;
      config.block_size = d.block_size();
      config.num_gpu_blocks = d.num_kv_blocks();
      config.vocab_size = d.vocab_size();
      config.eos_token_id = d.eos_token_id();
      config.max_model_len = options_.max_model_len > 0
                                 ? std::min(options_.max_model_len, d.max_model_len())
                                 : d.max_model_len();
      config.hash_root = HashRootParams{.model_fingerprint = d.model_fingerprint(),
                                        .kv_layout = d.kv_layout(),
                                        .block_size = d.block_size(),
                                        .dtype = "f32"};
      if (absl::Status s = config.Validate(); !s.ok()) {
        TANDEM_LOG(ERROR) << "worker " << options_.worker_address
                          << " described a configuration the scheduler cannot use: " << s;
        e.stream.reset();
        connector_->RequestReconnect();
        return;
      }
      scheduler_.reset();
      kv_connector_.reset();
      if (!options_.kvstore_target.empty()) {
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
            d.model_fingerprint(), d.kv_layout(), d.block_bytes(), d.block_size());
        if (kvc.ok()) {
          kv_connector_ = std::move(kvc).value();
        } else {
          TANDEM_LOG(ERROR) << "KV-store connector disabled: " << kvc.status();
        }
      }
      scheduler_ = std::make_unique<sched::Scheduler>(config, kv_connector_.get());
      worker_ = std::move(e.stream);
      in_flight_.clear();
      schedule_wanted_ = true;
      num_worker_connects_.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(mu_);
        model_info_.ready = true;
        v1::GetModelInfoResponse& info = model_info_.info;
        info.set_model_name(options_.served_model_name.empty() ? d.model_name()
                                                               : options_.served_model_name);
        info.set_model_fingerprint(d.model_fingerprint());
        info.set_vocab_size(d.vocab_size());
        info.set_max_model_len(config.max_model_len);
        info.set_block_size(d.block_size());
        info.set_num_kv_blocks(d.num_kv_blocks());
        info.set_eos_token_id(d.eos_token_id());
      }
      TANDEM_LOG(INFO) << "serving: " << scheduler_->num_total_blocks() << " usable KV blocks, "
                       << "max_model_len " << config.max_model_len << ", async scheduling "
                       << (config.async_scheduling ? "on" : "off");
      ResumeCalls();
      if (on_serving_changed_) on_serving_changed_(!draining_.load());
      return;
    }
    case Event::kWake:  // a lookup's answer arrived, or the drain began
      pace_until_ = {};
      return;
  }
}

void Engine::HandleOutput(const v1::ModelRunnerOutput& proto) {
  if (in_flight_.empty() || in_flight_.front().step_id != proto.step_id()) {
    DropWorker(absl::StrCat("worker answered step ", proto.step_id(), " but step ",
                            in_flight_.empty() ? 0 : in_flight_.front().step_id, " was expected"));
    return;
  }
  sched::SchedulerOutput scheduled = std::move(in_flight_.front());
  in_flight_.pop_front();
  sched::ModelRunnerOutput output;
  if (absl::Status s = rpc::FromProto(proto, &output); !s.ok()) {
    DropWorker(absl::StrCat("bad ModelRunnerOutput: ", s.message()));
    return;
  }
  const sched::KvConnectorReport& kv_report = output.kv_connector_report;
  load_failed_not_found_ += static_cast<uint64_t>(std::max(0, kv_report.num_load_failed_not_found));
  load_failed_checksum_ += static_cast<uint64_t>(std::max(0, kv_report.num_load_failed_checksum));
  load_failed_rpc_ += static_cast<uint64_t>(std::max(0, kv_report.num_load_failed_rpc));
  if (!output.error.empty()) {
    // The scheduler recomputes the step's requests (and un-publishes the
    // blocks it was to write); the others are unaffected.
    TANDEM_LOG(ERROR) << "worker failed step " << proto.step_id() << ": " << output.error;
  }
  scheduler_->UpdateFromOutputInto(scheduled, output, &outputs_scratch_);
  for (const sched::RequestOutput& out : outputs_scratch_) Deliver(out);
}

void Engine::ScheduleAndSend() {
  const size_t max_in_flight = options_.scheduler.async_scheduling ? 2 : 1;
  if (std::chrono::steady_clock::now() < pace_until_) return;
  while (scheduler_ != nullptr && worker_ != nullptr && schedule_wanted_ &&
         in_flight_.size() < max_in_flight && scheduler_->HasUnfinishedRequests()) {
    const int64_t schedule_start_ns = MonotonicNanos();
    sched::SchedulerOutput step = scheduler_->Schedule();
    if (metrics_ != nullptr) {
      metrics_->schedule_duration.Observe((MonotonicNanos() - schedule_start_ns) * 1e-9);
    }
    max_running_plus_loading_ =
        std::max(max_running_plus_loading_,
                 scheduler_->num_running() + scheduler_->stats().num_waiting_for_load);
    // An empty step still goes out (it may carry finished ids, and outputs
    // are processed in step order), but we wait for news before the next.
    if (step.total_num_scheduled_tokens == 0) {
      schedule_wanted_ = false;
      if (scheduler_->stats().num_waiting_for_load == 0) {
        pace_until_ = std::chrono::steady_clock::now() + kEmptyStepPace;
      }
    }
    if (!SendStep(std::move(step))) return;
  }
}

bool Engine::StoresToCollectWhileIdle() const {
  return kv_connector_ != nullptr && scheduler_ != nullptr && worker_ != nullptr &&
         in_flight_.empty() && !scheduler_->HasUnfinishedRequests() &&
         kv_connector_->stats().stores_in_flight > 0;
}

bool Engine::SendStep(sched::SchedulerOutput step) {
  const int64_t t0 = MonotonicNanos();
  step_proto_.Clear();
  rpc::ToProto(step, &step_proto_);
  const int64_t t1 = MonotonicNanos();
  ++num_steps_sent_;
  step_to_proto_ns_sum_ += t1 - t0;
  step_scheduled_reqs_sum_ += step.num_scheduled_tokens.size();
  step_message_bytes_sum_ += step_proto_.ByteSizeLong();
  if (num_steps_sent_ % kSerializeSampleEvery == 0) {
    const int64_t s0 = MonotonicNanos();
    serialize_scratch_.clear();
    step_proto_.SerializeToString(&serialize_scratch_);
    step_serialize_ns_sum_ += MonotonicNanos() - s0;
    ++step_serialize_samples_;
  }
  if (!worker_->Write(step_proto_)) {
    DropWorker("writing to the worker's Execute stream failed");
    return false;
  }
  in_flight_.push_back(std::move(step));
  max_steps_in_flight_ = std::max(max_steps_in_flight_, static_cast<int32_t>(in_flight_.size()));
  return true;
}

void Engine::Deliver(const sched::RequestOutput& out) {
  auto it = calls_.find(out.request_id);
  if (it == calls_.end()) return;
  if (out.finished.has_value()) {
    std::shared_ptr<GenerateCall> call = it->second;
    FinishCall(out.request_id, call, ToFinishReason(*out.finished), &out,
               *out.finished == sched::RequestState::kFinishedError
                   ? grpc::Status(grpc::StatusCode::INTERNAL, out.error)
                   : grpc::Status::OK);
    return;
  }
  if (out.new_token_ids.empty()) return;
  NoteTokens(*it->second, out.new_token_ids.size());
  if (options_.worker_loss_grace_s > 0) {
    std::vector<int32_t>& streamed = it->second->streamed_token_ids;
    streamed.insert(streamed.end(), out.new_token_ids.begin(), out.new_token_ids.end());
  }
  v1::GenerateResponse msg;
  msg.set_request_id(out.request_id);
  msg.mutable_token_ids()->Assign(out.new_token_ids.begin(), out.new_token_ids.end());
  it->second->Push(std::move(msg));
}

void Engine::FinishCall(const std::string& request_id, std::shared_ptr<GenerateCall> call,
                        v1::FinishReason reason, const sched::RequestOutput* out,
                        grpc::Status status) {
  calls_.erase(request_id);
  num_calls_open_.fetch_sub(1);
  if (out != nullptr && !out->new_token_ids.empty()) NoteTokens(*call, out->new_token_ids.size());
  const double latency_ms = (MonotonicNanos() - call->start_ns) * 1e-6;
  if (metrics_ != nullptr) {
    metrics_->requests_finished.Add({{"reason", ReasonName(reason)}}).Increment();
    metrics_->request_latency.Observe(latency_ms * 1e-3);
    if (out != nullptr) {
      metrics_->prompt_tokens.Increment(out->num_prompt_tokens);
      if (out->num_output_tokens > 1 && call->first_token_ns > 0) {
        metrics_->time_per_output_token.Observe((call->last_token_ns - call->first_token_ns) *
                                                1e-9 / (out->num_output_tokens - 1));
      }
    }
  }
  if (status.ok()) {
    v1::GenerateResponse msg;
    msg.set_request_id(request_id);
    msg.set_finish_reason(reason);
    if (out != nullptr) {
      msg.mutable_token_ids()->Assign(out->new_token_ids.begin(), out->new_token_ids.end());
      v1::Usage* usage = msg.mutable_usage();
      usage->set_prompt_tokens(out->num_prompt_tokens);
      usage->set_output_tokens(out->num_output_tokens);
      usage->set_cached_tokens_local(out->num_cached_tokens_local);
      usage->set_cached_tokens_external(out->num_cached_tokens_external);
    }
    call->Push(std::move(msg));
  }
  call->Finish(status);
  TANDEM_LOG(INFO) << "request " << request_id << " finished: reason=" << ReasonName(reason)
                   << " status=" << rpc::StatusCodeName(status)
                   << " prompt_tokens=" << (out ? out->num_prompt_tokens : call->num_prompt_tokens)
                   << " output_tokens=" << (out ? out->num_output_tokens : 0)
                   << " cached_local=" << (out ? out->num_cached_tokens_local : 0)
                   << " cached_external=" << (out ? out->num_cached_tokens_external : 0)
                   << " latency_ms=" << latency_ms;
}

void Engine::NoteTokens(GenerateCall& call, size_t num_tokens) {
  if (metrics_ == nullptr) return;
  metrics_->generation_tokens.Increment(static_cast<double>(num_tokens));
  const int64_t now = MonotonicNanos();
  if (call.first_token_ns == 0) {
    call.first_token_ns = now;
    metrics_->time_to_first_token.Observe((now - call.start_ns) * 1e-9);
  } else {
    metrics_->inter_token_latency.Observe((now - call.last_token_ns) * 1e-9);
  }
  call.last_token_ns = now;
}

void Engine::DropWorker(const std::string& reason) {
  if (options_.worker_loss_grace_s > 0) {
    // Every live request keeps its call and resumes on the next worker; the
    // KV on the lost one is gone, so all of it recomputes.
    TANDEM_LOG(ERROR) << "lost worker " << options_.worker_address << ": " << reason << "; "
                      << calls_.size() << " requests wait up to " << options_.worker_loss_grace_s
                      << " s for a worker to resume on";
    if (!worker_lost_at_) {
      worker_lost_at_ = std::chrono::steady_clock::now();
      worker_lost_reason_ = reason;
    }
    num_worker_lost_preemptions_ += calls_.size();
  } else {
    TANDEM_LOG(ERROR) << "lost worker " << options_.worker_address << ": " << reason << "; failing "
                      << calls_.size() << " requests";
    const grpc::Status status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("lost the worker (", reason, "); the request was aborted"));
    auto calls = std::move(calls_);
    calls_.clear();
    for (auto& [id, call] : calls) FinishCall(id, call, v1::FINISH_REASON_ERROR, nullptr, status);
  }
  in_flight_.clear();
  scheduler_.reset();
  kv_connector_.reset();
  if (worker_ != nullptr)
    max_broken_generation_ = std::max(max_broken_generation_, worker_->generation());
  worker_.reset();
  if (!worker_lost_at_) {
    std::lock_guard<std::mutex> lock(mu_);
    model_info_.ready = false;
  }  // else: calls validate against the lost worker's model while they may wait
  if (on_serving_changed_) on_serving_changed_(false);
  connector_->RequestReconnect();
}

std::chrono::steady_clock::time_point Engine::WorkerLossDeadline() const {
  return *worker_lost_at_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(options_.worker_loss_grace_s));
}

void Engine::ExpireWorkerLossGrace() {
  if (!worker_lost_at_ || std::chrono::steady_clock::now() < WorkerLossDeadline()) return;
  TANDEM_LOG(ERROR) << "no worker came back within " << options_.worker_loss_grace_s
                    << " s: failing " << calls_.size() << " requests";
  const grpc::Status status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("lost the worker (", worker_lost_reason_, ") and none came back within ",
                   options_.worker_loss_grace_s, " s (--worker-loss-grace-s)"));
  worker_lost_at_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    model_info_.ready = false;
  }
  auto calls = std::move(calls_);
  calls_.clear();
  for (auto& [id, call] : calls) FinishCall(id, call, v1::FINISH_REASON_ERROR, nullptr, status);
}

void Engine::ResumeCalls() {
  if (!worker_lost_at_) return;
  worker_lost_at_.reset();
  std::vector<std::shared_ptr<GenerateCall>> order;
  for (auto& [id, call] : calls_) order.push_back(call);
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a->start_ns < b->start_ns; });
  int resumed = 0;
  for (const std::shared_ptr<GenerateCall>& call : order) {
    sched::RequestSpec spec = call->spec;
    spec.resumed_output_token_ids = call->streamed_token_ids;
    if (absl::Status s = scheduler_->AddRequest(std::move(spec), call->start_ns); !s.ok()) {
      // E.g. the new worker's context is shorter than this request.
      FinishCall(
          call->request_id, call, v1::FINISH_REASON_ERROR, nullptr,
          grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                       absl::StrCat("after the worker was lost, the new worker cannot take it: ",
                                    s.message())));
      continue;
    }
    ++resumed;
  }
  TANDEM_LOG(INFO) << "resumed " << resumed << " requests on the new worker";
}

void Engine::PublishStats() {
  v1::GetStatsResponse s;
  s.set_worker_connected(worker_ != nullptr);
  s.set_draining(draining_.load());
  s.set_async_scheduling(options_.scheduler.async_scheduling);
  s.set_num_active_streams(static_cast<int32_t>(calls_.size()));
  s.set_num_steps_in_flight(static_cast<int32_t>(in_flight_.size()));
  s.set_num_worker_connects(num_worker_connects_.load());
  if (scheduler_ != nullptr) {
    const sched::SchedulerStats& st = scheduler_->stats();
    s.set_num_running(scheduler_->num_running());
    s.set_num_waiting(scheduler_->num_waiting());
    s.set_num_free_blocks(scheduler_->num_free_blocks());
    s.set_num_total_blocks(scheduler_->num_total_blocks());
    s.set_num_preemptions(st.num_preemptions_total);
    s.set_prefix_cache_queries(st.prefix_cache_queries_tokens);
    s.set_prefix_cache_hits(st.prefix_cache_hits_tokens);
    s.set_external_cache_queries(st.external_cache_queries_tokens);
    s.set_external_cache_hits(st.external_cache_hits_tokens);
    s.set_num_steps(st.num_steps);
    s.set_num_requests_finished(st.num_requests_finished);
    s.set_num_waiting_for_lookup(st.num_waiting_for_lookup);
    s.set_num_waiting_for_load(st.num_waiting_for_load);
    s.set_external_loaded_tokens(st.external_loaded_tokens);
  }
  s.set_max_running_plus_loading(max_running_plus_loading_);
  s.set_max_steps_in_flight(max_steps_in_flight_);
  s.set_num_steps_sent(num_steps_sent_);
  s.set_step_scheduled_reqs_sum(step_scheduled_reqs_sum_);
  s.set_step_message_bytes_sum(step_message_bytes_sum_);
  s.set_step_to_proto_seconds_sum(static_cast<double>(step_to_proto_ns_sum_) * 1e-9);
  s.set_step_serialize_samples(step_serialize_samples_);
  s.set_step_serialize_seconds_sum(static_cast<double>(step_serialize_ns_sum_) * 1e-9);
  s.set_external_load_failed_not_found(load_failed_not_found_);
  s.set_external_load_failed_checksum(load_failed_checksum_);
  s.set_external_load_failed_rpc(load_failed_rpc_);
  if (kv_connector_ != nullptr) {
    const kvconnector::KvConnectorSchedulerStats k = kv_connector_->stats();
    s.set_external_lookups(k.lookups);
    s.set_external_lookups_with_hits(k.lookups_with_hits);
    s.set_external_lookups_failed(k.lookups_failed);
    s.set_external_lookup_hit_tokens(k.lookup_hit_tokens);
    s.set_external_lookup_latency_seconds_sum(static_cast<double>(k.lookup_latency_ns_sum) * 1e-9);
    s.set_external_lookup_latency_seconds_max(static_cast<double>(k.lookup_latency_ns_max) * 1e-9);
    s.set_external_invalid_blocks(k.invalid_blocks);
    s.set_external_stored_blocks(k.stored_blocks);
    s.set_num_lookups_pending(k.lookups_pending);
    s.set_num_loads_in_flight(k.loads_in_flight);
    s.set_num_stores_in_flight(k.stores_in_flight);
  }
  if (metrics_ != nullptr) {
    metrics_->num_requests_running.Set(s.num_running());
    metrics_->num_requests_waiting.Set(s.num_waiting());
    metrics_->kv_blocks_free.Set(s.num_free_blocks());
    metrics_->kv_cache_usage.Set(scheduler_ != nullptr ? scheduler_->stats().kv_cache_usage : 0.0);
    metrics_->worker_connected.Set(worker_ != nullptr ? 1 : 0);
    metrics_->num_steps_in_flight.Set(s.num_steps_in_flight());
    metrics_->num_async_loads_in_flight.Set(s.num_waiting_for_load());
    metrics_->num_lookups_pending.Set(s.num_lookups_pending());
    if (scheduler_ != nullptr) {
      const sched::SchedulerStats& st = scheduler_->stats();
      metrics_->num_requests_waiting_by_reason[0]->Set(st.num_waiting_for_capacity);
      metrics_->num_requests_waiting_by_reason[1]->Set(st.num_waiting_for_lookup);
      metrics_->num_requests_waiting_by_reason[2]->Set(st.num_waiting_for_load);
      for (int i = 0; i < sched::kNumPreemptionReasons; ++i) {
        // The scheduler is rebuilt after a worker loss: the engine counts those.
        metrics_->preemptions[i].Set(i == static_cast<int>(sched::PreemptionReason::kWorkerLost)
                                         ? num_worker_lost_preemptions_
                                         : st.num_preemptions_by_reason[i]);
      }
      for (int i = 0; i < sched::kNumAdmissionLimits; ++i) {
        metrics_->admission_blocked_steps[i].Set(st.num_admission_blocked_steps[i]);
      }
      metrics_->requests_admitted.Set(st.num_requests_admitted);
      metrics_->recomputed_tokens.Set(st.num_recomputed_tokens);
      metrics_->prefix_cache_queries.Set(s.prefix_cache_queries());
      metrics_->prefix_cache_hits.Set(s.prefix_cache_hits());
      metrics_->external_cache_queries.Set(s.external_cache_queries());
      metrics_->external_cache_hits.Set(s.external_cache_hits());
      metrics_->steps.Set(s.num_steps());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = std::move(s);
}

}  // namespace tandem::scheduler
