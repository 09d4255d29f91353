// The split of the bf16 paged-attention kernel (flash-decoding split-K) as
// host arithmetic, with no CUDA dependency: the CUDA kernels use it, and so
// does the model library's step-memory reserve, which is built without CUDA
// too (the sanitizer builds).
#pragma once

#include <cstdint>

namespace tandem::kernels::cuda {

// Tokens per attention split: a row whose context is longer is computed in
// ceil(context / kAttentionSplitTokens) independent parts that a second
// kernel combines. Fixed, so the split of a row never depends on the batch.
inline constexpr int32_t kAttentionSplitTokens = 128;

inline int32_t AttentionSplits(int32_t max_context) {
  return (max_context + kAttentionSplitTokens - 1) / kAttentionSplitTokens;
}

// Floats of the split-K scratch for `rows` rows of `num_heads` heads.
inline int64_t AttentionScratchFloats(int32_t rows, int32_t num_heads, int32_t head_size,
                                      int32_t max_context) {
  return int64_t{rows} * num_heads * AttentionSplits(max_context) * (head_size + 2);
}

}  // namespace tandem::kernels::cuda
