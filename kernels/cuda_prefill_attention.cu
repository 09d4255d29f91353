// Prefill attention on tensor cores (issue 31): FlashAttention-2's tiling
// over the paged bf16 KV cache with mma.sync m16n8k16 (bf16 in, fp32
// accumulate), for the prefill chunks AttentionPlan routes here.
//
// One block per (tile of up to 64 query rows of one sequence, query head);
// each of its 4 warps owns 16 query rows. Per step of 64 keys the block
// gathers K (row-major) and V (transposed) from the cache's blocks into
// shared memory; each warp computes S = Q K^T for its rows, masks the keys
// past each row's position, updates the online softmax in fp32 (base 2,
// scale folded in), rounds P to bf16 as FlashAttention does, and adds P V
// into its fp32 output fragments. A warp skips the key steps wholly past
// its last row. A row's result depends only on its own query and context:
// the key steps start at multiples of 64 and the MMA reduces each row on its
// own, so the tile a row lands in does not change its bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tandem/kernels/attention_plan.h"
#include "tandem/kernels/cuda_bf16_ops.h"

namespace tandem::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kBM = kWarps * 16;  // query rows per block
constexpr int kBN = 64;           // keys per step
static_assert(kBM == kTileRows, "AttentionPlan's tiles are this kernel's blocks");

