// Which attention kernel computes which rows of a step (DESIGN §6, issue 31).
// Host code, built with or without CUDA, so the routing is tested on the CPU;
// the tile geometry below is shared with the tensor-core kernel.
//
// A prefill chunk (a run of consecutive positions of one sequence) of at
// least kMinTileRows rows goes to the tensor-core kernel in tiles of
// TensorCoreTilePositions positions; every other row (decodes, short chunks)
// goes to the split-K kernel, which reads each K/V row once for all the
// query heads of its GQA group and so wins where a row's queries cannot fill
// a tile.
#pragma once

#include <cstdint>
#include <vector>
#if __cplusplus >= 202002L  // nvcc builds the .cu files as C++17
#include <span>
#endif

#include "tandem/kernels/hd.h"

namespace tandem::kernels {

struct AttentionPlan {
  // Tensor-core tiles as (first row, rows) pairs, flattened; the rows of a
  // tile belong to one sequence and hold consecutive positions.
  std::vector<int32_t> tiles;
  // Rows for the split-K kernel, ascending.
  std::vector<int32_t> single_rows;
  // max(row_pos + 1) over single_rows (0 when there are none).
  int32_t single_max_context = 0;

  int32_t num_tiles() const { return static_cast<int32_t>(tiles.size() / 2); }
  int32_t num_single_rows() const { return static_cast<int32_t>(single_rows.size()); }
};

inline constexpr int32_t kMinTileRows = 16;

// Whether the tensor-core decode attention takes this head size (one
// instance each; head size 256 keeps the split-K kernel: its fp32 output
// fragments would not fit a thread's registers beside Q's).
TANDEM_HD constexpr bool TensorCoreHeadSize(int32_t head_size) {
  return head_size == 32 || head_size == 64 || head_size == 96 || head_size == 128;
}
// Whether the tensor-core prefill kernel takes it: those and Gemma's 256
// (whose Q fragments the kernel reads from shared memory).
TANDEM_HD constexpr bool TensorCorePrefillHeadSize(int32_t head_size) {
  return TensorCoreHeadSize(head_size) || head_size == 256;
}

// The tensor-core decode attention (cuda_decode_attention_tc.cu) walks a
// row's context 16 tokens at a time and looks up each 16 in one cache
// block: it takes block sizes that are multiples of 16.
TANDEM_HD constexpr bool TensorCoreDecodeBlockSize(int32_t block_size) {
  return block_size > 0 && block_size % 16 == 0;
}

// The tensor-core kernel's block: 4 warps of 16 query rows per MMA tile, two
// tiles per warp up to head size 64 (one above: the output fragments of a
// 128- or 256-wide head take the registers), so 128 or 64 rows of MMA work.
// `wide`: two tiles a warp at head size 128 too, Q's fragments read from
// shared memory to make room (FlashAttention-2's block for that size; an
// option until a GPU has timed it, ModelRunnerOptions::tensor_core_prefill_wide). A block
// serves one KV head: its rows are (query head, position) pairs of up to
// TensorCoreBlockHeads query heads of that KV head's group (so one K/V read
// from shared memory feeds them all) times TensorCoreTilePositions
// consecutive positions of one sequence, a multiple of 16 so that every MMA
// tile holds one head.
TANDEM_HD constexpr int32_t TensorCoreBlockRows(int32_t head_size, bool wide = false) {
  return head_size <= 64 || (wide && head_size == 128) ? 128 : 64;
}
TANDEM_HD constexpr int32_t TensorCoreBlockHeads(int32_t head_size, int32_t group,
                                                 bool wide = false) {
  const int32_t slots = TensorCoreBlockRows(head_size, wide) / 16;
  return group < slots ? group : slots;
}
TANDEM_HD constexpr int32_t TensorCoreTilePositions(int32_t head_size, int32_t group,
                                                    bool wide = false) {
  return TensorCoreBlockRows(head_size, wide) / TensorCoreBlockHeads(head_size, group, wide) / 16 *
         16;
}

#if __cplusplus >= 202002L
// row_pos[r] and row_table_offset[r] as in BatchLayout: rows of one sequence
// are adjacent, share a table offset and count positions up by one. group:
// query heads per KV head. With tensor_cores false, or a head size the
// kernel does not take (TensorCorePrefillHeadSize), every row is a single
// row.
AttentionPlan PlanAttention(std::span<const int32_t> row_pos,
                            std::span<const int32_t> row_table_offset, int32_t head_size,
                            int32_t group, bool tensor_cores, bool wide = false);
#endif

}  // namespace tandem::kernels
