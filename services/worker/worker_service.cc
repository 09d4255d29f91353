#include "worker_service.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <span>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
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
  if (max_model_len < 0) {
    return absl::InvalidArgumentError("--max-model-len must be >= 0 (0: the model's context)");
  }
  if (num_blocks < 0) return absl::InvalidArgumentError("--num-blocks must be >= 0");
  if (kv_cache_bytes < 0) {
    return absl::InvalidArgumentError("--kv-cache-bytes must be >= 0 (0: sized automatically)");
  }
  if (!(gpu_memory_utilization >= 0 && gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization=", gpu_memory_utilization, " must be in (0, 1]"));
  }
  if (gpu_memory_utilization > 0 && backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory-utilization sizes the KV cache of --backend=cuda; with --backend=", backend,
        " give --kv-cache-bytes or --num-blocks"));
  }
  if (gpu_memory_utilization > 0 && (num_blocks > 0 || kv_cache_bytes > 0)) {
    return absl::InvalidArgumentError(
        "--gpu-memory-utilization and --num-blocks/--kv-cache-bytes both size the KV cache: "
        "give one");
  }
  if (num_threads < 1) return absl::InvalidArgumentError("--threads must be >= 1");
  if (grammar_mask_cache_mib < 0) {
    return absl::InvalidArgumentError("--grammar-mask-cache-mib must be >= 0 (0: none kept)");
  }
  if (dtype != "auto") {
    const absl::StatusOr<model::DType> kv_dtype = model::ResolveDType(dtype, "", backend == "cuda");
    if (!kv_dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dtype=", dtype, ": ", kv_dtype.status().message()));
    }
  }
  if (device < 0) return absl::InvalidArgumentError("--device must be >= 0");
  if (gpus != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus=", gpus,
                     ": a worker drives exactly one GPU (no tensor parallelism yet); run one "
                     "worker per GPU and pick it with --device"));
  }
  if (cuda_async_launch && backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda-async-launch launches the cuda backend's steps; --backend=", backend,
                     " has none to launch"));
  }
  if (!kvstore_target.empty() && backend == "sim") {
    return absl::InvalidArgumentError(
        "--kvstore needs --backend=cpu or cuda (sim has no KV bytes)");
  }
  if (kvstore_transfer_deadline_ms <= 0) {
    return absl::InvalidArgumentError("--kvstore-transfer-deadline-ms must be > 0");
  }
  if (kvstore_load_threads < 1 || kvstore_load_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--kvstore-load-threads must be in [1, 64], got ",
                                                   kvstore_load_threads));
  }
  if (kvstore_empty_step_wait_ms < 0 || kvstore_empty_step_wait_ms > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kvstore-empty-step-wait-ms must be in [0, 1000], got ", kvstore_empty_step_wait_ms));
  }
  if (!kvstore_target.empty()) {
    TANDEM_RETURN_IF_ERROR(kvconnector::KvStoreConnectorOptions::ValidateBulkLoad(
        kvstore_bulk_port, "--kvstore-bulk-port"));
  }
  if (debug_step_delay_us < 0) {
    return absl::InvalidArgumentError("--debug-step-delay-us must be >= 0");
  }
  if (debug_send_delay_us < 0) {
    return absl::InvalidArgumentError("--debug-send-delay-us must be >= 0");
  }
  if (sim_step_us < 0 || sim_token_us < 0) {
    return absl::InvalidArgumentError("--sim-step-us and --sim-token-us must be >= 0");
  }
  TANDEM_RETURN_IF_ERROR(DebugFailSteps().status());
  return DebugRejectSteps().status();
}

namespace {
int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : 0;
}

absl::StatusOr<std::vector<uint64_t>> ParseStepIds(const char* flag, const std::string& value) {
  std::vector<uint64_t> steps;
  for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    uint64_t id = 0;
    if (!absl::SimpleAtoi(part, &id) || id == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " must be a comma-separated list of step ids >= 1, got '", value, "'"));
    }
    steps.push_back(id);
  }
  return steps;
}
}  // namespace

absl::StatusOr<std::vector<uint64_t>> WorkerOptions::DebugFailSteps() const {
  return ParseStepIds("debug-fail-steps", debug_fail_steps);
}

absl::StatusOr<std::vector<uint64_t>> WorkerOptions::DebugRejectSteps() const {
  return ParseStepIds("debug-reject-steps", debug_reject_steps);
}

