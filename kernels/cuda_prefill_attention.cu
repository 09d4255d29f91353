// Prefill attention on tensor cores (issue 31): FlashAttention-2's tiling
// over the paged bf16 KV cache with mma.sync m16n8k16 (bf16 in, fp32
// accumulate), for the prefill chunks AttentionPlan routes here.
//
// One block per (tile of one sequence's positions, KV head, chunk of that KV
// head's query heads); its rows are (query head, position) pairs laid out as
// attention_plan.h's TensorCore* functions say, so the K/V a block reads
// serves every query head of the GQA group it holds. Each of the 4 warps
// owns kMT MMA tiles of 16 rows, its Q fragments in registers (head size
// 256, and 128 in the wide block: in shared memory, read by ldmatrix for
// each MMA, as FlashAttention-2 reads them; in registers they would not fit
// beside the output's 128). Per step of kBN keys the block copies K and V
// rows from the cache's blocks into shared memory with cp.async, the next
// step's copy in flight while this one computes (two stages); each warp
// computes S = Q K^T (K fragments by ldmatrix), softcaps it where the model
// does (Gemma 2), masks keys past each row's position (on the steps that
// hold any such key: the diagonal's and a window's edge; the others skip
// the per-key tests), updates the online softmax in fp32 (base 2, the scale
// in the exponent's FMA, exp2 flushing subnormals as __expf does; the
// output's rescale skipped while the warp's maxima stand), rounds P to bf16
// as FlashAttention does, and adds P V (V fragments by ldmatrix.trans) into
// its fp32 output fragments. A warp skips the key steps wholly past its
// rows, and, under a sliding window, those wholly below its rows' windows;
// a step that masks all of a row's keys leaves its state (max -inf, sum 0,
// output 0) as it was, bit for bit. A row's result depends only on its own
// query and context: key steps start at multiples of kBN and the MMA
// reduces each row on its own, so neither the tile a row lands in nor its
// neighbours change its bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_bf16_device.cuh"
#include "tandem/kernels/attention_plan.h"
#include "tandem/kernels/cuda_bf16_ops.h"

namespace tandem::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Four 8x8 bf16 matrices; lane 8i + r gives the address of row r of matrix
// i, and out[i] is this lane's fragment of matrix i: row lane / 4, columns
// 2 (lane % 4) and + 1, or with Trans, column lane / 4, rows 2 (lane % 4)
// and + 1.
template <bool Trans>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&out)[4], const Bf16* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                 : "r"(SharedAddress(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                 : "r"(SharedAddress(row)));
  }
#elif defined(TANDEM_SIMT)
  ::tandem::simt::LdMatrixX4(out, row, Trans);
#endif
}

// kWide: TensorCoreBlockRows' wide block (two tiles a warp at head size
// 128), with Q's fragments in shared memory and 32 keys a step, as at 256.
template <int D, bool kWide>
constexpr int kMT = TensorCoreBlockRows(D, kWide) / (kWarps * 16);  // MMA row tiles per warp
// Q's fragments in shared memory rather than registers (see the top).
template <int D, bool kWide>
constexpr bool kQShared = D == 256 || (kWide && D == 128);
// Keys per step: 64; 32 where Q is shared, so that the two stages of K and V
// and the Q tile (at 256: 99 KiB) leave room for two blocks a
// multiprocessor, and the wide block's scores fit its registers.
template <int D, bool kWide>
constexpr int kKeysPerStep = kQShared<D, kWide> ? 32 : 64;
// Padded shared rows: ldmatrix's 8 row addresses of a phase hit distinct banks.
template <int D>
constexpr int kStride = D + 8;
// 2 stages x K, V, then the Q tile where it is shared.
template <int D, bool kWide>
constexpr size_t kSharedBytes = size_t{2 * 2 * kKeysPerStep<D, kWide> +
                                       (kQShared<D, kWide> ? TensorCoreBlockRows(D, kWide) : 0)} *
                                kStride<D> * sizeof(Bf16);

