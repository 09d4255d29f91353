#include "tandem/engine/engine_core.h"

#include <algorithm>
#include <future>

#include "absl/strings/str_cat.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"

namespace tandem::engine {
namespace {

FinishReason ReasonOf(sched::RequestState state) {
  switch (state) {
    case sched::RequestState::kFinishedStopped:
      return FinishReason::kStop;
    case sched::RequestState::kFinishedLength:
      return FinishReason::kLength;
    case sched::RequestState::kFinishedAborted:
      return FinishReason::kAbort;
    default:
      return FinishReason::kError;
  }
}

}  // namespace

EngineCore::EngineCore(EngineCoreOptions options) : options_(std::move(options)) {
  counters_.async_scheduling = options_.scheduler.async_scheduling;
}

EngineCore::~EngineCore() {
  scheduler_.reset();
  kv_connector_.reset();
  retiring_.clear();  // waits for the retired connectors' ends
}

void EngineCore::RetireConnector() {
  if (kv_connector_ == nullptr) return;
  std::erase_if(retiring_, [](const std::future<void>& f) {
    return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  });
  // Off the loop: the KV-store client waits for the store to answer the
  // calls it has in flight (up to their deadlines, 5 s for a release), and
  // a store that stalled held the engine loop that long on a worker loss.
  retiring_.push_back(std::async(
      std::launch::async, [connector = std::move(kv_connector_)]() mutable { connector.reset(); }));
}

size_t EngineCore::window() const { return options_.scheduler.async_scheduling ? 2 : 1; }

absl::Status EngineCore::ConnectWorker(const WorkerDescription& d, StepTransport* transport) {
  sched::SchedulerConfig config = options_.scheduler;
  config.block_size = d.block_size;
  config.num_gpu_blocks = d.num_kv_blocks;
  config.vocab_size = d.vocab_size;
  config.eos_token_id = d.eos_token_id;
  config.extra_eos_token_ids = d.extra_eos_token_ids;
  config.structured_outputs = d.structured_outputs;
  // A --max-model-len past the model's context is refused, as vLLM refuses
  // one past the derived max_model_len, rather than quietly lowered.
  if (options_.max_model_len > d.max_model_len) {
    return absl::FailedPreconditionError(
        absl::StrCat("--max-model-len (", options_.max_model_len,
                     ") is larger than the model's context (", d.max_model_len,
                     " tokens, the max_model_len the worker describes for ", d.model_name, ")"));
  }
  config.max_model_len = options_.max_model_len > 0 ? options_.max_model_len : d.max_model_len;
  config.hash_root = HashRootParams{.model_fingerprint = d.model_fingerprint,
                                    .kv_layout = d.kv_layout,
                                    .block_size = d.block_size,
                                    .dtype = "f32"};
  TANDEM_RETURN_IF_ERROR(config.Validate());
  TANDEM_RETURN_IF_ERROR(d.generation.Validate(d.vocab_size));
  // One request of max_model_len must fit the cache (vLLM refuses to start
  // otherwise): block 0 is the null block.
  const int64_t capacity = int64_t{d.num_kv_blocks - 1} * d.block_size;
  if (config.max_model_len > capacity) {
    return absl::FailedPreconditionError(absl::StrCat(
        "max_model_len (", config.max_model_len,
        ") is larger than the maximum number of tokens the worker's KV cache can hold (", capacity,
        ": ", d.num_kv_blocks - 1, " usable blocks of ", d.block_size,
        " tokens); lower the scheduler's --max-model-len to at most ", capacity,
        " or give the worker more KV cache (--kv-cache-bytes or --num-blocks)"));
  }
  scheduler_.reset();
  RetireConnector();
  if (options_.make_kv_connector) kv_connector_ = options_.make_kv_connector(d);
  scheduler_ = std::make_unique<sched::Scheduler>(config, kv_connector_.get());
  transport_ = transport;
  owed_since_.reset();
  last_config_ = config;
  last_num_total_blocks_ = scheduler_->num_total_blocks();
  schedule_wanted_ = true;
  pace_until_ = {};
  ++counters_.num_worker_connects;
  model_info_ = ModelInfo{
      .ready = true,
      .model_name = options_.served_model_name.empty() ? d.model_name : options_.served_model_name,
      .model_fingerprint = d.model_fingerprint,
      .vocab_size = d.vocab_size,
      .max_model_len = config.max_model_len,
      .block_size = d.block_size,
      .num_kv_blocks = d.num_kv_blocks,
      .eos_token_id = d.eos_token_id,
      .extra_eos_token_ids = d.extra_eos_token_ids,
      .generation = d.generation,
      .max_logprobs = options_.scheduler.max_logprobs,
  };
  TANDEM_LOG(INFO) << "serving: " << scheduler_->num_total_blocks() << " usable KV blocks, "
                   << "max_model_len " << config.max_model_len << ", async scheduling "
                   << (config.async_scheduling ? "on" : "off");
  ResumeRequests();
  return absl::OkStatus();
}

void EngineCore::DropWorker(std::string_view reason) {
  if (options_.worker_loss_grace_s > 0) {
    // Every live request is kept and resumes on the next worker; the KV on
    // the lost one is gone, so all of it recomputes.
    TANDEM_LOG(ERROR) << "lost worker " << options_.worker_address << ": " << reason << "; "
                      << requests_.size() << " requests wait up to " << options_.worker_loss_grace_s
                      << " s for a worker to resume on";
    if (!worker_lost_at_) {
      worker_lost_at_ = Clock::now();
      worker_lost_reason_ = std::string(reason);
    }
    counters_.num_worker_lost_preemptions += requests_.size();
  } else {
    TANDEM_LOG(ERROR) << "lost worker " << options_.worker_address << ": " << reason << "; failing "
                      << requests_.size() << " requests";
    FailAll(absl::UnavailableError(
        absl::StrCat("lost the worker (", std::string(reason), "); the request was aborted")));
  }
  // Its counters go on in the next scheduler's (Prometheus counters never
  // go down): what it counted is kept.
  if (scheduler_ != nullptr) AddCounters(scheduler_->stats(), &lost_scheduler_counters_);
  scheduler_.reset();
  RetireConnector();
  transport_ = nullptr;
  owed_since_.reset();
  // While requests wait out the grace they validate against the lost
  // worker's model.
  if (!worker_lost_at_) model_info_.ready = false;
  if (options_.on_worker_lost) options_.on_worker_lost(std::string(reason));
}

void EngineCore::AddRequest(sched::RequestSpec spec, std::shared_ptr<RequestSink> sink,
                            int64_t arrival_ns) {
  pace_until_ = {};  // new work: schedule now
  schedule_wanted_ = true;
  const std::string id = spec.request_id;
  absl::Status status;
  if (requests_.contains(id)) {
    status = absl::AlreadyExistsError(absl::StrCat("request id '", id, "' is already running"));
  } else if (scheduler_ != nullptr) {
    sched::RequestSpec kept;
    if (options_.worker_loss_grace_s > 0) kept = spec;
    status = scheduler_->AddRequest(std::move(spec), arrival_ns);
    if (status.ok()) {
      requests_.emplace(id, Entry{.sink = std::move(sink),
                                  .arrival_ns = arrival_ns,
                                  .spec = std::move(kept),
                                  .started = true});
      return;
    }
  } else if (worker_lost_at_) {
    // Within the grace after a worker loss: it waits with the others,
    // checked against the lost worker's model now and the next one's then,
    // and against the waiting limit with the others that arrived since.
    status = sched::Scheduler::ValidateRequest(spec, *last_config_, last_num_total_blocks_);
    const auto arrived = std::count_if(requests_.begin(), requests_.end(),
                                       [](const auto& e) { return !e.second.started; });
    if (status.ok() && arrived >= last_config_->max_waiting_requests) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("waiting queue is full (", last_config_->max_waiting_requests,
                       " requests arrived while the scheduler waits for its worker to come back)"));
    }
    if (status.ok()) {
      requests_.emplace(
          id, Entry{.sink = std::move(sink), .arrival_ns = arrival_ns, .spec = std::move(spec)});
      return;
    }
  } else {
    status = absl::UnavailableError(
        absl::StrCat("no worker is connected (worker address ", options_.worker_address, ")"));
  }
  sink->OnRejected(status);
}