WorkerService::WorkerService(WorkerOptions options, prometheus::Registry* registry)
    : options_(std::move(options)) {
  if (registry != nullptr) {
    prometheus::Registry& r = *registry;
    auto& grammar_masks = prometheus::BuildCounter()
                              .Name("tandem_worker_grammar_masks_total")
                              .Help(
                                  "Structured outputs' token masks by source: cache (kept "
                                  "from a request that reached the same grammar state), walk "
                                  "(the vocabulary stepped through the grammar)")
                              .Register(r);
    metrics_.reset(new Metrics{
        metrics::AddCounter(r, "tandem_worker_steps_total", "Steps executed."),
        metrics::AddCounter(r, "tandem_worker_step_errors_total", "Steps that failed."),
        metrics::AddCounter(r, "tandem_worker_scheduled_tokens_total",
                            "Tokens run through the model (prefill and decode)."),
        metrics::AddCounter(r, "tandem_worker_sampled_tokens_total", "Tokens sampled."),
        metrics::AddHistogram(
            r, "tandem_worker_step_duration_seconds",
            "Time from a step's launch (its loads, forward pass and sampling) to its output; "
            "its batch diff and inputs are prepared before, while the step before runs.",
            {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
        metrics::AddGauge(r, "tandem_worker_num_requests_active",
                          "Requests the worker holds batch state for."),
        metrics::AddCounter(r, "tandem_worker_device_busy_seconds_total",
                            "Time the device ran steps, on its own clock (CUDA events; the cpu "
                            "and sim backends: the monotonic clock around the forward pass)."),
        metrics::AddCounter(r, "tandem_worker_device_idle_seconds_total",
                            "Device time from one step's end to the next one's start: the "
                            "host's work between steps, or no work at all."),
        metrics::AddCounter(r, "tandem_worker_steps_overlapped_total",
                            "Steps whose batch diff and inputs were prepared while the step "
                            "before still ran on the device (async scheduling)."),
        grammar_masks,
        metrics::MirroredCounter(&grammar_masks.Add({{"source", "cache"}})),
        metrics::MirroredCounter(&grammar_masks.Add({{"source", "walk"}})),
        metrics::AddCounter(r, "tandem_worker_grammar_mask_seconds_total",
                            "Host time making structured outputs' token masks, on the step's "
                            "path before its launch."),
        metrics::AddGauge(r, "tandem_worker_grammar_mask_cache_bytes",
                          "Memory the token masks kept by grammar state take "
                          "(--grammar-mask-cache-mib bounds it)."),
    });
    kv_metrics_ = std::make_unique<WorkerKvMetrics>(r);
  }
  loop_ = std::thread([this] { Loop(); });
  send_loop_ = std::thread([this] { SendLoop(); });
}

WorkerService::~WorkerService() {
  Stop();
  // Before mu_ and cv_ go: a backend may still run a finished step's
  // on_done, which takes them, until it is destroyed (the sim's notifier
  // joins; the cuda runner synchronizes its stream).
  executor_.reset();
  kv_connector_.reset();
  backend_.reset();
  runner_.reset();
}

void WorkerService::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    send_stopping_ = true;  // the outputs already sent still go out first
  }
  send_cv_.notify_all();
  if (send_loop_.joinable()) send_loop_.join();
}

void WorkerService::Send(Stream* stream, sched::ModelRunnerOutput out) {
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    sends_.emplace_back(stream, std::move(out));
  }
  send_cv_.notify_all();
}

void WorkerService::FlushSends() {
  std::unique_lock<std::mutex> lock(send_mu_);
  send_cv_.wait(lock, [&] { return sends_.empty() && !sending_; });
}

void WorkerService::SendLoop() {
  v1::ModelRunnerOutput proto;  // reused: its repeated fields keep their room
  for (;;) {
    std::pair<Stream*, sched::ModelRunnerOutput> send;
    {
      std::unique_lock<std::mutex> lock(send_mu_);
      send_cv_.wait(lock, [&] { return send_stopping_ || !sends_.empty(); });
      if (sends_.empty()) return;  // stopping, everything written
      send = std::move(sends_.front());
      sends_.pop_front();
      sending_ = true;
    }
    if (options_.debug_send_delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(options_.debug_send_delay_us));
    }
    proto.Clear();
    rpc::ToProto(send.second, &proto);
    // A failed write means the stream is gone; its reader sees that too and
    // posts the end marker, which waits for this loop (FlushSends).
    send.first->Write(proto);
    {
      std::lock_guard<std::mutex> lock(send_mu_);
      sending_ = false;
    }
    send_cv_.notify_all();
  }
}

