#include "tandem/kvstore/kv_store.h"

#include <memory>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_store_fixture.h"
#include "test_util.h"

namespace tandem::kvstore {
namespace {

using ::tandem::kvstore::testing::Crc;
using ::tandem::kvstore::testing::kBlock;
using ::tandem::kvstore::testing::kNs;
using ::tandem::kvstore::testing::KvStoreTest;
using ::tandem::kvstore::testing::TempDir;
using ::tandem::kvstore::testing::TestHash;
using ::tandem::kvstore::testing::TestPayload;
using ::testing::HasSubstr;

TEST_F(KvStoreTest, OptionsValidateRejectsNonsense) {
  EXPECT_FALSE(KvStoreOptions{}.Validate().ok());
  EXPECT_FALSE((KvStoreOptions{.data_dir = "x", .hot_capacity_bytes = 10, .hot_slot_bytes = 100})
                   .Validate()
                   .ok());
  EXPECT_TRUE((KvStoreOptions{.data_dir = "x"}).Validate().ok());
  EXPECT_FALSE((NamespaceSpec{.name = "", .block_bytes = 1}).Validate().ok());
  EXPECT_FALSE((NamespaceSpec{.name = "a", .block_bytes = 0}).Validate().ok());
}

TEST_F(KvStoreTest, CreateNamespaceIsIdempotentAndRejectsAConflictingSpec) {
  Open(Options());
  auto again = store_->CreateNamespace({.name = kNs, .block_bytes = kBlock, .layout = "test"});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  auto conflict = store_->CreateNamespace({.name = kNs, .block_bytes = 2 * kBlock});
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(conflict.status().message()), HasSubstr("block_bytes=4096"));
}

TEST_F(KvStoreTest, UnknownNamespaceIsNotFoundWithItsName) {
  Open(Options());
  auto p = TestPayload(1, kBlock);
  std::vector<BlockHash> hashes{TestHash(1)};
  auto store = store_->Store("nope", TestHash(1), p, Crc(p));
  auto lookup = store_->Lookup("nope", hashes);
  auto read = store_->ReadInto("nope", TestHash(1), p);
  for (const absl::Status& s : {store.status(), lookup.status(), read.status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(s.message()), HasSubstr("namespace 'nope' is not registered"));
  }
}

TEST_F(KvStoreTest, StoredBlockReadsBackIdentical) {
  Open(Options());
  Put(7);
  ReadResult r = Get(7);
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.from_hot);
  EXPECT_EQ(r.checksum, Crc(TestPayload(7, kBlock)));
}

TEST_F(KvStoreTest, BadPayloadsAreRejectedAndNothingIsStored) {
  Open(Options());
  auto short_payload = TestPayload(1, kBlock - 1);
  auto s = store_->Store(kNs, TestHash(1), short_payload, Crc(short_payload));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("payload has 4095 bytes"));

  auto p = TestPayload(1, kBlock);
  s = store_->Store(kNs, TestHash(1), p, Crc(p) ^ 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Hits({1}), 0);
  EXPECT_EQ(store_->GetStats().cold_blocks, 0u);
}

// A CRC32C the caller computed while receiving (the bulk port's) is what
// the writer's checksum is compared with: bytes damaged before it was taken
// are refused even though the buffer now matches, and a matching one is
// taken without reading the payload again.
TEST_F(KvStoreTest, StoreBatchComparesTheChecksumWithTheCrcTheCallerComputed) {
  Open(Options());
  const auto p1 = TestPayload(1, kBlock), p2 = TestPayload(2, kBlock);
  std::vector<StoreBlock> batch = {
      {.hash = TestHash(1), .payload = p1, .checksum = Crc(p1), .payload_crc = Crc(p1) ^ 4},
      {.hash = TestHash(2), .payload = p2, .checksum = Crc(p2), .payload_crc = Crc(p2)}};
  auto rs = store_->StoreBatch(kNs, batch, std::nullopt);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(rs[0].status().message()), HasSubstr("does not match the payload"));
  EXPECT_TRUE(rs[1].ok()) << rs[1].status();
  EXPECT_EQ(Hits({1}), 0);
  EXPECT_EQ(Hits({2}), 1);
}

