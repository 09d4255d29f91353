// CudaRunnerBase, private to libs/model (built only with TANDEM_HAVE_CUDA):
// what the CUDA backend's two modes share, the step upload, the logits,
// sampling, decode graphs and block copies. A mode implements Init() and
// RunLayers(), which leaves the logits of the rows in BatchLayout::last_rows
// in logits_:
//   cuda_runner_f32.cc   float32, the CPU backend's order of operations
//   cuda_runner_bf16.cc  bfloat16, the fast path (cuda_bf16_ops.h)
// CudaRunnerBase's longer methods and CreateCudaRunner are in cuda_runner.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "block_copies.h"
#include "cpu_runner.h"
#include "cuda_buffers.h"
#include "decode_graphs.h"
#include "step_events.h"
#include "tandem/common/pinned_memory.h"
#include "tandem/common/status.h"
#include "tandem/kernels/attention_plan.h"
#include "tandem/kernels/cuda_bf16_ops.h"
#include "tandem/kernels/cuda_ops.h"
#include "tandem/model/model_runner.h"

namespace tandem::model::internal {

using kernels::KvCacheShape;
using kernels::PagedAttentionArgs;
using kernels::RopeKind;

inline RopeKind ToKernel(RopeStyle style) {
  return style == RopeStyle::kRotateHalf ? RopeKind::kRotateHalf : RopeKind::kAdjacentPairs;
}

inline kernels::ActKind ToKernel(Activation a) {
  return a == Activation::kGeluTanh ? kernels::ActKind::kGeluTanh : kernels::ActKind::kSilu;
}

// Device pointers of one step's metadata, all in one buffer uploaded by one
// copy from pinned memory.
struct StepInputs {
  const int32_t* tokens = nullptr;
  const int32_t* row_pos = nullptr;
  const int32_t* row_off = nullptr;
  const int32_t* tables = nullptr;
  const int64_t* slots = nullptr;
  const int32_t* last_rows = nullptr;
  // Which attention kernel takes which rows (bf16), and its two row lists.
  const kernels::AttentionPlan* plan = nullptr;
  const int32_t* tiles = nullptr;
  const int32_t* single_rows = nullptr;
};

// What both modes share: the step upload, the logits, sampling and block
// copies. A mode implements Init() and RunLayers(), which leaves the logits of
// the rows in BatchLayout::last_rows in logits_.
class CudaRunnerBase : public ModelRunner {
 public:
  CudaRunnerBase(const Model* model, KvCacheOptions opts, ModelRunnerOptions runner_opts)
      : ModelRunner(model, opts, Backend::kCuda),
        runner_opts_(runner_opts),
        dependent_launch_(runner_opts.dependent_launch),
        gemv_max_rows_(runner_opts.gemv_max_rows),
        tc_gemm_max_rows_(runner_opts.tc_gemm_max_rows),
        decode_tensor_cores_(runner_opts.decode_attention_tensor_cores),
        device_(runner_opts.cuda_device),
        tensor_core_attention_(runner_opts.tensor_core_attention),
        graphs_enabled_(runner_opts.cuda_graphs) {}
  ~CudaRunnerBase() override {
    kd::StreamSynchronize(stream_);  // a launched step's callback runs first
    if (launched_end_ != nullptr) kd::EventDestroy(launched_end_);
    DropGraphs();
    kd::DestroyBlas(blas_);
    kd::StreamDestroy(stream_);
  }

  virtual absl::Status Init() = 0;

  absl::Status Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) override {
    int32_t rows = 0;
    TANDEM_RETURN_IF_ERROR(Run(batch, /*argmax=*/false, &rows));
    logits->resize(static_cast<size_t>(rows) * model_->config().vocab_size);
    return CudaStatus(
        kd::CopyToHost(logits->data(), logits_.get<float>(), logits->size() * sizeof(float)),
        "logits download");
  }

  absl::Status ForwardSample(std::span<const SequenceInput> batch,
                             std::span<const SampleRequest> sample, std::vector<int32_t>* tokens,
                             std::vector<SampleLogprobs>* logprobs) override;
  // With ModelRunnerOptions::async_launch (steps without logprobs): the
  // step and its token downloads enqueued, then a host function that runs
  // on_done; FinishSample synchronizes the stream once and reads the
  // tokens from pinned memory. Else ModelRunner's (ForwardSample at once).
  absl::Status LaunchSample(std::span<const SequenceInput> batch,
                            std::span<const SampleRequest> sample, bool want_logprobs,
                            std::function<void()> on_done) override;
  absl::Status FinishSample(std::vector<int32_t>* tokens,
                            std::vector<SampleLogprobs>* logprobs) override;
  bool launches_async(bool want_logprobs) const override {
    return runner_opts_.async_launch && !want_logprobs;
  }
  // ForwardSample's step, which StepEvents times.
  absl::Status SampleOnDevice(std::span<const SequenceInput> batch,
                              std::span<const SampleRequest> sample, std::vector<int32_t>* tokens,
                              std::vector<SampleLogprobs>* logprobs);

