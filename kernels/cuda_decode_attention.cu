// The bf16 split-K ("flash-decoding") paged attention of PagedAttentionBf16:
// decode rows and the prefill rows that AttentionPlan keeps off the tensor
// cores. Two kernels compute it with the same arithmetic, so a row's bits do
// not depend on which one ran:
//
// - Per split: one block per (row, KV head, chunk of the GQA group's query
//   heads, split of kAttentionSplitTokens tokens). Each lane group loads its
//   tokens' K/V straight into registers; CombineSplitsKernel merges the
//   splits of rows longer than one. Many short blocks: right when rows are
//   few, since every split is a block of its own.
// - Pipelined: one block takes `splits_per_block` consecutive splits of its
//   row, and walks their tokens a stage (the tokens one pass of the block's
//   lane groups covers) at a time, K/V copied into shared memory with
//   cp.async kStages - 1 stages ahead of the stage being computed, so copies
//   stay in flight through the merge at each split's end. A block that
//   covers its row's every split also combines them. For large batches,
//   where one block per split left each block two stages of loads and then a
//   merge, and the profile (DESIGN-NOTES, round two) put the kernel at about
//   1.2 TB/s at batch 256.
//
// Each split is folded, merged and finished by the same device functions in
// both, in the same order: a lane group's tokens, the shuffle merge of a
// warp's lane groups, the block's merge of its warps through shared memory,
// then the splits' combine.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cfloat>

#include "cuda_bf16_device.cuh"
#include "tandem/kernels/cuda_bf16_ops.h"

namespace tandem::kernels::cuda {

namespace {

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * 32;
constexpr int kMaxGroup = 8;    // query heads per block (more: several blocks per KV head)
constexpr int kMaxE = 8;        // head elements per lane
constexpr int kAttnTokens = 4;  // tokens per lane group per loop iteration
constexpr int kStages = 3;      // the pipelined kernel's shared-memory stages

// What one block computes: row `row`'s query heads h0 .. h0 + G of KV head
// `kvh`, over positions lo .. ctx - 1 (lo > 0 under a sliding window).
struct AttnBlock {
  int32_t row, kvh, h0, G, ctx, lo;
  const int32_t* table;
};

template <int kG>
__device__ __forceinline__ AttnBlock LocateBlock(const Bf16AttentionArgs& a) {
  const KvCacheShape& sh = a.shape;
  const int32_t group = a.num_heads / sh.num_kv_heads;
  const int32_t head_chunks = (group + kG - 1) / kG;
  int64_t bx = blockIdx.x;
  const int32_t chunk = static_cast<int32_t>(bx % head_chunks);
  bx /= head_chunks;
  AttnBlock b;
  b.kvh = static_cast<int32_t>(bx % sh.num_kv_heads);
  b.row = a.rows != nullptr ? a.rows[bx / sh.num_kv_heads]
                            : static_cast<int32_t>(bx / sh.num_kv_heads);
  b.ctx = a.row_pos[b.row] + 1;
  b.lo = WindowStart(a.row_pos[b.row], a.window);
  b.h0 = b.kvh * group + chunk * kG;
  b.G = min(kG, group - chunk * kG);
  b.table = a.block_tables + a.row_table_offset[b.row];
  return b;
}

// A lane's place: L lanes cooperate on one token; each holds E =
// ceil(head_size / L) <= kMaxE consecutive elements from d0 (one 16-byte
// load when E = 8).
template <int L>
struct Lane {
  int lane, warp, sub, grp;
  int32_t E, d0;
  __device__ __forceinline__ explicit Lane(int32_t hs)
      : lane(threadIdx.x % 32),
        warp(threadIdx.x / 32),
        sub(lane % L),
        grp(lane / L),
        E((hs + L - 1) / L),
        d0(sub * E) {}
};

// A lane's online-softmax state for up to kG query heads, and its query.
template <int kG>
struct SplitState {
  float q[kG][kMaxE];
  float acc[kG][kMaxE];
  float m[kG], l[kG];

  __device__ __forceinline__ void Reset() {
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      m[j] = -FLT_MAX;
      l[j] = 0.0f;
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) acc[j][e] = 0.0f;
    }
  }
};

