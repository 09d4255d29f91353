// KvStoreEngine::StoreBatch against N Store() calls: the same per-block
// results, counters and cold tier, with one RocksDB write for the batch.
#include <memory>
#include <string>
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

constexpr uint64_t kBatchBlock = 4096;
constexpr char kBatchNs[] = "ns";

std::unique_ptr<KvStoreEngine> OpenStore(const TempDir& dir) {
  auto s = KvStoreEngine::Open({.data_dir = dir.path(),
                                .hot_capacity_bytes = 4 * kBatchBlock,
                                .hot_slot_bytes = kBatchBlock,
                                .lock_hot_memory = false});
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_TRUE((*s)->CreateNamespace({.name = kBatchNs, .block_bytes = kBatchBlock}).ok());
  return std::move(*s);
}

// A batch with every kind of block: new, present (same bytes), present with
// other bytes (mismatched), a bad checksum, a wrong size, the same new hash
// twice (the second already present), and the same new hash twice with
// other bytes (the second mismatched).
struct Mixed {
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<StoreBlock> blocks;
  Mixed() {
    auto add = [&](uint64_t id, std::vector<uint8_t> p, bool bad_crc = false) {
      payloads.push_back(std::move(p));
      blocks.push_back(
          {.hash = TestHash(id), .checksum = Crc(payloads.back()) ^ (bad_crc ? 1 : 0)});
    };
    add(10, TestPayload(10, kBatchBlock));        // new
    add(1, TestPayload(1, kBatchBlock));          // present
    add(2, TestPayload(2, kBatchBlock, 7));       // present, other bytes
    add(11, TestPayload(11, kBatchBlock), true);  // bad checksum
    add(12, TestPayload(12, kBatchBlock / 2));    // wrong size
    add(13, TestPayload(13, kBatchBlock));        // new
    add(13, TestPayload(13, kBatchBlock));        // again: already present
    add(14, TestPayload(14, kBatchBlock));        // new
    add(14, TestPayload(14, kBatchBlock, 9));     // again, other bytes: mismatched
    add(15, TestPayload(15, kBatchBlock));        // new
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i].payload = payloads[i];
  }
};

void Preload(KvStoreEngine* store) {
  for (uint64_t id : {1, 2}) {
    auto p = TestPayload(id, kBatchBlock);
    ASSERT_TRUE(store->Store(kBatchNs, TestHash(id), p, Crc(p)).ok());
  }
}

std::string Describe(const absl::StatusOr<StoreResult>& r) {
  if (!r.ok()) return absl::StatusCodeToString(r.status().code());
  return std::string(r->already_present ? "present" : "new") + (r->mismatched ? "+mismatched" : "");
}

TEST(StoreBatchTest, SameResultsCountersAndColdTierAsOneStoreEach) {
  TempDir one_dir, batch_dir;
  std::unique_ptr<KvStoreEngine> one = OpenStore(one_dir);
  std::unique_ptr<KvStoreEngine> batch = OpenStore(batch_dir);
  ASSERT_TRUE(one && batch);
  Preload(one.get());
  Preload(batch.get());
  const Mixed m;
  std::vector<std::string> want;
  for (const StoreBlock& b : m.blocks) {
    want.push_back(Describe(one->Store(kBatchNs, b.hash, b.payload, b.checksum)));
  }
  std::vector<std::string> got;
  for (const auto& r : batch->StoreBatch(kBatchNs, m.blocks)) got.push_back(Describe(r));
  EXPECT_EQ(got, want);
  EXPECT_EQ(want, (std::vector<std::string>{"new", "present", "present+mismatched", "DATA_LOSS",
                                            "INVALID_ARGUMENT", "new", "present", "new",
                                            "present+mismatched", "new"}));
  const KvStoreStats a = one->GetStats(), b = batch->GetStats();
  EXPECT_EQ(b.stores, a.stores);
  EXPECT_EQ(b.stores_already_present, a.stores_already_present);
  EXPECT_EQ(b.stores_mismatched, a.stores_mismatched);
  EXPECT_EQ(b.cold_blocks, a.cold_blocks);
  EXPECT_EQ(b.cold_bytes, a.cold_bytes);
  EXPECT_EQ(b.hot_blocks, a.hot_blocks);
  EXPECT_TRUE(one->TEST_CheckColdTier().ok()) << one->TEST_CheckColdTier();
  EXPECT_TRUE(batch->TEST_CheckColdTier().ok()) << batch->TEST_CheckColdTier();
  // Every stored block reads back the first write's bytes, from both.
  for (uint64_t id : {1, 2, 10, 13, 14, 15}) {
    for (KvStoreEngine* s : {one.get(), batch.get()}) {
      std::vector<uint8_t> out(kBatchBlock);
      auto r = s->ReadInto(kBatchNs, TestHash(id), out);
      ASSERT_TRUE(r.ok() && r->ok()) << id;
      EXPECT_EQ(out, TestPayload(id, kBatchBlock)) << id;
    }
  }
  for (uint64_t id : {11, 12}) EXPECT_FALSE(batch->TEST_InCold(kBatchNs, TestHash(id))) << id;
}