TEST_F(KvStoreTest, StoringAnExistingBlockKeepsTheOriginal) {
  Open(Options());
  Put(3);
  auto other = TestPayload(99, kBlock);
  auto r = store_->Store(kNs, TestHash(3), other, Crc(other));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->already_present);
  EXPECT_TRUE(r->mismatched) << "other bytes under the same hash";
  EXPECT_TRUE(Get(3).ok());  // still block 3's bytes
  EXPECT_EQ(store_->GetStats().stores, 1u);
  EXPECT_EQ(store_->GetStats().stores_already_present, 1u);
  EXPECT_EQ(store_->GetStats().stores_mismatched, 1u);
  // The same bytes again: present, not a mismatch.
  auto same = TestPayload(3, kBlock);
  r = store_->Store(kNs, TestHash(3), same, Crc(same));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->already_present);
  EXPECT_FALSE(r->mismatched);
  EXPECT_EQ(store_->GetStats().stores_mismatched, 1u);
  // Still the first write after a reopen (RocksDB was not overwritten).
  Open(Options());
  EXPECT_TRUE(Get(3).ok());
}

TEST_F(KvStoreTest, LookupCountsOnlyLeadingHits) {
  Open(Options());
  Put(0);
  Put(1);
  Put(3);
  EXPECT_EQ(Hits({0, 1, 2, 3}), 2);
  EXPECT_EQ(Hits({2, 0, 1}), 0);
  EXPECT_EQ(Hits({}), 0);
}

TEST_F(KvStoreTest, NamespacesAreIsolated) {
  Open(Options());
  ASSERT_TRUE(store_->CreateNamespace({.name = "model-b", .block_bytes = kBlock}).ok());
  Put(5, kNs, /*tag=*/1);
  EXPECT_EQ(Hits({5}), 1);
  std::vector<BlockHash> h{TestHash(5)};
  EXPECT_EQ(store_->Lookup("model-b", h)->num_hits, 0);
  EXPECT_FALSE(Get(5, "model-b").ok());
  Put(5, "model-b", /*tag=*/2);
  EXPECT_TRUE(Get(5, kNs, 1).ok());
  EXPECT_TRUE(Get(5, "model-b", 2).ok());
}

TEST_F(KvStoreTest, HotTierEvictsLeastRecentlyUsedAndKeepsItCold) {
  Open(Options());  // 3 hot slots
  Put(1);
  Put(2);
  Put(3);
  EXPECT_TRUE(Get(1).from_hot);  // order now 1,3,2 (2 least recent)
  Put(4);
  EXPECT_FALSE(store_->TEST_InHot(kNs, TestHash(2)));
  EXPECT_TRUE(store_->TEST_InCold(kNs, TestHash(2)));
  for (int i : {1, 3, 4}) EXPECT_TRUE(store_->TEST_InHot(kNs, TestHash(i))) << i;
  // Reading the cold block promotes it, evicting the least recent (3).
  ReadResult r = Get(2);
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(r.from_hot);
  EXPECT_TRUE(store_->TEST_InHot(kNs, TestHash(2)));
  EXPECT_FALSE(store_->TEST_InHot(kNs, TestHash(3)));
  EXPECT_TRUE(Get(2).from_hot);
  EXPECT_EQ(store_->GetStats().evictions_hot, 2u);
  EXPECT_EQ(store_->GetStats().promotions, 1u);
}

