// Decode attention on tensor cores (issue 31): the rows PagedAttentionBf16
// takes (decodes and short prefill chunks), with the query heads of a GQA
// group as the rows of mma.sync m16n8k16 (bf16 in, fp32 accumulate).
//
// Why: on the H200 (2026-11-30) Llama-3.2-1B's decode at batch 256 spent
// 64% of its step in the split-K kernel, about 1.2 TB/s. With 4 query heads
// per KV head it does 4 FLOP per byte of K/V in fp32 FMAs, shuffles and
// exps: about 600 instructions per lane for 16 tokens, at 161 registers (3
// blocks of 4 warps per multiprocessor). Here a warp does the same 16
// tokens in 16 MMAs and about 100 other instructions, with no shared
// memory for K and V.
//
// One block per (row, KV head, chunk of up to 16 of its query heads, split
// of kAttentionSplitTokens tokens), as the split-K kernel's blocks: at batch
// 1 a warp per split would leave a quarter of the warps, each walking 128
// tokens in turn. Each of the 4 warps takes 32 of the split's tokens, 16 at
// a time, loading K and V from the cache straight into MMA fragments (the
// head dimensions and the output dimensions are permuted so that each
// lane's share is contiguous); the warps' states merge through shared
// memory in warp order, and the splits combine as the split-K kernel's do
// (same scratch, CombineAttentionSplits).
// - S = Q K^T: A is Q (row g: head g, row g + 8: head g + 8), B is K^T (n:
//   token). The reduction index k of k-step kk, lane t, maps to head
//   dimension t * D/4 + 4 kk + (0, 1 for k = 2t, 2t+1; 2, 3 for k = 2t+8,
//   2t+9), the same for Q and K, so the sum is over every dimension once
//   and lane (g, t) loads token g's dimensions [t D/4, (t+1) D/4): two
//   consecutive words per k-step.
// - O += P V: A is P, the S fragments of the tile's two 8-token halves as
//   FlashAttention-2 reuses them (rounded to bf16). B's n index of n-tile dn
//   is output dimension g * D/8 + dn, so lane (g, t) loads, for the tokens
//   of its P columns (2t, 2t+1, 8+2t, 8+2t+1), the dimensions [g D/8,
//   (g+1) D/8), and pairs them into fragments with a byte permute; its
//   output fragment holds dimensions [2t D/8, (2t+2) D/8) of rows g and
//   g + 8.
// Q and P are rounded to bf16 before their MMAs, as in the prefill kernel,
// so a row's result is not the split-K kernel's to the bit (within the
// prefill kernel's tolerance of the fp32 reference). It depends only on the
// row's own query and context (the MMA reduces each row on its own), so a
// decode graph gives the eager step's bits. Head sizes 32, 64, 96 and 128.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda_bf16_device.cuh"
#include "tandem/kernels/attention_plan.h"
#include "tandem/kernels/attention_split.h"
#include "tandem/kernels/cuda_bf16_ops.h"
#include "tandem/kernels/math.h"

namespace tandem::kernels::cuda {

namespace {

constexpr int kTcWarps = 4;  // warps per block, each kWarpTokens of the split
constexpr int kWarpTokens = kAttentionSplitTokens / kTcWarps;
constexpr int kTile = 16;  // tokens per MMA step (TensorCoreDecodeBlockSize)
static_assert(kWarpTokens % kTile == 0, "a warp's tokens are whole MMA steps");

// kWords 32-bit words from p: 16-byte loads where kWords is a multiple of 4
// (p then 16-byte aligned), else 8-byte ones.
template <int kWords>
__device__ __forceinline__ void LoadWords(const Bf16* p, uint32_t (&w)[kWords]) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else {
    static_assert(kWords % 2 == 0, "whole 8-byte loads");
#pragma unroll
    for (int i = 0; i < kWords / 2; ++i) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i];
      w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
  }
}

template <int kWords>
__device__ __forceinline__ void ZeroWords(uint32_t (&w)[kWords]) {
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = 0u;
}

