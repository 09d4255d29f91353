// The worker service: owns the model and the paged KV cache, and executes the
// scheduler's steps (DESIGN §2, §4, §6).
//
// Threads: gRPC handler threads only read the Execute stream and enqueue the
// steps; one loop thread owns the ModelRunner and the per-request batch state
// and executes the steps in order, writing each ModelRunnerOutput back.
// Because steps run strictly in order on one thread, a block the scheduler
// freed after step N and reused in step N+1 is never written by both at once
// (DESIGN §5 "Ordering": the worker orders its work after the previous step).
//
// Batch state per request: every token id it knows (the prompt, then each
// token it sampled itself: in async mode the scheduler's placeholders are
// filled from here), its block table (new_block_ids appended; replaced for a
// request resumed after preemption, whose token ids are then replaced by the
// scheduler's all_token_ids), and num_computed_tokens. A step samples for a
// request when its chunk reaches the last known token; the sampling position
// is the number of output tokens so far. Only one scheduler stream may be
// attached; when it ends, all batch state is dropped.
//
// Placeholder check (async scheduling): per request the worker remembers the
// steps in which it sampled a token. Those after the step's
// last_processed_step_id are tokens the scheduler has not seen yet, so their
// number must equal the step's num_output_placeholders for the request; a
// mismatch fails the step (the two sides would feed different tokens).
//
// A failed step: its loads are reported, its stores dropped, nothing is
// sampled. A step built before the scheduler had processed a failed step's
// output (its last_processed_step_id is older) builds on that step's
// samples and KV: it is failed too, after its loads and before its forward
// pass, so it never computes (or stores in the KV-store) KV from a context
// that was never written. The scheduler recomputes those requests.
//
// Each request's batch state ends with one log line (id, why, prompt and
// computed tokens, tokens sampled here, steps, preemptions, time held).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/common/sampling_params.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/metrics/metrics.h"
#include "tandem/model/model.h"
#include "tandem/model/model_runner.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::worker {

struct WorkerOptions {
  // llama2.c .bin file or Hugging Face directory.
  std::string model_path;
  // "cpu", "cuda" (error when no device), or "sim" (no math: deterministic
  // tokens after sim_step_us per step; for scheduler scale tests).
  std::string backend = "cpu";
  // Tokens per KV block.
  int32_t block_size = 16;
  // Number of KV blocks; 0 = derive from kv_cache_bytes.
  int32_t num_blocks = 0;
  // Memory budget of the KV cache when num_blocks is 0.
  int64_t kv_cache_bytes = 64ll << 20;
  // Simulated step time of the sim backend, per step plus per token.
  int32_t sim_step_us = 5000;
  int32_t sim_token_us = 0;
  // CPU threads of the model runner (results are identical for any value).
  int32_t num_threads = 1;
  // float32 | bfloat16 (model::ParseDType): the KV cache's and, on the cuda
  // backend, the weights' dtype. bfloat16 needs --backend=cuda.
  std::string dtype = "float32";
  // CUDA device ordinal of the cuda backend.
  int32_t device = 0;
  // GPUs per worker. Only 1: there is no tensor parallelism yet.
  int32_t gpus = 1;
  // host:port of tandem-kvstore; empty = no KV-store connector. Needs the
  // cpu or cuda backend (the sim backend has no KV bytes).
  std::string kvstore_target;
  // Deadline of one step's KV-store Load and of one Store, milliseconds.
  int64_t kvstore_transfer_deadline_ms = 5000;
  // auto | off | host:port: how KV-store loads travel (KvStoreConnectorOptions::bulk_load).
  std::string kvstore_bulk_load = "auto";
  // TEST-ONLY: comma-separated step ids (of each attached scheduler stream)
  // that fail after their loads and batch diff, before the forward pass
  // (their KV is not written). Empty: none.
  std::string debug_fail_steps;
  // TEST-ONLY: every step sleeps this long before its forward pass, so a
  // test can act while streams are surely mid-way (any backend). 0: off.
  int32_t debug_step_delay_us = 0;

  // debug_fail_steps parsed (Validate checks it).
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> DebugFailSteps() const;

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

 private:
  using Stream = grpc::ServerReaderWriter<v1::ModelRunnerOutput, v1::SchedulerOutput>;
  struct SeqState {
    std::vector<int32_t> token_ids;  // prompt + every output token known here
    int32_t num_prompt_tokens = 0;
    SamplingParams sampling;
    std::vector<int32_t> block_table;
    int32_t num_computed_tokens = 0;
    // Steps that sampled a token the scheduler may not have processed yet
    // (oldest first; at most two with async scheduling).
    std::deque<uint64_t> unconfirmed_sample_steps;
    // For the log line when the state is dropped.
    int64_t first_step_ns = 0;
    int32_t num_steps = 0;
    int32_t num_sampled = 0;
    int32_t num_preemptions = 0;
  };
  struct Work {
    std::unique_ptr<v1::SchedulerOutput> step;  // null: the stream ended
    Stream* stream = nullptr;
    std::shared_ptr<std::promise<void>> done;  // set for the end marker
  };

  void Loop();
  // Applies the diff, runs the model, samples. On error the batch state of
  // the step's requests may be partly updated; the scheduler fails them.
  absl::Status ExecuteStep(const v1::SchedulerOutput& step, sched::ModelRunnerOutput* out);
  // Drops a request's batch state with its log line.
  void DropSeq(std::unordered_map<std::string, SeqState>::iterator it, const char* why);
  absl::Status RunSim(const std::vector<SeqState*>& seqs, const std::vector<int32_t>& num_tokens,
                      std::vector<float>* logits);

  const WorkerOptions options_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::ModelRunner> runner_;
  std::atomic<bool> loaded_{false};
  std::atomic<bool> stream_attached_{false};
  std::atomic<int32_t> num_active_requests_{0};
  std::atomic<uint64_t> num_steps_{0};
  int32_t num_blocks_ = 0;
  model::DType dtype_ = model::DType::kFloat32;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> queue_;
  bool stopping_ = false;
  std::thread loop_;

  struct Metrics {
    prometheus::Counter& steps;
    prometheus::Counter& step_errors;
    prometheus::Counter& scheduled_tokens;
    prometheus::Counter& sampled_tokens;
    prometheus::Histogram& step_duration;
    prometheus::Gauge& active_requests;
  };
  std::unique_ptr<Metrics> metrics_;
  // The KV connector's worker role (null without --kvstore). Its loads run
  // on the loop thread before a step's forward pass and its stores copy
  // their blocks out right after it, so both are ordered against the
  // neighbouring steps (DESIGN §5 "Ordering").
  std::unique_ptr<kvconnector::KvStoreConnectorWorker> kv_connector_;
  std::vector<uint64_t> debug_fail_steps_;

  // Owned by the loop thread.
  std::unordered_map<std::string, SeqState> seqs_;
  // The last step of this stream that failed by itself (not because it was
  // built on a failed one); 0: none.
  uint64_t last_failed_step_id_ = 0;
};

}  // namespace tandem::worker