TEST_F(KvStoreTest, ColdTierEvictsLeastRecentlyUsed) {
  KvStoreOptions o = Options();
  o.cold_capacity_blocks = 3;
  Open(o);
  Put(1);
  Put(2);
  Put(3);
  EXPECT_TRUE(Get(1).ok());  // 2 is now least recent
  Put(4);
  EXPECT_EQ(Hits({2}), 0);
  EXPECT_FALSE(store_->TEST_InHot(kNs, TestHash(2)));
  EXPECT_EQ(Hits({1}), 1);  // touches 1: order 1,4,3
  Put(5);
  EXPECT_EQ(Hits({3}), 0);
  for (int i : {1, 4, 5}) EXPECT_EQ(Hits({static_cast<uint64_t>(i)}), 1) << i;
  EXPECT_EQ(store_->GetStats().evictions_cold, 2u);
  EXPECT_EQ(store_->GetStats().cold_blocks, 3u);
}

TEST_F(KvStoreTest, ColdTierCapacityInBytes) {
  KvStoreOptions o = Options();
  o.cold_capacity_bytes = 2 * kBlock + 1;
  Open(o);
  for (int i = 0; i < 5; ++i) Put(i);
  EXPECT_EQ(store_->GetStats().cold_blocks, 2u);
  EXPECT_EQ(Hits({3, 4}), 2);
  EXPECT_EQ(Hits({2}), 0);
}

TEST_F(KvStoreTest, LeasedBlockIsNeverEvictedUntilReleased) {
  KvStoreOptions o = Options();
  o.cold_capacity_blocks = 2;
  o.hot_capacity_bytes = kBlock;  // one hot slot
  Open(o);
  Put(1);
  std::vector<BlockHash> h{TestHash(1)};
  auto lease = store_->Lookup(kNs, h, {.take_lease = true});
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->num_hits, 1);
  ASSERT_NE(lease->lease.value(), 0u);
  for (int i = 2; i < 8; ++i) Put(i);
  EXPECT_TRUE(store_->TEST_InHot(kNs, TestHash(1)));  // its slot is pinned too
  EXPECT_TRUE(Get(1).ok());
  EXPECT_EQ(store_->GetStats().active_leases, 1u);
  EXPECT_TRUE(store_->Release(lease->lease));
  EXPECT_FALSE(store_->Release(lease->lease));
  for (int i = 8; i < 11; ++i) Put(i);
  EXPECT_EQ(Hits({1}), 0);
}

// A restarted store hands out lease ids the one before it did not: a
// client's Release of a lease from before the restart unpins nothing of
// anyone else's. With ids from 1 after each start, the stale Release below
// unpinned block 1 and the Puts evicted it.
TEST_F(KvStoreTest, AStaleLeaseFromBeforeARestartReleasesNothing) {
  KvStoreOptions o = Options();
  o.cold_capacity_blocks = 2;
  o.hot_capacity_bytes = kBlock;
  Open(o);
  Put(1);
  std::vector<BlockHash> h{TestHash(1)};
  auto before = store_->Lookup(kNs, h, {.take_lease = true});
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->num_hits, 1);
  Open(o);  // the same data directory: block 1 is still there
  auto after = store_->Lookup(kNs, h, {.take_lease = true});
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->num_hits, 1);
  EXPECT_NE(after->lease.value(), before->lease.value());
  EXPECT_FALSE(store_->Release(before->lease));
  for (int i = 2; i < 6; ++i) Put(i);
  EXPECT_TRUE(store_->TEST_InCold(kNs, TestHash(1)) || store_->TEST_InHot(kNs, TestHash(1)));
  EXPECT_EQ(Hits({1}), 1);
}

TEST_F(KvStoreTest, LeasesExpireOnTheClock) {
  KvStoreOptions o = Options();
  o.cold_capacity_blocks = 1;
  Open(o);
  Put(1);
  std::vector<BlockHash> h{TestHash(1)};
  auto lease = store_->Lookup(kNs, h, {.take_lease = true, .lease_ttl_ms = 100});
  ASSERT_EQ(lease->num_hits, 1);
  clock_.AdvanceNanos(99'000'000);
  Put(2);  // over capacity, but 1 is pinned and 2 is the new block
  EXPECT_EQ(Hits({1}), 1);
  clock_.AdvanceNanos(2'000'000);
  store_->ExpireLeases();
  EXPECT_EQ(store_->GetStats().leases_expired, 1u);
  EXPECT_EQ(store_->GetStats().active_leases, 0u);
  EXPECT_FALSE(store_->Release(lease->lease));
  Put(3);
  EXPECT_EQ(Hits({1}), 0);
}

