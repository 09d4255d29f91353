#include "worker_service.h"

#include <chrono>
#include <span>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/model/sampler.h"
#include "tandem/rpc/convert.h"
#include "tandem/rpc/status.h"

namespace tandem::worker {

absl::Status WorkerOptions::Validate() const {
  if (model_path.empty()) return absl::InvalidArgumentError("--model is empty");
  if (backend != "cpu" && backend != "cuda" && backend != "sim") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be cpu, cuda or sim, got '", backend, "'"));
  }
  if (block_size <= 0) return absl::InvalidArgumentError("--block-size must be > 0");
  if (num_blocks < 0) return absl::InvalidArgumentError("--num-blocks must be >= 0");
  if (num_blocks == 0 && kv_cache_bytes <= 0) {
    return absl::InvalidArgumentError("--kv-cache-bytes must be > 0 when --num-blocks is 0");
  }
  if (num_threads < 1) return absl::InvalidArgumentError("--threads must be >= 1");
  const absl::StatusOr<model::DType> kv_dtype = model::ParseDType(dtype);
  if (!kv_dtype.ok()) return Annotate(kv_dtype.status(), "--dtype");
  if (*kv_dtype != model::DType::kFloat32 && backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype=", dtype,
                                                   " needs --backend=cuda (the ", backend,
                                                   " backend is float32)"));
  }
  if (device < 0) return absl::InvalidArgumentError("--device must be >= 0");
  if (gpus != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus=", gpus,
                     ": a worker drives exactly one GPU (no tensor parallelism yet); run one "
                     "worker per GPU and pick it with --device"));
  }
  if (!kvstore_target.empty() && backend == "sim") {
    return absl::InvalidArgumentError(
        "--kvstore needs --backend=cpu or cuda (sim has no KV bytes)");
  }
  if (kvstore_transfer_deadline_ms <= 0) {
    return absl::InvalidArgumentError("--kvstore-transfer-deadline-ms must be > 0");
  }
  if (debug_step_delay_us < 0) {
    return absl::InvalidArgumentError("--debug-step-delay-us must be >= 0");
  }
  if (sim_step_us < 0 || sim_token_us < 0) {
    return absl::InvalidArgumentError("--sim-step-us and --sim-token-us must be >= 0");
  }
  return DebugFailSteps().status();
}

absl::StatusOr<std::vector<uint64_t>> WorkerOptions::DebugFailSteps() const {
  std::vector<uint64_t> steps;
  for (absl::string_view part : absl::StrSplit(debug_fail_steps, ',', absl::SkipEmpty())) {
    uint64_t id = 0;
    if (!absl::SimpleAtoi(part, &id) || id == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--debug-fail-steps must be a comma-separated list of step ids >= 1, got '",
                       debug_fail_steps, "'"));
    }
    steps.push_back(id);
  }
  return steps;
}

