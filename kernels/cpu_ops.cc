#include "tandem/kernels/cpu_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_simd.h"
#include "tandem/kernels/hd.h"

namespace tandem::kernels::cpu {
namespace {
constexpr int32_t kCpuThreads = 64;  // threads of the walked grid
}  // namespace

void EmbeddingGather(const float* table, int32_t dim, std::span<const int32_t> tokens, float* out) {
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

void Rope(float* vec, int32_t rows, const int32_t* positions, int32_t num_heads, int32_t head_size,
          RopeKind kind, float theta, const float* inv_freq, float amplitude, int32_t rotary_dim) {
  LaunchOnCpu(Grid{rows, kCpuThreads}, RopeFn{vec, positions, num_heads, head_size, kind, theta,
                                              inv_freq, amplitude, rotary_dim});
}

void KvWrite(float* cache, const KvCacheShape& shape, int32_t layer, const float* k, const float* v,
             int32_t rows, const int64_t* slots) {
  LaunchOnCpu(Grid{rows, kCpuThreads}, KvWriteFn{cache, shape, layer, k, v, slots});
}

namespace {

constexpr int32_t kLanes = 8;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

// AttendRowHead's arithmetic, op for op, arranged for a CPU: walks the block
// table without divisions and computes four scores at a time (four
// independent sequential sums) so the adds' latency overlaps. Bitwise equal
// to AttendRowHead (tested).
TANDEM_CPU_CLONES
void AttendRowHeadCpu(const PagedAttentionArgs& a, int32_t row, int32_t head,
                      float* __restrict scores, float* __restrict acc) {
  const KvCacheShape& sh = a.shape;
  const int32_t hs = sh.head_size;
  const int32_t pos = a.row_pos[row];
  const int32_t* table = a.block_tables + a.row_table_offset[row];
  const int32_t kv_head = head / (a.num_heads / sh.num_kv_heads);
  const int64_t stride = int64_t{sh.num_kv_heads} * hs;  // between slots of a block
  const float* __restrict q = a.q + (int64_t{row} * a.num_heads + head) * hs;
  const float scale = sqrtf(static_cast<float>(hs));
  // Positions lo .. pos: blocks b0 .. num_blocks - 1, slots first(t0) .. n(t0).
  const int32_t lo = WindowStart(pos, a.window);
  const int32_t b0 = lo / sh.block_size;
  const int32_t num_blocks = pos / sh.block_size + 1;
  auto first = [&](int32_t t0) { return std::max(0, lo - t0); };
  auto count = [&](int32_t t0) { return std::min(sh.block_size, pos + 1 - t0); };
  for (int32_t b = b0, t0 = b0 * sh.block_size; b < num_blocks; ++b, t0 += sh.block_size) {
    const float* kb = a.cache + sh.Offset(table[b], a.layer, 0, 0, kv_head);
    const int32_t n = count(t0);
    int32_t s = first(t0);
    for (; s + 4 <= n; s += 4) {
      const float* k0 = kb + s * stride;
      const float* k1 = k0 + stride;
      const float* k2 = k1 + stride;
      const float* k3 = k2 + stride;
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
      for (int32_t i = 0; i < hs; ++i) {
        a0 += q[i] * k0[i];
        a1 += q[i] * k1[i];
        a2 += q[i] * k2[i];
        a3 += q[i] * k3[i];
      }
      scores[t0 + s] = a0 / scale;
      scores[t0 + s + 1] = a1 / scale;
      scores[t0 + s + 2] = a2 / scale;
      scores[t0 + s + 3] = a3 / scale;
    }
    for (; s < n; ++s) {
      const float* k0 = kb + s * stride;
      float a0 = 0.0f;
      for (int32_t i = 0; i < hs; ++i) a0 += q[i] * k0[i];
      scores[t0 + s] = a0 / scale;
    }
  }
  if (a.softcap > 0.0f) {
    for (int32_t t = lo; t <= pos; ++t) scores[t] = TanhSoftcap(scores[t], a.softcap);
  }
  float max_val = scores[lo];
  for (int32_t t = lo + 1; t <= pos; ++t) {
    if (scores[t] > max_val) max_val = scores[t];
  }
  float sum = 0.0f;
  for (int32_t t = lo; t <= pos; ++t) {
    scores[t] = expf(scores[t] - max_val);
    sum += scores[t];
  }
  for (int32_t t = lo; t <= pos; ++t) scores[t] /= sum;
  // Each lane of a vector is one output element, summed over t in order.
  int32_t i0 = 0;
  for (; i0 + kLanes <= hs; i0 += kLanes) {
    Vec o = {};
    for (int32_t b = b0, t0 = b0 * sh.block_size; b < num_blocks; ++b, t0 += sh.block_size) {
      const float* vb = a.cache + sh.Offset(table[b], a.layer, 1, 0, kv_head) + i0;
      const int32_t n = count(t0);
      for (int32_t s = first(t0); s < n; ++s) {
        Vec v;
        std::memcpy(&v, vb + s * stride, sizeof(Vec));
        o = o + scores[t0 + s] * v;
      }
    }
    std::memcpy(acc + i0, &o, sizeof(Vec));
  }
  for (int32_t i = i0; i < hs; ++i) acc[i] = 0.0f;
  if (i0 < hs) {
    for (int32_t b = b0, t0 = b0 * sh.block_size; b < num_blocks; ++b, t0 += sh.block_size) {
      const float* vb = a.cache + sh.Offset(table[b], a.layer, 1, 0, kv_head);
      const int32_t n = count(t0);
      for (int32_t s = first(t0); s < n; ++s) {
        const float* __restrict v = vb + s * stride;
        const float w = scores[t0 + s];
        for (int32_t i = i0; i < hs; ++i) acc[i] += w * v[i];
      }
    }
  }
  std::memcpy(a.out + (int64_t{row} * a.num_heads + head) * hs, acc, hs * sizeof(float));
}

}  // namespace

void PagedAttention(const PagedAttentionArgs& args) { PagedAttentionRows(args, 0, args.num_rows); }

void PagedAttentionRows(const PagedAttentionArgs& args, int32_t row_begin, int32_t row_end) {
  std::vector<float> scores, acc(static_cast<size_t>(args.shape.head_size));
  for (int32_t r = row_begin; r < row_end; ++r) {
    scores.resize(static_cast<size_t>(args.row_pos[r]) + 1);
    for (int32_t h = 0; h < args.num_heads; ++h) {
      AttendRowHeadCpu(args, r, h, scores.data(), acc.data());
    }
  }
}

void PagedAttentionReference(const PagedAttentionArgs& args) {
  std::vector<float> scores;
  for (int32_t r = 0; r < args.num_rows; ++r) {
    scores.resize(static_cast<size_t>(args.row_pos[r]) + 1);
    for (int32_t h = 0; h < args.num_heads; ++h) AttendRowHead(args, r, h, scores.data());
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out, ActKind kind) {
  LaunchOnCpu(Grid{(n + kCpuThreads - 1) / kCpuThreads, kCpuThreads},
              SiluMulFn{gate, up, out, n, kind});
}

void AddBias(float* x, const float* bias, int32_t rows, int32_t width) {
  LaunchOnCpu(Grid{rows, kCpuThreads}, AddBiasFn{x, bias, width, width});
}

void Softcap(float* x, int64_t n, float cap) {
  LaunchOnCpu(Grid{(n + kCpuThreads - 1) / kCpuThreads, kCpuThreads}, SoftcapFn{x, cap, n});
}

void Scale(float* x, int64_t n, float scale) {
  LaunchOnCpu(Grid{(n + kCpuThreads - 1) / kCpuThreads, kCpuThreads}, ScaleFn{x, scale, n});
}

void ResidualAdd(float* x, const float* y, int64_t n) {
  LaunchOnCpu(Grid{(n + kCpuThreads - 1) / kCpuThreads, kCpuThreads}, ResidualAddFn{x, y, n});
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