// kCap: Gemma 2's tanh softcapping of the scaled scores (a.softcap).
template <int D, bool kCap, bool kWide = false>
__global__ void __launch_bounds__(kThreads)
    PrefillAttentionKernel(Bf16AttentionArgs a, KvLayerRows rows, const int32_t* tiles,
                           int32_t head_chunks) {
  constexpr int MT = kMT<D, kWide>;
  constexpr int S = kStride<D>;
  constexpr int kBN = kKeysPerStep<D, kWide>;
  constexpr bool kQS = kQShared<D, kWide>;
  TANDEM_DYNAMIC_SHARED(smem_raw);
  Bf16* const smem = reinterpret_cast<Bf16*>(smem_raw);
  auto k_stage = [&](int buf) { return smem + buf * 2 * kBN * S; };
  auto v_stage = [&](int buf) { return smem + (buf * 2 + 1) * kBN * S; };
  Bf16* const qs = smem + 4 * kBN * S;  // the Q tile's rows, where kQS

  // The last tiles of a sequence carry the most keys: start them first.
  const int32_t tile = static_cast<int32_t>(gridDim.x - 1 - blockIdx.x);
  const int32_t first = tiles[2 * tile], m = tiles[2 * tile + 1];
  const KvCacheShape& sh = a.shape;
  const int32_t group = a.num_heads / sh.num_kv_heads;
  const int32_t kvh = static_cast<int32_t>(blockIdx.y) / head_chunks;
  const int32_t chunk = static_cast<int32_t>(blockIdx.y) % head_chunks;
  const int32_t block_heads = TensorCoreBlockHeads(D, group, kWide);
  const int32_t positions = TensorCoreTilePositions(D, group, kWide);
  const int32_t head0 = kvh * group + chunk * block_heads;
  const int32_t heads_here = min(block_heads, group - chunk * block_heads);
  const int32_t pos0 = a.row_pos[first];
  const int32_t ctx = pos0 + m;
  // The first key of the tile's first row (its lowest position).
  const int32_t block_first_key = WindowStart(pos0, a.window);
  const int32_t* table = a.block_tables + a.row_table_offset[first];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale = rsqrtf(static_cast<float>(D));
  // What the exponent's FMA scales a score by: the softcap's scores are
  // already scaled (and in base 2).
  const float exp_scale = kCap ? 1.0f : scale * kLog2e;

  // Block row r is (head head0 + r / positions, position pos0 + r % positions).
  // Rows past the tile's heads or positions compute a copy of a real row
  // (finite, never stored).
  auto row_head = [&](int32_t r) { return head0 + min(r / positions, heads_here - 1); };
  auto row_index = [&](int32_t r) { return min(r % positions, m - 1); };  // within the tile
  auto row_real = [&](int32_t r) { return r / positions < heads_here && r % positions < m; };
  // The last position any row of this warp attends from (-1: none real).
  int32_t warp_last_pos = -1;
  // The first key any real row of this warp attends to.
  int32_t warp_first_key = ctx;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int32_t r = (warp * MT + mt) * 16;  // a tile's 16 rows share a head
    if (row_real(r)) {
      warp_last_pos = max(warp_last_pos, pos0 + min(r % positions + 15, m - 1));
      warp_first_key = min(warp_first_key, WindowStart(pos0 + r % positions, a.window));
    }
  }

  // Q's A fragments: fragment i of (mt, kk) holds row r0 (i even) or r1
  // (i odd), columns c and c + 1 (i < 2) or c + 8 and c + 9. Where kQS,
  // each lane writes the same elements to the Q tile instead, for ldmatrix.
  uint32_t qa[kQS ? 1 : MT][kQS ? 1 : D / 16][4];
  int32_t qpos[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int32_t r0 = (warp * MT + mt) * 16 + g, r1 = r0 + 8;
    qpos[mt][0] = pos0 + row_index(r0);
    qpos[mt][1] = pos0 + row_index(r1);
    const float* q0 = a.q + int64_t{first + row_index(r0)} * a.q_stride + int64_t{row_head(r0)} * D;
    const float* q1 = a.q + int64_t{first + row_index(r1)} * a.q_stride + int64_t{row_head(r1)} * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int c = kk * 16 + 2 * t;
      const uint32_t f[4] = {PackBf16(q0[c], q0[c + 1]), PackBf16(q1[c], q1[c + 1]),
                             PackBf16(q0[c + 8], q0[c + 9]), PackBf16(q1[c + 8], q1[c + 9])};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (kQS) {
          *reinterpret_cast<uint32_t*>(qs + (i % 2 == 0 ? r0 : r1) * S + c + (i / 2) * 8) = f[i];
        } else {
          qa[mt][kk][i] = f[i];
        }
      }
    }
  }
  if constexpr (kQS) __syncthreads();  // the Q tile is written (read by other lanes)
  // The lowest and highest positions the warp's rows attend from (a padded
  // row's are a real row's): a key step wholly at or below the lowest, and
  // wholly inside the highest one's window, masks nothing in this warp.
  int32_t warp_min_q = qpos[0][0], warp_max_q = qpos[0][0];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      warp_min_q = min(warp_min_q, qpos[mt][i]);
      warp_max_q = max(warp_max_q, qpos[mt][i]);
    }
  }