WorkerService::WorkerService(WorkerOptions options, prometheus::Registry* registry)
    : options_(std::move(options)) {
  if (registry != nullptr) {
    prometheus::Registry& r = *registry;
    metrics_.reset(new Metrics{
        metrics::AddCounter(r, "tandem_worker_steps_total", "Steps executed."),
        metrics::AddCounter(r, "tandem_worker_step_errors_total", "Steps that failed."),
        metrics::AddCounter(r, "tandem_worker_scheduled_tokens_total",
                            "Tokens run through the model (prefill and decode)."),
        metrics::AddCounter(r, "tandem_worker_sampled_tokens_total", "Tokens sampled."),
        metrics::AddHistogram(
            r, "tandem_worker_step_duration_seconds", "Time to apply, run and sample one step.",
            {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
        metrics::AddGauge(r, "tandem_worker_num_requests_active",
                          "Requests the worker holds batch state for."),
    });
  }
  loop_ = std::thread([this] { Loop(); });
}

WorkerService::~WorkerService() { Stop(); }

void WorkerService::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

absl::Status WorkerService::Load() {
  TANDEM_RETURN_IF_ERROR(options_.Validate());
  debug_fail_steps_ = *options_.DebugFailSteps();
  auto model = model::Model::Load(options_.model_path);
  if (!model.ok()) return Annotate(model.status(), absl::StrCat("loading ", options_.model_path));
  model_ = std::move(model).value();
  const model::ModelConfig& config = model_->config();
  dtype_ = *model::ParseDType(options_.dtype);  // Validate checked it
  num_blocks_ = options_.num_blocks;
  if (num_blocks_ == 0) {
    const int64_t block_bytes = model::KvBlockBytes(config, options_.block_size, dtype_);
    num_blocks_ = static_cast<int32_t>(std::min<int64_t>(options_.kv_cache_bytes / block_bytes,
                                                         std::numeric_limits<int32_t>::max()));
    if (num_blocks_ < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-cache-bytes=", options_.kv_cache_bytes,
                                                     " holds no KV block of ", block_bytes,
                                                     " bytes"));
    }
  }
  model::Backend backend =
      options_.backend == "cuda" ? model::Backend::kCuda : model::Backend::kCpu;
  if (options_.backend != "sim") {
    auto runner = model::ModelRunner::Create(
        model_.get(),
        model::KvCacheOptions{
            .block_size = options_.block_size, .num_blocks = num_blocks_, .dtype = dtype_},
        backend,
        model::ModelRunnerOptions{.num_threads = options_.num_threads,
                                  .cuda_device = options_.device});
    if (!runner.ok()) return Annotate(runner.status(), "creating the model runner");
    runner_ = std::move(runner).value();
  }
  if (!options_.kvstore_target.empty()) {
    model::ModelRunner* runner = runner_.get();
    auto kvc = kvconnector::KvStoreConnectorWorker::Create(
        kvconnector::KvStoreConnectorOptions{
            .target = options_.kvstore_target,
            .transfer_deadline_ms = options_.kvstore_transfer_deadline_ms,
            // Pinned staging only pays off when the cache is on the GPU.
            .use_cuda_host_alloc = options_.backend == "cuda",
            .bulk_load = options_.kvstore_bulk_load},
        model_->fingerprint(), model::KvLayoutString(config, options_.block_size, dtype_),
        model::KvBlockBytes(config, options_.block_size, dtype_),
        [runner](int32_t block, std::span<std::byte> out) {
          return runner->CopyBlockToHost(block, out);
        },
        [runner](int32_t block, std::span<const std::byte> in) {
          return runner->CopyBlockFromHost(block, in);
        });
    if (!kvc.ok()) return Annotate(kvc.status(), "creating the KV-store connector");
    kv_connector_ = std::move(kvc).value();
    TANDEM_LOG(INFO) << "KV-store connector to " << options_.kvstore_target;
  }
  TANDEM_LOG(INFO) << "loaded " << model_->name() << " (" << config.num_layers << " layers, vocab "
                   << config.vocab_size << ") backend=" << options_.backend
                   << " kv_blocks=" << num_blocks_ << " block_size=" << options_.block_size;
  loaded_.store(true);
  return absl::OkStatus();
}

grpc::Status WorkerService::Describe(grpc::ServerContext*, const v1::DescribeRequest*,
                                     v1::DescribeResponse* response) {
  if (!loaded_.load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "model is still loading");
  const model::ModelConfig& config = model_->config();
  response->set_model_name(model_->name());
  response->set_model_fingerprint(model_->fingerprint());
  response->set_vocab_size(config.vocab_size);
  response->set_max_model_len(config.max_seq_len);
  response->set_num_layers(config.num_layers);
  response->set_num_kv_heads(config.num_kv_heads);
  response->set_head_size(config.head_size);
  response->set_block_size(options_.block_size);
  response->set_num_kv_blocks(num_blocks_);
  response->set_backend(options_.backend);
  response->set_eos_token_id(config.eos_token_id);
  response->set_num_active_requests(num_active_requests_.load());
  response->set_block_bytes(model::KvBlockBytes(config, options_.block_size, dtype_));
  response->set_kv_layout(model::KvLayoutString(config, options_.block_size, dtype_));
  response->set_num_steps(num_steps_.load());
  return grpc::Status::OK;
}

