// PlanAttention's routing: which rows reach the tensor-core kernel, in which
// tiles, and what the split-K kernel is left with.
#include "tandem/kernels/attention_plan.h"

#include <vector>

#include "gtest/gtest.h"
#include "tandem/kernels/attention_split.h"

namespace tandem::kernels {
namespace {

// Rows of a batch built as MakeBatchLayout does: sequence s holds positions
// first .. first + rows - 1 under its own table offset.
struct Rows {
  std::vector<int32_t> pos, off;
  void Add(int32_t first, int32_t rows) {
    const int32_t offset = off.empty() ? 0 : off.back() + 100;
    for (int32_t i = 0; i < rows; ++i) {
      pos.push_back(first + i);
      off.push_back(offset);
    }
  }
};

TEST(AttentionPlanTest, DecodeRowsStayOnTheSplitKKernel) {
  Rows r;
  for (int32_t i = 0; i < 40; ++i) r.Add(100 + i, 1);
  const AttentionPlan plan = PlanAttention(r.pos, r.off, 64, 4, true);
  EXPECT_EQ(plan.num_tiles(), 0);
  ASSERT_EQ(plan.num_single_rows(), 40);
  for (int32_t i = 0; i < 40; ++i) EXPECT_EQ(plan.single_rows[i], i);
  EXPECT_EQ(plan.single_max_context, 140);
}

// A block holds 128 MMA rows up to head size 64, 64 above (128 at 128 in the
// wide block); as many query
// heads of one KV head as fit 16 rows each, and the positions left for them
// in multiples of 16.
TEST(AttentionPlanTest, TileGeometryFollowsHeadSizeAndGroup) {
  struct Case {
    int32_t hs, group, heads, positions;
  };
  for (const Case c : {Case{64, 1, 1, 128}, Case{64, 4, 4, 32}, Case{64, 8, 8, 16},
                       Case{64, 6, 6, 16}, Case{32, 2, 2, 64}, Case{64, 16, 8, 16},
                       Case{128, 1, 1, 64}, Case{128, 4, 4, 16}, Case{128, 8, 4, 16},
                       Case{128, 7, 4, 16}, Case{96, 3, 3, 16}}) {
    EXPECT_EQ(TensorCoreBlockHeads(c.hs, c.group), c.heads) << c.hs << " " << c.group;
    EXPECT_EQ(TensorCoreTilePositions(c.hs, c.group), c.positions) << c.hs << " " << c.group;
  }
  Rows r;
  r.Add(0, 100);
  EXPECT_EQ(PlanAttention(r.pos, r.off, 64, 4, true).tiles,
            (std::vector<int32_t>{0, 32, 32, 32, 64, 32, 96, 4}));
  // The wide block: 128 rows at head size 128 (Qwen2.5's GQA 6 in one
  // chunk), the same blocks at every other size.
  for (const Case c : {Case{128, 1, 1, 128}, Case{128, 4, 4, 32}, Case{128, 6, 6, 16},
                       Case{128, 8, 8, 16}, Case{128, 16, 8, 16}}) {
    EXPECT_EQ(TensorCoreBlockHeads(c.hs, c.group, true), c.heads) << c.group;
    EXPECT_EQ(TensorCoreTilePositions(c.hs, c.group, true), c.positions) << c.group;
  }
  for (const int32_t hs : {32, 64, 96, 256}) {
    EXPECT_EQ(TensorCoreBlockRows(hs, true), TensorCoreBlockRows(hs)) << hs;
  }
  EXPECT_EQ(PlanAttention(r.pos, r.off, 128, 4, true, /*wide=*/true).tiles,
            (std::vector<int32_t>{0, 32, 32, 32, 64, 32, 96, 4}));
}

TEST(AttentionPlanTest, ChunksFromSixteenRowsAreTiledBySixtyFour) {
  Rows r;
  r.Add(7, 1);      // row 0: a decode
  r.Add(0, 15);     // rows 1..15: one row short of a tile
  r.Add(32, 16);    // rows 16..31: the smallest tile
  r.Add(500, 130);  // rows 32..161: two full tiles and 2 rows
  r.Add(9, 1);      // row 162: a decode
  const AttentionPlan plan = PlanAttention(r.pos, r.off, 128, 1, true);
  EXPECT_EQ(plan.tiles, (std::vector<int32_t>{16, 16, 32, 64, 96, 64, 160, 2}));
  std::vector<int32_t> single = {0};
  for (int32_t i = 1; i <= 15; ++i) single.push_back(i);
  single.push_back(162);
  EXPECT_EQ(plan.single_rows, single);
  EXPECT_EQ(plan.single_max_context, 15);  // row 15 sits at position 14
}

TEST(AttentionPlanTest, ARunBreaksAtANewSequenceOrAGapInPositions) {
  Rows r;
  r.Add(0, 10);
  r.Add(10, 10);  // continues the positions, but under another table
  std::vector<int32_t> pos = r.pos, off = r.off;
  EXPECT_EQ(PlanAttention(pos, off, 64, 4, true).num_tiles(), 0);
  // The same table with a gap at row 10: two runs of 10.
  off.assign(20, 0);
  pos[10] += 1;
  EXPECT_EQ(PlanAttention(pos, off, 64, 4, true).num_tiles(), 0);
  pos[10] -= 1;  // now one run of 20
  EXPECT_EQ(PlanAttention(pos, off, 64, 4, true).tiles, (std::vector<int32_t>{0, 20}));
}

TEST(AttentionPlanTest, WithoutTensorCoresOrForOtherHeadSizesEveryRowIsSingle) {
  Rows r;
  r.Add(0, 300);
  for (auto [hs, tc] : {std::pair{64, false}, {256, false}, {40, true}, {8, true}, {512, true}}) {
    const AttentionPlan plan = PlanAttention(r.pos, r.off, hs, 1, tc);
    EXPECT_EQ(plan.num_tiles(), 0) << hs;
    EXPECT_EQ(plan.num_single_rows(), 300) << hs;
    EXPECT_EQ(plan.single_max_context, 300) << hs;
  }
  for (int32_t hs : {32, 64, 96, 128, 256}) {
    const int32_t tile = TensorCoreTilePositions(hs, 1);
    EXPECT_EQ(PlanAttention(r.pos, r.off, hs, 1, true).num_tiles(), (300 + tile - 1) / tile);
  }
}

// How many splits a block of the split-K kernel takes, by the batch: with
// blocks enough for kPipelinedBlocksPerSm per multiprocessor at a split a
// block, no pipelining; beyond that, as many splits as keep that many
// blocks, spread evenly over the row; never more than the row has.
TEST(AttentionPlanTest, SplitsPerBlockGrowWithTheBatch) {
  using cuda::PipelinedSplitsPerBlock;
  constexpr int32_t kSms = 132;  // an H100's / H200's
  // Llama-3.2-1B (8 KV heads, one head chunk), context 512 (4 splits).
  EXPECT_EQ(PipelinedSplitsPerBlock(1 * 8, 4, kSms), 1);    // batch 1
  EXPECT_EQ(PipelinedSplitsPerBlock(32 * 8, 4, kSms), 1);   // 1,024 blocks: enough
  EXPECT_EQ(PipelinedSplitsPerBlock(64 * 8, 4, kSms), 2);   // 3 per block -> 2 + 2
  EXPECT_EQ(PipelinedSplitsPerBlock(256 * 8, 4, kSms), 4);  // a row per block
  // Context 4,096 (32 splits) at batch 32: 15 per block -> 3 blocks of 11, 11, 10.
  EXPECT_EQ(PipelinedSplitsPerBlock(32 * 8, 32, kSms), 11);
  // At least 4 blocks per multiprocessor remain whenever it pipelines.
  for (int64_t row_blocks : {8, 64, 256, 512, 1000, 2048, 4096}) {
    for (int32_t splits : {1, 2, 4, 7, 32, 64}) {
      const int32_t spb = PipelinedSplitsPerBlock(row_blocks, splits, kSms);
      SCOPED_TRACE(std::to_string(row_blocks) + " row blocks, " + std::to_string(splits) +
                   " splits");
      ASSERT_GE(spb, 1);
      ASSERT_LE(spb, std::max(splits, 1));
      if (spb > 1 && spb < splits) {
        const int64_t blocks = row_blocks * ((splits + spb - 1) / spb);
        EXPECT_GE(blocks, cuda::kPipelinedBlocksPerSm * kSms);
      }
    }
  }
  // No device to ask, or one split: a block per split.
  EXPECT_EQ(PipelinedSplitsPerBlock(256 * 8, 4, 0), 1);
  EXPECT_EQ(PipelinedSplitsPerBlock(256 * 8, 1, kSms), 1);
}

}  // namespace
}  // namespace tandem::kernels