bool EngineCore::Abort(const std::string& request_id, const RequestSink* sink,
                       const absl::Status& status, FinishReason reason) {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || (sink != nullptr && it->second.sink.get() != sink)) return false;
  pace_until_ = {};
  schedule_wanted_ = true;
  std::optional<sched::RequestOutput> out;
  if (scheduler_ != nullptr) out = scheduler_->AbortRequest(request_id);
  Finish(request_id, reason, out ? &*out : nullptr, status);
  return true;
}

void EngineCore::FailAll(const absl::Status& status) {
  auto requests = std::move(requests_);
  requests_.clear();
  for (auto& [id, entry] : requests) entry.sink->OnFinished(FinishReason::kError, nullptr, status);
}

void EngineCore::ProcessOutput(const sched::ModelRunnerOutput& output) {
  if (scheduler_ == nullptr) return;  // from a worker already dropped
  if (output.step_id == 0 || output.step_id != scheduler_->oldest_step_in_flight()) {
    DropWorker(absl::StrCat("worker answered step ", output.step_id, " but step ",
                            scheduler_->oldest_step_in_flight(), " was expected"));
    return;
  }
  schedule_wanted_ = true;
  const sched::KvConnectorReport& kv_report = output.kv_connector_report;
  counters_.load_failed_not_found +=
      static_cast<uint64_t>(std::max(0, kv_report.num_load_failed_not_found));
  counters_.load_failed_checksum +=
      static_cast<uint64_t>(std::max(0, kv_report.num_load_failed_checksum));
  counters_.load_failed_rpc += static_cast<uint64_t>(std::max(0, kv_report.num_load_failed_rpc));
  if (!output.error.empty()) {
    // The scheduler recomputes the step's requests (and un-publishes the
    // blocks it was to write); the others are unaffected.
    TANDEM_LOG(ERROR) << "worker failed step " << output.step_id << ": " << output.error;
  }
  scheduler_->UpdateOldestStepInto(output, &outputs_scratch_);
  if (scheduler_->num_steps_in_flight() > 0) {
    owed_since_ = Clock::now();
  } else {
    owed_since_.reset();
  }
  for (const sched::RequestOutput& out : outputs_scratch_) Deliver(out);
}

