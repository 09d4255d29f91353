#include "tandem/sched/block_pool.h"

#include "gtest/gtest.h"

namespace tandem::sched {
namespace {

BlockHash H(uint8_t v) {
  BlockHash h;
  h.bytes[0] = v;
  return h;
}

TEST(BlockPoolTest, NullBlockIsNeverHandedOut) {
  BlockPool pool(4, /*enable_caching=*/true);
  EXPECT_EQ(pool.num_usable_blocks(), 3);
  std::vector<int32_t> got;
  pool.Allocate(3, &got);
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
}

TEST(BlockPoolTest, UnhashedFreedBlocksAreReusedFirstHashedOnesLru) {
  BlockPool pool(7, true);
  std::vector<int32_t> a;
  pool.Allocate(3, &a);  // 1 2 3
  ASSERT_TRUE(pool.CacheBlock(1, H(1)));
  ASSERT_TRUE(pool.CacheBlock(2, H(2)));
  pool.FreeReversed(a);  // tail first: 3 (unhashed) to the head, then 2, 1 to the tail
  EXPECT_EQ(pool.FreeQueueForTest(), (std::vector<int32_t>{3, 4, 5, 6, 2, 1}));
  std::vector<int32_t> b;
  pool.Allocate(5, &b);  // evicts 2's hash, keeps 1's
  EXPECT_EQ(b, (std::vector<int32_t>{3, 4, 5, 6, 2}));
  EXPECT_FALSE(pool.Lookup(H(2)).has_value());
  EXPECT_EQ(pool.Lookup(H(1)), 1);
}

TEST(BlockPoolTest, TouchingACachedFreeBlockTakesItOffTheFreeQueue) {
  BlockPool pool(3, true);
  std::vector<int32_t> a;
  pool.Allocate(1, &a);
  ASSERT_TRUE(pool.CacheBlock(a[0], H(7)));
  pool.Free(a);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  pool.Touch(a[0]);
  pool.Touch(a[0]);
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_TRUE(pool.is_cached(a[0]));
}

TEST(BlockPoolTest, DuplicateHashIsNotPublishedTwice) {
  BlockPool pool(3, true);
  std::vector<int32_t> a;
  pool.Allocate(2, &a);
  EXPECT_TRUE(pool.CacheBlock(a[0], H(9)));
  EXPECT_FALSE(pool.CacheBlock(a[1], H(9)));
  EXPECT_FALSE(pool.is_cached(a[1]));
  EXPECT_EQ(pool.Lookup(H(9)), a[0]);
}

TEST(BlockPoolTest, CachingOffNeverPublishes) {
  BlockPool pool(3, false);
  std::vector<int32_t> a;
  pool.Allocate(1, &a);
  EXPECT_FALSE(pool.CacheBlock(a[0], H(1)));
  EXPECT_FALSE(pool.Lookup(H(1)).has_value());
}

}  // namespace
}  // namespace tandem::sched
