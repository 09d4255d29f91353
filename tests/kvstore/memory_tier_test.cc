// Durability::kMemory: blocks kept in the hot tier only (the engine's
// KvStoreTest fixture, kv_store_fixture.h).
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_store_fixture.h"
#include "tandem/kvstore/kv_store.h"
#include "test_util.h"

namespace tandem::kvstore {
namespace {

using ::tandem::kvstore::testing::Crc;
using ::tandem::kvstore::testing::kBlock;
using ::tandem::kvstore::testing::KvStoreTest;
using ::tandem::kvstore::testing::kNs;
using ::tandem::kvstore::testing::TestHash;
using ::tandem::kvstore::testing::TestPayload;
using ::testing::HasSubstr;

// ---- Durability::kMemory: the hot tier only -------------------------------

absl::StatusOr<StoreResult> StoreIn(KvStoreEngine* store, uint64_t i,
                                    std::optional<Durability> d) {
  auto p = TestPayload(i, kBlock);
  return store->Store(kNs, TestHash(i), p, Crc(p), d);
}

TEST_F(KvStoreTest, MemoryBlocksStayInTheHotTierAndAreGoneAfterARestart) {
  KvStoreOptions o = Options();
  Open(o);
  Put(1);  // wal, the default
  ASSERT_TRUE(StoreIn(store_.get(), 2, Durability::kMemory).ok());
  EXPECT_TRUE(store_->TEST_InHot(kNs, TestHash(2)));
  EXPECT_FALSE(store_->TEST_InCold(kNs, TestHash(2)));
  EXPECT_TRUE(Get(2).from_hot);
  EXPECT_EQ(Hits({1, 2}), 2);
  KvStoreStats st = store_->GetStats();
  EXPECT_EQ(st.cold_blocks, 1u);  // not counted in the cold tier
  EXPECT_EQ(st.cold_bytes, kBlock);
  EXPECT_EQ(st.hot_blocks, 2u);
  EXPECT_EQ(st.stores, 2u);
  Open(o);
  EXPECT_EQ(Hits({1}), 1);
  EXPECT_EQ(Hits({2}), 0);
  EXPECT_EQ(Get(2).miss, MissReason::kNotFound);
}

TEST_F(KvStoreTest, ADroppedMemoryBlockLeavesTheColdTiersCountsAlone) {
  Open(Options());
  Put(1);  // wal: the cold tier's one block
  ASSERT_TRUE(StoreIn(store_.get(), 2, Durability::kMemory).ok());
  ASSERT_TRUE(store_->TEST_CorruptHot(kNs, TestHash(2), 7).ok());
  std::vector<uint8_t> out(kBlock);
  auto r = store_->ReadInto(kNs, TestHash(2), out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->miss, MissReason::kChecksum);
  EXPECT_EQ(Hits({2}), 0);
  KvStoreStats st = store_->GetStats();
  EXPECT_EQ(st.cold_blocks, 1u);
  EXPECT_EQ(st.cold_bytes, kBlock);
  EXPECT_EQ(st.hot_blocks, 1u);
}

TEST_F(KvStoreTest, MemoryBlocksEvictedFromTheHotTierAreGoneAndCanBeStoredAgain) {
  KvStoreOptions o = Options();  // 3 hot slots
  o.durability = Durability::kMemory;
  Open(o);
  Put(1);
  Put(2);
  Put(3);
  EXPECT_TRUE(Get(1).from_hot);  // 2 is now the least recent
  Put(4);
  EXPECT_EQ(Hits({2}), 0);
  EXPECT_EQ(Get(2).miss, MissReason::kNotFound);
  for (uint64_t i : {1, 3, 4}) EXPECT_TRUE(Get(i).from_hot) << i;
  EXPECT_EQ(store_->GetStats().evictions_hot, 1u);
  EXPECT_EQ(store_->GetStats().cold_blocks, 0u);
  auto again = StoreIn(store_.get(), 2, std::nullopt);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->already_present);
  EXPECT_TRUE(Get(2).from_hot);
}

TEST_F(KvStoreTest, AMemoryStoreWithEveryHotSlotLeasedIsRefusedAndLeavesNothing) {
  KvStoreOptions o = Options();
  o.hot_capacity_bytes = kBlock;  // one slot
  Open(o);
  ASSERT_TRUE(StoreIn(store_.get(), 1, Durability::kMemory).ok());
  std::vector<BlockHash> h{TestHash(1)};
  auto lease = store_->Lookup(kNs, h, {.take_lease = true});
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->num_hits, 1);
  auto refused = StoreIn(store_.get(), 2, Durability::kMemory);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("no hot slot"));
  EXPECT_EQ(Hits({2}), 0);
  EXPECT_TRUE(Get(1).ok());  // the leased block is intact
  // A durable store does not need the slot: it is kept in the cold tier.
  ASSERT_TRUE(StoreIn(store_.get(), 3, Durability::kWal).ok());
  EXPECT_TRUE(store_->TEST_InCold(kNs, TestHash(3)));
  EXPECT_TRUE(store_->Release(lease->lease));
  ASSERT_TRUE(StoreIn(store_.get(), 2, Durability::kMemory).ok());
  EXPECT_EQ(Hits({1}), 0);  // its slot went to 2
  EXPECT_TRUE(Get(2).from_hot);
}

