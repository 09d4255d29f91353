// Skinny GEMMs on tensor cores (issue 31): y = x W^T + beta y for decode
// batches of 5 to kTcGemmMaxRows rows, where cuBLAS read the weights at about
// 54% of an H200's bandwidth (round two's profile: 960 us of GEMMs a
// Llama-3.2-1B step at batch 32, against 803 us for the GEMV at batch 1).
//
// The weights are the traffic, so they stream from global memory straight
// into mma.sync m16n8k16 A fragments (W's rows are the MMA's rows), and the
// batch is the n side (x's rows, 8 tokens an n-tile). A block of 4 warps
// takes 64 output rows (a warp 16) over one slice of the reduction; the
// slice's x goes through shared memory, 64 dimensions at a time (cp.async,
// two stages), and serves the 4 warps. Within each 64-dimension chunk, lane
// (g, t) reads dimensions [16t, 16t + 16) of its rows, 32 contiguous bytes:
// the reduction index k of k-step s maps to dimension 16t + 4s + (0, 1 for
// k = 2t, 2t+1; 2, 3 for k = 2t+8, 2t+9), the same for W and x, so every
// dimension is summed once.
//
// Small out_dim leaves too few blocks to stream the weights, so the
// reduction splits over TcGemmSplits(out_dim, in_dim) blocks, whose partial
// sums a second kernel adds in split order. The splits depend on the shape
// only, and the MMA reduces each output on its own: a row's result does not
// depend on the rows beside it (a decode graph's padded bucket gives the
// eager step's bits).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda_bf16_device.cuh"
#include "tandem/kernels/cuda_bf16_ops.h"