grpc::Status WorkerService::Execute(grpc::ServerContext* context, Stream* stream) {
  if (!loaded_.load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "model is still loading");
  bool expected = false;
  if (!stream_attached_.compare_exchange_strong(expected, true)) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "another scheduler stream is attached to this worker");
  }
  TANDEM_LOG(INFO) << "scheduler attached from " << context->peer();
  for (;;) {
    auto step = std::make_unique<v1::SchedulerOutput>();
    if (!stream->Read(step.get())) break;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(step), stream, nullptr});
    }
    cv_.notify_all();
  }
  // The loop thread drops the whole batch state: a scheduler that reconnects
  // starts from scratch.
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({nullptr, stream, done});
  }
  cv_.notify_all();
  finished.wait();
  TANDEM_LOG(INFO) << "scheduler detached (" << context->peer() << ")";
  stream_attached_.store(false);
  return grpc::Status::OK;
}

void WorkerService::Loop() {
  v1::ModelRunnerOutput out_proto;  // reused: its repeated fields keep their room
  for (;;) {
    Work work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    if (work.step == nullptr) {
      while (!seqs_.empty()) DropSeq(seqs_.begin(), "scheduler-detached");
      last_failed_step_id_ = 0;  // step ids restart with the next stream
      num_active_requests_.store(0);
      work.done->set_value();
      continue;
    }
    sched::ModelRunnerOutput out;
    const int64_t start_ns = MonotonicNanos();
    absl::Status s = ExecuteStep(*work.step, &out);
    if (metrics_ != nullptr) {
      metrics_->steps.Increment();
      metrics_->step_duration.Observe((MonotonicNanos() - start_ns) * 1e-9);
      metrics_->scheduled_tokens.Increment(work.step->total_num_scheduled_tokens());
      if (s.ok()) {
        int64_t sampled = 0;
        for (const sched::SampledTokens& t : out.sampled) sampled += std::ssize(t.token_ids);
        metrics_->sampled_tokens.Increment(static_cast<double>(sampled));
      } else {
        metrics_->step_errors.Increment();
      }
      metrics_->active_requests.Set(static_cast<double>(seqs_.size()));
    }
    if (!s.ok()) {
      TANDEM_LOG(ERROR) << "step " << work.step->step_id() << " failed: " << s;
      if (work.step->last_processed_step_id() >= last_failed_step_id_) {
        last_failed_step_id_ = work.step->step_id();  // failed by itself
      }
      // Loads already done are still reported: the scheduler must learn
      // that those requests' blocks arrived (or failed), or they would wait
      // for them forever.
      sched::KvConnectorReport report = std::move(out.kv_connector_report);
      out = sched::ModelRunnerOutput{.step_id = work.step->step_id(),
                                     .kv_connector_report = std::move(report),
                                     .error = std::string(s.message())};
    }
    num_active_requests_.store(static_cast<int32_t>(seqs_.size()));
    num_steps_.fetch_add(1);
    // A failed write means the stream is gone; the reader sees it too and
    // posts the end marker.
    out_proto.Clear();
    rpc::ToProto(out, &out_proto);
    work.stream->Write(out_proto);
  }
}