template <int L, int kG>
__device__ __forceinline__ void LoadQuery(const Bf16AttentionArgs& a, const AttnBlock& b,
                                          const Lane<L>& ln, SplitState<kG>& st) {
  const int32_t hs = a.shape.head_size;
  const float scale = rsqrtf(static_cast<float>(hs));
#pragma unroll
  for (int j = 0; j < kG; ++j) {
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {
      const int32_t d = ln.d0 + e;
      st.q[j][e] = (j < b.G && e < ln.E && d < hs)
                       ? a.q[int64_t{b.row} * a.q_stride + (b.h0 + j) * hs + d] * scale
                       : 0.0f;
    }
  }
}

// Fills the lane group's kAttnTokens tokens of the iteration at `base`:
// token t = base + u * (32 / L) + grp, valid in [t_lo, t_end), its K/V bf16
// pairs from fetch(t, kw[u], vw[u]), zeros where not valid. A fold of only
// invalid tokens leaves the softmax state as it was, bit for bit, so the
// tokens below a sliding window cost no loads and change nothing.
template <int L, typename Fetch>
__device__ __forceinline__ void GatherTokens(int32_t base, int32_t t_lo, int32_t t_end, int grp,
                                             uint32_t (&kw)[kAttnTokens][kMaxE / 2],
                                             uint32_t (&vw)[kAttnTokens][kMaxE / 2],
                                             bool (&valid)[kAttnTokens], Fetch fetch) {
#pragma unroll
  for (int u = 0; u < kAttnTokens; ++u) {
    const int32_t t = base + u * (32 / L) + grp;
    valid[u] = t >= t_lo && t < t_end;
#pragma unroll
    for (int w = 0; w < kMaxE / 2; ++w) kw[u][w] = vw[u][w] = 0u;
    if (valid[u]) fetch(t, kw[u], vw[u]);
  }
}

// A lane's 8 elements of one token's K and V: one 16-byte load each.
__device__ __forceinline__ void Load16(const Bf16* kp, const Bf16* vp, uint32_t (&kw)[kMaxE / 2],
                                       uint32_t (&vw)[kMaxE / 2]) {
  const uint4 k4 = *reinterpret_cast<const uint4*>(kp);
  const uint4 v4 = *reinterpret_cast<const uint4*>(vp);
  kw[0] = k4.x, kw[1] = k4.y, kw[2] = k4.z, kw[3] = k4.w;
  vw[0] = v4.x, vw[1] = v4.y, vw[2] = v4.z, vw[3] = v4.w;
}

// Folds kAttnTokens tokens (their K/V bf16 pairs, zero where !valid) into
// the online softmax: one max and one rescale of acc per call. kCap: Gemma
// 2's tanh softcapping of each score by `softcap` first (a template
// parameter, so that the kernels of every other model compile as before).
template <int L, int kG, bool kCap>
__device__ __forceinline__ void FoldTokens(const uint32_t (&kw)[kAttnTokens][kMaxE / 2],
                                           const uint32_t (&vw)[kAttnTokens][kMaxE / 2],
                                           const bool (&valid)[kAttnTokens], int32_t G,
                                           float softcap, SplitState<kG>& st) {
#pragma unroll
  for (int j = 0; j < kG; ++j) {
    if (j >= G) break;
    float s[kAttnTokens];
    float s_max = -FLT_MAX;
#pragma unroll
    for (int u = 0; u < kAttnTokens; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) dot += st.q[j][e] * Bf16Half(kw[u][e / 2], e % 2);
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if constexpr (kCap) dot = softcap * tanhf(dot / softcap);
      s[u] = valid[u] ? dot : -FLT_MAX;
      s_max = fmaxf(s_max, s[u]);
    }
    const float m_new = fmaxf(st.m[j], s_max);
    const float corr = __expf(st.m[j] - m_new);
    float p[kAttnTokens];
    float p_sum = 0.0f;
#pragma unroll
    for (int u = 0; u < kAttnTokens; ++u) {
      p[u] = valid[u] ? __expf(s[u] - m_new) : 0.0f;
      p_sum += p[u];
    }
    st.l[j] = st.l[j] * corr + p_sum;
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {
      float v = st.acc[j][e] * corr;
#pragma unroll
      for (int u = 0; u < kAttnTokens; ++u) v += p[u] * Bf16Half(vw[u][e / 2], e % 2);
      st.acc[j][e] = v;
    }
    st.m[j] = m_new;
  }
}

