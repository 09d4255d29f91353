// The paged KV cache layout of DESIGN §6, block-major so that one block (all
// layers) is one contiguous payload:
//   [num_blocks][num_layers][2 (K, V)][block_size][num_kv_heads][head_size]
// A token at position p of a sequence lives in block table[p / block_size],
// slot p % block_size.
#pragma once

#include <cstdint>

#include "tandem/kernels/hd.h"

namespace tandem::kernels {

struct KvCacheShape {
  int32_t num_blocks = 0;
  int32_t num_layers = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_size = 0;

  // Floats of one block (all layers, K and V).
  TANDEM_HD int64_t BlockFloats() const {
    return int64_t{num_layers} * 2 * block_size * num_kv_heads * head_size;
  }
  // Float offset of element 0 of (block, layer, kv (0 = K, 1 = V), slot, head).
  TANDEM_HD int64_t Offset(int64_t block, int32_t layer, int32_t kv, int32_t slot,
                           int32_t head) const {
    return ((((block * num_layers + layer) * 2 + kv) * block_size + slot) * num_kv_heads + head) *
           int64_t{head_size};
  }
};

// n / d for 0 <= n < 2^31 by a multiply and a shift, d fixed (1 <= d < 2^31):
// Granlund and Montgomery, "Division by invariant integers using
// multiplication" (1994), as CUTLASS's FastDivmod. A GPU has no integer
// divider: `t / block_size` by a runtime value is a sequence of about 20
// instructions, which the attention kernels ran once per token.
struct FastDivmod {
  int32_t divisor = 1;
  uint32_t multiplier = 1;  // floor(2^32 (2^shift - d) / d) + 1 < 2^32
  uint32_t shift = 0;       // ceil(log2(d))

  TANDEM_HD explicit FastDivmod(int32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < static_cast<uint64_t>(d)) ++shift;
    multiplier = static_cast<uint32_t>((uint64_t{1} << 32) *
                                           ((uint64_t{1} << shift) - static_cast<uint64_t>(d)) /
                                           static_cast<uint64_t>(d) +
                                       1);
  }
  TANDEM_HD int32_t Div(int32_t n) const {
    const uint32_t u = static_cast<uint32_t>(n);
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(u, multiplier);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{u} * multiplier) >> 32);
#endif
    return static_cast<int32_t>((hi + u) >> shift);  // hi <= u < 2^31: no overflow
  }
};

// One layer's rows in the cache, with what a kernel's token loop would
// otherwise recompute per token worked out once on the host: the block
// size's division and Offset's products. The attention kernels take it as a
// parameter, so its fields stay in the constant bank instead of holding
// registers across the loop. K(table, t, head) == Offset(table[t /
// block_size], layer, 0, t % block_size, head); the V row is v_after_k
// further.
struct KvLayerRows {
  FastDivmod block_size;
  int64_t block_stride;  // BlockFloats()
  int64_t layer_base;    // Offset(0, layer, 0, 0, 0)
  int64_t v_after_k;     // block_size * slot_stride
  int64_t slot_stride;   // num_kv_heads * head_size
  int32_t head_size;

  TANDEM_HD KvLayerRows(const KvCacheShape& sh, int32_t layer)
      : block_size(sh.block_size),
        block_stride(sh.BlockFloats()),
        layer_base(sh.Offset(0, layer, 0, 0, 0)),
        v_after_k(int64_t{sh.block_size} * sh.num_kv_heads * sh.head_size),
        slot_stride(int64_t{sh.num_kv_heads} * sh.head_size),
        head_size(sh.head_size) {}

  // Token t's K row of KV head `head`, in the sequence whose block table is
  // `table`.
  TANDEM_HD int64_t K(const int32_t* table, int32_t t, int32_t head) const {
    const int32_t i = block_size.Div(t);
    return table[i] * block_stride + layer_base + (t - i * block_size.divisor) * slot_stride +
           head * head_size;
  }
};

}  // namespace tandem::kernels
