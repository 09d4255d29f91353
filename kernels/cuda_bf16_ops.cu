#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "cuda_blas_handle.h"
#include "tandem/kernels/cuda_bf16_ops.h"

namespace tandem::kernels::cuda {

namespace {

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

__device__ __forceinline__ float Load(const Bf16* p) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}
__device__ __forceinline__ Bf16 Store(float f) {
  const __nv_bfloat16 b = __float2bfloat16(f);
  return *reinterpret_cast<const Bf16*>(&b);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? partial[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // partial[] may be reused by the caller's next BlockSum
  return v;
}

__global__ void EmbeddingGatherKernel(const Bf16* table, int32_t dim, const int32_t* tokens,
                                      float* out) {
  const Bf16* src = table + int64_t{tokens[blockIdx.x]} * dim;
  float* dst = out + int64_t{blockIdx.x} * dim;
  for (int32_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = Load(src + j);
}

__global__ void RmsNormKernel(const float* x, const int32_t* row_index, const float* w,
                              int32_t dim, float eps, Bf16* out) {
  const int64_t src = row_index != nullptr ? row_index[blockIdx.x] : blockIdx.x;
  const float* xr = x + src * dim;
  float ss = 0.0f;
  for (int32_t j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  Bf16* o = out + int64_t{blockIdx.x} * dim;
  for (int32_t j = threadIdx.x; j < dim; j += blockDim.x) o[j] = Store(w[j] * (inv * xr[j]));
}

// One block per row: RoPE on q and k (threads over (head, pair)), then K/V
// into the cache.
__global__ void RopeKvWriteKernel(float* qkv, int32_t q_stride, const int32_t* positions,
                                  int32_t num_heads, KvCacheShape shape, RopeKind kind,
                                  float theta, const float* inv_freq, Bf16* cache, int32_t layer,
                                  const int64_t* slots) {
  const int64_t row = blockIdx.x;
  const int32_t hs = shape.head_size, half = hs / 2, kvh = shape.num_kv_heads;
  float* q = qkv + row * q_stride;
  float* k = q + num_heads * hs;
  const float* v = k + kvh * hs;
  const int32_t pos = positions[row];
  for (int32_t i = threadIdx.x; i < (num_heads + kvh) * half; i += blockDim.x) {
    const int32_t head = i / half, pair = i % half;
    float c, s;
    RopeCosSin(pos, pair, hs, theta, inv_freq, &c, &s);
    RopePair(q + head * hs, pair, hs, kind, c, s);  // heads past num_heads are k's
  }
  __syncthreads();
  const int64_t slot = slots[row];
  if (slot < 0) return;
  const int64_t block = slot / shape.block_size;
  const int32_t off = static_cast<int32_t>(slot % shape.block_size);
  Bf16* kd = cache + shape.Offset(block, layer, 0, off, 0);
  Bf16* vd = cache + shape.Offset(block, layer, 1, off, 0);
  for (int32_t i = threadIdx.x; i < kvh * hs; i += blockDim.x) {
    kd[i] = Store(k[i]);
    vd[i] = Store(v[i]);
  }
}

constexpr int kAttnWarps = 4;
constexpr int kMaxGroup = 8;  // query heads per block (more: several blocks per KV head)
constexpr int kMaxE = 8;      // head elements per lane

// L lanes cooperate on one token; each holds E = ceil(head_size / L) <= kMaxE
// consecutive elements of the head.
// 8 bf16 at p (16-byte aligned) as floats, in one 16-byte load.
__device__ __forceinline__ void Load8(const Bf16* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// kG: query heads per block (a power of two >= the GQA group, at most
// kMaxGroup), so the per-head registers are only what the model needs.
template <int L, int kG>
__global__ void __launch_bounds__(kAttnWarps * 32)
    PagedAttentionKernel(Bf16AttentionArgs a, int32_t num_splits, float* scratch) {
  constexpr int kGroupsPerWarp = 32 / L;
  constexpr int kSlots = kAttnWarps * kGroupsPerWarp;
  extern __shared__ float smem[];
  const KvCacheShape& sh = a.shape;
  const int32_t hs = sh.head_size;
  const int32_t group = a.num_heads / sh.num_kv_heads;
  const int32_t head_chunks = (group + kG - 1) / kG;
  int64_t bx = blockIdx.x;
  const int32_t chunk = static_cast<int32_t>(bx % head_chunks);
  bx /= head_chunks;
  const int32_t kvh = static_cast<int32_t>(bx % sh.num_kv_heads);
  const int32_t row = a.rows != nullptr ? a.rows[bx / sh.num_kv_heads]
                                        : static_cast<int32_t>(bx / sh.num_kv_heads);
  const int32_t split = blockIdx.y;
  const int32_t ctx = a.row_pos[row] + 1;
  const int32_t t_begin = split * kAttentionSplitTokens;
  if (t_begin >= ctx) return;
  const int32_t t_end = min(ctx, t_begin + kAttentionSplitTokens);
  const int32_t h0 = kvh * group + chunk * kG;
  const int32_t G = min(kG, group - chunk * kG);
  const int32_t* table = a.block_tables + a.row_table_offset[row];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane % L, grp = lane / L;
  const int32_t E = (hs + L - 1) / L;
  const int32_t d0 = sub * E;
  const bool vec = hs == L * kMaxE;
  const float scale = rsqrtf(static_cast<float>(hs));

  float q[kG][kMaxE];
  float acc[kG][kMaxE];
  float m[kG], l[kG];
#pragma unroll
  for (int j = 0; j < kG; ++j) {
    m[j] = -FLT_MAX;
    l[j] = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {
      const int32_t d = d0 + e;
      q[j][e] = (j < G && e < E && d < hs) ? a.q[int64_t{row} * a.q_stride + (h0 + j) * hs + d] *
                                                  scale
                                            : 0.0f;
      acc[j][e] = 0.0f;
    }
  }

  // The loop condition is uniform across the warp (the shuffles need every
  // lane); a lane group past the end masks its token.
  for (int32_t base = t_begin + warp * kGroupsPerWarp; base < t_end;
       base += kAttnWarps * kGroupsPerWarp) {
    const int32_t t = base + grp;
    const bool valid = t < t_end;
    float kr[kMaxE], vr[kMaxE];
    if (valid) {
      const int32_t blk = table[t / sh.block_size], slot = t % sh.block_size;
      const Bf16* kp = a.cache + sh.Offset(blk, a.layer, 0, slot, kvh);
      const Bf16* vp = a.cache + sh.Offset(blk, a.layer, 1, slot, kvh);
      if (vec) {  // the head is exactly L * 8 elements: 16-byte loads
        Load8(kp + d0, kr);
        Load8(vp + d0, vr);
      } else {
#pragma unroll
        for (int e = 0; e < kMaxE; ++e) {
          const bool in = e < E && d0 + e < hs;
          kr[e] = in ? Load(kp + d0 + e) : 0.0f;
          vr[e] = in ? Load(vp + d0 + e) : 0.0f;
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) kr[e] = vr[e] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      if (j >= G) break;
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) s += q[j][e] * kr[e];
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (valid) {
        const float m_new = fmaxf(m[j], s);
        const float corr = __expf(m[j] - m_new);
        const float p = __expf(s - m_new);
        l[j] = l[j] * corr + p;
#pragma unroll
        for (int e = 0; e < kMaxE; ++e) acc[j][e] = acc[j][e] * corr + p * vr[e];
        m[j] = m_new;
      }
    }
  }

  // Slots (one per lane group) -> shared memory: m, l, then acc[head_size].
  const int32_t stride = hs + 2;
  const int slot_id = warp * kGroupsPerWarp + grp;
#pragma unroll
  for (int j = 0; j < kG; ++j) {
    if (j >= G) break;
    float* dst = smem + (slot_id * kG + j) * stride;
    if (sub == 0) {
      dst[0] = m[j];
      dst[1] = l[j];
    }
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {
      if (e < E && d0 + e < hs) dst[2 + d0 + e] = acc[j][e];
    }
  }
  __syncthreads();
  const bool single = ctx <= kAttentionSplitTokens;
  for (int32_t i = threadIdx.x; i < G * hs; i += blockDim.x) {
    const int32_t j = i / hs, d = i % hs;
    float mx = -FLT_MAX;
    for (int s = 0; s < kSlots; ++s) mx = fmaxf(mx, smem[(s * kG + j) * stride]);
    float lsum = 0.0f, asum = 0.0f;
    for (int s = 0; s < kSlots; ++s) {
      const float* src = smem + (s * kG + j) * stride;
      const float w = __expf(src[0] - mx);
      lsum += src[1] * w;
      asum += src[2 + d] * w;
    }
    const int32_t h = h0 + j;
    if (single) {
      a.out[(int64_t{row} * a.num_heads + h) * hs + d] = Store(asum / lsum);
    } else {
      float* p = scratch + ((int64_t{row} * a.num_heads + h) * num_splits + split) * stride;
      if (d == 0) {
        p[0] = mx;
        p[1] = lsum;
      }
      p[2 + d] = asum;
    }
  }
}

// Combines the splits of rows whose context spans more than one.
__global__ void CombineSplitsKernel(Bf16AttentionArgs a, int32_t num_splits,
                                    const float* scratch) {
  const int32_t i = blockIdx.x / a.num_heads, h = blockIdx.x % a.num_heads;
  const int32_t row = a.rows != nullptr ? a.rows[i] : i;
  const int32_t ctx = a.row_pos[row] + 1;
  if (ctx <= kAttentionSplitTokens) return;
  const int32_t n = (ctx + kAttentionSplitTokens - 1) / kAttentionSplitTokens;
  const int32_t hs = a.shape.head_size, stride = hs + 2;
  const float* base = scratch + (int64_t{row} * a.num_heads + h) * num_splits * stride;
  float mx = -FLT_MAX;
  for (int32_t s = 0; s < n; ++s) mx = fmaxf(mx, base[s * stride]);
  for (int32_t d = threadIdx.x; d < hs; d += blockDim.x) {
    float lsum = 0.0f, asum = 0.0f;
    for (int32_t s = 0; s < n; ++s) {
      const float w = __expf(base[s * stride] - mx);
      lsum += base[s * stride + 1] * w;
      asum += base[s * stride + 2 + d] * w;
    }
    a.out[(int64_t{row} * a.num_heads + h) * hs + d] = Store(asum / lsum);
  }
}

__global__ void SiluMulKernel(const float* gu, int32_t hidden, int64_t n, Bf16* out,
                              ActKind kind) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t r = i / hidden, c = i % hidden;
  const float g = gu[r * 2 * hidden + c], u = gu[r * 2 * hidden + hidden + c];
  out[i] = Store(kind == ActKind::kGeluTanh ? GeluTanhMul(g, u) : g / (1.0f + __expf(-g)) * u);
}

// (value, index) pair ordering: larger value first, then lower index.
__device__ __forceinline__ bool Better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

// Reduces (bv, bi) across the warp with Better; every lane gets the result.
__device__ __forceinline__ void WarpArgMax(float& bv, int32_t& bi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
}

__global__ void ArgMaxKernel(const float* logits, int32_t vocab, int32_t* out) {
  const float* x = logits + int64_t{blockIdx.x} * vocab;
  float bv = -FLT_MAX;
  int32_t bi = INT32_MAX;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = x[i];
    if (Better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  WarpArgMax(bv, bi);
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp != 0) return;
  const int warps = blockDim.x / 32;
  bv = lane < warps ? sv[lane] : -FLT_MAX;
  bi = lane < warps ? si[lane] : INT32_MAX;
  WarpArgMax(bv, bi);
  // All -inf or NaN logits: kernels::ArgMax answers 0.
  if (lane == 0) out[blockIdx.x] = bi == INT32_MAX ? 0 : bi;
}

template <int L, int kG>
int LaunchAttention(const Bf16AttentionArgs& a, int32_t splits, float* scratch, void* stream) {
  constexpr int kSlots = kAttnWarps * (32 / L);
  const int32_t group = a.num_heads / a.shape.num_kv_heads;
  const int32_t chunks = (group + kG - 1) / kG;
  const size_t smem = sizeof(float) * kSlots * kG * (a.shape.head_size + 2);
  // At most 4 * 8 * 8 * (32 + 2) floats (L = 4) .. 4 * 8 * (256 + 2) (L = 32):
  // about 34 KiB, under the 48 KiB that needs no opt-in.
  const dim3 grid(static_cast<unsigned>(int64_t{a.num_rows} * a.shape.num_kv_heads * chunks),
                  static_cast<unsigned>(splits));
  PagedAttentionKernel<L, kG><<<grid, kAttnWarps * 32, smem, S(stream)>>>(a, splits, scratch);
  return cudaGetLastError();
}

template <int L>
int LaunchAttentionForGroup(const Bf16AttentionArgs& a, int32_t splits, float* scratch,
                            void* stream) {
  const int32_t group = a.num_heads / a.shape.num_kv_heads;
  if (group <= 1) return LaunchAttention<L, 1>(a, splits, scratch, stream);
  if (group <= 2) return LaunchAttention<L, 2>(a, splits, scratch, stream);
  if (group <= 4) return LaunchAttention<L, 4>(a, splits, scratch, stream);
  return LaunchAttention<L, kMaxGroup>(a, splits, scratch, stream);
}

}  // namespace

int EmbeddingGatherBf16(const Bf16* table, int32_t dim, const int32_t* tokens, int32_t rows,
                        float* out, void* stream) {
  if (rows == 0) return cudaSuccess;
  EmbeddingGatherKernel<<<rows, 256, 0, S(stream)>>>(table, dim, tokens, out);
  return cudaGetLastError();
}

int RmsNormBf16(const float* x, const int32_t* row_index, const float* w, int32_t rows,
                int32_t dim, float eps, Bf16* out, void* stream) {
  if (rows == 0) return cudaSuccess;
  const int threads = dim >= 2048 ? 1024 : dim >= 512 ? 256 : 64;
  RmsNormKernel<<<rows, threads, 0, S(stream)>>>(x, row_index, w, dim, eps, out);
  return cudaGetLastError();
}

int MatmulBf16(BlasHandle* blas, const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x,
               int32_t rows, float* y, float beta) {
  if (rows == 0) return cudaSuccess;
  const float alpha = 1.0f;
  // Column-major view: Y (out x rows) = W^T-view (out x in) * X (in x rows).
  const cublasStatus_t s =
      cublasGemmEx(blas->handle, CUBLAS_OP_T, CUBLAS_OP_N, out_dim, rows, in_dim, &alpha, w,
                   CUDA_R_16BF, in_dim, x, CUDA_R_16BF, in_dim, &beta, y, CUDA_R_32F, out_dim,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? cudaGetLastError() : cudaErrorUnknown;
}

int RopeKvWriteBf16(float* qkv, int32_t q_stride, int32_t rows, const int32_t* positions,
                    int32_t num_heads, const KvCacheShape& shape, RopeKind kind, float theta,
                    Bf16* cache, int32_t layer, const int64_t* slots, void* stream,
                    const float* inv_freq) {
  if (rows == 0) return cudaSuccess;
  RopeKvWriteKernel<<<rows, 128, 0, S(stream)>>>(qkv, q_stride, positions, num_heads, shape, kind,
                                                 theta, inv_freq, cache, layer, slots);
  return cudaGetLastError();
}

int PagedAttentionBf16(const Bf16AttentionArgs& a, int32_t max_context, float* scratch,
                       void* stream) {
  if (a.num_rows == 0) return cudaSuccess;
  const int32_t hs = a.shape.head_size;
  if (hs <= 0 || hs > kMaxAttentionHeadSize || a.shape.num_kv_heads <= 0 ||
      a.num_heads % a.shape.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const int32_t splits = AttentionSplits(max_context);
  int err;
  if (hs <= 4 * kMaxE) {
    err = LaunchAttentionForGroup<4>(a, splits, scratch, stream);
  } else if (hs <= 8 * kMaxE) {
    err = LaunchAttentionForGroup<8>(a, splits, scratch, stream);
  } else if (hs <= 16 * kMaxE) {
    err = LaunchAttentionForGroup<16>(a, splits, scratch, stream);
  } else {
    err = LaunchAttentionForGroup<32>(a, splits, scratch, stream);
  }
  if (err != cudaSuccess || splits == 1) return err;
  CombineSplitsKernel<<<static_cast<unsigned>(int64_t{a.num_rows} * a.num_heads),
                        hs <= 64 ? 64 : 128, 0, S(stream)>>>(a, splits, scratch);
  return cudaGetLastError();
}

int SiluMulBf16(const float* gate_up, int32_t rows, int32_t hidden, Bf16* out, void* stream,
                ActKind kind) {
  const int64_t n = int64_t{rows} * hidden;
  if (n == 0) return cudaSuccess;
  SiluMulKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, S(stream)>>>(gate_up, hidden,
                                                                               n, out, kind);
  return cudaGetLastError();
}

int ArgMaxRows(const float* logits, int32_t rows, int32_t vocab, int32_t* out, void* stream) {
  if (rows == 0) return cudaSuccess;
  ArgMaxKernel<<<rows, 1024, 0, S(stream)>>>(logits, vocab, out);
  return cudaGetLastError();
}

int CopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(stream));
}
int StreamSynchronize(void* stream) { return cudaStreamSynchronize(S(stream)); }

}  // namespace tandem::kernels::cuda