// The warp's lane groups merge by shuffles (the same head elements sit L
// lanes apart), so shared memory holds one slot per warp, not one per lane
// group: the block's final merge reads kAttnWarps slots.
template <int L, int kG>
__device__ __forceinline__ void MergeLaneGroups(SplitState<kG>& st) {
#pragma unroll
  for (int o = L; o < 32; o <<= 1) {
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      const float m_o = __shfl_xor_sync(0xffffffffu, st.m[j], o);
      const float l_o = __shfl_xor_sync(0xffffffffu, st.l[j], o);
      const float m_new = fmaxf(st.m[j], m_o);
      const float a_self = __expf(st.m[j] - m_new), a_other = __expf(m_o - m_new);
      st.l[j] = st.l[j] * a_self + l_o * a_other;
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) {
        const float acc_o = __shfl_xor_sync(0xffffffffu, st.acc[j][e], o);
        st.acc[j][e] = st.acc[j][e] * a_self + acc_o * a_other;
      }
      st.m[j] = m_new;
    }
  }
}

// Ends split `split` of the block's row, after MergeLaneGroups: the warps'
// slots go to shared memory `slots` (m, l, then acc[head_size] each), and
// the block merges them into the output (a row of one split) or into the
// split's place in scratch. Barrier inside: every thread of the block calls it.
template <int L, int kG>
__device__ __forceinline__ void FinishSplit(const Bf16AttentionArgs& a, const AttnBlock& b,
                                            const Lane<L>& ln, const SplitState<kG>& st,
                                            int32_t split, int32_t num_splits, float* slots,
                                            float* scratch) {
  const int32_t hs = a.shape.head_size;
  const int32_t stride = hs + 2;
  if (ln.grp == 0) {
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      if (j >= b.G) break;
      float* dst = slots + (ln.warp * kG + j) * stride;
      if (ln.sub == 0) {
        dst[0] = st.m[j];
        dst[1] = st.l[j];
      }
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) {
        if (e < ln.E && ln.d0 + e < hs) dst[2 + ln.d0 + e] = st.acc[j][e];
      }
    }
  }
  __syncthreads();
  const bool single = b.ctx <= kAttentionSplitTokens;
  for (int32_t i = threadIdx.x; i < b.G * hs; i += blockDim.x) {
    const int32_t j = i / hs, d = i % hs;
    float mx = -FLT_MAX;
    for (int s = 0; s < kAttnWarps; ++s) mx = fmaxf(mx, slots[(s * kG + j) * stride]);
    float lsum = 0.0f, asum = 0.0f;
    for (int s = 0; s < kAttnWarps; ++s) {
      const float* src = slots + (s * kG + j) * stride;
      const float w = __expf(src[0] - mx);
      lsum += src[1] * w;
      asum += src[2 + d] * w;
    }
    const int32_t h = b.h0 + j;
    if (single) {
      a.out[(int64_t{b.row} * a.num_heads + h) * hs + d] = Store(asum / lsum);
    } else {
      float* p = scratch + ((int64_t{b.row} * a.num_heads + h) * num_splits + split) * stride;
      if (d == 0) {
        p[0] = mx;
        p[1] = lsum;
      }
      p[2 + d] = asum;
    }
  }
}

// Output element d of one (row, head) from its n splits' results at `base`
// (stride floats apart: m, l, acc[]).
__device__ __forceinline__ float CombineSplitsAt(const float* base, int32_t n, int32_t stride,
                                                 int32_t d) {
  float mx = -FLT_MAX;
  for (int32_t s = 0; s < n; ++s) mx = fmaxf(mx, base[s * stride]);
  float lsum = 0.0f, asum = 0.0f;
  for (int32_t s = 0; s < n; ++s) {
    const float w = __expf(base[s * stride] - mx);
    lsum += base[s * stride + 1] * w;
    asum += base[s * stride + 2 + d] * w;
  }
  return asum / lsum;
}