absl::Status WorkerService::Load() {
  TANDEM_RETURN_IF_ERROR(options_.Validate());
  // The runner reads each tensor from the mapped checkpoint in its own dtype
  // (a Hugging Face directory is never expanded into fp32 host weights) and
  // keeps what it needs; the mapping is dropped once it has.
  auto model = model::Model::Load(options_.model_path,
                                  {.host_weights = false,
                                   .disable_sliding_window = options_.disable_sliding_window,
                                   .max_model_len = options_.max_model_len});
  if (!model.ok()) return Annotate(model.status(), absl::StrCat("loading ", options_.model_path));
  model_ = std::move(model).value();
  const model::ModelConfig& config = model_->config();
  TANDEM_ASSIGN_OR_RETURN(
      dtype_, model::ResolveDType(options_.dtype, config.torch_dtype, options_.backend == "cuda"));
  if (options_.dtype == "auto") {
    TANDEM_LOG(INFO) << "--dtype auto: " << model::DTypeName(dtype_) << " (the checkpoint's "
                     << (config.torch_dtype.empty() ? "dtype is not named" : config.torch_dtype)
                     << ", backend " << options_.backend << ")";
  }
  // The KV cache: --num-blocks, else --kv-cache-bytes, else on cuda what
  // --gpu-memory-utilization leaves after the weights (the runner measures
  // it: num_blocks 0), else a share of the machine's memory.
  num_blocks_ = options_.num_blocks;
  double gpu_memory_utilization = 0;
  std::string cache_source = "--num-blocks";
  if (num_blocks_ == 0 && options_.kv_cache_bytes == 0 && options_.backend == "cuda") {
    constexpr double kVllmDefault = 0.9;
    gpu_memory_utilization =
        options_.gpu_memory_utilization > 0 ? options_.gpu_memory_utilization : kVllmDefault;
    cache_source = absl::StrCat("--gpu-memory-utilization ", gpu_memory_utilization);
  } else if (num_blocks_ == 0) {
    cache_source =
        options_.kv_cache_bytes > 0 ? "--kv-cache-bytes" : "the default: min(4 GiB, memory / 4)";
    const int64_t block_bytes = model::KvBlockBytes(config, options_.block_size, dtype_);
    const int64_t bytes = options_.kv_cache_bytes > 0
                              ? options_.kv_cache_bytes
                              : model::DefaultCpuKvCacheBytes(PhysicalMemoryBytes());
    num_blocks_ = static_cast<int32_t>(
        std::min<int64_t>(bytes / block_bytes, std::numeric_limits<int32_t>::max()));
    if (num_blocks_ < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-cache-bytes=", bytes, options_.kv_cache_bytes > 0 ? "" : " (the default)",
          " holds no KV block of ", block_bytes, " bytes"));
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
                                  .cuda_device = options_.device,
                                  .async_launch = options_.cuda_async_launch,
                                  .cuda_graphs = !options_.enforce_eager,
                                  .gpu_memory_utilization = gpu_memory_utilization});
    if (!runner.ok()) return Annotate(runner.status(), "creating the model runner");
    runner_ = std::move(runner).value();
    num_blocks_ = runner_->num_blocks();
    model_->ReleaseCheckpoint();
    backend_ = std::make_unique<RunnerBackend>(runner_.get());
  } else {
    backend_ = std::make_unique<SimBackend>(config.vocab_size, config.EosTokenIds(),
                                            options_.sim_step_us, options_.sim_token_us);
  }
  if (!options_.kvstore_target.empty()) {
    model::ModelRunner* runner = runner_.get();
    auto kvc = kvconnector::KvStoreConnectorWorker::Create(
        kvconnector::KvStoreConnectorOptions{
            .target = options_.kvstore_target,
            .transfer_deadline_ms = options_.kvstore_transfer_deadline_ms,
            .load_threads = options_.kvstore_load_threads,
            // Pinned staging only pays off when the cache is on the GPU.
            .use_cuda_host_alloc = options_.backend == "cuda",
            .on_load =
                [metrics = kv_metrics_.get()](const kvconnector::KvLoadTiming& t) {
                  if (metrics != nullptr) metrics->OnLoad(t);
                },
            .bulk_load = options_.kvstore_bulk_port},
        model_->fingerprint(), KvLayout(config),
        model::KvBlockBytes(config, options_.block_size, dtype_),
        [runner](std::span<const int32_t> blocks, std::span<const std::span<std::byte>> out) {
          return runner->CopyBlocksToHostAsync(blocks, out);
        },
        [runner](std::span<const int32_t> blocks, std::span<const std::span<const std::byte>> in)
            -> absl::StatusOr<kvconnector::KvStoreConnectorWorker::CopyIn> {
          TANDEM_ASSIGN_OR_RETURN(model::ModelRunner::BlockCopyIn copy,
                                  runner->CopyBlocksFromHostAsync(blocks, in));
          return kvconnector::KvStoreConnectorWorker::CopyIn{.done = std::move(copy.done),
                                                             .wait = std::move(copy.wait)};
        });
    if (!kvc.ok()) return Annotate(kvc.status(), "creating the KV-store connector");
    kv_connector_ = std::move(kvc).value();
    TANDEM_LOG(INFO) << "KV-store connector to " << options_.kvstore_target;
  }
  debug_reject_steps_ = *options_.DebugRejectSteps();
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<const grammar::TokenVocabulary> vocabulary,
                          StructuredOutputsVocabulary(config));
  structured_outputs_ = vocabulary != nullptr;
  executor_ = std::make_unique<StepExecutor>(
      backend_.get(), kv_connector_.get(),
      StepExecutorOptions{
          .eos_token_ids = config.EosTokenIds(),
          .vocabulary = std::move(vocabulary),
          .grammar_mask_cache_bytes = static_cast<size_t>(options_.grammar_mask_cache_mib) << 20,
          .debug_fail_steps = *options_.DebugFailSteps(),
          .debug_step_delay_us = options_.debug_step_delay_us,
          .empty_step_load_wait = std::chrono::milliseconds(options_.kvstore_empty_step_wait_ms)});
  TANDEM_LOG(INFO) << "loaded " << model_->name() << " (" << config.num_layers << " layers, vocab "
                   << config.vocab_size << ") backend=" << options_.backend
                   << " kv_blocks=" << num_blocks_ << " block_size=" << options_.block_size << " ("
                   << cache_source << ", "
                   << num_blocks_ * model::KvBlockBytes(config, options_.block_size, dtype_) /
                          (1 << 20)
                   << " MiB, " << int64_t{num_blocks_} * options_.block_size << " tokens)";
  loaded_.store(true);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>>
WorkerService::StructuredOutputsVocabulary(const model::ModelConfig& config) const {
  const bool named = !options_.tokenizer_path.empty();
  std::string path = options_.tokenizer_path;
  if (!named && std::filesystem::is_directory(options_.model_path)) path = options_.model_path;
  if (path.empty()) {
    TANDEM_LOG(INFO) << "structured outputs: off (a llama2.c checkpoint has no tokenizer; "
                     << "--tokenizer names its tokenizer.bin)";
    return nullptr;
  }
  auto vocabulary = LoadVocabulary(path, config.vocab_size);
  if (!vocabulary.ok()) {
    if (named) return Annotate(vocabulary.status(), "--tokenizer");
    TANDEM_LOG(WARNING) << "structured outputs: off (" << vocabulary.status().message()
                        << "; --tokenizer names the model's tokenizer)";
    return nullptr;
  }
  TANDEM_LOG(INFO) << "structured outputs: on (the vocabulary of " << path << ", "
                   << (*vocabulary)->order().size() << " ids with text)";
  return vocabulary;
}

std::string WorkerService::KvLayout(const model::ModelConfig& config) const {
  return absl::StrCat(model::KvLayoutString(config, options_.block_size, dtype_), "/",
                      options_.backend);
}

grpc::Status WorkerService::Describe(grpc::ServerContext*, const v1::DescribeRequest*,
                                     v1::DescribeResponse* response) {
  if (!loaded_.load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "model is still loading");
  const model::ModelConfig& config = model_->config();
  response->set_model_name(model_->name());
  response->set_model_fingerprint(model_->fingerprint());
  response->set_vocab_size(config.vocab_size);
  response->set_max_model_len(options_.max_model_len > 0 ? options_.max_model_len
                                                         : config.max_seq_len);
  response->set_num_layers(config.num_layers);
  response->set_num_kv_heads(config.num_kv_heads);
  response->set_head_size(config.head_size);
  response->set_block_size(options_.block_size);
  response->set_num_kv_blocks(num_blocks_);
  response->set_backend(options_.backend);
  // EosTokenIds() starts with eos_token_id and repeats none.
  const std::vector<int32_t> eos = config.EosTokenIds();
  response->set_eos_token_id(eos.front());
  response->mutable_extra_eos_token_ids()->Assign(eos.begin() + 1, eos.end());
  rpc::ToProto(config.generation, response->mutable_generation());
  response->set_num_active_requests(num_active_requests_.load());
  response->set_block_bytes(model::KvBlockBytes(config, options_.block_size, dtype_));
  response->set_kv_layout(KvLayout(config));
  response->set_num_steps(num_steps_.load());
  response->set_structured_outputs(structured_outputs_);
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
  v1::SchedulerOutput proto;  // reused
  for (;;) {
    if (!stream->Read(&proto)) break;
    // Read into the step's struct here, while the loop runs the step before.
    Work work{.step = std::make_unique<sched::SchedulerOutput>(),
              .step_id = proto.step_id(),
              .last_processed_step_id = proto.last_processed_step_id(),
              .scheduled_tokens = proto.total_num_scheduled_tokens(),
              .stream = stream};
    work.read = rpc::FromProto(proto, work.step.get());
    if (std::find(debug_reject_steps_.begin(), debug_reject_steps_.end(), proto.step_id()) !=
        debug_reject_steps_.end()) {
      work.read = absl::InvalidArgumentError(absl::StrCat(
          "step ", proto.step_id(), " could not be read (TEST-ONLY --debug-reject-steps)"));
    }
    // A step with nothing to compute may be waiting for a load: one that
    // computes or begins loads goes first (an empty one behind it would
    // only wait too).
    work.urgent =
        proto.total_num_scheduled_tokens() != 0 || proto.kv_connector_metadata().loads_size() != 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Under mu_, ordered with Loop's update.
      const bool urgent = work.urgent;
      queue_.push_back(std::move(work));
      if (urgent) ++num_urgent_queued_;
      if (kv_connector_ != nullptr) kv_connector_->SetStepQueued(num_urgent_queued_ > 0);
    }
    cv_.notify_all();
  }
  // The loop thread drops the whole batch state: a scheduler that reconnects
  // starts from scratch.
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({.stream = stream, .done = done, .urgent = true});
    ++num_urgent_queued_;
    if (kv_connector_ != nullptr) kv_connector_->SetStepQueued(true);
  }
  cv_.notify_all();
  finished.wait();
  TANDEM_LOG(INFO) << "scheduler detached (" << context->peer() << ")";
  stream_attached_.store(false);
  return grpc::Status::OK;
}