absl::Status WorkerService::ExecuteStep(const v1::SchedulerOutput& proto,
                                        sched::ModelRunnerOutput* out) {
  sched::SchedulerOutput step;
  TANDEM_RETURN_IF_ERROR(rpc::FromProto(proto, &step));
  for (const std::string& id : step.finished_req_ids) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) DropSeq(it, "finished");
  }
  // KV-store loads of this step, before its forward pass (and after every
  // earlier step's: steps run in order on this thread). Reported in this
  // step's output (even if the step then fails), failed blocks as
  // invalid_block_ids. Loads need no batch state, so they come first.
  sched::KvConnectorReport& report = out->kv_connector_report;
  if (kv_connector_ != nullptr) {
    const kvconnector::KvLoadFailures failed =
        kv_connector_->LoadBlocks(step.kv_connector_metadata, &report);
    report.num_load_failed_not_found = failed.not_found;
    report.num_load_failed_checksum = failed.checksum;
    report.num_load_failed_rpc = failed.rpc;
  }

  // A preempted request keeps its entry (its prompt length fixes the sampling
  // positions) but loses its blocks; it comes back resumed_from_preemption.
  for (const std::string& id : step.preempted_req_ids) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) {
      it->second.block_table.clear();
      it->second.num_computed_tokens = 0;
      ++it->second.num_preemptions;
    }
  }

  std::vector<SeqState*> batch;
  std::vector<const std::string*> ids;
  batch.reserve(step.num_scheduled_tokens.size());
  const int64_t now_ns = MonotonicNanos();
  for (sched::NewRequestData& r : step.scheduled_new_reqs) {
    SeqState& s = seqs_[r.request_id];
    if (s.first_step_ns == 0) s.first_step_ns = now_ns;
    s.unconfirmed_sample_steps.clear();
    s.num_prompt_tokens = static_cast<int32_t>(r.prompt_token_ids.size());
    s.token_ids = std::move(r.prompt_token_ids);
    s.token_ids.insert(s.token_ids.end(), r.output_token_ids.begin(), r.output_token_ids.end());
    s.sampling = std::move(r.sampling);
    s.block_table = std::move(r.block_ids);
    s.num_computed_tokens = r.num_computed_tokens;
    batch.push_back(&s);
    ids.push_back(&r.request_id);
  }
  for (sched::CachedRequestData& r : step.scheduled_cached_reqs) {
    auto it = seqs_.find(r.request_id);
    if (it == seqs_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step.step_id, ": cached request ", r.request_id, " is unknown to this worker"));
    }
    SeqState& s = it->second;
    if (r.resumed_from_preemption) {
      // Tokens this worker sampled that the scheduler dropped are forgotten.
      s.token_ids = std::move(r.all_token_ids);
      s.block_table = std::move(r.new_block_ids);
      s.unconfirmed_sample_steps.clear();
    } else {
      s.block_table.insert(s.block_table.end(), r.new_block_ids.begin(), r.new_block_ids.end());
    }
    while (!s.unconfirmed_sample_steps.empty() &&
           s.unconfirmed_sample_steps.front() <= step.last_processed_step_id) {
      s.unconfirmed_sample_steps.pop_front();
    }
    if (static_cast<int32_t>(s.unconfirmed_sample_steps.size()) != r.num_output_placeholders) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step.step_id, ": request ", r.request_id, " has ", r.num_output_placeholders,
          " output placeholders on the scheduler, but this worker sampled ",
          s.unconfirmed_sample_steps.size(), " tokens for it after step ",
          step.last_processed_step_id, ", the last step the scheduler had processed"));
    }
    s.num_computed_tokens = r.num_computed_tokens;
    batch.push_back(&s);
    ids.push_back(&r.request_id);
  }

  if (step.last_processed_step_id < last_failed_step_id_) {
    return absl::AbortedError(absl::StrCat("step ", step.step_id, " was built on step ",
                                           last_failed_step_id_, ", which failed; it is not run"));
  }
  if (std::find(debug_fail_steps_.begin(), debug_fail_steps_.end(), step.step_id) !=
      debug_fail_steps_.end()) {
    return absl::InternalError(
        absl::StrCat("step ", step.step_id, " failed (TEST-ONLY --debug-fail-steps)"));
  }
  if (options_.debug_step_delay_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(options_.debug_step_delay_us));
  }

  std::vector<model::SequenceInput> inputs;
  inputs.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    SeqState& s = *batch[i];
    const int32_t n = step.num_scheduled_tokens[i];
    // In async mode the last n tokens may be ones this worker sampled itself
    // (the scheduler's placeholders); they are already in token_ids.
    if (n <= 0 || s.num_computed_tokens + n > static_cast<int32_t>(s.token_ids.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step.step_id, ": request ", *ids[i], " schedules ", n, " tokens from position ",
          s.num_computed_tokens, " but the worker knows ", s.token_ids.size(), " tokens"));
    }
    inputs.push_back({
        .token_ids = std::span<const int32_t>(s.token_ids).subspan(s.num_computed_tokens, n),
        .start_pos = s.num_computed_tokens,
        .block_table = s.block_table,
    });
  }

  // A prefill chunk that does not reach the last known token samples nothing.
  std::vector<model::SampleRequest> sample(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqState& s = *batch[i];
    const int32_t known = static_cast<int32_t>(s.token_ids.size());
    if (s.num_computed_tokens + step.num_scheduled_tokens[i] < known) continue;
    sample[i] = {.params = &s.sampling, .output_position = known - s.num_prompt_tokens};
  }
  std::vector<int32_t> tokens;
  if (!inputs.empty()) {
    if (runner_ != nullptr) {
      TANDEM_RETURN_IF_ERROR(runner_->ForwardSample(inputs, sample, &tokens));
    } else {
      std::vector<float> logits;
      TANDEM_RETURN_IF_ERROR(RunSim(batch, step.num_scheduled_tokens, &logits));
      model::SampleRows(logits, model_->config().vocab_size, sample, &tokens);
    }
  }
  // Stores read their blocks now, before the next step can overwrite them.
  if (kv_connector_ != nullptr) {
    kv_connector_->SnapshotStores(step.kv_connector_metadata);
    report.finished_sending.clear();
    report.failed_sending.clear();
    kv_connector_->TakeFinishedSending(&report);
  }

  out->step_id = step.step_id;
  out->sampled.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    SeqState& s = *batch[i];
    s.num_computed_tokens += step.num_scheduled_tokens[i];
    sched::SampledTokens& sampled = out->sampled.emplace_back();
    sampled.request_id = *ids[i];
    if (sample[i].params == nullptr) continue;
    const int32_t token = tokens[i];
    s.token_ids.push_back(token);
    s.unconfirmed_sample_steps.push_back(step.step_id);
    ++s.num_sampled;
    sampled.token_ids.push_back(token);
  }
  for (SeqState* s : batch) ++s->num_steps;
  return absl::OkStatus();
}

