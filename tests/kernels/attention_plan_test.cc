// PlanAttention's routing: which rows reach the tensor-core kernel, in which
// tiles, and what the split-K kernel is left with.
#include "tandem/kernels/attention_plan.h"

#include <vector>

#include "gtest/gtest.h"

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

// A block holds 128 MMA rows up to head size 64, 64 above; as many query
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
  for (auto [hs, tc] : {std::pair{64, false}, {256, true}, {40, true}, {8, true}}) {
    const AttentionPlan plan = PlanAttention(r.pos, r.off, hs, 1, tc);
    EXPECT_EQ(plan.num_tiles(), 0) << hs;
    EXPECT_EQ(plan.num_single_rows(), 300) << hs;
    EXPECT_EQ(plan.single_max_context, 300) << hs;
  }
  for (int32_t hs : {32, 64, 96, 128}) {
    const int32_t tile = TensorCoreTilePositions(hs, 1);
    EXPECT_EQ(PlanAttention(r.pos, r.off, hs, 1, true).num_tiles(), (300 + tile - 1) / tile);
  }
}

}  // namespace
}  // namespace tandem::kernels