// kG: query heads per block (a power of two >= the GQA group, at most
// kMaxGroup), so the per-head registers are only what the model needs.
template <int L, int kG, bool kCap>
__global__ void __launch_bounds__(kAttnThreads)
    PagedAttentionKernel(Bf16AttentionArgs a, KvLayerRows rows, int32_t num_splits,
                         float* scratch) {
  LetDependentsLaunch();  // the output projection's GEMV may come up beside it
  constexpr int kGroupsPerWarp = 32 / L;
  TANDEM_DYNAMIC_SHARED(smem_raw);
  float* const smem = reinterpret_cast<float*>(smem_raw);
  const KvCacheShape& sh = a.shape;
  const AttnBlock b = LocateBlock<kG>(a);
  const int32_t split = blockIdx.y;
  const int32_t t_begin = split * kAttentionSplitTokens;
  if (t_begin >= b.ctx) return;
  const int32_t t_end = min(b.ctx, t_begin + kAttentionSplitTokens);
  const int32_t hs = sh.head_size;
  const Lane<L> ln(hs);
  const bool vec = hs == L * kMaxE;

  SplitState<kG> st;
  LoadQuery(a, b, ln, st);
  st.Reset();

  // Each lane group takes kAttnTokens tokens per iteration and issues all
  // their K/V loads before it computes with any (their latency overlaps). The
  // loop condition is uniform across the warp (the shuffles need every
  // lane); a lane group past the end masks its token.
  const int32_t per_iter = kAttnWarps * kGroupsPerWarp * kAttnTokens;
  int32_t first = t_begin + ln.warp * kGroupsPerWarp * kAttnTokens;
  // The warp's iterations whose tokens all lie below the window fold nothing:
  // start past them (a split wholly below the window folds none and reports
  // the empty state, m = -FLT_MAX and l = 0, which the combine weighs by 0).
  if (b.lo > first) first += (b.lo - first) / per_iter * per_iter;
  for (int32_t base = first; base < t_end; base += per_iter) {
    uint32_t kw[kAttnTokens][kMaxE / 2], vw[kAttnTokens][kMaxE / 2];  // bf16 pairs
    bool valid[kAttnTokens];
    GatherTokens<L>(base, b.lo, t_end, ln.grp, kw, vw, valid,
                    [&](int32_t t, uint32_t(&kwu)[kMaxE / 2], uint32_t(&vwu)[kMaxE / 2]) {
                      const Bf16* kp = a.cache + rows.K(b.table, t, b.kvh) + ln.d0;
                      const Bf16* vp = kp + rows.v_after_k;
                      if (vec) {  // the head is exactly L * 8 elements: 16-byte loads
                        Load16(kp, vp, kwu, vwu);
                        return;
                      }
#pragma unroll
                      for (int e = 0; e < kMaxE; ++e) {
                        if (e < ln.E && ln.d0 + e < hs) {
                          kwu[e / 2] |= uint32_t{kp[e]} << (16 * (e % 2));
                          vwu[e / 2] |= uint32_t{vp[e]} << (16 * (e % 2));
                        }
                      }
                    });
    FoldTokens<L, kG, kCap>(kw, vw, valid, b.G, a.softcap, st);
  }
  MergeLaneGroups<L, kG>(st);
  FinishSplit<L, kG>(a, b, ln, st, split, num_splits, smem, scratch);
}

// The pipelined kernel takes head sizes of exactly L * kMaxE elements.
template <int L>
constexpr int kVecHead = L * kMaxE;
// Tokens one pass of the block's lane groups covers: a stage.
template <int L>
constexpr int kStageTokens = kAttnWarps * (32 / L) * kAttnTokens;
template <int L, int kG>
constexpr size_t kPipelinedSharedBytes =
    size_t{kStages} * 2 * kStageTokens<L> * kVecHead<L> * sizeof(Bf16) +
    sizeof(float) * kAttnWarps * kG * (kVecHead<L> + 2);

