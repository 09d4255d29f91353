#include "tandem/sched/kv_cache_manager.h"

#include "gtest/gtest.h"
#include "sched_test_util.h"

namespace tandem::sched {
namespace {

Request MakeRequest(int32_t num_tokens, int32_t seed) {
  Request r;
  r.all_token_ids = testing::Tokens(num_tokens, seed);
  r.num_prompt_tokens = num_tokens;
  r.root_hash = ComputeRootHash(testing::TestConfig().hash_root);
  ExtendBlockHashes(r.root_hash, r.all_token_ids, 4, &r.block_hashes);
  return r;
}

TEST(KvCacheManagerTest, LookaheadSlotsAreAllocatedBeyondTheNewTokensAndNeverCached) {
  KvCacheManager kv(/*num_blocks=*/6, /*block_size=*/4, /*enable_caching=*/true);  // 5 usable
  Request r = MakeRequest(6, 1);
  // 6 tokens + 3 lookahead slots: 9 slots, 3 blocks.
  const SlotRequest prefill{.num_new_tokens = 6, .num_lookahead_tokens = 3};
  ASSERT_EQ(kv.NumFreeBlocksNeeded(r, prefill), 3);
  ASSERT_TRUE(kv.CanAllocateSlots(r, prefill));
  EXPECT_EQ(kv.AllocateSlots(&r, prefill), 0);
  EXPECT_EQ(r.block_ids.size(), 3u);
  r.num_computed_tokens = 6;
  // Only the full block of known tokens is published, not the slots beyond.
  kv.CacheBlocks(&r, 9);
  EXPECT_EQ(r.num_cached_blocks, 1);
  EXPECT_TRUE(kv.pool().is_cached(r.block_ids[0]));
  EXPECT_FALSE(kv.pool().is_cached(r.block_ids[1]));
  // The next decode's lookahead is already covered: no new block.
  EXPECT_EQ(kv.NumFreeBlocksNeeded(r, {.num_new_tokens = 1, .num_lookahead_tokens = 3}), 0);
  // 7 + 13 = 20 slots: 5 blocks, 2 more, both free; 21 slots need 3 more.
  EXPECT_TRUE(kv.CanAllocateSlots(r, {.num_new_tokens = 1, .num_lookahead_tokens = 13}));
  EXPECT_FALSE(kv.CanAllocateSlots(r, {.num_new_tokens = 1, .num_lookahead_tokens = 14}));
  kv.FreeBlocks(&r);
  EXPECT_EQ(kv.pool().num_free_blocks(), 5);
}

TEST(KvCacheManagerTest, CachedHitsInTheFreeQueueCountAsBlocksTaken) {
  KvCacheManager kv(/*num_blocks=*/6, /*block_size=*/4, /*enable_caching=*/true);
  Request a = MakeRequest(9, 2);
  ASSERT_EQ(kv.AllocateSlots(&a, {.num_new_tokens = 9}), 0);  // 3 blocks
  a.num_computed_tokens = 9;
  kv.CacheBlocks(&a, 9);  // blocks 0 and 1 published
  kv.FreeBlocks(&a);      // back in the free queue, still cached
  Request b = MakeRequest(9, 2);
  const PrefixHit hit = kv.FindPrefixHit(b);
  ASSERT_EQ(hit.num_tokens, 8);
  // One new block plus the two hit blocks taken out of the free queue.
  EXPECT_EQ(kv.NumFreeBlocksNeeded(b, {.num_new_tokens = 1, .hit = &hit}), 3);
  kv.AllocateSlots(&b, {.num_new_tokens = 1, .hit = &hit});
  EXPECT_EQ(kv.pool().num_free_blocks(), 2);
  // While b holds them, the same hit takes nothing from the free queue.
  Request c = MakeRequest(9, 2);
  const PrefixHit shared = kv.FindPrefixHit(c);
  EXPECT_EQ(kv.NumFreeBlocksNeeded(c, {.num_new_tokens = 1, .hit = &shared}), 1);
}

}  // namespace
}  // namespace tandem::sched