bool EngineCore::CanSchedule() const {
  return scheduler_ != nullptr && transport_ != nullptr && schedule_wanted_ &&
         static_cast<size_t>(scheduler_->num_steps_in_flight()) < window() &&
         scheduler_->HasUnfinishedRequests();
}

void EngineCore::Step() {
  if (Clock::now() < pace_until_) return;
  while (CanSchedule()) {
    const int64_t schedule_start_ns = MonotonicNanos();
    sched::SchedulerOutput step = scheduler_->Schedule();
    if (options_.on_schedule_duration) {
      options_.on_schedule_duration((MonotonicNanos() - schedule_start_ns) * 1e-9);
    }
    counters_.max_running_plus_loading =
        std::max(counters_.max_running_plus_loading,
                 scheduler_->num_running() + scheduler_->stats().num_waiting_for_load);
    // An empty step still goes out (it may carry finished ids, and outputs
    // are processed in step order), but we wait for news before the next.
    if (step.total_num_scheduled_tokens == 0) {
      schedule_wanted_ = false;
      if (scheduler_->stats().num_waiting_for_load == 0)
        pace_until_ = Clock::now() + kEmptyStepPace;
    }
    if (!SendStep(std::move(step))) return;
  }
}

void EngineCore::Wake() {
  pace_until_ = {};
  // Also while the empty step that waits for this news is in flight: with
  // async scheduling the window has room for the step the news unblocked.
  schedule_wanted_ = true;
}