TEST(StoreBatchTest, NewBlocksGoToTheHotTierAndSurviveAReopen) {
  TempDir dir;
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<StoreBlock> blocks;
  for (uint64_t id = 0; id < 3; ++id) payloads.push_back(TestPayload(id, kBatchBlock));
  for (uint64_t id = 0; id < 3; ++id) {
    blocks.push_back(
        {.hash = TestHash(id), .payload = payloads[id], .checksum = Crc(payloads[id])});
  }
  {
    std::unique_ptr<KvStoreEngine> store = OpenStore(dir);
    ASSERT_TRUE(store);
    for (const auto& r : store->StoreBatch(kBatchNs, blocks))
      ASSERT_TRUE(r.ok() && !r->already_present);
    for (uint64_t id = 0; id < 3; ++id)
      EXPECT_TRUE(store->TEST_InHot(kBatchNs, TestHash(id))) << id;
  }
  std::unique_ptr<KvStoreEngine> store = OpenStore(dir);
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->TEST_CheckColdTier().ok());
  for (const auto& r : store->StoreBatch(kBatchNs, blocks))
    ASSERT_TRUE(r.ok() && r->already_present);
}

// A batch received into reserved hot slots (the bulk port's stores): a block
// the store has gets none and is not evicted for another's; the new blocks
// keep their slots and read back intact; the slots of blocks not stored (a
// bad one) go back when the reservation is destroyed, so every slot can
// hold a block again.
TEST(StoreBatchTest, BlocksReceivedIntoReservedSlotsKeepThemAndTheOthersGoBack) {
  TempDir dir;
  std::unique_ptr<KvStoreEngine> store = OpenStore(dir);  // 4 hot slots
  ASSERT_TRUE(store);
  Preload(store.get());  // blocks 1 and 2
  for (Durability d : {Durability::kWal, Durability::kMemory}) {
    SCOPED_TRACE(DurabilityName(d));
    const uint64_t fresh = d == Durability::kWal ? 20 : 30;
    const uint64_t ids[] = {fresh, 1, fresh + 1, fresh + 2};
    const std::vector<uint64_t> sizes = {kBatchBlock, kBatchBlock, kBatchBlock, kBatchBlock};
    std::vector<BlockHash> hashes;
    for (uint64_t id : ids) hashes.push_back(TestHash(id));
    ASSERT_TRUE(store->TEST_InHot(kBatchNs, TestHash(1)));
    HotSlots slots = store->ReserveHotSlots(kBatchNs, hashes, sizes, d);
    // Three new blocks: the free slots, then the least recently used other
    // than block 1, which the batch has.
    ASSERT_EQ(slots.num_reserved(), 3u);
    EXPECT_TRUE(slots.slot(1).empty());
    EXPECT_TRUE(store->TEST_InHot(kBatchNs, TestHash(1)));
    std::vector<StoreBlock> blocks;
    std::vector<std::vector<uint8_t>> payloads;
    for (size_t k = 0; k < 4; ++k) {
      payloads.push_back(TestPayload(ids[k], kBatchBlock));
      const std::vector<uint8_t>& p = payloads.back();
      std::span<const uint8_t> payload = p;
      if (k != 1) {
        ASSERT_EQ(slots.slot(k).size(), kBatchBlock);
        std::copy(p.begin(), p.end(), slots.slot(k).begin());  // "received"
        payload = slots.slot(k);
      }
      blocks.push_back({.hash = TestHash(ids[k]),
                        .payload = payload,
                        .checksum = Crc(p) ^ (k == 2 ? 1u : 0u),  // block 2: a bad checksum
                        .reserved_slot = k != 1 ? static_cast<int32_t>(k) : -1});
    }
    std::vector<std::string> got;
    for (const auto& r : store->StoreBatch(kBatchNs, blocks, d, &slots)) got.push_back(Describe(r));
    if (d == Durability::kWal) {
      EXPECT_EQ(got, (std::vector<std::string>{"new", "present", "DATA_LOSS", "new"}));
    } else {  // block 1 is on disk: more than a memory store asks
      EXPECT_EQ(got, (std::vector<std::string>{"new", "present", "DATA_LOSS", "new"}));
    }
    EXPECT_EQ(slots.num_reserved(), 1u);  // the bad block's
    slots = HotSlots();                   // ... go back
    for (uint64_t id : {fresh, fresh + 2}) {
      std::vector<uint8_t> out(kBatchBlock);
      auto r = store->ReadInto(kBatchNs, TestHash(id), out);
      ASSERT_TRUE(r.ok() && r->ok()) << id;
      EXPECT_TRUE(r->from_hot) << id;
      EXPECT_EQ(out, TestPayload(id, kBatchBlock)) << id;
    }
    EXPECT_FALSE(store->TEST_InCold(kBatchNs, TestHash(fresh + 1)));
  }
  // Nothing leaked: four memory blocks (which need a slot each) fit, with
  // every slot's block evictable.
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<StoreBlock> blocks;
  for (uint64_t id = 40; id < 44; ++id) payloads.push_back(TestPayload(id, kBatchBlock));
  for (uint64_t k = 0; k < 4; ++k) {
    blocks.push_back({.hash = TestHash(40 + k), .payload = payloads[k], .checksum = Crc(payloads[k])});
  }
  for (const auto& r : store->StoreBatch(kBatchNs, blocks, Durability::kMemory)) {
    EXPECT_EQ(Describe(r), "new");
  }
  EXPECT_EQ(store->GetStats().hot_blocks, 4u);
  EXPECT_TRUE(store->TEST_CheckColdTier().ok()) << store->TEST_CheckColdTier();
}