#pragma unroll
  for (int lanes = 16; lanes > 0; lanes /= 2) {
    warp_min_q = min(warp_min_q, __shfl_xor_sync(0xffffffffu, warp_min_q, lanes));
    warp_max_q = max(warp_max_q, __shfl_xor_sync(0xffffffffu, warp_max_q, lanes));
  }
  float o[MT][D / 8][4];
  float mx[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) o[mt][dn][0] = o[mt][dn][1] = o[mt][dn][2] = o[mt][dn][3] = 0.0f;
    mx[mt][0] = mx[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }

  // Copies keys [step * kBN, + kBN) into stage buf; keys past the tile's
  // last row or below its first row's window become zeros (never NaN under a
  // zero weight).
  auto load = [&](int32_t step, int buf) {
    constexpr int kVecs = D / 8;  // 16-byte vectors per K/V row
    Bf16* ks = k_stage(buf);
    Bf16* vs = v_stage(buf);
    for (int i = threadIdx.x; i < kBN * kVecs; i += kThreads) {
      const int key = i / kVecs, c = (i % kVecs) * 8;
      const int32_t tok = step * kBN + key;
      const Bf16* kp = a.cache;
      const Bf16* vp = a.cache;
      int bytes = 0;
      if (tok < ctx && tok >= block_first_key) {
        kp = a.cache + rows.K(table, tok, kvh) + c;
        vp = kp + rows.v_after_k;
        bytes = 16;
      }
      CpAsync16(ks + key * S + c, kp, bytes);
      CpAsync16(vs + key * S + c, vp, bytes);
    }
    CpAsyncCommit();
  };

  // ldmatrix addressing: lane 8i + r gives row r of matrix i.
  const int mi = lane / 8, ri = lane % 8;
  const int32_t steps = (ctx + kBN - 1) / kBN;
  // Key steps start at multiples of kBN whatever the window: a row's steps
  // below its window are all masked, so skipping them changes no bits.
  const int32_t first_step = block_first_key / kBN;
  load(first_step, first_step & 1);
  for (int32_t step = first_step; step < steps; ++step) {
    const int buf = step & 1;
    if (step + 1 < steps) {
      load(step + 1, buf ^ 1);  // that stage's readers passed the barrier below
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // this stage's copies, from every thread, have landed
    const int32_t k0 = step * kBN;
    if (k0 <= warp_last_pos && k0 + kBN > warp_first_key) {
      const Bf16* ks = k_stage(buf);
      const Bf16* vs = v_stage(buf);
      float s[MT][kBN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
      }
      // S = Q K^T. Matrices: keys jn*16 + (0|8), head columns kk*16 + (0|8):
      // b[0], b[1] feed key tile 2 jn, b[2], b[3] key tile 2 jn + 1.
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        // Q's fragments for these 16 head columns. From the Q tile: matrices
        // rows + (0|8), columns kk*16 + (0|8), in the fragments' order.
        uint32_t qf[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kQS) {
            LdMatrixX4<false>(qf[mt], qs + ((warp * MT + mt) * 16 + (mi % 2) * 8 + ri) * S +
                                          kk * 16 + (mi / 2) * 8);
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) qf[mt][i] = qa[mt][kk][i];
          }
        }
#pragma unroll
        for (int jn = 0; jn < kBN / 16; ++jn) {
          uint32_t b[4];
          LdMatrixX4<false>(b, ks + (jn * 16 + (mi / 2) * 8 + ri) * S + kk * 16 + (mi % 2) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma(s[mt][2 * jn], qf[mt], b[0], b[1]);
            Mma(s[mt][2 * jn + 1], qf[mt], b[2], b[3]);
          }
        }
      }
      // Most steps see every key of every row (all but the diagonal's and a
      // window's edge) and skip the per-key tests, which took more issue
      // slots than the MMAs.
      const bool all_seen = KeysAllSeen(k0, k0 + kBN - 1, warp_min_q, warp_max_q, a.window);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        // Softcap the scaled scores, into base 2 (before the mask: a masked
        // key stays -inf).
        if constexpr (kCap) {
#pragma unroll
          for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              s[mt][j][e] = a.softcap * tanhf(s[mt][j][e] * scale / a.softcap) * kLog2e;
            }
          }
        }
        // Mask (causal, window), and the rows' maxima over the quad's lanes,
        // before the scale: rounding is monotone, so max(s) * c is max(s * c),
        // and the scale joins the subtraction in one FMA below.
        if (!all_seen) {
#pragma unroll
          for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int32_t key = k0 + j * 8 + 2 * t + (e & 1);
              if (!KeySeen(key, qpos[mt][e / 2], a.window)) s[mt][j][e] = -INFINITY;
            }
          }
        }
        float step_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) step_max[e / 2] = fmaxf(step_max[e / 2], s[mt][j][e]);
        }
        float corr[2], m_use[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          // mx stays -inf while every key so far was masked (the steps below
          // a sliding window).
          QuadSoftmaxStep(step_max[i] * exp_scale, mx[mt][i], m_use[i], corr[i],
                          [](float x) { return Exp2Ftz(x); });
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][j][e] = Exp2Ftz(fmaf(s[mt][j][e], exp_scale, -m_use[e / 2]));
            sum[e / 2] += s[mt][j][e];
          }
        }
        // Per lane partial sums; corr is the same on the quad's four lanes.
        l[mt][0] = l[mt][0] * corr[0] + sum[0];
        l[mt][1] = l[mt][1] * corr[1] + sum[1];
        // Once a row's maximum settles, its steps leave corr at 1: the
        // output's rescale is then x * 1, skipped where the whole warp has it.
        if (!__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f)) {
#pragma unroll
          for (int dn = 0; dn < D / 8; ++dn) {
            o[mt][dn][0] *= corr[0];
            o[mt][dn][1] *= corr[0];
            o[mt][dn][2] *= corr[1];
            o[mt][dn][3] *= corr[1];
          }
        }
      }
      // O += P V: the S fragments of two adjacent 8-key tiles are P's A
      // fragment for 16 keys. Matrices: keys kk*16 + (0|8), head columns
      // dp*16 + (0|8), transposed: b[0], b[1] feed column tile 2 dp, b[2],
      // b[3] column tile 2 dp + 1.
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          pa[mt][0] = PackBf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = PackBf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = PackBf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = PackBf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          LdMatrixX4<true>(b, vs + (kk * 16 + (mi % 2) * 8 + ri) * S + dp * 16 + (mi / 2) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma(o[mt][2 * dp], pa[mt], b[0], b[1]);
            Mma(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[mt][i] += __shfl_xor_sync(0xffffffffu, l[mt][i], 1);
      l[mt][i] += __shfl_xor_sync(0xffffffffu, l[mt][i], 2);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t r = (warp * MT + mt) * 16 + g + 8 * half;
      if (!row_real(r)) continue;
      Bf16* out = a.out + (int64_t{first + r % positions} * a.num_heads + row_head(r)) * D;
      const float inv = 1.0f / l[mt][half];
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<uint32_t*>(out + dn * 8 + 2 * t) =
            PackBf16(o[mt][dn][2 * half] * inv, o[mt][dn][2 * half + 1] * inv);
      }
    }
  }
}

