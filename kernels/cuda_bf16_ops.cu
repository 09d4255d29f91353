#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "cuda_bf16_device.cuh"
#include "cuda_blas_handle.h"
#include "tandem/kernels/cuda_bf16_ops.h"

namespace tandem::kernels::cuda {

namespace {

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

// Threads of a one-block-per-row norm: a multiple of the warp (BlockSum's).
int RmsNormThreads(int32_t dim) { return dim >= 2048 ? 1024 : dim >= 512 ? 256 : 64; }

__global__ void RmsNormKernel(const float* x, const int32_t* row_index, const float* w,
                              int32_t dim, float eps, Bf16* out) {
  LetDependentsLaunch();
  const int64_t src = row_index != nullptr ? row_index[blockIdx.x] : blockIdx.x;
  const float* xr = x + src * dim;
  float ss = 0.0f;
  for (int32_t j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  Bf16* o = out + int64_t{blockIdx.x} * dim;
  for (int32_t j = threadIdx.x; j < dim; j += blockDim.x) o[j] = Store(w[j] * (inv * xr[j]));
}

// x[r] += w * y[r] / rms(y[r]) in fp32 (Gemma 3's norms of the attention's
// and the MLP's outputs, then the residual add), one block per row.
__global__ void RmsNormAddKernel(float* x, const float* y, const float* w, int32_t dim, float eps) {
  const float* yr = y + int64_t{blockIdx.x} * dim;
  float* xr = x + int64_t{blockIdx.x} * dim;
  float ss = 0.0f;
  for (int32_t j = threadIdx.x; j < dim; j += blockDim.x) ss += yr[j] * yr[j];
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int32_t j = threadIdx.x; j < dim; j += blockDim.x) xr[j] += w[j] * (inv * yr[j]);
}

// Grid (row, chunk of kRopeThreads): thread i of a row owns pair i of the
// row's q heads, then k heads, then v heads. A q or k pair is rotated in
// place and a k pair also written to the cache; a v pair is only copied.
// Pairs past rotary_dim / 2 (partial RoPE) are copied as they are.
// No thread reads what another writes, so there is no barrier, and a
// single decode row spreads over as many blocks as it has heads.
constexpr int kRopeThreads = 128;
__global__ void RopeKvWriteKernel(float* qkv, int32_t q_stride, const int32_t* positions,
                                  int32_t num_heads, KvCacheShape shape, RopeKind kind, float theta,
                                  const float* inv_freq, float amplitude, int32_t rotary_dim,
                                  Bf16* cache, int32_t layer, const int64_t* slots) {
  const int64_t row = blockIdx.x;
  const int32_t hs = shape.head_size, half = hs / 2, kvh = shape.num_kv_heads;
  const int32_t rd = rotary_dim > 0 ? rotary_dim : hs;
  const int32_t i = blockIdx.y * kRopeThreads + threadIdx.x;
  if (i >= (num_heads + 2 * kvh) * half) return;
  const int32_t head = i / half, pair = i % half;
  float* hv = qkv + row * q_stride + int64_t{head} * hs;  // k and v heads follow q's
  if (head < num_heads + kvh && 2 * pair < rd) {
    float c, s;
    RopeCosSin(positions[row], pair, rd, theta, inv_freq, amplitude, &c, &s);
    RopePair(hv, pair, rd, kind, c, s);
  }
  const int64_t slot = slots[row];
  if (head < num_heads || slot < 0) return;
  // RopePair's two elements of this pair (any split of a v head would do).
  int32_t i0, i1;
  RopePairIndices(pair, rd, kind, &i0, &i1);
  const bool is_v = head >= num_heads + kvh;
  const int32_t kv_head = head - num_heads - (is_v ? kvh : 0);
  Bf16* dst = cache +
              shape.Offset(slot / shape.block_size, layer, is_v ? 1 : 0,
                           static_cast<int32_t>(slot % shape.block_size), 0) +
              int64_t{kv_head} * hs;
  dst[i0] = Store(hv[i0]);
  dst[i1] = Store(hv[i1]);
}

// out[r][c .. c + V) for a thread (x: chunks of a row's columns, y: rows,
// looping past the grid's 65,535), V = 4 where hidden allows: 16-byte loads
// of the gate and the up halves, one 8-byte store, and no 64-bit division
// per element (at 8,192 prefill rows of Llama-3.2-1B the kernel moves 671
// MB a layer). The same arithmetic per element for any V.
template <int V>
__global__ void SiluMulKernel(const float* gu, int32_t hidden, int32_t rows, Bf16* out,
                              ActKind kind) {
  LetDependentsLaunch();
  const int32_t c = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= hidden) return;
  auto act = [kind](float g, float u) {
    return kind == ActKind::kGeluTanh ? GeluTanhMul(g, u) : g / (1.0f + __expf(-g)) * u;
  };
  for (int32_t r = static_cast<int32_t>(blockIdx.y); r < rows;
       r += static_cast<int32_t>(gridDim.y)) {
    const float* g = gu + int64_t{r} * 2 * hidden + c;
    const float* u = g + hidden;
    Bf16* o = out + int64_t{r} * hidden + c;
    if constexpr (V == 4) {
      const float4 gv = *reinterpret_cast<const float4*>(g);
      const float4 uv = *reinterpret_cast<const float4*>(u);
      *reinterpret_cast<uint2*>(o) = make_uint2(PackBf16(act(gv.x, uv.x), act(gv.y, uv.y)),
                                                PackBf16(act(gv.z, uv.z), act(gv.w, uv.w)));
    } else {
      *o = Store(act(*g, *u));
    }
  }
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
  auto take = [&](float v, int32_t i) {
    if (Better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  };
  // 16-byte loads, four in flight per thread (a row is 0.5 MB for a 128k
  // vocabulary and one block reads it: latency, not bandwidth, bounds it).
  // Better orders by index on ties, so the visiting order does not matter.
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int32_t n4 = aligned && vocab % 4 == 0 ? vocab / 4 : 0;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int32_t stride = static_cast<int32_t>(blockDim.x);
  int32_t i = static_cast<int32_t>(threadIdx.x);
  for (; i + 3 * stride < n4; i += 4 * stride) {
    float4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = x4[i + k * stride];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int32_t j = 4 * (i + k * stride);
      take(v[k].x, j), take(v[k].y, j + 1), take(v[k].z, j + 2), take(v[k].w, j + 3);
    }
  }
  for (; i < n4; i += stride) {
    const float4 v = x4[i];
    take(v.x, 4 * i), take(v.y, 4 * i + 1), take(v.z, 4 * i + 2), take(v.w, 4 * i + 3);
  }
  for (int32_t j = 4 * n4 + static_cast<int32_t>(threadIdx.x); j < vocab; j += stride) {
    take(x[j], j);
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

// Decode GEMMs (rows <= kGemvMaxRows): one warp per output, each lane
// streams 16-byte runs of the weight row (the warp reads 512 contiguous
// bytes per load, kGemvUnroll loads in flight) against every input row, fp32
// sums reduced across the warp. cuBLAS's kernels for these shapes read the
// weights at 55-70% of an H200's bandwidth (ncu, Llama-3.2-1B decode at
// batch 1: 0.90 ms of GEMMs against 0.52 ms of weight traffic); the weights
// are the whole cost of such a step.
// Eight loads in flight (4 KiB a warp): a 2,048-wide row (q/k/v, o, gate and
// up of a 1B model) is one round trip to memory instead of two, a warp of
// an 8,192-wide one keeps twice the bytes in flight, and a row whose lanes
// end part-way through the eight loads them together (predicated), not one
// round trip each. Each lane still adds its runs in order, so the sums and
// bits are the four-load kernel's (kernels_simt_bf16_ops_test pins them).
constexpr int kGemvWarps = 8;
constexpr int kGemvUnroll = 8;

// kDependent: launched as a programmatic dependent of the kernel before it
// (LaunchGemvRows), so the block may run while that kernel finishes:
// it sends its weight rows toward L2 (they do not depend on that kernel),
// then waits before it reads x or touches y. The sums are the same either
// way, so are the bits.
template <int R, bool kDependent>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvBf16Kernel(const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x, float* y,
                   float beta) {
  const int32_t o = blockIdx.x * kGemvWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if constexpr (kDependent) {
    if (o < out_dim) {
      const Bf16* row = w + int64_t{o} * in_dim;
      for (int32_t k = lane * 64; k < in_dim; k += 32 * 64) PrefetchL2(row + k);  // 128-byte lines
    }
    WaitForPriorGrid();
  }
  if (o >= out_dim) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + int64_t{o} * in_dim);
  const int32_t n = in_dim / 8;  // 16-byte runs per row
  float sum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sum[r] = 0.0f;
  auto fma8 = [&](const uint4& wv, int32_t k) {
    const uint32_t wp[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 xv = reinterpret_cast<const uint4*>(x + int64_t{r} * in_dim)[k];
      const uint32_t xp[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[r] += Bf16Half(wp[e / 2], e % 2) * Bf16Half(xp[e / 2], e % 2);
    }
  };
  for (int32_t k = lane; k < n; k += 32 * kGemvUnroll) {
    uint4 wv[kGemvUnroll];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      if (k + 32 * u < n) wv[u] = wr[k + 32 * u];
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      if (k + 32 * u < n) fma8(wv[u], k + 32 * u);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = sum[r];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) {
      float* dst = y + int64_t{r} * out_dim + o;
      *dst = beta == 0.0f ? v : v + beta * *dst;  // beta 0: y is not read (as cuBLAS)
    }
  }
}

#ifndef TANDEM_SIMT  // the CPU emulator (tests/kernels/simt) runs the kernels itself
template <int R>
int LaunchGemvRows(const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x, float* y,
                   float beta, bool dependent, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((out_dim + kGemvWarps - 1) / kGemvWarps);
  const unsigned threads = kGemvWarps * 32;
  if (!dependent) {
    GemvBf16Kernel<R, false><<<blocks, threads, 0, stream>>>(w, out_dim, in_dim, x, y, beta);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, GemvBf16Kernel<R, true>, w, out_dim, in_dim, x, y, beta);
}

int LaunchGemv(const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x, int32_t rows,
               float* y, float beta, bool dependent, cudaStream_t stream) {
  switch (rows) {
    case 1: return LaunchGemvRows<1>(w, out_dim, in_dim, x, y, beta, dependent, stream);
    case 2: return LaunchGemvRows<2>(w, out_dim, in_dim, x, y, beta, dependent, stream);
    case 3: return LaunchGemvRows<3>(w, out_dim, in_dim, x, y, beta, dependent, stream);
    default: return LaunchGemvRows<4>(w, out_dim, in_dim, x, y, beta, dependent, stream);
  }
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
  RmsNormKernel<<<rows, RmsNormThreads(dim), 0, S(stream)>>>(x, row_index, w, dim, eps, out);
  return cudaGetLastError();
}

int RmsNormAddBf16(float* x, const float* y, const float* w, int32_t rows, int32_t dim, float eps,
                   void* stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormAddKernel<<<rows, RmsNormThreads(dim), 0, S(stream)>>>(x, y, w, dim, eps);
  return cudaGetLastError();
}

int MatmulBf16(BlasHandle* blas, const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x,
               int32_t rows, float* y, float beta, bool dependent_launch, int32_t gemv_max_rows,
               int32_t tc_gemm_max_rows) {
  if (rows == 0) return cudaSuccess;
  if (rows > std::min(gemv_max_rows, kGemvMaxRows) &&
      rows <= std::min(tc_gemm_max_rows, kTcGemmMaxRows) && TcGemmTakes(in_dim, w, x)) {
    cudaStream_t stream = nullptr;
    if (cublasGetStream(blas->handle, &stream) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
    return TcGemmBf16(w, out_dim, in_dim, x, rows, y, beta, blas->workspace, blas->workspace_bytes,
                      stream);
  }
  if (rows <= std::min(gemv_max_rows, kGemvMaxRows) && in_dim % 8 == 0 &&
      reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    cudaStream_t stream = nullptr;
    if (cublasGetStream(blas->handle, &stream) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
    return LaunchGemv(w, out_dim, in_dim, x, rows, y, beta, dependent_launch, stream);
  }
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
                    const float* inv_freq, float amplitude, int32_t rotary_dim) {
  if (rows == 0) return cudaSuccess;
  const int32_t pairs = (num_heads + 2 * shape.num_kv_heads) * (shape.head_size / 2);
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((pairs + kRopeThreads - 1) / kRopeThreads));
  RopeKvWriteKernel<<<grid, kRopeThreads, 0, S(stream)>>>(qkv, q_stride, positions, num_heads,
                                                          shape, kind, theta, inv_freq, amplitude,
                                                          rotary_dim, cache, layer, slots);
  return cudaGetLastError();
}

int SiluMulBf16(const float* gate_up, int32_t rows, int32_t hidden, Bf16* out, void* stream,
                ActKind kind) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const bool vec = hidden % 4 == 0;
  const int32_t per_block = kThreads * (vec ? 4 : 1);
  const dim3 grid(static_cast<unsigned>((hidden + per_block - 1) / per_block),
                  static_cast<unsigned>(std::min(rows, 65535)));
  if (vec) {
    SiluMulKernel<4><<<grid, kThreads, 0, S(stream)>>>(gate_up, hidden, rows, out, kind);
  } else {
    SiluMulKernel<1><<<grid, kThreads, 0, S(stream)>>>(gate_up, hidden, rows, out, kind);
  }
  return cudaGetLastError();
}

int ArgMaxRows(const float* logits, int32_t rows, int32_t vocab, int32_t* out, void* stream) {
  if (rows == 0) return cudaSuccess;
  ArgMaxKernel<<<rows, 1024, 0, S(stream)>>>(logits, vocab, out);
  return cudaGetLastError();
}

bool DeviceHasDependentLaunch(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}

int CopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(stream));
}
int StreamSynchronize(void* stream) { return cudaStreamSynchronize(S(stream)); }
int LaunchHostFunc(void* stream, void (*fn)(void*), void* arg) {
  return cudaLaunchHostFunc(S(stream), fn, arg);
}

#else
}  // namespace
#endif  // TANDEM_SIMT

}  // namespace tandem::kernels::cuda