void WorkerService::DropSeq(std::unordered_map<std::string, SeqState>::iterator it,
                            const char* why) {
  const SeqState& s = it->second;
  TANDEM_LOG(INFO) << "request " << it->first << " dropped: reason=" << why
                   << " prompt_tokens=" << s.num_prompt_tokens
                   << " computed_tokens=" << s.num_computed_tokens
                   << " sampled_tokens=" << s.num_sampled << " steps=" << s.num_steps
                   << " preemptions=" << s.num_preemptions << " held_ms="
                   << (s.first_step_ns > 0 ? (MonotonicNanos() - s.first_step_ns) * 1e-6 : 0.0);
  seqs_.erase(it);
}

// Deterministic fake logits: one token gets all the mass, chosen from the
// sequence's last token and length, never EOS.
absl::Status WorkerService::RunSim(const std::vector<SeqState*>& seqs,
                                   const std::vector<int32_t>& num_tokens,
                                   std::vector<float>* logits) {
  const int32_t vocab = model_->config().vocab_size;
  int64_t total = 0;
  for (int32_t n : num_tokens) total += n;
  std::this_thread::sleep_for(
      std::chrono::microseconds(options_.sim_step_us + options_.sim_token_us * total));
  logits->assign(seqs.size() * static_cast<size_t>(vocab), 0.0f);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqState& s = *seqs[i];
    const int32_t end = s.num_computed_tokens + num_tokens[i];
    const uint64_t last = static_cast<uint64_t>(s.token_ids[end - 1]);
    int32_t token =
        static_cast<int32_t>((last * 2654435761ull + static_cast<uint64_t>(end) * 40503ull) %
                             static_cast<uint64_t>(vocab));
    if (token == model_->config().eos_token_id) token = (token + 1) % vocab;
    (*logits)[i * vocab + token] = 10.0f;
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker
