// The worker service: owns the model and the paged KV cache, and executes the
// scheduler's steps (DESIGN §2, §4, §6).
//
// Threads: gRPC handler threads only read the Execute stream and enqueue the
// steps; one loop thread owns the ModelRunner and the per-request batch state
// and executes the steps in order, writing each ModelRunnerOutput back. When
// the scheduler runs ahead (async scheduling), the loop prepares a step that
// arrives while the one before runs on the device (StepExecutor's
// "Overlap"), and launches it once that one is finished.
// Because steps run strictly in order on one thread, a block the scheduler
// freed after step N and reused in step N+1 is never written by both at once
// (DESIGN §5 "Ordering": the worker orders its work after the previous step).
//
// The step itself (batch state, placeholder check, KV loads and stores,
// forward pass, sampling, failed steps) is worker::StepExecutor in
// libs/worker; this adapter converts the protos, keeps one scheduler stream
// attached at a time (its end drops all batch state) and exports metrics.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/metrics/metrics.h"
#include "tandem/model/model.h"
#include "tandem/model/model_runner.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tandem/worker/step_executor.h"
#include "worker_kv_metrics.h"

namespace tandem::worker {

struct WorkerOptions {
  // llama2.c .bin file or Hugging Face directory.
  std::string model_path;
  // The model's tokenizer, for structured outputs (the vocabulary's bytes):
  // a tokenizer.bin, tokenizer.model, tokenizer.json or a directory holding
  // one. "" = the model's directory when it holds one; a llama2.c checkpoint
  // (a file) has none, and the worker then serves no json_schema.
  std::string tokenizer_path;
  // Structured outputs' token masks kept by grammar state, in MiB (0: none
  // kept, each mask walks the vocabulary).
  int32_t grammar_mask_cache_mib = 256;
  // "cpu", "cuda" (error when no device), or "sim" (no math: deterministic
  // tokens after sim_step_us per step; for scheduler scale tests).
  std::string backend = "cpu";
  // Tokens per KV block.
  int32_t block_size = 16;
  // Number of KV blocks; 0 = derive from kv_cache_bytes.
  int32_t num_blocks = 0;
  // Memory budget of the KV cache when num_blocks is 0. 0 (default): on
  // cuda, what gpu_memory_utilization leaves once the weights are loaded;
  // on cpu and sim, model::DefaultCpuKvCacheBytes of the machine's memory.
  int64_t kv_cache_bytes = 0;
  // vLLM's --gpu-memory-utilization: the fraction of the device's memory
  // this worker may use (model::KvBlocksForMemoryUtilization), in (0, 1];
  // 0 = vLLM's default, 0.9. Sizes the cuda backend's cache only, so a
  // value given with another backend, --num-blocks or --kv-cache-bytes is
  // refused rather than ignored.
  double gpu_memory_utilization = 0;
  // Simulated step time of the sim backend, per step plus per token.
  int32_t sim_step_us = 5000;
  int32_t sim_token_us = 0;
  // CPU threads of the model runner (results are identical for any value).
  int32_t num_threads = 1;
  // auto | float32 | bfloat16 (model::ResolveDType): the KV cache's and, on
  // the cuda backend, the weights' dtype. auto: bfloat16 for a bfloat16
  // checkpoint on cuda, else float32. bfloat16 needs --backend=cuda;
  // float16 is refused.
  std::string dtype = "auto";
  // CUDA device ordinal of the cuda backend.
  int32_t device = 0;
  // vLLM's --enforce-eager: no CUDA graphs for decode steps (cuda bfloat16
  // captures them per batch-size bucket; ModelRunnerOptions::cuda_graphs).
  bool enforce_eager = false;
  // vLLM's --disable-sliding-window (model::LoadOptions).
  bool disable_sliding_window = false;
  // vLLM's --max-model-len (model::LoadOptions): the context the worker
  // serves and describes; 0 = the model's.
  int32_t max_model_len = 0;
  // GPUs per worker. Only 1: there is no tensor parallelism yet.
  int32_t gpus = 1;
  // host:port of tandem-kvstore; empty = no KV-store connector. Needs the
  // cpu or cuda backend (the sim backend has no KV bytes).
  std::string kvstore_target;
  // Deadline of one step's KV-store Load and of one Store, milliseconds.
  int64_t kvstore_transfer_deadline_ms = 5000;
  // Steps' KV-store loads read at once (KvStoreConnectorOptions::load_threads).
  int32_t kvstore_load_threads = 4;
  // How long a step with nothing to compute waits for a KV-store load to
  // arrive before it answers (StepExecutorOptions::empty_step_load_wait;
  // a step that computes or begins loads ends the wait), milliseconds, at
  // most 1000. A request that arrives meanwhile may wait this long for its
  // first step: the scheduler's window is full of empty steps until then.
  int32_t kvstore_empty_step_wait_ms = 10;
  // auto | off | host:port: how KV-store loads travel (KvStoreConnectorOptions::bulk_load).
  std::string kvstore_bulk_port = "auto";
  // Prepares each step while the step before runs on the device (StepExecutor's
  // "Overlap"): the next step's batch diff, inputs and sampling plan are built
  // between the launch of a step and its end. false: each step is prepared
  // once the one before has ended (to measure what the overlap gains).
  bool overlap_steps = true;
  // The cuda backend's steps return once enqueued (ModelRunnerOptions::
  // async_launch), so that the overlap above runs beside the GPU's work.
  // Off until it has run on a GPU.
  bool cuda_async_launch = false;
  // TEST-ONLY: comma-separated step ids (of each attached scheduler stream)
  // that fail after their loads and batch diff, before the forward pass
  // (their KV is not written). Empty: none.
  std::string debug_fail_steps;
  // TEST-ONLY: every step sleeps this long before its forward pass, so a
  // test can act while streams are surely mid-way (any backend). 0: off.
  int32_t debug_step_delay_us = 0;
  // TEST-ONLY: the output writer sleeps this long before it writes each
  // step's output, so a test can end a stream while outputs are still
  // queued. 0: off.
  int32_t debug_send_delay_us = 0;

  // TEST-ONLY: comma-separated step ids that the worker answers as if it
  // could not read them (StepExecutor::Reject). Empty: none.
  std::string debug_reject_steps;

  // debug_fail_steps and debug_reject_steps parsed (Validate checks them).
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> DebugFailSteps() const;
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> DebugRejectSteps() const;

  [[nodiscard]] absl::Status Validate() const;
};

class WorkerService final : public v1::Worker::Service {
 public:
  // `registry` receives the worker's metrics; may be null.
  explicit WorkerService(WorkerOptions options, prometheus::Registry* registry = nullptr);
  ~WorkerService() override;

  // Loads the weights and allocates the KV cache. Describe and Execute answer
  // UNAVAILABLE until this has succeeded.
  [[nodiscard]] absl::Status Load();

  grpc::Status Describe(grpc::ServerContext* context, const v1::DescribeRequest* request,
                        v1::DescribeResponse* response) override;
  grpc::Status Execute(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ModelRunnerOutput, v1::SchedulerOutput>* stream) override;

  // Stops the loop thread (after the current step).
  void Stop();

  // A scheduler's Execute stream is open.
  bool stream_attached() const { return stream_attached_.load(); }
  // How long the loop has been at one piece of work (a step: its launch,
  // or the wait for its results), in seconds; 0 while it waits for work.
  double busy_s() const;

 private:
  using Stream = grpc::ServerReaderWriter<v1::ModelRunnerOutput, v1::SchedulerOutput>;
  struct Work {
    // The step as the stream's thread read it (while the step before ran),
    // or why it could not be read; null: the stream ended.
    std::unique_ptr<sched::SchedulerOutput> step;
    absl::Status read;
    uint64_t step_id = 0;
    uint64_t last_processed_step_id = 0;
    int64_t scheduled_tokens = 0;
    Stream* stream = nullptr;
    std::shared_ptr<std::promise<void>> done;  // set for the end marker
    // Computes, begins loads, or ends the stream: a step waiting for loads
    // (StepExecutorOptions::empty_step_load_wait) stops waiting for it.
    bool urgent = false;
  };

  void Loop();
  // A finished step's output, with what its metrics need.
  struct Finished {
    sched::ModelRunnerOutput out;
    Work work;
    int64_t start_ns = 0;
  };
  // The launched step's end (none launched: nullopt).
  std::optional<Finished> FinishLaunchedStep();
  // Its metrics and its output (Send).
  void SendFinished(Finished f);
  // Both at once.
  void FinishLaunched();
  // Records one step's metrics.
  void CountStep(const Work& work, const sched::ModelRunnerOutput& out, int64_t start_ns);
  // The outputs go out on a thread of their own, in order, so the next step
  // begins once a step's forward pass and sampling are done, not once its
  // output is serialized and written (DESIGN §8's GPU idle between steps).
  void Send(Stream* stream, sched::ModelRunnerOutput out);
  // Returns once every output sent so far is written (or its stream failed).
  void FlushSends();
  void SendLoop();
  // The KV layout this worker describes and stores under: the cache's
  // layout, then the backend that computes the values. CPU and CUDA K/V
  // agree only within rounding, so their blocks must never cross through a
  // shared KV-store (DESIGN §5: outputs equal a run without the store).
  std::string KvLayout(const model::ModelConfig& config) const;
  // The vocabulary structured outputs read (--tokenizer, else the model's
  // directory); null (logged) when there is none; an error only for a
  // --tokenizer that cannot be read or does not fit the model.
  absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> StructuredOutputsVocabulary(
      const model::ModelConfig& config) const;

  const WorkerOptions options_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::ModelRunner> runner_;
  std::unique_ptr<StepBackend> backend_;  // runner_'s, or the sim backend
  std::atomic<bool> loaded_{false};
  std::atomic<bool> stream_attached_{false};
  // When the loop took the work it is at (or launched the step it waits
  // for); 0 while it waits for work. See busy_s().
  std::atomic<int64_t> busy_since_ns_{0};
  std::atomic<int32_t> num_active_requests_{0};
  std::atomic<uint64_t> num_steps_{0};
  int32_t num_blocks_ = 0;
  bool structured_outputs_ = false;  // a vocabulary was loaded (Describe)
  model::DType dtype_ = model::DType::kFloat32;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> queue_;
  // The loop thread's: the step launched and not finished (null: none),
  // its work and when it was launched.
  std::unique_ptr<StepExecutor::Step> launched_;
  Work launched_work_;
  int64_t launched_start_ns_ = 0;
  // Under mu_: whether launched_ is done (its Finish would not wait), and
  // which launch it is (a launch's on_done may come after the next launch).
  bool launched_done_ = false;
  uint64_t launch_count_ = 0;
  int32_t num_urgent_queued_ = 0;  // Work::urgent in queue_
  bool stopping_ = false;
  std::thread loop_;

  std::mutex send_mu_;
  std::condition_variable send_cv_;
  std::deque<std::pair<Stream*, sched::ModelRunnerOutput>> sends_;
  bool sending_ = false;  // SendLoop holds one taken from sends_
  bool send_stopping_ = false;
  std::thread send_loop_;

  struct Metrics {
    prometheus::Counter& steps;
    prometheus::Counter& step_errors;
    prometheus::Counter& scheduled_tokens;
    prometheus::Counter& sampled_tokens;
    prometheus::Histogram& step_duration;
    prometheus::Gauge& active_requests;
    prometheus::Counter& device_busy;
    prometheus::Counter& device_idle;
    prometheus::Counter& steps_overlapped;
    prometheus::Family<prometheus::Counter>& grammar_masks;
    metrics::MirroredCounter masks_kept;
    metrics::MirroredCounter masks_walked;
    prometheus::Counter& mask_seconds;
    prometheus::Gauge& mask_cache_bytes;
  };
  std::unique_ptr<Metrics> metrics_;
  model::DeviceTime device_seen_;                // what metrics_ has of backend_->device_time()
  double mask_seconds_seen_ = 0;                 // what metrics_ has of the masks' time
  std::unique_ptr<WorkerKvMetrics> kv_metrics_;  // with metrics_
  // The KV connector's worker role (null without --kvstore). Its loads are
  // read on a thread of its own and copied into the cache on the loop
  // thread between forward passes, and its stores copy their blocks out
  // right after a step's forward pass, so both are ordered against the
  // neighbouring steps (DESIGN §5 "Ordering").
  std::unique_ptr<kvconnector::KvStoreConnectorWorker> kv_connector_;
  // Owned by the loop thread once Load() has made it.
  std::unique_ptr<StepExecutor> executor_;
  std::vector<uint64_t> debug_reject_steps_;  // TEST-ONLY (--debug-reject-steps)
};

}  // namespace tandem::worker