TEST_F(KvStoreTest, FlippedByteInHotTierIsAMissAndDropsTheBlock) {
  Open(Options());
  Put(1);
  ASSERT_TRUE(store_->TEST_CorruptHot(kNs, TestHash(1), 100).ok());
  bool sink_called = false;
  auto r = store_->Read(kNs, TestHash(1), [&](std::span<const uint8_t>, uint32_t) { sink_called = true; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->miss, MissReason::kChecksum);
  EXPECT_FALSE(sink_called);
  EXPECT_EQ(Hits({1}), 0);
  EXPECT_FALSE(store_->TEST_InCold(kNs, TestHash(1)));
  EXPECT_EQ(store_->GetStats().checksum_failures, 1u);
  Put(1);  // can be stored again, intact
  EXPECT_TRUE(Get(1).ok());
}

TEST_F(KvStoreTest, FlippedByteInRocksDbIsAMissAndDropsTheBlock) {
  KvStoreOptions o = Options();
  o.store_to_hot = false;
  Open(o);
  Put(1);
  ASSERT_TRUE(store_->TEST_CorruptCold(kNs, TestHash(1), kBlock - 1).ok());
  bool sink_called = false;
  auto r = store_->Read(kNs, TestHash(1), [&](std::span<const uint8_t>, uint32_t) { sink_called = true; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->miss, MissReason::kChecksum);
  EXPECT_FALSE(sink_called);
  EXPECT_EQ(Hits({1}), 0);
  Open(o);  // dropped for good, also after a restart
  EXPECT_EQ(Hits({1}), 0);
}

// ReadVerify::kReader: the sink gets the bytes with the checksum written with
// them; a reader that finds a mismatch reports it, and the store checks the
// block itself before it drops it.
class KvStoreReaderVerifyTest : public KvStoreTest, public ::testing::WithParamInterface<bool> {};

TEST_P(KvStoreReaderVerifyTest, AReportedCorruptBlockIsCheckedAndDroppedAnIntactOneKept) {
  const bool hot = GetParam();
  KvStoreOptions o = Options();
  o.store_to_hot = hot;
  Open(o);
  Put(1);
  Put(2);
  ASSERT_EQ(store_->TEST_InHot(kNs, TestHash(1)), hot);
  ASSERT_TRUE((hot ? store_->TEST_CorruptHot(kNs, TestHash(1), 5)
                   : store_->TEST_CorruptCold(kNs, TestHash(1), 5))
                  .ok());
  // The reader sees the bytes as stored, corrupt ones included.
  uint32_t reader_crc = 0, written_crc = 0;
  auto r = store_->Read(
      kNs, TestHash(1),
      [&](std::span<const uint8_t> data, uint32_t checksum) {
        reader_crc = Crc32c(data);
        written_crc = checksum;
      },
      ReadVerify::kReader);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(written_crc, Crc32c(TestPayload(1, kBlock)));
  EXPECT_NE(reader_crc, written_crc);
  EXPECT_EQ(store_->GetStats().checksum_failures, 0u);  // nobody has checked yet
  // A report of an intact block is checked and refuted; of a corrupt one, acted on.
  auto report = [&](uint64_t id) {
    absl::StatusOr<bool> dropped = store_->ReportCorrupt(kNs, TestHash(id));
    EXPECT_TRUE(dropped.ok()) << dropped.status();
    return dropped.value_or(false);
  };
  EXPECT_FALSE(report(2));
  EXPECT_TRUE(report(1));
  EXPECT_FALSE(report(1));  // gone
  EXPECT_EQ(store_->ReportCorrupt("nope", TestHash(1)).status().code(),
            absl::StatusCode::kNotFound);
  const KvStoreStats stats = store_->GetStats();
  EXPECT_EQ(stats.corrupt_reports, 3u);
  EXPECT_EQ(stats.checksum_failures, 1u);
  EXPECT_EQ(Hits({1}), 0);
  EXPECT_FALSE(store_->TEST_InCold(kNs, TestHash(1)));
  EXPECT_EQ(Hits({2}), 1);
  EXPECT_TRUE(Get(2).ok());
}

INSTANTIATE_TEST_SUITE_P(Tiers, KvStoreReaderVerifyTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Hot" : "Cold"; });

TEST_F(KvStoreTest, ColdTierCheckFindsAPayloadThatDoesNotMatchItsMetadata) {
  Open(Options());
  for (int i = 0; i < 3; ++i) Put(i);
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok());
  ASSERT_TRUE(store_->TEST_CorruptCold(kNs, TestHash(1), 7).ok());
  const absl::Status s = store_->TEST_CheckColdTier();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(TestHash(1).ToHex()));
}

TEST_F(KvStoreTest, CorruptColdBlockEndsAStagedLookupPrefix) {
  KvStoreOptions o = Options();
  o.store_to_hot = false;
  Open(o);
  for (int i = 0; i < 3; ++i) Put(i);
  ASSERT_TRUE(store_->TEST_CorruptCold(kNs, TestHash(1), 0).ok());
  auto r = store_->Lookup(kNs, std::vector<BlockHash>{TestHash(0), TestHash(1), TestHash(2)},
                          {.take_lease = false, .stage_to_hot = true});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_hits, 1);
  EXPECT_EQ(r->num_hot_hits, 1);
}

