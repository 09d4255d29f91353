#include "tandem/kernels/attention_plan.h"

#include <algorithm>

namespace tandem::kernels {

AttentionPlan PlanAttention(std::span<const int32_t> row_pos,
                            std::span<const int32_t> row_table_offset, int32_t head_size,
                            int32_t group, bool tensor_cores, bool wide) {
  AttentionPlan plan;
  const int32_t n = static_cast<int32_t>(row_pos.size());
  const bool tiles = tensor_cores && TensorCorePrefillHeadSize(head_size) && group > 0;
  const int32_t tile = tiles ? TensorCoreTilePositions(head_size, group, wide) : 0;
  int32_t begin = 0;
  while (begin < n) {
    // The run of one sequence's consecutive positions starting at `begin`.
    int32_t end = begin + 1;
    while (end < n && row_table_offset[end] == row_table_offset[begin] &&
           row_pos[end] == row_pos[end - 1] + 1) {
      ++end;
    }
    if (tiles && end - begin >= kMinTileRows) {
      for (int32_t r = begin; r < end; r += tile) {
        plan.tiles.push_back(r);
        plan.tiles.push_back(std::min(tile, end - r));
      }
    } else {
      for (int32_t r = begin; r < end; ++r) {
        plan.single_rows.push_back(r);
        plan.single_max_context = std::max(plan.single_max_context, row_pos[r] + 1);
      }
    }
    begin = end;
  }
  return plan;
}

}  // namespace tandem::kernels
