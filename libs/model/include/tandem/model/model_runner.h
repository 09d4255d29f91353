// Runs batches of sequences through a Model over a paged KV cache.
//
// Each step is a batch of SequenceInputs; a sequence is a prefill chunk of
// any length starting at any computed offset, or a decode step (one token).
// Forward() returns each sequence's next-token logits. The CPU backend
// follows llama2.c's order of operations, and every output row is a
// sequential sum, so a sequence's logits are bitwise identical whatever else
// is in the batch, however its prefill was chunked, and whether its prefix KV
// was computed by itself or by another sequence.
//
// Per layer, K/V of every token of the batch is written before any attention
// of that layer reads the cache: two sequences of one step may share prefix
// blocks that only the first computes (DESIGN §6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/model/device_time.h"
#include "tandem/model/model.h"
#include "tandem/model/sampler.h"

namespace tandem::model {

enum class Backend { kCpu, kCuda };

// Element type of the KV cache and, on the CUDA backend, of the weights and
// the GEMM inputs.
//  - kFloat32: every backend; the CUDA backend's simple fp32 kernels follow
//    the CPU backend's order of operations (the exactness mode).
//  - kBFloat16: CUDA only. Weights and KV cache in bf16, converted from the
//    checkpoint at load; cuBLAS GEMMs with fp32 accumulation; fused QKV and
//    gate/up GEMMs; split-K paged attention; argmax on the GPU. The residual
//    stream, norms, softmax and logits stay fp32.
enum class DType { kFloat32, kBFloat16 };
// "float32" / "bfloat16" (vLLM's --dtype names); Parse also takes "fp32",
// "f32", "bf16".
const char* DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(std::string_view name);
// A worker's --dtype (vLLM's names) for a checkpoint whose config.json says
// `checkpoint_dtype` (ModelConfig::torch_dtype), on the cuda backend or not:
//  - "auto" (vLLM's default): bfloat16 for a bfloat16 checkpoint on cuda;
//    else float32, the checkpoint's values exactly (a float16 or float32
//    checkpoint, where vLLM would compute in float16: there is no float16
//    path here, and bfloat16 would round its weights), and always on the cpu
//    backend, which computes in float32.
//  - "float16" / "half" / "fp16": refused by name (no float16 path).
//  - else ParseDType; bfloat16 needs cuda.
absl::StatusOr<DType> ResolveDType(std::string_view flag, std::string_view checkpoint_dtype,
                                   bool cuda);
int32_t DTypeBytes(DType dtype);

struct KvCacheOptions {
  // Tokens per KV block; > 0.
  int32_t block_size = 16;
  // Blocks in the cache; > 0. 0 only for the CUDA backend with
  // ModelRunnerOptions::gpu_memory_utilization, which then sizes it
  // (ModelRunner::num_blocks() reports the result).
  int32_t num_blocks = 0;
  // See DType. Part of the KV layout string, so a KV-store never hands
  // blocks of one dtype to a worker of another.
  DType dtype = DType::kFloat32;
  // runner_sizes_cache: num_blocks 0 is allowed (see num_blocks).
  [[nodiscard]] absl::Status Validate(bool runner_sizes_cache = false) const;
};

// Bytes of one KV block: num_layers * 2 * block_size * num_kv_heads *
// head_size * DTypeBytes(dtype).
int64_t KvBlockBytes(const ModelConfig& config, int32_t block_size,
                     DType dtype = DType::kFloat32);
// "block-major/L{layers}/KV2/B{block}/H{kv_heads}/D{head}/{f32|bf16}", for
// HashRootParams.kv_layout.
std::string KvLayoutString(const ModelConfig& config, int32_t block_size,
                           DType dtype = DType::kFloat32);

struct SequenceInput {
  std::span<const int32_t> token_ids;    // tokens of this chunk (a decode step has 1)
  int32_t start_pos = 0;                 // tokens whose KV is already in the cache
  std::span<const int32_t> block_table;  // block ids covering >= start_pos + token_ids.size()
  // Also compute the logits after every other token of the chunk (prompt
  // logprobs); see ModelRunner::Forward for where they go.
  bool all_logits = false;
};

struct ModelRunnerOptions {
  // CPU worker threads for the matmuls and attention (1 = the calling thread
  // only). Results are bitwise identical for any value.
  int32_t num_threads = 1;
  // CUDA device ordinal (CUDA backend); must be < the number of devices.
  int32_t cuda_device = 0;
  // CUDA bfloat16: prefill chunks of 16 rows or more take the tensor-core
  // attention kernel where the device and head size allow
  // (kernels/attention_plan.h); false keeps every row on the split-K kernel
  // (bench_cuda --attention split-k compares the two).
  bool tensor_core_attention = true;
  // CUDA bfloat16, with tensor_core_attention: the tensor-core prefill
  // kernel also takes Gemma's head size 256 and Gemma 2's softcapped scores
  // (each row within the kernel's tolerance of the split-K kernel, as at the
  // other head sizes). Off until it has run on a GPU: until then such a
  // model's prefill rows stay on the split-K kernel (bench_cuda --shape
  // gemma-2-2b --attention tensor-cores-gemma compares).
  bool tensor_core_prefill_gemma = false;
  // CUDA bfloat16, with tensor_core_attention, head size 128 (the 7-8B
  // models): the tensor-core prefill kernel's blocks take 128 rows (two MMA
  // tiles a warp, Q's fragments in shared memory, 32 keys a step;
  // FlashAttention-2's block for that size) instead of 64. Other bits, the
  // same tolerance. Off until a GPU has timed it (bench_cuda --shape
  // qwen2.5-1.5b --attention tensor-cores-wide).
  bool tensor_core_prefill_wide = false;
  // CUDA bfloat16: consecutive attention splits of a row that one block of
  // the split-K kernel takes (kernels::cuda::PagedAttentionBf16): -1 picks by
  // the batch's size, 1 gives every split its own block, 0 a row's splits to
  // one block. Every value gives the same bits (bench_cuda
  // --decode-attention compares them). 1 until the pipelined kernel (any
  // other value) has passed its tests on a GPU; then -1.
  int32_t attention_splits_per_block = 1;
  // CUDA bfloat16 on compute capability 8.0 and above, head sizes 32, 64, 96
  // and 128, block sizes that are multiples of 16: the rows the split-K kernel takes (decodes,
  // short chunks) take the tensor-core decode attention instead
  // (kernels::cuda::DecodeAttentionTcBf16: Q and P rounded to bf16 as in the
  // prefill kernel, so other bits than the split-K kernel's; eager steps and
  // decode graphs agree). Elsewhere the option changes nothing. Off until it
  // has run on a GPU (bench_cuda --decode-attention tensor-cores).
  bool decode_attention_tensor_cores = false;
  // CUDA bfloat16 on compute capability 9.0 and above: decode GEMVs (up to
  // kernels::cuda::kGemvMaxRows rows) are launched as programmatic dependents
  // of the kernel before them, so they start streaming their weights while
  // it finishes (kernels::cuda::MatmulBf16). The same bits either way
  // (bench_cuda --dependent-launch compares). Off until it has run on a GPU.
  bool dependent_launch = false;
  // CUDA bfloat16: GEMMs of up to this many rows (at most
  // kernels::cuda::kGemvMaxRows) run the project's GEMV, the rest cuBLAS;
  // 0: cuBLAS for every GEMM (bench_cuda --gemv-max-rows compares them).
  int32_t gemv_max_rows = 4;
  // CUDA bfloat16 on compute capability 8.0 and above: GEMMs of more rows
  // than the GEMV takes and up to this many (at most
  // kernels::cuda::kTcGemmMaxRows = 64) run the tensor-core GEMM
  // (kernels::cuda::TcGemmBf16: other bits than cuBLAS's, a row's own
  // whatever rows run with it); 0: cuBLAS. Off until it has run on a GPU
  // (bench_cuda --tc-gemm-max-rows).
  int32_t tc_gemm_max_rows = 0;
  // CUDA backend: LaunchSample returns once the step is enqueued, its token
  // ids downloaded by an asynchronous copy into pinned memory that
  // FinishSample reads after one stream synchronization (steps that ask for
  // logprobs run as ForwardSample). The same kernels and bits. Off until it
  // has run on a GPU (tandem-worker --cuda-async-launch,
  // tools/bench_services.sh --backend cuda).
  bool async_launch = false;
  // CUDA bfloat16: decode steps of up to 256 sequences replay CUDA graphs
  // captured per batch-size bucket (model/decode_graphs.h); false runs every
  // step eagerly (bench_cuda --cuda-graphs off compares the two).
  bool cuda_graphs = true;
  // CUDA backend with KvCacheOptions::num_blocks = 0: the cache is sized as
  // vLLM sizes it for --gpu-memory-utilization, once the weights are on the
  // device (KvBlocksForMemoryUtilization, with StepReserveBytes for
  // max_step_tokens). 0: num_blocks must be given. In (0, 1].
  double gpu_memory_utilization = 0;
  // Rows of the largest step the reserve above is sized for.
  int32_t max_step_tokens = 8192;
  [[nodiscard]] absl::Status Validate() const;
};

// One device's memory as cudaMemGetInfo reports it, when the runner starts
// (its CUDA context made, nothing of its own allocated) and once the
// weights are on it.
struct DeviceMemory {
  int64_t total = 0;
  int64_t free_at_start = 0;
  int64_t free_after_weights = 0;
};
// vLLM's rule for --gpu-memory-utilization (its gpu_worker's
// determine_available_memory): the runner may use utilization * total
// bytes. What it has allocated by the time the weights are loaded and
// reserve_bytes (the step buffers) come off that; the rest, in whole blocks
// of block_bytes, is the KV cache. Refused, with vLLM's wording and the
// numbers, when the device has less free at start than that budget (another
// process holds it) or when nothing is left for one block.
absl::StatusOr<int32_t> KvBlocksForMemoryUtilization(double utilization, const DeviceMemory& memory,
                                                     int64_t reserve_bytes, int64_t block_bytes);
// Device bytes the CUDA runner's step buffers grow to for a step of `tokens`
// rows in either dtype, with the logits of up to 256 sampled rows, the
// split-K attention scratch of 256 decode rows at max_seq_len, and 256 MiB
// for cuBLAS and the decode graphs. A larger step grows them further (and
// fails with CUDA's out-of-memory error if the device has no room).
int64_t StepReserveBytes(const ModelConfig& config, int32_t tokens);
// The CPU backend's KV cache when no size is given: vLLM's CPU default
// (VLLM_CPU_KVCACHE_SPACE, 4 GiB), at most a quarter of the machine's
// physical memory. The CPU runner's cache is anonymous zero pages, so the
// blocks cost memory only once written.
int64_t DefaultCpuKvCacheBytes(int64_t physical_memory_bytes);

// A step launched by running it at once (ForwardSample), its results kept
// until it is finished: ModelRunner::LaunchSample's default, and the
// worker's StepBackend's.
class ImmediateStep {
 public:
  using Run = std::function<absl::Status(std::vector<int32_t>* tokens,
                                         std::vector<SampleLogprobs>* logprobs)>;
  absl::Status Launch(bool want_logprobs, const Run& run, const std::function<void()>& on_done) {
    logprobs_.clear();
    if (absl::Status s = run(&tokens_, want_logprobs ? &logprobs_ : nullptr); !s.ok()) return s;
    on_done();
    return absl::OkStatus();
  }
  absl::Status Finish(std::vector<int32_t>* tokens, std::vector<SampleLogprobs>* logprobs) {
    tokens->swap(tokens_);
    logprobs->swap(logprobs_);
    return absl::OkStatus();
  }

