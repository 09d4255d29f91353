#include "tandem/model/model_runner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cpu_runner.h"
#include "tandem/common/status.h"
#include "tandem/kernels/attention_split.h"
#include "tandem/model/sampler.h"

namespace tandem::model {

absl::Status KvCacheOptions::Validate(bool runner_sizes_cache) const {
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheOptions.block_size = ", block_size, " must be positive"));
  }
  if (num_blocks < 0 || (num_blocks == 0 && !runner_sizes_cache)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheOptions.num_blocks = ", num_blocks, " must be positive"));
  }
  return absl::OkStatus();
}

const char* DTypeName(DType dtype) {
  return dtype == DType::kBFloat16 ? "bfloat16" : "float32";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "float32" || name == "fp32" || name == "f32" || name == "float") {
    return DType::kFloat32;
  }
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", std::string(name), "' (want float32 or bfloat16)"));
}

absl::StatusOr<DType> ResolveDType(std::string_view flag, std::string_view checkpoint_dtype,
                                   bool cuda) {
  if (flag == "auto") {
    return cuda && checkpoint_dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
  }
  if (flag == "float16" || flag == "half" || flag == "fp16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype '", std::string(flag),
        "' is not supported: there is no float16 path (weights, activations and KV cache); use "
        "auto, bfloat16 (cuda) or float32"));
  }
  TANDEM_ASSIGN_OR_RETURN(DType dtype, ParseDType(flag));
  if (dtype == DType::kBFloat16 && !cuda) {
    return absl::InvalidArgumentError(
        "dtype bfloat16 needs the cuda backend (the cpu backend "
        "computes in float32)");
  }
  return dtype;
}

int32_t DTypeBytes(DType dtype) { return dtype == DType::kBFloat16 ? 2 : 4; }

absl::Status ModelRunnerOptions::Validate() const {
  if (num_threads < 1 || num_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelRunnerOptions.num_threads = ", num_threads, " must be in [1, 256]"));
  }
  if (cuda_device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelRunnerOptions.cuda_device = ", cuda_device, " must be >= 0"));
  }
  if (attention_splits_per_block < -1) {
    return absl::InvalidArgumentError(absl::StrCat("ModelRunnerOptions.attention_splits_per_block = ",
                                                   attention_splits_per_block,
                                                   " must be -1 (automatic), 0 (a row) or positive"));
  }
  if (!(gpu_memory_utilization >= 0 && gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelRunnerOptions.gpu_memory_utilization = ", gpu_memory_utilization,
                     " must be 0 (num_blocks given) or in (0, 1]"));
  }
  if (max_step_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelRunnerOptions.max_step_tokens = ", max_step_tokens, " must be >= 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> KvBlocksForMemoryUtilization(double utilization, const DeviceMemory& m,
                                                     int64_t reserve_bytes, int64_t block_bytes) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (!(utilization > 0 && utilization <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization = ", utilization, " must be in (0, 1]"));
  }
  const auto requested = static_cast<int64_t>(utilization * static_cast<double>(m.total));
  if (m.free_at_start < requested) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "Free memory on device (%.2f/%.2f GiB) on startup is less than desired GPU memory "
        "utilization (%g, %.2f GiB). Decrease GPU memory utilization or reduce GPU memory used "
        "by other processes.",
        m.free_at_start / kGiB, m.total / kGiB, utilization, requested / kGiB));
  }
  const int64_t weights = m.free_at_start - m.free_after_weights;
  const int64_t available = requested - weights - reserve_bytes;
  if (block_bytes <= 0 || available < block_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "No available memory for the cache blocks: --gpu-memory-utilization %g gives %.2f GiB, "
        "the weights took %.2f GiB and the step buffers need %.2f GiB, leaving %.2f GiB for "
        "KV blocks of %d bytes. Try increasing --gpu-memory-utilization.",
        utilization, requested / kGiB, weights / kGiB, reserve_bytes / kGiB,
        std::max<int64_t>(available, 0) / kGiB, block_bytes));
  }
  return static_cast<int32_t>(
      std::min<int64_t>(available / block_bytes, std::numeric_limits<int32_t>::max()));
}

int64_t DefaultCpuKvCacheBytes(int64_t physical_memory_bytes) {
  return std::min<int64_t>(int64_t{4} << 30, physical_memory_bytes / 4);
}

int64_t StepReserveBytes(const ModelConfig& c, int32_t tokens) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, qd = c.q_dim(), kv = c.kv_dim();
  const int64_t qkv_width = qd + 2 * kv;
  // fp32 everywhere (the float32 mode's buffers; bf16's are no larger):
  // residual, normed input, q/k/v or gate/up, attention output, hidden.
  const int64_t per_token =
      4 * (2 * dim + std::max(dim, qd) * 2 + std::max(qkv_width, 2 * hidden) + 2 * hidden + 2 * kv);
  constexpr int32_t kSampledRows = 256;
  // The logits and the sampler's scratch, fp32 each.
  const int64_t logits = int64_t{2} * 4 * kSampledRows * c.vocab_size;
  const int64_t scratch = 4 * kernels::cuda::AttentionScratchFloats(kSampledRows, c.num_heads,
                                                                    c.head_size, c.max_seq_len);
  constexpr int64_t kFixed = int64_t{256} << 20;
  return per_token * tokens + logits + scratch + kFixed;
}