#ifndef TANDEM_SIMT  // the CPU emulator runs the kernel itself
template <int D, bool kCap, bool kWide>
int Launch(const Bf16AttentionArgs& a, const int32_t* tiles, int32_t num_tiles, void* stream) {
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      PrefillAttentionKernel<D, kCap, kWide>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(kSharedBytes<D, kWide>));
  if (opt_in != cudaSuccess) return opt_in;
  const int32_t group = a.num_heads / a.shape.num_kv_heads;
  const int32_t block_heads = TensorCoreBlockHeads(D, group, kWide);
  const int32_t head_chunks = (group + block_heads - 1) / block_heads;
  const dim3 grid(static_cast<unsigned>(num_tiles),
                  static_cast<unsigned>(a.shape.num_kv_heads * head_chunks));
  PrefillAttentionKernel<D, kCap, kWide>
      <<<grid, kThreads, kSharedBytes<D, kWide>, static_cast<cudaStream_t>(stream)>>>(
          a, KvLayerRows(a.shape, a.layer), tiles, head_chunks);
  return cudaGetLastError();
}

template <int D, bool kWide = false>
int LaunchForCap(const Bf16AttentionArgs& a, const int32_t* tiles, int32_t num_tiles,
                 void* stream) {
  return a.softcap > 0.0f ? Launch<D, true, kWide>(a, tiles, num_tiles, stream)
                          : Launch<D, false, kWide>(a, tiles, num_tiles, stream);
}

}  // namespace

int PrefillAttentionBf16(const Bf16AttentionArgs& a, const int32_t* tiles, int32_t num_tiles,
                         void* stream, bool wide) {
  if (num_tiles == 0) return cudaSuccess;
  if (a.shape.num_kv_heads <= 0 || a.num_heads % a.shape.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  switch (a.shape.head_size) {
    case 32:
      return LaunchForCap<32>(a, tiles, num_tiles, stream);
    case 64:
      return LaunchForCap<64>(a, tiles, num_tiles, stream);
    case 96:
      return LaunchForCap<96>(a, tiles, num_tiles, stream);
    case 128:
      return wide ? LaunchForCap<128, true>(a, tiles, num_tiles, stream)
                  : LaunchForCap<128>(a, tiles, num_tiles, stream);
    case 256:
      return LaunchForCap<256>(a, tiles, num_tiles, stream);
    default: return cudaErrorInvalidValue;
  }
}

bool DeviceHasTensorCoreAttention(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 8;
}

#else
}  // namespace
#endif  // TANDEM_SIMT

}  // namespace tandem::kernels::cuda