TEST_F(KvStoreTest, MemoryDurabilityNeedsAHotTierWithSlotsTheBlocksSize) {
  KvStoreOptions o = Options();
  o.durability = Durability::kMemory;
  o.hot_capacity_bytes = 0;
  auto bad = KvStoreEngine::Open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("hot tier only"));
  o.durability = Durability::kWal;
  Open(o);  // no hot tier: a store asking for memory is refused by name
  auto none = StoreIn(store_.get(), 1, Durability::kMemory);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("--hot-capacity-bytes 0"));
  EXPECT_EQ(Hits({1}), 0);
  Open(Options());
  ASSERT_TRUE(store_->CreateNamespace({.name = "big", .block_bytes = 2 * kBlock, .layout = "x"})
                  .ok());
  auto p = TestPayload(1, 2 * kBlock);
  auto big = store_->Store("big", TestHash(1), p, Crc(p), Durability::kMemory);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(big.status().message(), HasSubstr("does not fit a hot slot"));
  EXPECT_TRUE(store_->Store("big", TestHash(1), p, Crc(p), Durability::kWal).ok());
}

TEST_F(KvStoreTest, ADurableStoreOfAMemoryOnlyBlockIsRefusedNotAcknowledged) {
  Open(Options());
  ASSERT_TRUE(StoreIn(store_.get(), 1, Durability::kMemory).ok());
  for (Durability d : {Durability::kNone, Durability::kWal, Durability::kFsync}) {
    auto r = StoreIn(store_.get(), 1, d);
    ASSERT_FALSE(r.ok()) << DurabilityName(d);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(r.status().message(), HasSubstr("held in memory only"));
    auto p = TestPayload(1, kBlock);
    std::vector<StoreBlock> batch{{.hash = TestHash(1), .payload = p, .checksum = Crc(p)}};
    auto rs = store_->StoreBatch(kNs, batch, d);
    ASSERT_FALSE(rs[0].ok()) << DurabilityName(d);
    EXPECT_THAT(rs[0].status().message(), HasSubstr("held in memory only"));
  }
  auto same = StoreIn(store_.get(), 1, Durability::kMemory);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->already_present);
  // A memory store of a block already on disk finds it there: more than asked.
  Put(2);
  auto on_disk = StoreIn(store_.get(), 2, Durability::kMemory);
  ASSERT_TRUE(on_disk.ok());
  EXPECT_TRUE(on_disk->already_present);
  EXPECT_TRUE(store_->TEST_InCold(kNs, TestHash(2)));
}

TEST_F(KvStoreTest, AMemoryBatchLargerThanTheHotTierHoldsItsFirstBlocks) {
  Open(Options());  // 3 hot slots
  Put(9);           // wal: its slot may go, it stays cold
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<StoreBlock> batch;
  for (uint64_t i = 0; i < 5; ++i) payloads.push_back(TestPayload(i, kBlock));
  for (uint64_t i = 0; i < 5; ++i) {
    batch.push_back({.hash = TestHash(i), .payload = payloads[i], .checksum = Crc(payloads[i])});
  }
  auto rs = store_->StoreBatch(kNs, batch, Durability::kMemory);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(rs[i].ok()) << i << ": " << rs[i].status();
  for (uint64_t i = 3; i < 5; ++i) {
    ASSERT_FALSE(rs[i].ok()) << i;
    EXPECT_EQ(rs[i].status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(Hits({0, 1, 2, 3}), 3);
  EXPECT_EQ(Hits({9}), 1);
  EXPECT_FALSE(store_->TEST_InHot(kNs, TestHash(9)));
}

TEST_F(KvStoreTest, MemoryStoresGoOnWhenTheDiskIsFull) {
  Open(Options());
  KvStoreOptions o = Options();
  o.min_free_disk_bytes = uint64_t{1} << 62;  // more than any disk has
  Open(o);
  auto wal = StoreIn(store_.get(), 1, Durability::kWal);
  ASSERT_FALSE(wal.ok());
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(StoreIn(store_.get(), 2, Durability::kMemory).ok());
  EXPECT_TRUE(Get(2).from_hot);
}

}  // namespace
}  // namespace tandem::kvstore