TEST(StoreBatchTest, SlotsAreReservedOnlyWhereAStoreWouldUseTheHotTier) {
  TempDir dir;
  auto s = KvStoreEngine::Open({.data_dir = dir.path(),
                                .hot_capacity_bytes = 4 * kBatchBlock,
                                .hot_slot_bytes = kBatchBlock,
                                .store_to_hot = false,
                                .lock_hot_memory = false});
  ASSERT_TRUE(s.ok()) << s.status();
  KvStoreEngine& store = **s;
  ASSERT_TRUE(store.CreateNamespace({.name = kBatchNs, .block_bytes = kBatchBlock}).ok());
  const std::vector<uint64_t> sizes = {kBatchBlock, 0, kBatchBlock + 1, kBatchBlock / 2};
  const std::vector<BlockHash> hashes = {TestHash(1), TestHash(2), TestHash(3), TestHash(4)};
  EXPECT_EQ(store.ReserveHotSlots(kBatchNs, hashes, sizes, Durability::kWal).num_reserved(), 0u);
  EXPECT_EQ(store.ReserveHotSlots(kBatchNs, hashes, sizes, std::nullopt).num_reserved(),
            0u);  // wal
  EXPECT_EQ(store.ReserveHotSlots("nope", hashes, sizes, Durability::kMemory).num_reserved(), 0u);
  HotSlots memory = store.ReserveHotSlots(kBatchNs, hashes, sizes, Durability::kMemory);
  EXPECT_EQ(memory.num_reserved(), 2u);  // not the empty nor the oversized block
  EXPECT_EQ(memory.slot(0).size(), kBatchBlock);
  EXPECT_TRUE(memory.slot(1).empty());
  EXPECT_TRUE(memory.slot(2).empty());
  EXPECT_EQ(memory.slot(3).size(), kBatchBlock / 2);
  EXPECT_TRUE(memory.slot(4).empty());  // past the batch
}

TEST(StoreBatchTest, UnknownNamespaceFailsEveryBlock) {
  TempDir dir;
  std::unique_ptr<KvStoreEngine> store = OpenStore(dir);
  ASSERT_TRUE(store);
  const Mixed m;
  for (const auto& r : store->StoreBatch("nope", m.blocks)) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace tandem::kvstore
