#include "decode_graphs.h"

namespace tandem::model::internal {

int32_t GraphBatchBucket(int32_t rows) {
  if (rows <= 0 || rows > kMaxGraphRows) return 0;
  if (rows <= 8) {
    int32_t b = 1;
    while (b < rows) b *= 2;
    return b;
  }
  if (rows <= 64) return (rows + 7) / 8 * 8;
  return (rows + 31) / 32 * 32;
}

int32_t GraphSplitsBucket(int32_t splits) {
  int32_t b = 1;
  while (b < splits) b *= 2;
  return b;
}

bool IsDecodeBatch(std::span<const SequenceInput> batch) {
  for (const SequenceInput& s : batch) {
    if (s.token_ids.size() != 1) return false;
  }
  return !batch.empty();
}

void PadDecodeLayout(BatchLayout* lay, int32_t rows) {
  if (lay->num_rows >= rows) return;
  const int32_t table = static_cast<int32_t>(lay->block_tables.size());
  lay->block_tables.push_back(0);
  for (int32_t r = lay->num_rows; r < rows; ++r) {
    lay->tokens.push_back(0);
    lay->row_pos.push_back(0);
    lay->row_table_offset.push_back(table);
    lay->slots.push_back(-1);
    lay->last_rows.push_back(r);
  }
  lay->num_rows = rows;
}

}  // namespace tandem::model::internal