void WorkerService::Loop() {
  for (;;) {
    Work work;
    bool have_work = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Waiting for work is not being stuck; waiting for a launched step is
      // (a hung kernel never calls back), since its launch.
      busy_since_ns_.store(launched_ != nullptr ? launched_start_ns_ : 0);
      cv_.wait(lock, [&] {
        return stopping_ || !queue_.empty() || (launched_ != nullptr && launched_done_);
      });
      if (busy_since_ns_.load() == 0) busy_since_ns_.store(MonotonicNanos());
      if (!queue_.empty()) {
        work = std::move(queue_.front());
        queue_.pop_front();
        have_work = true;
        // Under mu_, as Execute's: a step that arrives later sets it again.
        // One taken while a launched step is unfinished still waits behind
        // it: that step, if it waits for loads, stops waiting.
        if (work.urgent) --num_urgent_queued_;
        if (kv_connector_ != nullptr) {
          kv_connector_->SetStepQueued(num_urgent_queued_ > 0 ||
                                       (work.urgent && launched_ != nullptr));
        }
      }
    }
    if (!have_work) {
      // The launched step is done (or the service stops): its output goes
      // out now rather than when the next step arrives.
      if (launched_ != nullptr) {
        FinishLaunched();
        continue;
      }
      return;  // stopping
    }
    if (work.step == nullptr) {
      FinishLaunched();
      FlushSends();  // the stream goes once Execute returns
      executor_->Reset("scheduler-detached");
      num_active_requests_.store(0);
      work.done->set_value();
      continue;
    }
    if (!work.read.ok()) {
      FinishLaunched();
      const int64_t start_ns = MonotonicNanos();
      sched::ModelRunnerOutput out = executor_->Reject(work.step_id, work.read);
      CountStep(work, out, start_ns);
      Send(work.stream, std::move(out));
      continue;
    }
    if (!options_.overlap_steps) FinishLaunched();
    // While the launched step runs on the device.
    if (metrics_ != nullptr && launched_ != nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!launched_done_) metrics_->steps_overlapped.Increment();
    }
    std::unique_ptr<StepExecutor::Step> step = executor_->Prepare(std::move(*work.step));
    // The step before ends here. Where this one's launch returns at once,
    // the step before's output goes out after it, so that writing it and
    // the metrics are not between the two steps on the device; where the
    // launch runs the whole step (the cpu backend), before it.
    std::optional<Finished> before = FinishLaunchedStep();
    if (before.has_value() && !executor_->LaunchReturnsAtOnce(*step)) {
      SendFinished(*std::move(before));
      before.reset();
    }
    uint64_t launch = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      launched_done_ = false;
      launch = ++launch_count_;
      if (kv_connector_ != nullptr) kv_connector_->SetStepQueued(num_urgent_queued_ > 0);
    }
    // A scheduler that runs ahead (async scheduling: this step was built
    // before the output of the step before it) sends the next step while
    // this one runs: the loop waits for either, and prepares the next step
    // if it comes first. One that waits for each output gets it at once.
    const bool ahead = work.step_id > work.last_processed_step_id + 1;
    launched_ = std::move(step);
    launched_work_ = std::move(work);
    launched_start_ns_ = MonotonicNanos();
    executor_->Launch(*launched_, [this, launch] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (launch != launch_count_) return;  // a launch finished already
        launched_done_ = true;
      }
      cv_.notify_all();
    });
    if (before.has_value()) SendFinished(*std::move(before));
    if (!ahead) FinishLaunched();
  }
}