// blockIdx.y: the block's run of splits_per_block splits of its row. With
// gridDim.y == 1 the block covers the row and combines its splits itself.
template <int L, int kG, bool kCap>
__global__ void __launch_bounds__(kAttnThreads)
    PagedAttentionPipelinedKernel(Bf16AttentionArgs a, KvLayerRows rows, int32_t num_splits,
                                  int32_t splits_per_block, float* scratch) {
  LetDependentsLaunch();
  constexpr int kHs = kVecHead<L>;
  constexpr int kT = kStageTokens<L>;
  constexpr int kGroupsPerWarp = 32 / L;
  constexpr int kStagesPerSplit = kAttentionSplitTokens / kT;
  static_assert(kAttentionSplitTokens % kT == 0, "a split is whole stages");
  TANDEM_DYNAMIC_SHARED(smem_raw);
  Bf16* const stages = reinterpret_cast<Bf16*>(smem_raw);  // [kStages][K, V][kT][kHs]
  float* const slots =
      reinterpret_cast<float*>(smem_raw + size_t{kStages} * 2 * kT * kHs * sizeof(Bf16));
  const AttnBlock b = LocateBlock<kG>(a);
  const int32_t row_splits = (b.ctx + kAttentionSplitTokens - 1) / kAttentionSplitTokens;
  const int32_t s_begin = static_cast<int32_t>(blockIdx.y) * splits_per_block;
  if (s_begin >= row_splits) return;
  const int32_t s_end = min(row_splits, s_begin + splits_per_block);
  const int32_t tok_begin = s_begin * kAttentionSplitTokens;
  const int32_t tok_end = min(b.ctx, s_end * kAttentionSplitTokens);
  const int32_t n_stages = (tok_end - tok_begin + kT - 1) / kT;
  const Lane<L> ln(kHs);

  // Stage g holds tokens tok_begin + g * kT ..: K rows, then V rows, in
  // buffer g % kStages. Every thread commits one group per stage, empty
  // past the end, so the wait below counts alike in every thread.
  auto issue = [&](int32_t g) {
    if (g < n_stages) {
      Bf16* const ks = stages + (g % kStages) * 2 * kT * kHs;
      Bf16* const vs = ks + kT * kHs;
      const int32_t t0 = tok_begin + g * kT;
      for (int32_t c = threadIdx.x; c < kT * L; c += kAttnThreads) {
        const int32_t tok = c / L, part = c % L;
        const int32_t t = t0 + tok;
        if (t >= tok_end || t < b.lo) continue;  // never read: masked below
        const Bf16* kp = a.cache + rows.K(b.table, t, b.kvh) + part * kMaxE;
        CpAsync16(ks + tok * kHs + part * kMaxE, kp);
        CpAsync16(vs + tok * kHs + part * kMaxE, kp + rows.v_after_k);
      }
    }
    CpAsyncCommit();
  };

  SplitState<kG> st;
  LoadQuery(a, b, ln, st);
  st.Reset();
  for (int32_t g = 0; g < kStages - 1; ++g) issue(g);
  for (int32_t g = 0; g < n_stages; ++g) {
    CpAsyncWait<kStages - 2>();  // stage g has landed (this thread's part)
    __syncthreads();             // everyone's part; and stage g - 1's buffer is free
    issue(g + kStages - 1);
    // As the per-split kernel's loop: stage g is iteration g % kStagesPerSplit
    // of split s_begin + g / kStagesPerSplit.
    const int32_t split = s_begin + g / kStagesPerSplit;
    const int32_t t_begin = split * kAttentionSplitTokens;
    const int32_t t_end = min(b.ctx, t_begin + kAttentionSplitTokens);
    const int32_t stage_t0 = tok_begin + g * kT;
    const int32_t base = stage_t0 + ln.warp * kGroupsPerWarp * kAttnTokens;
    // The warp's tokens are base .. base + kGroupsPerWarp * kAttnTokens - 1.
    if (base < t_end && base + kGroupsPerWarp * kAttnTokens > b.lo) {
      const Bf16* const ks = stages + (g % kStages) * 2 * kT * kHs;
      const Bf16* const vs = ks + kT * kHs;
      uint32_t kw[kAttnTokens][kMaxE / 2], vw[kAttnTokens][kMaxE / 2];
      bool valid[kAttnTokens];
      GatherTokens<L>(base, b.lo, t_end, ln.grp, kw, vw, valid,
                      [&](int32_t t, uint32_t(&kwu)[kMaxE / 2], uint32_t(&vwu)[kMaxE / 2]) {
                        const int32_t at = (t - stage_t0) * kHs + ln.d0;
                        Load16(ks + at, vs + at, kwu, vwu);
                      });
      FoldTokens<L, kG, kCap>(kw, vw, valid, b.G, a.softcap, st);
    }
    if ((g + 1) % kStagesPerSplit == 0 || g + 1 == n_stages) {  // the split's last stage
      MergeLaneGroups<L, kG>(st);
      FinishSplit<L, kG>(a, b, ln, st, split, num_splits, slots, scratch);
      st.Reset();
    }
  }
  CpAsyncWait<0>();
  if (gridDim.y != 1 || row_splits == 1) return;  // CombineSplitsKernel's, or done
  __syncthreads();  // the splits' scratch, written by any thread of the block
  constexpr int32_t stride = kHs + 2;
  for (int32_t i = threadIdx.x; i < b.G * kHs; i += kAttnThreads) {
    const int32_t j = i / kHs, d = i % kHs;
    const int64_t rh = int64_t{b.row} * a.num_heads + b.h0 + j;
    a.out[rh * kHs + d] = Store(CombineSplitsAt(scratch + rh * num_splits * stride, row_splits,
                                                stride, d));
  }
}