bool EngineCore::StoresToCollectWhileIdle() const {
  return kv_connector_ != nullptr && scheduler_ != nullptr && transport_ != nullptr &&
         scheduler_->num_steps_in_flight() == 0 && !scheduler_->HasUnfinishedRequests() &&
         kv_connector_->stats().stores_in_flight > 0;
}

std::optional<EngineCore::Clock::time_point> EngineCore::NextDeadline() const {
  std::optional<Clock::time_point> out;
  auto earliest = [&out](Clock::time_point t) { out = out ? std::min(*out, t) : t; };
  if (CanSchedule()) earliest(pace_until_);  // {} when not paced: at once
  if (const auto deadline = worker_loss_deadline()) earliest(*deadline);
  if (store_collect_at_) earliest(*store_collect_at_);
  if (const auto deadline = step_deadline()) earliest(*deadline);
  return out;
}

std::optional<EngineCore::Clock::time_point> EngineCore::step_deadline() const {
  if (!owed_since_ || transport_ == nullptr || options_.step_timeout_s <= 0) return std::nullopt;
  return *owed_since_ + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(options_.step_timeout_s));
}

void EngineCore::Tick(Clock::time_point now) {
  if (const auto deadline = step_deadline(); deadline && now >= *deadline) {
    DropWorker(absl::StrCat("step ", scheduler_->oldest_step_in_flight(),
                            " has not returned and the worker answered nothing for ",
                            options_.step_timeout_s, " s (--step-timeout-s): it is wedged"));
  }
  ExpireWorkerLossGrace(now);
  if (!StoresToCollectWhileIdle()) {
    store_collect_at_.reset();
  } else if (!store_collect_at_) {
    store_collect_at_ = now + kIdleStoreCollectPeriod;
  } else if (now >= *store_collect_at_) {
    // Nothing to schedule: the step carries no request; its output brings
    // back the store entries the worker finished since the last step.
    store_collect_at_.reset();
    SendStep(scheduler_->Schedule());
  }
}

bool EngineCore::SendStep(sched::SchedulerOutput step) {
  ++counters_.num_steps_sent;
  counters_.step_scheduled_reqs_sum += step.num_scheduled_tokens.size();
  for (const sched::NewRequestData& r : step.scheduled_new_reqs) {
    if (auto it = requests_.find(r.request_id); it != requests_.end())
      it->second.sink->OnScheduled();
  }
  if (options_.on_step_sent) options_.on_step_sent(step.total_num_scheduled_tokens);
  if (!transport_->Send(step)) {
    DropWorker("writing to the worker's Execute stream failed");
    return false;
  }
  if (!owed_since_) owed_since_ = Clock::now();
  counters_.max_steps_in_flight =
      std::max(counters_.max_steps_in_flight, scheduler_->num_steps_in_flight());
  return true;
}

void EngineCore::Deliver(const sched::RequestOutput& out) {
  auto it = requests_.find(out.request_id);
  if (it == requests_.end()) return;
  if (out.finished.has_value()) {
    Finish(out.request_id, ReasonOf(*out.finished), &out,
           *out.finished == sched::RequestState::kFinishedError ? absl::InternalError(out.error)
                                                                : absl::OkStatus());
    return;
  }
  if (out.new_token_ids.empty()) return;
  if (options_.worker_loss_grace_s > 0) {
    std::vector<int32_t>& streamed = it->second.streamed_token_ids;
    streamed.insert(streamed.end(), out.new_token_ids.begin(), out.new_token_ids.end());
  }
  it->second.sink->OnTokens(out);
}

void EngineCore::Finish(const std::string& request_id, FinishReason reason,
                        const sched::RequestOutput* out, const absl::Status& status) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  std::shared_ptr<RequestSink> sink = std::move(it->second.sink);
  requests_.erase(it);
  sink->OnFinished(reason, out, status);
}

std::optional<EngineCore::Clock::time_point> EngineCore::worker_loss_deadline() const {
  if (!worker_lost_at_) return std::nullopt;
  return *worker_lost_at_ + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(options_.worker_loss_grace_s));
}