TEST_F(KvStoreTest, StagedLookupPutsColdHitsInTheHotTier) {
  KvStoreOptions o = Options();
  o.store_to_hot = false;
  Open(o);
  Put(1);
  Put(2);
  EXPECT_FALSE(store_->TEST_InHot(kNs, TestHash(1)));
  auto r = store_->Lookup(kNs, std::vector<BlockHash>{TestHash(1), TestHash(2)},
                          {.take_lease = true, .stage_to_hot = true});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_hits, 2);
  EXPECT_EQ(r->num_hot_hits, 2);
  EXPECT_TRUE(Get(1).from_hot);
  EXPECT_TRUE(Get(2).from_hot);
}

// A cold hit that cannot be promoted is intact in RocksDB: it stays a hit,
// under the lookup's lease, and its load reads it from the cold tier.
TEST_F(KvStoreTest, StagedLookupWithoutAHotTierKeepsColdHitsUnderTheLease) {
  KvStoreOptions o = Options();
  o.hot_capacity_bytes = 0;
  o.cold_capacity_blocks = 2;
  Open(o);
  Put(1);
  Put(2);
  auto r = store_->Lookup(kNs, std::vector<BlockHash>{TestHash(1), TestHash(2)},
                          {.take_lease = true, .stage_to_hot = true});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_hits, 2);
  EXPECT_EQ(r->num_hot_hits, 0);
  ASSERT_NE(r->lease.value(), 0u);
  Put(3);  // over capacity, but 1 and 2 are leased
  Put(4);
  for (int i : {1, 2}) {
    ReadResult read = Get(i);
    EXPECT_TRUE(read.ok()) << i;
    EXPECT_FALSE(read.from_hot) << i;
  }
  EXPECT_TRUE(store_->Release(r->lease));
}

