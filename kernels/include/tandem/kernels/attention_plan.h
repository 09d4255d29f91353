// Which attention kernel computes which rows of a step (DESIGN §6, issue 31).
// Host code, built with or without CUDA, so the routing is tested on the CPU.
//
// A prefill chunk (a run of consecutive positions of one sequence) of at
// least kMinTileRows rows goes to the tensor-core kernel in tiles of up to
// kTileRows query rows; every other row (decodes, short chunks) goes to the
// split-K kernel, which reads each K/V row once for all the query heads of
// its GQA group and so wins where a row's queries cannot fill a tile.
#pragma once

#include <cstdint>
#include <vector>
#if __cplusplus >= 202002L  // nvcc builds the .cu files as C++17
#include <span>
#endif

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

inline constexpr int32_t kTileRows = 64;
inline constexpr int32_t kMinTileRows = 16;

// Whether the tensor-core kernel takes this head size (one instance each;
// head size 256 keeps the split-K kernel: its fp32 output fragments would
// not fit a thread's registers).
inline bool TensorCoreHeadSize(int32_t head_size) {
  return head_size == 32 || head_size == 64 || head_size == 96 || head_size == 128;
}

#if __cplusplus >= 202002L
// row_pos[r] and row_table_offset[r] as in BatchLayout: rows of one sequence
// are adjacent, share a table offset and count positions up by one. With
// tensor_cores false, or a head size the kernel does not take, every row is
// a single row.
AttentionPlan PlanAttention(std::span<const int32_t> row_pos,
                            std::span<const int32_t> row_table_offset, int32_t head_size,
                            bool tensor_cores);
#endif

}  // namespace tandem::kernels