// Combines the splits of rows whose context spans more than one.
__global__ void CombineSplitsKernel(Bf16AttentionArgs a, int32_t num_splits,
                                    const float* scratch) {
  LetDependentsLaunch();
  const int32_t i = blockIdx.x / a.num_heads, h = blockIdx.x % a.num_heads;
  const int32_t row = a.rows != nullptr ? a.rows[i] : i;
  const int32_t ctx = a.row_pos[row] + 1;
  if (ctx <= kAttentionSplitTokens) return;
  const int32_t n = (ctx + kAttentionSplitTokens - 1) / kAttentionSplitTokens;
  const int32_t hs = a.shape.head_size, stride = hs + 2;
  const float* base = scratch + (int64_t{row} * a.num_heads + h) * num_splits * stride;
  for (int32_t d = threadIdx.x; d < hs; d += blockDim.x) {
    a.out[(int64_t{row} * a.num_heads + h) * hs + d] = Store(CombineSplitsAt(base, n, stride, d));
  }
}

// Query heads per block for a GQA group: a power of two >= the group, at
// most kMaxGroup (the kernels' kG).
constexpr int32_t BlockHeads(int32_t group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : kMaxGroup;
}

#ifndef TANDEM_SIMT  // the CPU emulator runs the kernels itself
// Blocks per split: rows x KV heads x chunks of each KV head's query heads.
int64_t RowBlocks(const Bf16AttentionArgs& a) {
  const int32_t group = a.num_heads / a.shape.num_kv_heads;
  const int32_t kg = BlockHeads(group);
  return int64_t{a.num_rows} * a.shape.num_kv_heads * ((group + kg - 1) / kg);
}

