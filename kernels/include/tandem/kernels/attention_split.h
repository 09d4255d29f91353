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

// How many consecutive splits of a row one block of the decode attention
// kernel takes (PagedAttentionBf16's splits_per_block, when automatic). A
// block per split leaves each block two stages of loads and then a merge:
// with few rows that is the parallelism the device needs, with many it keeps
// loads from staying in flight. So a block takes as many splits as still
// leave kPipelinedBlocksPerSm blocks per multiprocessor, balanced over the
// row (1: a block per split). row_blocks: rows x KV heads x head chunks;
// sms: the device's multiprocessors (0: a block per split).
inline constexpr int64_t kPipelinedBlocksPerSm = 4;
inline int32_t PipelinedSplitsPerBlock(int64_t row_blocks, int32_t splits, int32_t sms) {
  if (splits <= 1 || sms <= 0 || row_blocks <= 0) return 1;
  const int64_t per_block = row_blocks * splits / (kPipelinedBlocksPerSm * sms);
  if (per_block <= 1) return 1;
  if (per_block >= splits) return splits;
  const int64_t blocks_per_row = (splits + per_block - 1) / per_block;
  return static_cast<int32_t>((splits + blocks_per_row - 1) / blocks_per_row);
}

}  // namespace tandem::kernels::cuda