int64_t KvBlockBytes(const ModelConfig& c, int32_t block_size, DType dtype) {
  return int64_t{c.num_layers} * 2 * block_size * c.num_kv_heads * c.head_size *
         DTypeBytes(dtype);
}

std::string KvLayoutString(const ModelConfig& c, int32_t block_size, DType dtype) {
  return absl::StrCat("block-major/L", c.num_layers, "/KV2/B", block_size, "/H", c.num_kv_heads,
                      "/D", c.head_size, dtype == DType::kBFloat16 ? "/bf16" : "/f32");
}

int32_t LogitsRowOf(std::span<const SequenceInput> batch, size_t i, int32_t j) {
  const int32_t n = static_cast<int32_t>(batch[i].token_ids.size());
  if (j == n - 1) return static_cast<int32_t>(i);
  int32_t row = static_cast<int32_t>(batch.size());
  for (size_t k = 0; k < i; ++k) {
    if (batch[k].all_logits) row += static_cast<int32_t>(batch[k].token_ids.size()) - 1;
  }
  return row + j;
}

absl::Status ModelRunner::ForwardSample(std::span<const SequenceInput> batch,
                                        std::span<const SampleRequest> sample,
                                        std::vector<int32_t>* tokens,
                                        std::vector<SampleLogprobs>* logprobs) {
  if (sample.size() != batch.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardSample: ", sample.size(),
                                                   " sample requests for ", batch.size(),
                                                   " sequences"));
  }
  // The CPU is this backend's device: the step is busy from here to the end.
  const DeviceClock::Scope step(&device_clock_);
  std::vector<float> logits;
  TANDEM_RETURN_IF_ERROR(Forward(batch, &logits));
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  SampleRows(logits, model_->config().vocab_size, sample, tokens);
  if (logprobs == nullptr) return absl::OkStatus();
  return ComputeBatchLogprobs(
      batch, sample, *tokens, model_->config().vocab_size,
      [&](int32_t row) -> absl::StatusOr<std::span<const float>> {
        return std::span<const float>(logits).subspan(row * vocab, vocab);
      },
      logprobs);
}

absl::Status ModelRunner::LaunchSample(std::span<const SequenceInput> batch,
                                       std::span<const SampleRequest> sample, bool want_logprobs,
                                       std::function<void()> on_done) {
  return immediate_.Launch(
      want_logprobs,
      [&](std::vector<int32_t>* tokens, std::vector<SampleLogprobs>* logprobs) {
        return ForwardSample(batch, sample, tokens, logprobs);
      },
      on_done);
}

absl::Status ModelRunner::FinishSample(std::vector<int32_t>* tokens,
                                       std::vector<SampleLogprobs>* logprobs) {
  return immediate_.Finish(tokens, logprobs);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const Model* model,
                                                                 KvCacheOptions opts,
                                                                 Backend backend) {
  return Create(model, opts, backend, ModelRunnerOptions{});
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const Model* model,
                                                                 KvCacheOptions opts,
                                                                 Backend backend,
                                                                 ModelRunnerOptions runner_opts) {
  if (model == nullptr) return absl::InvalidArgumentError("ModelRunner::Create: null model");
  // num_blocks 0: the CUDA runner sizes the cache by gpu_memory_utilization.
  TANDEM_RETURN_IF_ERROR(opts.Validate(
      /*runner_sizes_cache=*/backend == Backend::kCuda && runner_opts.gpu_memory_utilization > 0));
  TANDEM_RETURN_IF_ERROR(runner_opts.Validate());
  switch (backend) {
    case Backend::kCpu:
      if (opts.dtype != DType::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "dtype ", DTypeName(opts.dtype), " needs the cuda backend; the cpu backend is float32"));
      }
      return internal::CreateCpuRunner(model, opts, runner_opts);
    case Backend::kCuda:
      return internal::CreateCudaRunner(model, opts, runner_opts);
  }
  return absl::InvalidArgumentError("unknown backend");
}