double WorkerService::busy_s() const {
  const int64_t since = busy_since_ns_.load();
  return since == 0 ? 0 : (MonotonicNanos() - since) * 1e-9;
}

std::optional<WorkerService::Finished> WorkerService::FinishLaunchedStep() {
  if (launched_ == nullptr) return std::nullopt;
  Finished f{.out = executor_->Finish(std::move(launched_)),
             .work = std::move(launched_work_),
             .start_ns = launched_start_ns_};
  return f;
}

void WorkerService::SendFinished(Finished f) {
  CountStep(f.work, f.out, f.start_ns);
  Send(f.work.stream, std::move(f.out));
}

void WorkerService::FinishLaunched() {
  if (std::optional<Finished> f = FinishLaunchedStep(); f.has_value()) {
    SendFinished(*std::move(f));
  }
}

void WorkerService::CountStep(const Work& work, const sched::ModelRunnerOutput& out,
                              int64_t start_ns) {
  if (metrics_ != nullptr) {
    metrics_->steps.Increment();
    metrics_->step_duration.Observe((MonotonicNanos() - start_ns) * 1e-9);
    metrics_->scheduled_tokens.Increment(static_cast<double>(work.scheduled_tokens));
    if (out.error.empty()) {
      int64_t sampled = 0;
      for (const sched::SampledTokens& t : out.sampled) sampled += std::ssize(t.token_ids);
      metrics_->sampled_tokens.Increment(static_cast<double>(sampled));
    } else {
      metrics_->step_errors.Increment();
    }
    metrics_->active_requests.Set(executor_->num_requests());
    const model::DeviceTime device = backend_->device_time();
    metrics_->device_busy.Increment(device.busy_s - device_seen_.busy_s);
    metrics_->device_idle.Increment(device.idle_between_s - device_seen_.idle_between_s);
    device_seen_ = device;
    if (kv_connector_ != nullptr) kv_metrics_->Mirror(kv_connector_->stats());
    const StructuredOutputs::Stats masks = executor_->structured_stats();
    metrics_->masks_kept.Set(static_cast<uint64_t>(masks.masks_kept));
    metrics_->masks_walked.Set(static_cast<uint64_t>(masks.masks_walked));
    metrics_->mask_seconds.Increment(masks.mask_seconds - mask_seconds_seen_);
    mask_seconds_seen_ = masks.mask_seconds;
    metrics_->mask_cache_bytes.Set(static_cast<double>(masks.cache_bytes));
  }
  num_active_requests_.store(executor_->num_requests());
  num_steps_.fetch_add(1);
}

}  // namespace tandem::worker