void EngineCore::ExpireWorkerLossGrace(Clock::time_point now) {
  const std::optional<Clock::time_point> deadline = worker_loss_deadline();
  if (!deadline || now < *deadline) return;
  TANDEM_LOG(ERROR) << "no worker came back within " << options_.worker_loss_grace_s
                    << " s: failing " << requests_.size() << " requests";
  worker_lost_at_.reset();
  model_info_.ready = false;
  FailAll(absl::UnavailableError(
      absl::StrCat("lost the worker (", worker_lost_reason_, ") and none came back within ",
                   options_.worker_loss_grace_s, " s (--worker-loss-grace-s)")));
}

void EngineCore::ResumeRequests() {
  if (!worker_lost_at_) return;
  worker_lost_at_.reset();
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [id, entry] : requests_) order.emplace_back(entry.arrival_ns, id);
  std::sort(order.begin(), order.end());
  int resumed = 0;
  for (const auto& [arrival_ns, id] : order) {
    Entry& entry = requests_.at(id);
    sched::RequestSpec spec = entry.spec;
    spec.resumed_output_token_ids = entry.streamed_token_ids;
    // Its prompt logprobs went out with its first tokens.
    if (!spec.resumed_output_token_ids.empty()) spec.sampling.prompt_logprobs = -1;
    // Accepted before: the waiting limit is for new work.
    if (absl::Status s = scheduler_->AddRequest(std::move(spec), arrival_ns, /*resumed=*/true);
        !s.ok()) {
      // E.g. the new worker's context is shorter than this request.
      const std::string message =
          entry.started ? absl::StrCat("after the worker was lost, the new worker cannot take it: ",
                                       s.message())
                        : std::string(s.message());
      Finish(id, FinishReason::kError, nullptr, absl::Status(s.code(), message));
      continue;
    }
    entry.started = true;
    ++resumed;
  }
  TANDEM_LOG(INFO) << "resumed " << resumed << " requests on the new worker";
}

void EngineCore::AddCounters(const sched::SchedulerStats& from, sched::SchedulerStats* to) {
  to->num_steps += from.num_steps;
  to->num_preemptions_total += from.num_preemptions_total;
  for (int i = 0; i < sched::kNumPreemptionReasons; ++i) {
    to->num_preemptions_by_reason[i] += from.num_preemptions_by_reason[i];
  }
  to->num_recomputed_tokens += from.num_recomputed_tokens;
  to->prefix_cache_queries_tokens += from.prefix_cache_queries_tokens;
  to->prefix_cache_hits_tokens += from.prefix_cache_hits_tokens;
  to->external_cache_queries_tokens += from.external_cache_queries_tokens;
  to->external_cache_hits_tokens += from.external_cache_hits_tokens;
  to->external_loaded_tokens += from.external_loaded_tokens;
  to->num_requests_finished += from.num_requests_finished;
  to->num_requests_admitted += from.num_requests_admitted;
  for (int i = 0; i < sched::kNumAdmissionLimits; ++i) {
    to->num_admission_blocked_steps[i] += from.num_admission_blocked_steps[i];
  }
}

EngineStats EngineCore::stats() const {
  EngineStats s = counters_;
  s.worker_connected = transport_ != nullptr;
  s.num_requests = static_cast<int32_t>(requests_.size());
  if (scheduler_ != nullptr) {
    s.num_steps_in_flight = scheduler_->num_steps_in_flight();
    s.has_scheduler = true;
    s.num_running = scheduler_->num_running();
    s.num_waiting = scheduler_->num_waiting();
    s.num_free_blocks = scheduler_->num_free_blocks();
    s.num_total_blocks = scheduler_->num_total_blocks();
    s.scheduler = scheduler_->stats();
  } else if (worker_lost_at_) {
    // Within the grace every kept request waits for the next worker.
    s.num_waiting = static_cast<int32_t>(requests_.size());
  }
  AddCounters(lost_scheduler_counters_, &s.scheduler);
  if (kv_connector_ != nullptr) {
    s.has_kv_connector = true;
    s.kv_connector = kv_connector_->stats();
  }
  return s;
}

}  // namespace tandem::engine
