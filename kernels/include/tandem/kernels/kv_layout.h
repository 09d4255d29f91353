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

}  // namespace tandem::kernels