template <int D, bool kCap>
__global__ void __launch_bounds__(kTcWarps * 32)
    DecodeAttentionTcKernel(Bf16AttentionArgs a, int32_t num_splits, int32_t head_chunks,
                            float* scratch) {
  LetDependentsLaunch();       // the output projection's GEMV may come up beside it
  constexpr int kKW = D / 8;   // K words a lane loads per token (D/4 dimensions)
  constexpr int kVW = D / 16;  // V words a lane loads per token (D/8 dimensions)
  constexpr int kKS = D / 16;  // k-steps of Q K^T
  constexpr int kDN = D / 8;   // n-tiles of the output
  __shared__ float slots[kTcWarps][16][D + 2];  // each warp's m, l and sum per head row
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const KvCacheShape& sh = a.shape;
  // Block b: split b % num_splits of (row, KV head, head chunk) b / num_splits.
  const int32_t split = static_cast<int32_t>(blockIdx.x % num_splits);
  int64_t rest = blockIdx.x / num_splits;
  const int32_t chunk = static_cast<int32_t>(rest % head_chunks);
  rest /= head_chunks;
  const int32_t kvh = static_cast<int32_t>(rest % sh.num_kv_heads);
  const int64_t listed = rest / sh.num_kv_heads;
  const int32_t row = a.rows != nullptr ? a.rows[listed] : static_cast<int32_t>(listed);
  const int32_t pos = a.row_pos[row];
  const int32_t ctx = pos + 1;
  const int32_t t_begin = split * kAttentionSplitTokens;
  if (t_begin >= ctx) return;  // the whole block
  const int32_t t_end = min(ctx, t_begin + kAttentionSplitTokens);
  const int32_t w_begin = t_begin + warp * kWarpTokens;
  const int32_t w_end = min(t_end, w_begin + kWarpTokens);
  const int32_t lo = WindowStart(pos, a.window);
  const int32_t group = a.num_heads / sh.num_kv_heads;
  const int32_t h0 = kvh * group + chunk * 16;
  const int32_t heads = min(16, group - chunk * 16);
  const int32_t* table = a.block_tables + a.row_table_offset[row];

  // Q's fragments; a row past the chunk's heads repeats its last head
  // (finite, never stored).
  uint32_t qa[kKS][4];
  {
    const float* q_row = a.q + int64_t{row} * a.q_stride + t * (D / 4);
    const float* q0 = q_row + int64_t{h0 + min(g, heads - 1)} * D;
    const float* q1 = q_row + int64_t{h0 + min(g + 8, heads - 1)} * D;
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk) {
      qa[kk][0] = PackBf16(q0[4 * kk], q0[4 * kk + 1]);
      qa[kk][1] = PackBf16(q1[4 * kk], q1[4 * kk + 1]);
      qa[kk][2] = PackBf16(q0[4 * kk + 2], q0[4 * kk + 3]);
      qa[kk][3] = PackBf16(q1[4 * kk + 2], q1[4 * kk + 3]);
    }
  }
  const float scale = rsqrtf(static_cast<float>(D));
  float o[kDN][4];
#pragma unroll
  for (int dn = 0; dn < kDN; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // A token's K row (kv 0) or V row (1). The cache's blocks hold whole
  // tiles (block sizes 16, 32, ...), so a tile's 16 tokens lie in one
  // block, slot_stride apart: one table lookup and one offset per tile (per
  // token, the address arithmetic was most of the loop's instructions).
  const int64_t slot_stride = int64_t{sh.num_kv_heads} * D;
  const int64_t v_after_k = int64_t{sh.block_size} * slot_stride;
  const Bf16* tile_k = nullptr;  // token tile_base's K row
  int32_t tile_base = 0;
  auto cache_row = [&](int32_t tok, int kv) {
    return tile_k + kv * v_after_k + (tok - tile_base) * slot_stride;
  };
  auto seen = [&](int32_t tok) { return tok >= lo && tok < t_end; };

  // Tiles below the window fold nothing: start at the one holding lo.
  int32_t first = w_begin;
  if (lo > first) first += (lo - first) / kTile * kTile;
  for (int32_t base = first; base < w_end; base += kTile) {
    tile_base = base;
    tile_k =
        a.cache + sh.Offset(table[base / sh.block_size], a.layer, 0, base % sh.block_size, kvh);
    // K of tokens base + g and base + 8 + g (this lane's D/4 dimensions),
    // V of base + 2t, + 1, base + 8 + 2t, + 1 (its D/8). The tile lies in
    // one allocated cache block, so every slot may be read: K whatever a
    // slot holds (its score is masked after the MMA, and a score depends on
    // its own token's K alone), V zeros where not seen, so that a zero
    // weight never meets a stale NaN.
    uint32_t kw[2][kKW], vw[4][kVW];
#pragma unroll
    for (int j = 0; j < 2; ++j) LoadWords(cache_row(base + 8 * j + g, 0) + t * (D / 4), kw[j]);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int32_t tok = base + 8 * (u / 2) + 2 * t + u % 2;
      if (seen(tok)) {
        LoadWords(cache_row(tok, 1) + g * (D / 8), vw[u]);
      } else {
        ZeroWords(vw[u]);
      }
    }
    // S = Q K^T over the tile's two 8-token halves.
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKS; ++kk) Mma(s[j], qa[kk], kw[j][2 * kk], kw[j][2 * kk + 1]);
    }
    // Scale, softcap, mask; the online softmax of rows g (i = 0) and g + 8
    // (i = 1), their maxima over the quad's lanes.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[j][e] * scale;
        if constexpr (kCap) v = a.softcap * tanhf(v / a.softcap);
        v = seen(base + 8 * j + 2 * t + (e & 1)) ? v : -INFINITY;
        s[j][e] = v;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], v);
      }
    }
    float m_use[2], corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      QuadSoftmaxStep(tile_max[i], mx[i], m_use[i], corr[i], [](float x) { return __expf(x); });
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = __expf(s[j][e] - m_use[e / 2]);
        sum[e / 2] += s[j][e];
      }
    }
    l[0] = l[0] * corr[0] + sum[0];
    l[1] = l[1] * corr[1] + sum[1];
    const uint32_t pa[4] = {PackBf16(s[0][0], s[0][1]), PackBf16(s[0][2], s[0][3]),
                            PackBf16(s[1][0], s[1][1]), PackBf16(s[1][2], s[1][3])};
    // O = O * corr + P V; n-tile dn's B: the tokens' dimension g D/8 + dn
    // (word dn / 2, half dn % 2), two tokens to a register.