namespace tandem::kernels::cuda {

namespace {

constexpr int kTcGemmWarps = 4;
constexpr int kTcGemmThreads = kTcGemmWarps * 32;
constexpr int kBlockOutputs = 16 * kTcGemmWarps;  // a warp's m-tile each
constexpr int kChunk = 64;                        // dimensions per stage
constexpr int kXStride = kChunk + 8;              // padded shared rows (distinct banks per quad)

// kNT n-tiles of 8 batch rows. Block (bx, split): outputs [64 bx, + 64) over
// chunks [split * chunks / splits, (split + 1) * chunks / splits).
template <int kNT>
__global__ void __launch_bounds__(kTcGemmThreads, 4)
    TcGemmKernel(const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x, int32_t rows,
                 float* y, float beta, int32_t splits, float* partial) {
  LetDependentsLaunch();
  __shared__ __align__(16) Bf16 xs[2][kNT * 8][kXStride];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int32_t o0 = static_cast<int32_t>(blockIdx.x) * kBlockOutputs + 16 * warp;
  const int32_t split = static_cast<int32_t>(blockIdx.y);
  const int32_t chunks = in_dim / kChunk;
  const int32_t c_begin = static_cast<int32_t>(int64_t{split} * chunks / splits);
  const int32_t c_end = static_cast<int32_t>(int64_t{split + 1} * chunks / splits);
  // This lane's two weight rows (a row past out_dim reads the last one:
  // finite, never stored).
  const Bf16* w0 = w + int64_t{min(o0 + g, out_dim - 1)} * in_dim + 16 * t;
  const Bf16* w1 = w + int64_t{min(o0 + g + 8, out_dim - 1)} * in_dim + 16 * t;

  // Copies chunk c of x's rows into stage buf; rows past `rows` become zeros.
  auto load_x = [&](int32_t c, int buf) {
    for (int i = threadIdx.x; i < kNT * 8 * (kChunk / 8); i += kTcGemmThreads) {
      const int r = i / (kChunk / 8), v = (i % (kChunk / 8)) * 8;
      const bool real = r < rows;
      CpAsync16(&xs[buf][r][v], x + int64_t{real ? r : 0} * in_dim + int64_t{c} * kChunk + v,
                real ? 16 : 0);
    }
    CpAsyncCommit();
  };
  // This lane's 16 dimensions of chunk c of its two weight rows: words
  // 2s and 2s + 1 of each are k-step s's (k = 2t, 2t+1) and (2t+8, 2t+9).
  auto load_w = [&](int32_t c, uint4(&wv)[4]) {
    const uint4* p0 = reinterpret_cast<const uint4*>(w0 + int64_t{c} * kChunk);
    const uint4* p1 = reinterpret_cast<const uint4*>(w1 + int64_t{c} * kChunk);
    wv[0] = p0[0], wv[1] = p0[1], wv[2] = p1[0], wv[3] = p1[1];
  };

  float acc[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  uint4 wv[4], wn[4];
  if (c_begin < c_end) {
    load_x(c_begin, c_begin & 1);
    load_w(c_begin, wv);
  }
  for (int32_t c = c_begin; c < c_end; ++c) {
    const int buf = c & 1;
    if (c + 1 < c_end) {
      load_x(c + 1, buf ^ 1);  // that stage's readers passed the barrier below
      load_w(c + 1, wn);       // in flight while this chunk computes
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // this stage's copies, from every thread, have landed
    // Row g's and row g + 8's 8 words: k-step s takes words 2s and 2s + 1
    // (dims 4s, 4s + 1 and 4s + 2, 4s + 3 of the lane's 16).
    const uint32_t r0[8] = {wv[0].x, wv[0].y, wv[0].z, wv[0].w, wv[1].x, wv[1].y, wv[1].z, wv[1].w};
    const uint32_t r1[8] = {wv[2].x, wv[2].y, wv[2].z, wv[2].w, wv[3].x, wv[3].y, wv[3].z, wv[3].w};
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      // Batch row 8j + g's same 16 dims, two 16-byte shared loads (a
      // quarter-warp's 8 lanes hit distinct banks with the padded rows).
      const uint4* xp = reinterpret_cast<const uint4*>(&xs[buf][8 * j + g][16 * t]);
      const uint4 x0 = xp[0], x1 = xp[1];
      const uint32_t xr[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t a[4] = {r0[2 * s], r1[2 * s], r0[2 * s + 1], r1[2 * s + 1]};
        Mma(acc[j], a, xr[2 * s], xr[2 * s + 1]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
#pragma unroll
    for (int i = 0; i < 4; ++i) wv[i] = wn[i];
  }

  // acc[j]: outputs o0 + g (0, 1) and o0 + g + 8 (2, 3), batch rows
  // 8j + 2t and + 1.
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int32_t o = o0 + g + (e >= 2 ? 8 : 0), r = 8 * j + 2 * t + (e % 2);
      if (o >= out_dim || r >= rows) continue;
      if (splits > 1) {
        partial[(int64_t{split} * rows + r) * out_dim + o] = acc[j][e];
      } else {
        float* dst = y + int64_t{r} * out_dim + o;
        *dst = beta == 0.0f ? acc[j][e] : acc[j][e] + beta * *dst;  // beta 0: y is not read
      }
    }
  }
}

// y = the splits' partial sums added in split order, + beta y.
__global__ void TcGemmReduceKernel(const float* partial, int32_t splits, int64_t n, float* y,
                                   float beta) {
  LetDependentsLaunch();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = partial[i];
  for (int32_t s = 1; s < splits; ++s) v += partial[s * n + i];
  y[i] = beta == 0.0f ? v : v + beta * y[i];
}

#ifndef TANDEM_SIMT  // the CPU emulator (tests/kernels/simt) runs the kernels itself
template <int kNT>
int Launch(const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x, int32_t rows, float* y,
           float beta, int32_t splits, float* partial, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((out_dim + kBlockOutputs - 1) / kBlockOutputs),
                  static_cast<unsigned>(splits));
  TcGemmKernel<kNT>
      <<<grid, kTcGemmThreads, 0, stream>>>(w, out_dim, in_dim, x, rows, y, beta, splits, partial);
  if (splits == 1) return cudaGetLastError();
  const int64_t n = int64_t{rows} * out_dim;
  TcGemmReduceKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(partial, splits, n,
                                                                                 y, beta);
  return cudaGetLastError();
}
#endif  // TANDEM_SIMT

}  // namespace

#ifndef TANDEM_SIMT
int32_t TcGemmSplits(int32_t out_dim, int32_t in_dim, size_t workspace_bytes) {
  constexpr int64_t kTargetBlocks = 2 * 132;  // two a multiprocessor of an H100 / H200
  const int64_t blocks = (out_dim + kBlockOutputs - 1) / kBlockOutputs;
  const int64_t chunks = in_dim / kChunk;
  int64_t splits = (kTargetBlocks + blocks - 1) / blocks;
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, chunks / 2));  // two chunks a split
  // The partial sums of kTcGemmMaxRows rows fit the workspace.
  const int64_t per_split = int64_t{kTcGemmMaxRows} * out_dim * static_cast<int64_t>(sizeof(float));
  splits = std::min<int64_t>(
      splits, std::max<int64_t>(1, static_cast<int64_t>(workspace_bytes) / per_split));
  return static_cast<int32_t>(std::max<int64_t>(1, splits));
}

int TcGemmBf16(const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x, int32_t rows,
               float* y, float beta, void* workspace, size_t workspace_bytes, void* stream) {
  if (rows <= 0 || rows > kTcGemmMaxRows || !TcGemmTakes(in_dim, w, x)) {
    return cudaErrorInvalidValue;
  }
  const int32_t splits = TcGemmSplits(out_dim, in_dim, workspace_bytes);
  float* partial = static_cast<float*>(workspace);
  if (splits > 1 && partial == nullptr) return cudaErrorInvalidValue;
  // The launch for ceil(rows / 8) n-tiles.
  using LaunchFn = int (*)(const Bf16*, int32_t, int32_t, const Bf16*, int32_t, float*, float,
                           int32_t, float*, cudaStream_t);
  static constexpr LaunchFn kLaunch[] = {Launch<1>, Launch<2>, Launch<3>, Launch<4>,
                                         Launch<5>, Launch<6>, Launch<7>, Launch<8>};
  return kLaunch[(rows + 7) / 8 - 1](w, out_dim, in_dim, x, rows, y, beta, splits, partial,
                                     S(stream));
}
#endif  // TANDEM_SIMT

}  // namespace tandem::kernels::cuda
