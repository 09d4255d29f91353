// A store that finds its block present answers already_present only once the
// block has the durability the store asked for: one stored with a weaker one
// (none, then wal or fsync; wal, then fsync) is written again. The effect at a
// SIGKILL is kvstore_crash_test's (AWalStoreOfABlockStoredWithoutTheWal...).
#include <memory>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/kvstore/kv_store.h"
#include "test_util.h"

namespace tandem::kvstore {
namespace {

using ::tandem::kvstore::testing::Crc;
using ::tandem::kvstore::testing::TempDir;
using ::tandem::kvstore::testing::TestHash;
using ::tandem::kvstore::testing::TestPayload;

constexpr uint64_t kDurabilityBlock = 4096;
constexpr char kDurabilityNs[] = "ns";

int Rank(Durability d) { return d == Durability::kFsync ? 2 : d == Durability::kWal ? 1 : 0; }

class DurabilityTest : public ::testing::Test {
 protected:
  void Open() {
    store_.reset();
    auto s = KvStoreEngine::Open({.data_dir = dir_.path(),
                                  .hot_capacity_bytes = 4 * kDurabilityBlock,
                                  .hot_slot_bytes = kDurabilityBlock,
                                  .lock_hot_memory = false});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    ASSERT_TRUE(
        store_->CreateNamespace({.name = kDurabilityNs, .block_bytes = kDurabilityBlock}).ok());
  }
  StoreResult Put(uint64_t i, Durability d, uint8_t tag = 0) {
    const std::vector<uint8_t> p = TestPayload(i, kDurabilityBlock, tag);
    auto r = store_->Store(kDurabilityNs, TestHash(i), p, Crc(p), d);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : StoreResult{};
  }
  void ExpectIntact(uint64_t i) {
    std::vector<uint8_t> out(kDurabilityBlock);
    auto r = store_->ReadInto(kDurabilityNs, TestHash(i), out);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->ok()) << "block " << i << ": " << MissReasonName(r->miss);
    EXPECT_EQ(out, TestPayload(i, kDurabilityBlock)) << "block " << i;
  }

  TempDir dir_;
  std::unique_ptr<KvStoreEngine> store_;
};

TEST_F(DurabilityTest, AStoreAskingForMoreThanThePresentBlockHasWritesItAgain) {
  Open();
  const Durability all[] = {Durability::kNone, Durability::kWal, Durability::kFsync};
  uint64_t id = 0;
  uint64_t rewrites = 0;
  for (Durability had : all) {
    for (Durability want : all) {
      ++id;
      SCOPED_TRACE(std::string(DurabilityName(had)) + " then " + DurabilityName(want));
      EXPECT_FALSE(Put(id, had).already_present);
      const StoreResult again = Put(id, want);
      EXPECT_TRUE(again.already_present);
      EXPECT_FALSE(again.mismatched);
      if (Rank(want) > Rank(had)) ++rewrites;
      const KvStoreStats st = store_->GetStats();
      EXPECT_EQ(st.stores_made_durable, rewrites);
      EXPECT_EQ(st.stores, id);  // a rewrite is not a new block
      EXPECT_EQ(st.cold_blocks, id);
      EXPECT_EQ(st.cold_bytes, id * kDurabilityBlock);
      // Now it has `want` (or more): the same store again writes nothing.
      EXPECT_TRUE(Put(id, want).already_present);
      EXPECT_EQ(store_->GetStats().stores_made_durable, rewrites);
      ExpectIntact(id);
    }
  }
  EXPECT_EQ(rewrites, 3u);  // none -> wal, none -> fsync, wal -> fsync
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok());
  // A memory store asks for none of RocksDB's guarantees.
  Put(100, Durability::kNone);
  EXPECT_TRUE(Put(100, Durability::kMemory).already_present);
  EXPECT_EQ(store_->GetStats().stores_made_durable, rewrites);
}

TEST_F(DurabilityTest, ABatchWritesItsWeakerPresentBlocksAgainButNotOnesWithOtherBytes) {
  Open();
  Put(1, Durability::kNone);
  Put(2, Durability::kNone);
  Put(3, Durability::kWal);
  std::vector<std::vector<uint8_t>> payloads = {
      TestPayload(1, kDurabilityBlock), TestPayload(2, kDurabilityBlock, 7),
      TestPayload(3, kDurabilityBlock), TestPayload(4, kDurabilityBlock),
      TestPayload(1, kDurabilityBlock)};
  const uint64_t ids[] = {1, 2, 3, 4, 1};
  std::vector<StoreBlock> batch;
  for (size_t k = 0; k < payloads.size(); ++k) {
    batch.push_back({.hash = TestHash(ids[k]), .payload = payloads[k], .checksum = Crc(payloads[k])});
  }
  auto rs = store_->StoreBatch(kDurabilityNs, batch, Durability::kWal);
  ASSERT_EQ(rs.size(), 5u);
  for (const auto& r : rs) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(rs[0]->already_present);   // none -> wal: written again
  EXPECT_TRUE(rs[1]->mismatched);        // other bytes: the first write is kept as it was
  EXPECT_TRUE(rs[2]->already_present);   // already wal
  EXPECT_FALSE(rs[3]->already_present);  // new
  EXPECT_TRUE(rs[4]->already_present);   // block 1 again in the same batch
  EXPECT_EQ(store_->GetStats().stores_made_durable, 1u);
  ExpectIntact(1);
  ExpectIntact(3);
  ExpectIntact(4);
  std::vector<uint8_t> out(kDurabilityBlock);
  auto kept = store_->ReadInto(kDurabilityNs, TestHash(2), out);
  ASSERT_TRUE(kept.ok() && kept->ok());
  EXPECT_EQ(out, TestPayload(2, kDurabilityBlock));
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok());
}

// A clean close flushes the memtable and an open recovers and flushes what
// the WAL held, so every block found on open is on disk already.
TEST_F(DurabilityTest, BlocksFoundOnOpenAreNotWrittenAgain) {
  Open();
  Put(1, Durability::kNone);
  Put(2, Durability::kWal);
  Open();
  EXPECT_TRUE(Put(1, Durability::kFsync).already_present);
  EXPECT_TRUE(Put(2, Durability::kFsync).already_present);
  EXPECT_EQ(store_->GetStats().stores_made_durable, 0u);
  ExpectIntact(1);
  ExpectIntact(2);
}

}  // namespace
}  // namespace tandem::kvstore