 private:
  std::vector<int32_t> tokens_;
  std::vector<SampleLogprobs> logprobs_;
};

// Not thread-safe: one owner thread calls Forward and the block copies
// (the worker's loop thread). ModelRunnerOptions.num_threads adds helper
// threads inside Forward only.
// Row of Forward's logits after token j of sequence i's chunk (j <
// token_ids.size(); any j but the last needs all_logits).
int32_t LogitsRowOf(std::span<const SequenceInput> batch, size_t i, int32_t j);

class ModelRunner {
 public:
  // `model` must outlive the runner. kCuda returns UNAVAILABLE when the build
  // has no CUDA or no device is present.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const Model* model,
                                                             KvCacheOptions opts,
                                                             Backend backend = Backend::kCpu);
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const Model* model,
                                                             KvCacheOptions opts, Backend backend,
                                                             ModelRunnerOptions runner_opts);
  virtual ~ModelRunner() = default;

  // Runs one batch; writes the next-token logits of sequence i (after its
  // last chunk token) to row i of *logits ([rows][vocab_size], resized).
  // Rows batch.size() on hold, for each all_logits sequence in batch order,
  // the logits after its chunk's other tokens, first to last (n - 1 rows for
  // a chunk of n): LogitsRowOf finds them.
  // Validates every input first (block ids in range, table long enough,
  // positions < max_seq_len, token ids in vocab, non-empty chunks) and
  // returns INVALID_ARGUMENT naming the sequence and the problem without
  // touching the cache.
  virtual absl::Status Forward(std::span<const SequenceInput> batch,
                               std::vector<float>* logits) = 0;

  // Forward, then one token per sequence whose sample[i].params is set, with
  // SampleToken's semantics (tokens[i] = -1 for the others), and with
  // `logprobs` the logprobs each request asked for (ComputeBatchLogprobs;
  // sample.size() entries). The CUDA backend takes greedy argmaxes on the
  // GPU and copies back only the token ids (and the logits of rows that
  // sample at a temperature, ban tokens or need logprobs), instead of
  // batch * vocab logits.
  virtual absl::Status ForwardSample(std::span<const SequenceInput> batch,
                                     std::span<const SampleRequest> sample,
                                     std::vector<int32_t>* tokens,
                                     std::vector<SampleLogprobs>* logprobs = nullptr);

  // ForwardSample in two halves, so that the host can prepare the next step
  // while the device runs this one: LaunchSample begins the step and
  // returns once it has read its arguments (they need not outlive the
  // call); `on_done` runs once, on any thread, when FinishSample would no
  // longer wait (it must not call into the runner). FinishSample gives the
  // results. One step at a time; a LaunchSample that fails launched
  // nothing (on_done is not called). This implementation runs ForwardSample
  // within LaunchSample and calls on_done before returning; the CUDA
  // backend with ModelRunnerOptions::async_launch returns once the step is
  // enqueued (steps without logprobs).
  virtual absl::Status LaunchSample(std::span<const SequenceInput> batch,
                                    std::span<const SampleRequest> sample, bool want_logprobs,
                                    std::function<void()> on_done);
  virtual absl::Status FinishSample(std::vector<int32_t>* tokens,
                                    std::vector<SampleLogprobs>* logprobs);
  // Whether LaunchSample returns before a step (that asks for logprobs or
  // not) is done: a step without logprobs on the CUDA backend with
  // async_launch.
  virtual bool launches_async(bool /*want_logprobs*/) const { return false; }

  // Decode steps replayed from CUDA graphs so far (CUDA bfloat16 with
  // ModelRunnerOptions::cuda_graphs; 0 elsewhere).
  virtual int64_t graph_replays() const { return 0; }

  // ForwardSample's steps as the device saw them (device_time.h): on CUDA by
  // events at each step's first and last device work, on the CPU backend by
  // the monotonic clock around the step.
  const DeviceTime& device_time() const { return device_clock_.time(); }

  const Model& model() const { return *model_; }
  Backend backend() const { return backend_; }
  int32_t num_blocks() const { return opts_.num_blocks; }
  int32_t block_size() const { return opts_.block_size; }
  DType dtype() const { return opts_.dtype; }
  int64_t block_bytes() const {
    return KvBlockBytes(model_->config(), opts_.block_size, opts_.dtype);
  }
  // Host bytes of one block (CPU backend), for KV-store loads and stores.
  // Empty for an id outside [0, num_blocks) and for the CUDA backend (use
  // CopyBlockToHost / CopyBlockFromHost there).
  virtual std::span<std::byte> BlockBytes(int32_t block_id) = 0;
  // Copies one block to or from host memory of block_bytes() (any backend).
  virtual absl::Status CopyBlockToHost(int32_t block_id, std::span<std::byte> out) = 0;
  virtual absl::Status CopyBlockFromHost(int32_t block_id, std::span<const std::byte> in) = 0;

  // Waits for the copies CopyBlocksToHostAsync began; returns their error.
  using BlockCopyWait = std::function<absl::Status()>;
  // Begins copying blocks block_ids[i] into out[i] (block_bytes() each) and
  // returns what waits for them; `out` must stay valid until that returns
  // (on any thread). The copies read each block as the steps run so far
  // left it: a later Forward or CopyBlockFromHost that writes one of these
  // blocks is ordered after its copy (on the device; the host does not
  // wait). INVALID_ARGUMENT without copying anything when an id or a size
  // is wrong. This implementation copies at once (CopyBlockToHost); the
  // CUDA backend copies on a stream of its own, beside the steps' kernels,
  // so that the KV-store's stores never hold up a step (DESIGN §5).
  virtual absl::StatusOr<BlockCopyWait> CopyBlocksToHostAsync(
      std::span<const int32_t> block_ids, std::span<const std::span<std::byte>> out);
  // Copies in[i] (block_bytes() each) into block block_ids[i] (the
  // KV-store's loads) and returns once `in` may be reused; a later step reads
  // the loaded bytes. A block that a copy out (above) still reads is written
  // after it. INVALID_ARGUMENT without copying anything when an id or a size
  // is wrong. This implementation calls CopyBlockFromHost per block; the
  // CUDA backend queues every copy on its step stream and waits once.
  virtual absl::Status CopyBlocksFromHost(std::span<const int32_t> block_ids,
                                          std::span<const std::span<const std::byte>> in);
  // A copy into the cache that CopyBlocksFromHostAsync began.
  struct BlockCopyIn {
    // True once the copies have ended; never blocks (any thread).
    std::function<bool()> done;
    // Waits for the copies and returns their error (any thread).
    BlockCopyWait wait;
  };
  // Begins copying in[i] (block_bytes() each) into block block_ids[i] (the
  // KV-store's loads) and returns at once. `in` must stay valid, and no step
  // may read the blocks, until done() is true or wait() has returned: the
  // worker reports a load to the scheduler only then. The copies follow the
  // steps run so far and any copy out of the same blocks. INVALID_ARGUMENT
  // without copying anything when an id or a size is wrong. This
  // implementation copies at once (CopyBlocksFromHost), so done() is true
  // from the start; the CUDA backend copies on a stream of its own, beside
  // the steps' kernels, so that a load never holds up a step.
  virtual absl::StatusOr<BlockCopyIn> CopyBlocksFromHostAsync(
      std::span<const int32_t> block_ids, std::span<const std::span<const std::byte>> in);

 private:
  ImmediateStep immediate_;  // LaunchSample's default

 protected:
  ModelRunner(const Model* model, KvCacheOptions opts, Backend backend)
      : model_(model), opts_(opts), backend_(backend) {}
  // What ForwardSample adds each step to (device_time()).
  DeviceClock device_clock_;
  // Checks the batch against the cache and the model (see Forward).
  absl::Status ValidateBatch(std::span<const SequenceInput> batch) const;
  // Checks a block copy's id and host buffer size (CopyBlockToHost/FromHost).
  absl::Status ValidateBlockCopy(int32_t block_id, size_t size) const;
  // ValidateBlockCopy of every pair, and that there are as many of each.
  template <typename Byte>
  absl::Status ValidateBlockCopies(std::span<const int32_t> block_ids,
                                   std::span<const std::span<Byte>> buffers) const {
    if (block_ids.size() != buffers.size()) {
      return BlockCopyCountMismatch(block_ids.size(), buffers.size());
    }
    for (size_t i = 0; i < block_ids.size(); ++i) {
      if (absl::Status s = ValidateBlockCopy(block_ids[i], buffers[i].size()); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  static absl::Status BlockCopyCountMismatch(size_t block_ids, size_t buffers);

  const Model* model_;
  KvCacheOptions opts_;
  Backend backend_;
};

}  // namespace tandem::model