  std::span<std::byte> BlockBytes(int32_t) override { return {}; }
  int64_t graph_replays() const override { return graph_replays_; }

  absl::Status CopyBlockToHost(int32_t block_id, std::span<std::byte> out) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopy(block_id, out.size()));
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
    const int32_t blocks[] = {block_id};
    TANDEM_RETURN_IF_ERROR(copies_in_.OrderBefore(blocks, nullptr, /*host_waits=*/true));
    return CudaStatus(kd::CopyToHost(out.data(), BlockPtr(block_id), out.size()), "block copy");
  }
  absl::Status CopyBlockFromHost(int32_t block_id, std::span<const std::byte> in) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopy(block_id, in.size()));
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
    // A synchronous copy on the legacy stream: the host waits for a copy
    // out of this block first (rare: only a block freed and reused while
    // its store was still being copied).
    const int32_t blocks[] = {block_id};
    TANDEM_RETURN_IF_ERROR(copies_out_.OrderBefore(blocks, stream_, /*host_waits=*/true));
    TANDEM_RETURN_IF_ERROR(copies_in_.OrderBefore(blocks, stream_, /*host_waits=*/true));
    return CudaStatus(kd::CopyToDevice(BlockPtr(block_id), in.data(), in.size()), "block copy");
  }

  // The KV-store's loads: every copy queued on the step stream behind the
  // copies out that still read one of the blocks (a wait on the device),
  // then one wait for all of them, instead of a synchronous copy per block.
  // From the connector's pinned staging each is a DMA of its own.
  absl::Status CopyBlocksFromHost(std::span<const int32_t> block_ids,
                                  std::span<const std::span<const std::byte>> in) override;

  // Beside the steps, on copies_out_'s stream; a later step that writes one
  // of the blocks waits for its copy on the device (Run).
  absl::StatusOr<BlockCopyWait> CopyBlocksToHostAsync(
      std::span<const int32_t> block_ids, std::span<const std::span<std::byte>> out) override;
  // Beside the steps, on copies_in_'s stream, after the copies out of the
  // same blocks (on the device); a later step that reads or writes one of
  // the blocks waits for its copy (Run), though the worker does not run one
  // before done().
  absl::StatusOr<BlockCopyIn> CopyBlocksFromHostAsync(
      std::span<const int32_t> block_ids,
      std::span<const std::span<const std::byte>> in) override;

 protected:
  // Shared start of Init: device, cuBLAS, stream. Init then uploads the
  // weights and ends with AllocateCache.
  absl::Status InitCommon();

  // The zeroed cache, after the weights: num_blocks as given, or (0) what
  // --gpu-memory-utilization leaves (KvBlocksForMemoryUtilization).
  absl::Status AllocateCache();

  absl::Status ReadMemory(int64_t* free_bytes) {
    size_t free = 0, total = 0;
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::MemGetInfo(&free, &total), "cudaMemGetInfo"));
    *free_bytes = static_cast<int64_t>(free);
    memory_.total = static_cast<int64_t>(total);
    return absl::OkStatus();
  }

  // Grows the step buffers RunLayers uses for T rows and attention over
  // max_context positions (without running anything).
  virtual absl::Status ReserveLayers(int32_t T, int32_t max_context) = 0;
  // Runs the layers of one validated, non-empty batch on stream_.
  virtual absl::Status RunLayers(const BatchLayout& lay, const StepInputs& in, int32_t rows) = 0;

  const ModelRunnerOptions runner_opts_;
  bool dependent_launch_;  // ModelRunnerOptions::dependent_launch, where the device has it
  const int32_t gemv_max_rows_;     // ModelRunnerOptions::gemv_max_rows
  const int32_t tc_gemm_max_rows_;  // ModelRunnerOptions::tc_gemm_max_rows
  // ModelRunnerOptions::decode_attention_tensor_cores, where the device,
  // dtype and head size allow it.
  bool decode_tensor_cores_;
  // ModelRunnerOptions::tensor_core_prefill_wide, where it applies (bf16,
  // tensor-core attention, head size 128).
  bool prefill_wide_ = false;
  DeviceMemory memory_;  // for gpu_memory_utilization
  KvCacheShape shape_;
  kd::BlasHandle* blas_ = nullptr;
  void* stream_ = nullptr;  // every kernel of a step, and the graphs
  DeviceBuffer cache_, logits_;
  DeviceBuffer inv_freq_;        // RoPE's inverse frequencies, [rotary_dim / 2]
  DeviceBuffer local_inv_freq_;  // the local layers' (Gemma 3)
  // The RoPE table of `layer` (ModelConfig::LocalRope).
  const float* InvFreq(int32_t layer) const;

 private:
  // One step: logits_ of the sequences' last rows and, with argmax, their
  // greedy tokens in argmax_. A decode step replays a CUDA graph when
  // graphs are on (decode_graphs.h).
  absl::Status Run(std::span<const SequenceInput> batch, bool argmax, int32_t* rows);

  absl::Status ReserveOutputs(int32_t rows) {
    TANDEM_RETURN_IF_ERROR(logits_.Reserve(sizeof(float) * rows * model_->config().vocab_size));
    return argmax_.Reserve(sizeof(int32_t) * rows);
  }

  absl::Status RunStep(const BatchLayout& lay, const StepInputs& in, int32_t rows, bool argmax) {
    TANDEM_RETURN_IF_ERROR(RunLayers(lay, in, rows));
    if (!argmax) return absl::OkStatus();
    return CudaStatus(kd::ArgMaxRows(logits_.get<float>(), rows, model_->config().vocab_size,
                                     argmax_.get<int32_t>(), stream_),
                      "argmax");
  }

  // A decode step of lay.num_rows <= bucket sequences through the graph of
  // (bucket, its splits bucket), captured on first use. Any failure to
  // capture turns graphs off for this runner (logged) and runs the step
  // eagerly with the same inputs.
  absl::Status RunGraph(BatchLayout lay, int32_t bucket);

  std::vector<void*> GraphPointers() const {
    std::vector<void*> p = {inputs_.get<void>(), logits_.get<void>(), argmax_.get<void>()};
    AppendStepBuffers(&p);
    return p;
  }
  // The addresses of the mode's step buffers (GraphPointers).
  virtual void AppendStepBuffers(std::vector<void*>* out) const = 0;

  void DropGraphs() {
    for (auto& [key, exec] : graphs_) kd::GraphDestroy(exec);
    graphs_.clear();
  }

  // The step and its sampler on the device, up to the token downloads: the
  // draws' arguments (UploadDraws: *drawn_rows), the layers, the argmax of
  // each of the *rows logits rows, and the draws.
  absl::Status RunAndDraw(std::span<const SequenceInput> batch,
                          std::span<const SampleRequest> sample, std::vector<int32_t>* drawn_rows,
                          int32_t* rows);

  // Uploads the arguments of the draws ForwardSample makes on the device
  // after the step: the rows that need more than the argmax (temperature,
  // banned ids, penalties), drawn by kernels/sampling.h's program, the token
  // SampleToken draws from the same logits. Returns those rows.
  absl::StatusOr<std::vector<int32_t>> UploadDraws(std::span<const SampleRequest> sample);

  // The logprobs `sample` asks for, computed on the device from the step's
  // logits (kernels/logprobs.h; the same bits as ComputeBatchLogprobs on
  // the host), after ForwardSample's tokens.
  absl::Status DeviceLogprobs(std::span<const SequenceInput> batch,
                              std::span<const SampleRequest> sample,
                              std::span<const int32_t> tokens,
                              std::vector<SampleLogprobs>* logprobs);

  // Packs the layout into pinned memory and copies it in one transfer.
  absl::Status Upload(const BatchLayout& lay, StepInputs* in);

  std::byte* BlockPtr(int32_t block_id) const {
    return cache_.get<std::byte>() + int64_t{block_id} * block_bytes();
  }

  int32_t device_;
  bool tensor_core_attention_;
  bool graphs_enabled_;
  kernels::AttentionPlan plan_;  // of the step being run
  PinnedBuffer staging_;         // cudaHostAlloc: the upload is one async copy
  DeviceBuffer inputs_, argmax_, blas_workspace_;
  // UploadDraws': the draws' arguments, banned ids and histories (the
  // penalties'), the program's scratch [draws][vocab], the drawn tokens.
  DeviceBuffer sample_args_, sample_banned_, sample_penalties_, sample_scratch_, sample_tokens_;
  // DeviceLogprobs': its jobs, their results and top-n lists.
  DeviceBuffer logprob_jobs_, logprob_results_, logprob_top_ids_, logprob_top_values_;
  std::map<std::pair<int32_t, int32_t>, void*> graphs_;  // (rows, splits) -> exec
  std::vector<void*> graph_pointers_;                    // the buffers' addresses the graphs hold
  int64_t graph_replays_ = 0;
  BlockCopies copies_out_;  // CopyBlocksToHostAsync's
  BlockCopies copies_in_;   // CopyBlocksFromHostAsync's
  StepEvents step_events_;  // ForwardSample's device clock
  // The step LaunchSample enqueued (async_launch): what FinishSample needs
  // to put its tokens back in batch order.
  struct Launched {
    bool active = false;
    int32_t rows = 0;                 // argmax rows, then the drawn ones, in token_staging_
    std::vector<int32_t> drawn_rows;  // UploadDraws'
    std::vector<char> samples;        // sample[i].params != nullptr
  };
  Launched launched_;
  PinnedBuffer token_staging_;    // the launched step's token ids, downloaded
  void* launched_end_ = nullptr;  // event after the downloads
  // The host function after a launched step: runs and deletes its on_done
  // (a std::function<void()>*).
  static void LaunchedStepDone(void* on_done);
};

// The two modes, initialized by the caller (Init).
std::unique_ptr<CudaRunnerBase> NewCudaF32Runner(const Model* model, KvCacheOptions opts,
                                                 ModelRunnerOptions runner_opts);
std::unique_ptr<CudaRunnerBase> NewCudaBf16Runner(const Model* model, KvCacheOptions opts,
                                                  ModelRunnerOptions runner_opts);

}  // namespace tandem::model::internal
