// Which CUDA graph a decode step replays, and its padding (decode_graphs.h).
// Host code: runs without a GPU.
#include "decode_graphs.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem::model::internal {
namespace {

TEST(DecodeGraphsTest, BatchBucketsAreTheSmallestCapturedSizeAtOrAbove) {
  const std::vector<std::pair<int32_t, int32_t>> cases = {
      {1, 1},   {2, 2},   {3, 4},     {4, 4},     {5, 8},     {8, 8},   {9, 16},
      {16, 16}, {17, 24}, {57, 64},   {64, 64},   {65, 96},   {96, 96}, {97, 128},
      {200, 224}, {256, 256}, {257, 0}, {0, 0}};
  for (auto [rows, bucket] : cases) EXPECT_EQ(GraphBatchBucket(rows), bucket) << rows;
  // Padding: under twice the rows up to 8, then at most 7 rows up to 64 and
  // 31 beyond.
  for (int32_t rows = 1; rows <= kMaxGraphRows; ++rows) {
    const int32_t pad = GraphBatchBucket(rows) - rows;
    EXPECT_GE(pad, 0) << rows;
    EXPECT_LT(pad, rows <= 8 ? rows : rows <= 64 ? 8 : 32) << rows;
  }
}

TEST(DecodeGraphsTest, SplitsBucketsArePowersOfTwo) {
  const std::vector<std::pair<int32_t, int32_t>> cases = {
      {0, 1}, {1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8}, {100, 128}};
  for (auto [splits, bucket] : cases) EXPECT_EQ(GraphSplitsBucket(splits), bucket) << splits;
}

TEST(DecodeGraphsTest, OnlyOneTokenPerSequenceIsADecodeStep) {
  const std::vector<int32_t> one = {5}, two = {5, 6}, table = {0};
  std::vector<SequenceInput> batch = {{.token_ids = one, .start_pos = 3, .block_table = table},
                                      {.token_ids = one, .start_pos = 9, .block_table = table}};
  EXPECT_TRUE(IsDecodeBatch(batch));
  batch[1].token_ids = two;
  EXPECT_FALSE(IsDecodeBatch(batch));
  EXPECT_FALSE(IsDecodeBatch({}));
}

TEST(DecodeGraphsTest, PaddingRowsWriteNoKvAndReadBlockZero) {
  const std::vector<int32_t> t0 = {11}, t1 = {12}, table0 = {4, 5}, table1 = {7};
  const std::vector<SequenceInput> batch = {
      {.token_ids = t0, .start_pos = 20, .block_table = table0},
      {.token_ids = t1, .start_pos = 3, .block_table = table1}};
  BatchLayout lay = MakeBatchLayout(batch, 16);
  const BatchLayout before = lay;
  PadDecodeLayout(&lay, 4);
  EXPECT_EQ(lay.num_rows, 4);
  EXPECT_EQ(lay.max_context, before.max_context);
  // The real rows are untouched.
  for (int32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(lay.tokens[r], before.tokens[r]);
    EXPECT_EQ(lay.row_pos[r], before.row_pos[r]);
    EXPECT_EQ(lay.row_table_offset[r], before.row_table_offset[r]);
    EXPECT_EQ(lay.slots[r], before.slots[r]);
    EXPECT_EQ(lay.last_rows[r], before.last_rows[r]);
  }
  EXPECT_EQ(lay.block_tables, (std::vector<int32_t>{4, 5, 7, 0}));
  for (int32_t r = 2; r < 4; ++r) {
    EXPECT_EQ(lay.tokens[r], 0);
    EXPECT_EQ(lay.row_pos[r], 0);
    EXPECT_EQ(lay.row_table_offset[r], 3);
    EXPECT_EQ(lay.slots[r], -1);
    EXPECT_EQ(lay.last_rows[r], r);
  }
  PadDecodeLayout(&lay, 3);  // already past: unchanged
  EXPECT_EQ(lay.num_rows, 4);
}

}  // namespace
}  // namespace tandem::model::internal