#pragma unroll
    for (int dn = 0; dn < kDN; ++dn) {
      o[dn][0] *= corr[0];
      o[dn][1] *= corr[0];
      o[dn][2] *= corr[1];
      o[dn][3] *= corr[1];
      const uint32_t sel = dn % 2 == 0 ? 0x5410u : 0x7632u;
      const uint32_t b0 = __byte_perm(vw[0][dn / 2], vw[1][dn / 2], sel);
      const uint32_t b1 = __byte_perm(vw[2][dn / 2], vw[3][dn / 2], sel);
      Mma(o[dn], pa, b0, b1);
    }
  }

  // Each lane summed its own columns: the rows' sums over the quad. Then
  // the warp's state to shared memory (m is -FLT_MAX where it saw nothing,
  // as the split-K kernel's).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    float* slot = slots[warp][g + 8 * i];
    if (t == 0) {
      slot[0] = mx[i] == -INFINITY ? -FLT_MAX : mx[i];
      slot[1] = l[i];
    }
    // Output dimensions 2t D/8 + dn (column 2t) and (2t+1) D/8 + dn.
    const int32_t d0 = 2 * t * (D / 8), d1 = d0 + D / 8;
#pragma unroll
    for (int dn = 0; dn < kDN; ++dn) {
      slot[2 + d0 + dn] = o[dn][2 * i];
      slot[2 + d1 + dn] = o[dn][2 * i + 1];
    }
  }
  __syncthreads();
  // The warps' states merged in warp order: the output (a row of one
  // split) or the split's place in scratch.
  const bool single = ctx <= kAttentionSplitTokens;
  for (int32_t idx = threadIdx.x; idx < heads * D; idx += kTcWarps * 32) {
    const int32_t r = idx / D, d = idx % D;
    float m = -FLT_MAX;
#pragma unroll
    for (int v = 0; v < kTcWarps; ++v) m = fmaxf(m, slots[v][r][0]);
    float lsum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int v = 0; v < kTcWarps; ++v) {
      const float e = __expf(slots[v][r][0] - m);
      lsum += slots[v][r][1] * e;
      acc += slots[v][r][2 + d] * e;
    }
    const int64_t rh = int64_t{row} * a.num_heads + h0 + r;
    if (single) {
      a.out[rh * D + d] = Store(acc / lsum);
      continue;
    }
    float* p = scratch + (rh * num_splits + split) * (D + 2);
    if (d == 0) {
      p[0] = m;
      p[1] = lsum;
    }
    p[2 + d] = acc;
  }
}

#ifndef TANDEM_SIMT  // the CPU emulator runs the kernel itself
template <int D, bool kCap>
int Launch(const Bf16AttentionArgs& a, int32_t splits, float* scratch, void* stream) {
  const int32_t group = a.num_heads / a.shape.num_kv_heads;
  const int32_t head_chunks = (group + 15) / 16;
  const int64_t blocks = int64_t{a.num_rows} * a.shape.num_kv_heads * head_chunks * splits;
  DecodeAttentionTcKernel<D, kCap><<<static_cast<unsigned>(blocks), kTcWarps * 32, 0, S(stream)>>>(
      a, splits, head_chunks, scratch);
  return cudaGetLastError();
}

template <bool kCap>
int LaunchForHeadSize(const Bf16AttentionArgs& a, int32_t splits, float* scratch, void* stream) {
  switch (a.shape.head_size) {
    case 32:
      return Launch<32, kCap>(a, splits, scratch, stream);
    case 64:
      return Launch<64, kCap>(a, splits, scratch, stream);
    case 96:
      return Launch<96, kCap>(a, splits, scratch, stream);
    default:
      return Launch<128, kCap>(a, splits, scratch, stream);
  }
}

}  // namespace

int DecodeAttentionTcBf16(const Bf16AttentionArgs& a, int32_t max_context, float* scratch,
                          void* stream) {
  if (a.num_rows == 0) return cudaSuccess;
  if (!TensorCoreHeadSize(a.shape.head_size) || a.shape.num_kv_heads <= 0 ||
      a.num_heads % a.shape.num_kv_heads != 0 || !TensorCoreDecodeBlockSize(a.shape.block_size)) {
    return cudaErrorInvalidValue;
  }
  const int32_t splits = AttentionSplits(max_context);
  const int err = a.softcap > 0.0f ? LaunchForHeadSize<true>(a, splits, scratch, stream)
                                   : LaunchForHeadSize<false>(a, splits, scratch, stream);
  if (err != cudaSuccess || splits == 1) return err;
  return CombineAttentionSplits(a, splits, scratch, stream);
}

#else
}  // namespace
#endif  // TANDEM_SIMT

}  // namespace tandem::kernels::cuda