TEST_F(KvStoreTest, StagedLookupOfABlockLargerThanASlotStillHits) {
  KvStoreOptions o = Options();
  o.store_to_hot = false;
  Open(o);
  constexpr uint64_t kBig = 2 * kBlock;
  ASSERT_TRUE(store_->CreateNamespace({.name = "big", .block_bytes = kBig, .layout = "x"}).ok());
  for (uint64_t i : {1, 2}) {
    auto p = TestPayload(i, kBig);
    ASSERT_TRUE(store_->Store("big", TestHash(i), p, Crc(p)).ok());
  }
  auto r = store_->Lookup("big", std::vector<BlockHash>{TestHash(1), TestHash(2), TestHash(3)},
                          {.take_lease = true, .stage_to_hot = true});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_hits, 2);
  EXPECT_EQ(r->num_hot_hits, 0);
  EXPECT_EQ(store_->GetStats().active_leases, 1u);
  std::vector<uint8_t> out(kBig);
  auto read = store_->ReadInto("big", TestHash(2), out);
  ASSERT_TRUE(read.ok() && read->ok());
  EXPECT_FALSE(read->from_hot);
  EXPECT_EQ(out, TestPayload(2, kBig));
}

TEST_F(KvStoreTest, StagedLookupWhenEveryHotSlotIsLeasedStillHits) {
  KvStoreOptions o = Options();
  o.hot_capacity_bytes = kBlock;  // one slot
  Open(o);
  Put(1);  // takes the slot
  auto pin = store_->Lookup(kNs, std::vector<BlockHash>{TestHash(1)}, {.take_lease = true});
  ASSERT_TRUE(pin.ok());
  ASSERT_EQ(pin->num_hot_hits, 1);
  Put(2);  // the only slot is leased: cold only
  ASSERT_FALSE(store_->TEST_InHot(kNs, TestHash(2)));
  auto r = store_->Lookup(kNs, std::vector<BlockHash>{TestHash(2)},
                          {.take_lease = true, .stage_to_hot = true});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_hits, 1);
  EXPECT_EQ(r->num_hot_hits, 0);
  EXPECT_NE(r->lease.value(), 0u);
  EXPECT_TRUE(Get(2).ok());
  // Once the slot is free again, staging promotes.
  EXPECT_TRUE(store_->Release(pin->lease));
  auto again = store_->Lookup(kNs, std::vector<BlockHash>{TestHash(2)},
                              {.take_lease = false, .stage_to_hot = true});
  EXPECT_EQ(again->num_hot_hits, 1);
}

class KvStoreRestartTest : public KvStoreTest, public ::testing::WithParamInterface<Durability> {};

TEST_P(KvStoreRestartTest, CleanRestartServesTheSameLookups) {
  KvStoreOptions o = Options();
  o.durability = GetParam();
  Open(o);
  for (int i = 0; i < 10; ++i) Put(i);
  ASSERT_TRUE(store_->CreateNamespace({.name = "other", .block_bytes = 64, .layout = "x"}).ok());
  std::vector<std::vector<uint64_t>> queries = {{0, 1, 2}, {5, 6, 42, 7}, {42}, {9, 8, 7, 6}};
  std::vector<int32_t> before;
  for (const auto& q : queries) before.push_back(Hits(q));
  Open(o);
  std::vector<int32_t> after;
  for (const auto& q : queries) after.push_back(Hits(q));
  EXPECT_EQ(before, after);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(Get(i).ok()) << i;
  auto ns = store_->GetNamespace("other");
  ASSERT_TRUE(ns.ok());
  EXPECT_EQ(ns->block_bytes, 64u);
  EXPECT_EQ(ns->layout, "x");
  EXPECT_EQ(store_->GetStats().cold_blocks, 10u);
}

INSTANTIATE_TEST_SUITE_P(AllDurabilities, KvStoreRestartTest,
                         ::testing::Values(Durability::kNone, Durability::kWal, Durability::kFsync),
                         [](const auto& info) { return std::string(DurabilityName(info.param)); });

TEST_F(KvStoreTest, ColdLruOrderIsRebuiltFromStoreOrderOnOpen) {
  KvStoreOptions o = Options();
  Open(o);
  for (int i = 0; i < 4; ++i) Put(i);
  o.cold_capacity_blocks = 2;
  Open(o);  // over capacity on open: the two oldest stores go
  EXPECT_EQ(Hits({0}), 0);
  EXPECT_EQ(Hits({1}), 0);
  EXPECT_EQ(Hits({2, 3}), 2);
}

}  // namespace
}  // namespace tandem::kvstore