// Whether the pipelined kernel may launch: above 48 KiB of dynamic shared
// memory a kernel must opt in, once. The opt-in is not made during a stream
// capture (it may synchronize, which would break the capture); until it is
// made the per-split kernel runs, which gives the same bits. Every call of
// PagedAttentionBf16 for these head sizes asks, so the eager steps before a
// decode graph is captured make it.
template <int L, int kG, bool kCap>
bool PipelinedReady(void* stream) {
  static std::atomic<bool> ready{false};
  if (ready.load(std::memory_order_acquire)) return true;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(S(stream), &capture) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (capture != cudaStreamCaptureStatusNone) return false;
  if (cudaFuncSetAttribute(PagedAttentionPipelinedKernel<L, kG, kCap>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kPipelinedSharedBytes<L, kG>)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  ready.store(true, std::memory_order_release);
  return true;
}

// *splits_per_block 1: the per-split kernel; more: the pipelined one, or the
// per-split kernel (and *splits_per_block = 1) until PipelinedReady.
template <int L, int kG, bool kCap>
int Launch(const Bf16AttentionArgs& a, int32_t splits, int32_t* splits_per_block, float* scratch,
           void* stream) {
  if (a.shape.head_size == kVecHead<L> && !PipelinedReady<L, kG, kCap>(stream)) {
    *splits_per_block = 1;
  }
  const int32_t spb = *splits_per_block;
  if (spb <= 1) {
    // At most kAttnWarps * kMaxGroup * (256 + 2) floats: about 33 KiB, under
    // the 48 KiB that needs no opt-in.
    const size_t smem = sizeof(float) * kAttnWarps * kG * (a.shape.head_size + 2);
    const dim3 grid(static_cast<unsigned>(RowBlocks(a)), static_cast<unsigned>(splits));
    PagedAttentionKernel<L, kG, kCap><<<grid, kAttnThreads, smem, S(stream)>>>(
        a, KvLayerRows(a.shape, a.layer), splits, scratch);
    return cudaGetLastError();
  }
  const dim3 grid(static_cast<unsigned>(RowBlocks(a)),
                  static_cast<unsigned>((splits + spb - 1) / spb));
  PagedAttentionPipelinedKernel<L, kG, kCap>
      <<<grid, kAttnThreads, kPipelinedSharedBytes<L, kG>, S(stream)>>>(
          a, KvLayerRows(a.shape, a.layer), splits, spb, scratch);
  return cudaGetLastError();
}

template <int L, bool kCap>
int LaunchForGroup(const Bf16AttentionArgs& a, int32_t splits, int32_t* splits_per_block,
                   float* scratch, void* stream) {
  switch (BlockHeads(a.num_heads / a.shape.num_kv_heads)) {
    case 1:
      return Launch<L, 1, kCap>(a, splits, splits_per_block, scratch, stream);
    case 2:
      return Launch<L, 2, kCap>(a, splits, splits_per_block, scratch, stream);
    case 4:
      return Launch<L, 4, kCap>(a, splits, splits_per_block, scratch, stream);
    default:
      return Launch<L, kMaxGroup, kCap>(a, splits, splits_per_block, scratch, stream);
  }
}

template <bool kCap>
int LaunchForLanes(const Bf16AttentionArgs& a, int32_t lanes, int32_t splits,
                   int32_t* splits_per_block, float* scratch, void* stream) {
  switch (lanes) {
    case 4:
      return LaunchForGroup<4, kCap>(a, splits, splits_per_block, scratch, stream);
    case 8:
      return LaunchForGroup<8, kCap>(a, splits, splits_per_block, scratch, stream);
    case 16:
      return LaunchForGroup<16, kCap>(a, splits, splits_per_block, scratch, stream);
    default:
      return LaunchForGroup<32, kCap>(a, splits, splits_per_block, scratch, stream);
  }
}

// The current device's multiprocessors, or 0 where it cannot run cp.async
// (below compute capability 8.0) or cannot be asked. Asked once per device.
int32_t PipelineMultiprocessors() {
  constexpr int kDevices = 64;
  static std::atomic<int32_t> known[kDevices];  // 0 unknown, -1 none, else SMs
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    cudaGetLastError();
    return 0;
  }
  int32_t v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, sms = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    v = major >= 8 && sms > 0 ? sms : -1;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v > 0 ? v : 0;
}

}  // namespace

int PagedAttentionBf16(const Bf16AttentionArgs& a, int32_t max_context, float* scratch,
                       void* stream, int32_t splits_per_block) {
  if (a.num_rows == 0) return cudaSuccess;
  const int32_t hs = a.shape.head_size;
  if (hs <= 0 || hs > kMaxAttentionHeadSize || a.shape.num_kv_heads <= 0 ||
      a.num_heads % a.shape.num_kv_heads != 0 || splits_per_block < kAutoSplitsPerBlock) {
    return cudaErrorInvalidValue;
  }
  const int32_t splits = AttentionSplits(max_context);
  const int32_t lanes = hs <= 4 * kMaxE ? 4 : hs <= 8 * kMaxE ? 8 : hs <= 16 * kMaxE ? 16 : 32;
  int32_t spb = 1;
  if (hs == lanes * kMaxE && splits > 1) {  // the pipelined kernel's head sizes
    if (splits_per_block == kAutoSplitsPerBlock) {
      spb = PipelinedSplitsPerBlock(RowBlocks(a), splits, PipelineMultiprocessors());
    } else {
      spb = splits_per_block == 0 ? splits : std::min(splits_per_block, splits);
    }
  }
  const int err = a.softcap > 0.0f ? LaunchForLanes<true>(a, lanes, splits, &spb, scratch, stream)
                                   : LaunchForLanes<false>(a, lanes, splits, &spb, scratch, stream);
  // One pipelined block per row (spb == splits) combined its own splits.
  if (err != cudaSuccess || splits == 1 || spb == splits) return err;
  return CombineAttentionSplits(a, splits, scratch, stream);
}

int CombineAttentionSplits(const Bf16AttentionArgs& a, int32_t splits, const float* scratch,
                           void* stream) {
  CombineSplitsKernel<<<static_cast<unsigned>(int64_t{a.num_rows} * a.num_heads),
                        a.shape.head_size <= 64 ? 64 : 128, 0, S(stream)>>>(a, splits, scratch);
  return cudaGetLastError();
}

#else
}  // namespace
#endif  // TANDEM_SIMT

}  // namespace tandem::kernels::cuda