absl::Status ModelRunner::ValidateBlockCopy(int32_t block_id, size_t size) const {
  if (block_id < 0 || block_id >= opts_.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("block id ", block_id, " outside [0, ", opts_.num_blocks, ")"));
  }
  if (static_cast<int64_t>(size) != block_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block buffer of ", size, " bytes, want ", block_bytes()));
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::BlockCopyCountMismatch(size_t block_ids, size_t buffers) {
  return absl::InvalidArgumentError(
      absl::StrCat(block_ids, " block ids but ", buffers, " host buffers"));
}

absl::StatusOr<ModelRunner::BlockCopyWait> ModelRunner::CopyBlocksToHostAsync(
    std::span<const int32_t> block_ids, std::span<const std::span<std::byte>> out) {
  TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(block_ids, out));
  for (size_t i = 0; i < block_ids.size(); ++i) {
    TANDEM_RETURN_IF_ERROR(CopyBlockToHost(block_ids[i], out[i]));
  }
  return BlockCopyWait([] { return absl::OkStatus(); });
}

absl::Status ModelRunner::CopyBlocksFromHost(std::span<const int32_t> block_ids,
                                             std::span<const std::span<const std::byte>> in) {
  TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(block_ids, in));
  for (size_t i = 0; i < block_ids.size(); ++i) {
    TANDEM_RETURN_IF_ERROR(CopyBlockFromHost(block_ids[i], in[i]));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelRunner::BlockCopyIn> ModelRunner::CopyBlocksFromHostAsync(
    std::span<const int32_t> block_ids, std::span<const std::span<const std::byte>> in) {
  TANDEM_RETURN_IF_ERROR(CopyBlocksFromHost(block_ids, in));
  return BlockCopyIn{.done = [] { return true; }, .wait = [] { return absl::OkStatus(); }};
}

absl::Status ModelRunner::ValidateBatch(std::span<const SequenceInput> batch) const {
  const ModelConfig& c = model_->config();
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& s = batch[i];
    auto bad = [i](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": ", what));
    };
    const int64_t n = static_cast<int64_t>(s.token_ids.size());
    if (n == 0) return bad("no tokens");
    if (s.start_pos < 0) return bad(absl::StrCat("negative start_pos ", s.start_pos));
    const int64_t end = int64_t{s.start_pos} + n;
    if (end > c.max_seq_len) {
      return bad(absl::StrCat("positions up to ", end - 1, " exceed max_seq_len ", c.max_seq_len));
    }
    if (static_cast<int64_t>(s.block_table.size()) * opts_.block_size < end) {
      return bad(absl::StrCat("block table of ", s.block_table.size(), " blocks covers ",
                              s.block_table.size() * opts_.block_size, " tokens, need ", end));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= opts_.num_blocks) {
        return bad(absl::StrCat("block id ", b, " outside [0, ", opts_.num_blocks, ")"));
      }
    }
    for (int32_t t : s.token_ids) {
      if (t < 0 || t >= c.vocab_size) {
        return bad(absl::StrCat("token id ", t, " outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

namespace internal {

BatchLayout MakeBatchLayout(std::span<const SequenceInput> batch, int32_t block_size) {
  BatchLayout l;
  for (const SequenceInput& s : batch) {
    const int32_t table_offset = static_cast<int32_t>(l.block_tables.size());
    l.block_tables.insert(l.block_tables.end(), s.block_table.begin(), s.block_table.end());
    for (size_t j = 0; j < s.token_ids.size(); ++j) {
      const int32_t pos = s.start_pos + static_cast<int32_t>(j);
      l.tokens.push_back(s.token_ids[j]);
      l.row_pos.push_back(pos);
      l.row_table_offset.push_back(table_offset);
      l.slots.push_back(int64_t{s.block_table[static_cast<size_t>(pos / block_size)]} * block_size +
                        pos % block_size);
      l.max_context = std::max(l.max_context, pos + 1);
    }
    l.last_rows.push_back(static_cast<int32_t>(l.tokens.size()) - 1);
  }
  // The other rows of all_logits sequences follow (Forward's layout).
  int32_t first = 0;
  for (const SequenceInput& s : batch) {
    const int32_t n = static_cast<int32_t>(s.token_ids.size());
    if (s.all_logits) {
      for (int32_t j = 0; j + 1 < n; ++j) l.last_rows.push_back(first + j);
    }
    first += n;
  }
  l.num_rows = static_cast<int32_t>(l.tokens.size());
  return l;
}

std::vector<int32_t> WrittenBlocks(std::span<const SequenceInput> batch, int32_t block_size,
                                   bool read_too) {
  std::vector<int32_t> blocks;
  for (const SequenceInput& s : batch) {
    if (s.token_ids.empty()) continue;
    const int32_t last = s.start_pos + static_cast<int32_t>(s.token_ids.size()) - 1;
    for (int32_t b = read_too ? 0 : s.start_pos / block_size; b <= last / block_size; ++b) {
      blocks.push_back(s.block_table[static_cast<size_t>(b)]);
    }
  }
  return blocks;
}

#if !(defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA)
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(const Model*, KvCacheOptions,
                                                              ModelRunnerOptions) {
  return absl::UnavailableError("CUDA backend: this build has no CUDA support");
}
#endif

}  // namespace internal
}  // namespace tandem::model