// Two floats as a bf16 pair, `lo` in the low half (the lower column of an
// MMA fragment).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a * b for one 16x8x16 tile (PTX ISA "mma.sync m16n8k16" fragments:
// lane = 4 * g + t holds A rows g and g + 8, columns 2t, 2t + 1 and
// 2t + 8, 2t + 9; B columns g, rows 2t, 2t + 1 and 2t + 8, 2t + 9; D rows g
// and g + 8, columns 2t and 2t + 1).
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t Load32(const Bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    PrefillAttentionKernel(Bf16AttentionArgs a, const int32_t* tiles) {
  // Padded rows: the fragment loads of a warp hit 32 different banks.
  constexpr int kStrideK = D + 8;
  constexpr int kStrideV = kBN + 8;
  __shared__ __align__(16) Bf16 ks[kBN * kStrideK];  // K[key][d]
  __shared__ __align__(16) Bf16 vt[D * kStrideV];    // V[key][d] as [d][key]

  // The last tiles of a sequence carry the most keys: start them first.
  const int32_t tile = static_cast<int32_t>(gridDim.x - 1 - blockIdx.x);
  const int32_t first = tiles[2 * tile], m = tiles[2 * tile + 1];
  const int32_t h = blockIdx.y;
  const KvCacheShape& sh = a.shape;
  const int32_t kvh = h / (a.num_heads / sh.num_kv_heads);
  const int32_t pos0 = a.row_pos[first];
  const int32_t ctx = pos0 + m;
  const int32_t* table = a.block_tables + a.row_table_offset[first];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const float scale_log2 = rsqrtf(static_cast<float>(D)) * 1.4426950408889634f;

  // This thread's two rows; rows past the tile compute a copy of its last
  // row (finite, never stored).
  const int32_t r0 = min(warp * 16 + g, m - 1), r1 = min(warp * 16 + g + 8, m - 1);
  const int32_t qp0 = pos0 + r0, qp1 = pos0 + r1;
  const int32_t warp_last_pos = pos0 + min(warp * 16 + 15, m - 1);
  uint32_t qa[D / 16][4];
  {
    const float* q0 = a.q + int64_t{first + r0} * a.q_stride + int64_t{h} * D;
    const float* q1 = a.q + int64_t{first + r1} * a.q_stride + int64_t{h} * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int c = kk * 16 + 2 * t;
      qa[kk][0] = PackBf16(q0[c], q0[c + 1]);
      qa[kk][1] = PackBf16(q1[c], q1[c + 1]);
      qa[kk][2] = PackBf16(q0[c + 8], q0[c + 9]);
      qa[kk][3] = PackBf16(q1[c + 8], q1[c + 9]);
    }
  }
  float o[D / 8][4];
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  const int32_t steps = (ctx + kBN - 1) / kBN;
  for (int32_t step = 0; step < steps; ++step) {
    const int32_t k0 = step * kBN;
    __syncthreads();  // every warp is done with the previous step's keys
    constexpr int kVecs = D / 8;  // 16-byte vectors per K/V row
    for (int i = threadIdx.x; i < kBN * kVecs; i += kWarps * 32) {
      const int key = i / kVecs, c = (i % kVecs) * 8;
      const int32_t tok = k0 + key;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (tok < ctx) {  // keys past the tile's last row stay zero (never NaN)
        const int32_t blk = table[tok / sh.block_size], slot = tok % sh.block_size;
        kv = *reinterpret_cast<const uint4*>(a.cache + sh.Offset(blk, a.layer, 0, slot, kvh) + c);
        vv = *reinterpret_cast<const uint4*>(a.cache + sh.Offset(blk, a.layer, 1, slot, kvh) + c);
      }
      *reinterpret_cast<uint4*>(ks + key * kStrideK + c) = kv;
      const Bf16* ve = reinterpret_cast<const Bf16*>(&vv);
#pragma unroll
      for (int e = 0; e < 8; ++e) vt[(c + e) * kStrideV + key] = ve[e];
    }
    __syncthreads();
    if (k0 > warp_last_pos) continue;  // every key masked for this warp's rows

    float s[kBN / 8][4];
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const Bf16* kr = ks + (j * 8 + g) * kStrideK + kk * 16 + 2 * t;
        Mma(s[j], qa[kk], Load32(kr), Load32(kr + 8));
      }
    }
    // Scale, mask (causal), and the rows' maxima over the quad's lanes.
    float step_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int32_t key = k0 + j * 8 + 2 * t + (e & 1);
        const float v = key <= (e < 2 ? qp0 : qp1) ? s[j][e] * scale_log2 : -INFINITY;
        s[j][e] = v;
        step_max[e / 2] = fmaxf(step_max[e / 2], v);
      }
    }
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      step_max[i] = fmaxf(step_max[i], __shfl_xor_sync(0xffffffffu, step_max[i], 1));
      step_max[i] = fmaxf(step_max[i], __shfl_xor_sync(0xffffffffu, step_max[i], 2));
      // Key 0 is never masked, so from the first step on mx is finite.
      const float m_new = fmaxf(mx[i], step_max[i]);
      corr[i] = exp2f(mx[i] - m_new);
      mx[i] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - mx[e / 2]);
        sum[e / 2] += s[j][e];
      }
    }
    // Per lane partial sums; corr is the same on the quad's four lanes.
    l[0] = l[0] * corr[0] + sum[0];
    l[1] = l[1] * corr[1] + sum[1];
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      o[dn][0] *= corr[0];
      o[dn][1] *= corr[0];
      o[dn][2] *= corr[1];
      o[dn][3] *= corr[1];
    }
    // O += P V: the S fragments of two adjacent 8-key tiles are P's A
    // fragment for 16 keys.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t pa[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]),
                              PackBf16(s[2 * kk][2], s[2 * kk][3]),
                              PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        const Bf16* vr = vt + (dn * 8 + g) * kStrideV + kk * 16 + 2 * t;
        Mma(o[dn], pa, Load32(vr), Load32(vr + 8));
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  const int32_t rr0 = warp * 16 + g, rr1 = rr0 + 8;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    const int d = dn * 8 + 2 * t;
    if (rr0 < m) {
      *reinterpret_cast<uint32_t*>(a.out + (int64_t{first + rr0} * a.num_heads + h) * D + d) =
          PackBf16(o[dn][0] / l[0], o[dn][1] / l[0]);
    }
    if (rr1 < m) {
      *reinterpret_cast<uint32_t*>(a.out + (int64_t{first + rr1} * a.num_heads + h) * D + d) =
          PackBf16(o[dn][2] / l[1], o[dn][3] / l[1]);
    }
  }
}

template <int D>
int Launch(const Bf16AttentionArgs& a, const int32_t* tiles, int32_t num_tiles, void* stream) {
  const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(a.num_heads));
  PrefillAttentionKernel<D>
      <<<grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(a, tiles);
  return cudaGetLastError();
}

}  // namespace

int PrefillAttentionBf16(const Bf16AttentionArgs& a, const int32_t* tiles, int32_t num_tiles,
                         void* stream) {
  if (num_tiles == 0) return cudaSuccess;
  if (a.shape.num_kv_heads <= 0 || a.num_heads % a.shape.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  switch (a.shape.head_size) {
    case 32: return Launch<32>(a, tiles, num_tiles, stream);
    case 64: return Launch<64>(a, tiles, num_tiles, stream);
    case 96: return Launch<96>(a, tiles, num_tiles, stream);
    case 128: return Launch<128>(a, tiles, num_tiles, stream);
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

}  // namespace tandem::kernels::cuda
