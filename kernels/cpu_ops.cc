#include "tandem/kernels/cpu_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tandem/kernels/hd.h"

namespace tandem::kernels::cpu {
namespace {
constexpr int32_t kCpuThreads = 64;  // threads of the walked grid
}  // namespace

void EmbeddingGather(const float* table, int32_t dim, std::span<const int32_t> tokens,
                     float* out) {
  LaunchOnCpu(Grid{static_cast<int64_t>(tokens.size()), kCpuThreads},
              EmbeddingGatherFn{table, tokens.data(), out, dim});
}

void RmsNorm(const float* x, const float* w, int32_t rows, int32_t dim, float eps, float* out) {
  for (int32_t r = 0; r < rows; ++r) {
    RmsNormRow(x + int64_t{r} * dim, w, dim, eps, out + int64_t{r} * dim);
  }
}

void Matmul(const float* w, int32_t out_dim, int32_t in_dim, const float* x, int32_t rows,
            float* y) {
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t i = 0; i < out_dim; ++i) {
      y[int64_t{r} * out_dim + i] =
          DotRow(w + int64_t{i} * in_dim, x + int64_t{r} * in_dim, in_dim);
    }
  }
}

void Rope(float* vec, int32_t rows, const int32_t* positions, int32_t num_heads,
          int32_t head_size, RopeKind kind, float theta) {
  LaunchOnCpu(Grid{rows, kCpuThreads},
              RopeFn{vec, positions, num_heads, head_size, kind, theta});
}

void KvWrite(float* cache, const KvCacheShape& shape, int32_t layer, const float* k,
             const float* v, int32_t rows, const int64_t* slots) {
  LaunchOnCpu(Grid{rows, kCpuThreads}, KvWriteFn{cache, shape, layer, k, v, slots});
}

void PagedAttention(const PagedAttentionArgs& args) {
  std::vector<float> scores;
  for (int32_t r = 0; r < args.num_rows; ++r) {
    scores.resize(static_cast<size_t>(args.row_pos[r]) + 1);
    for (int32_t h = 0; h < args.num_heads; ++h) AttendRowHead(args, r, h, scores.data());
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  LaunchOnCpu(Grid{(n + kCpuThreads - 1) / kCpuThreads, kCpuThreads},
              SiluMulFn{gate, up, out, n});
}

void ResidualAdd(float* x, const float* y, int64_t n) {
  LaunchOnCpu(Grid{(n + kCpuThreads - 1) / kCpuThreads, kCpuThreads},
              ResidualAddFn{x, y, n});
}

void Sample(const float* logits, int32_t rows, int32_t vocab, const SampleArgs* args,
            int32_t* out_tokens) {
  std::vector<float> probs(static_cast<size_t>(vocab));
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  for (int32_t r = 0; r < rows; ++r) {
    out_tokens[r] =
        SampleRow(logits + int64_t{r} * vocab, vocab, args[r], probs.data(), idx.data());
  }
}

void BlockGather(const float* cache, int64_t block_floats, std::span<const int32_t> block_ids,
                 float* staging) {
  LaunchOnCpu(Grid{static_cast<int64_t>(block_ids.size()), kCpuThreads},
              BlockCopyFn{const_cast<float*>(cache), staging, block_ids.data(), block_floats,
                          /*to_staging=*/true});
}

void BlockScatter(float* cache, int64_t block_floats, std::span<const int32_t> block_ids,
                  const float* staging) {
  LaunchOnCpu(Grid{static_cast<int64_t>(block_ids.size()), kCpuThreads},
              BlockCopyFn{cache, const_cast<float*>(staging), block_ids.data(), block_floats,
                          /*to_staging=*/false});
}

}  // namespace tandem::kernels::cpu
