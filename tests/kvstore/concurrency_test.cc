// Concurrency of the KV-store engine: races made deterministic with sync
// points, duplicate writers, and a mixed workload under eviction pressure.
// Also run under ThreadSanitizer (label tsan).
#include <atomic>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/kvstore/sync_point.h"
#include "test_util.h"

namespace tandem::kvstore {
namespace {

using ::tandem::kvstore::testing::Crc;
using ::tandem::kvstore::testing::TempDir;
using ::tandem::kvstore::testing::TestHash;
using ::tandem::kvstore::testing::TestPayload;

constexpr uint64_t kBlock = 4096;
constexpr char kNs[] = "ns";

class KvStoreConcurrencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SyncPoint::Get()->DisableProcessing();
    SyncPoint::Get()->ClearAll();
  }
  void TearDown() override {
    SyncPoint::Get()->DisableProcessing();
    SyncPoint::Get()->ClearAll();
  }
  void Open(KvStoreOptions o) {
    o.data_dir = dir_.path();
    o.lock_hot_memory = false;
    auto s = KvStoreEngine::Open(o);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    ASSERT_TRUE(store_->CreateNamespace({.name = kNs, .block_bytes = kBlock}).ok());
  }
  absl::StatusOr<StoreResult> Put(uint64_t i) {
    auto p = TestPayload(i, kBlock);
    return store_->Store(kNs, TestHash(i), p, Crc(p));
  }
  int32_t Hits(uint64_t i) {
    std::vector<BlockHash> h{TestHash(i)};
    return store_->Lookup(kNs, h, {.take_lease = false})->num_hits;
  }

  TempDir dir_;
  std::unique_ptr<KvStoreEngine> store_;
};

// The lookup pins block 1 before the store's eviction selects victims: the
// leased block must survive although the tier is over capacity.
TEST_F(KvStoreConcurrencyTest, LeasedBlockSurvivesAConcurrentEviction) {
  Open({.hot_capacity_bytes = 0, .cold_capacity_blocks = 1});
  ASSERT_TRUE(Put(1).ok());
  SyncPoint::Get()->LoadDependency(
      {{"KvStoreEngine::Lookup:AfterPin", "KvStoreEngine::EvictCold:BeforeSelect"}});
  SyncPoint::Get()->EnableProcessing();
  LookupResult lease;
  std::thread writer([&] { ASSERT_TRUE(Put(2).ok()); });
  std::thread reader([&] {
    std::vector<BlockHash> h{TestHash(1)};
    lease = *store_->Lookup(kNs, h, {.take_lease = true});
  });
  writer.join();
  reader.join();
  SyncPoint::Get()->DisableProcessing();
  EXPECT_EQ(lease.num_hits, 1);
  EXPECT_EQ(Hits(1), 1);
  std::vector<uint8_t> out(kBlock);
  EXPECT_TRUE(store_->ReadInto(kNs, TestHash(1), out)->ok());
  EXPECT_EQ(out, TestPayload(1, kBlock));
  // Once released, the next store's eviction may take it.
  EXPECT_TRUE(store_->Release(lease.lease));
  ASSERT_TRUE(Put(3).ok());
  EXPECT_EQ(Hits(1), 0);
  EXPECT_EQ(Hits(3), 1);
}

// The eviction has chosen block 1 before the lookup arrives: the lookup must
// report a miss (no lease on a block being deleted), never a dangling hit.
TEST_F(KvStoreConcurrencyTest, LookupDuringEvictionOfItsBlockIsAMiss) {
  Open({.hot_capacity_bytes = 0, .cold_capacity_blocks = 1});
  ASSERT_TRUE(Put(1).ok());
  SyncPoint::Get()->LoadDependency({{"KvStoreEngine::EvictCold:AfterSelect", "KvStoreEngine::Lookup:Start"},
                                    {"KvStoreEngine::Lookup:End", "KvStoreEngine::EvictCold:BeforeDelete"}});
  SyncPoint::Get()->EnableProcessing();
  LookupResult result;
  std::thread writer([&] { ASSERT_TRUE(Put(2).ok()); });
  std::thread reader([&] {
    std::vector<BlockHash> h{TestHash(1)};
    result = *store_->Lookup(kNs, h, {.take_lease = true});
  });
  writer.join();
  reader.join();
  SyncPoint::Get()->DisableProcessing();
  EXPECT_EQ(result.num_hits, 0);
  EXPECT_EQ(result.lease.value(), 0u);
  EXPECT_EQ(store_->GetStats().active_leases, 0u);
  EXPECT_EQ(Hits(1), 0);
  // And the evicted block can be stored again.
  auto again = Put(1);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->already_present);
}

// A store of the same block while the first writer is inside RocksDB waits
// for it and reports already_present; exactly one write happens.
TEST_F(KvStoreConcurrencyTest, ConcurrentDuplicateStoresLeaveOneIntactBlock) {
  Open({.hot_capacity_bytes = 4 * kBlock, .hot_slot_bytes = kBlock});
  constexpr int kWriters = 6;
  std::atomic<int> entered{0};
  // Hold the first writer before its write until every writer has started.
  SyncPoint::Get()->SetCallBack("KvStoreEngine::Store:BeforeWrite", [&] {
    while (entered.load() < kWriters) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
  SyncPoint::Get()->EnableProcessing();
  std::atomic<int> fresh{0}, present{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&] {
      auto p = TestPayload(42, kBlock);
      entered.fetch_add(1);
      auto r = store_->Store(kNs, TestHash(42), p, Crc(p));
      ASSERT_TRUE(r.ok()) << r.status();
      (r->already_present ? present : fresh).fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  SyncPoint::Get()->DisableProcessing();
  EXPECT_EQ(fresh.load(), 1);
  EXPECT_EQ(present.load(), kWriters - 1);
  EXPECT_EQ(store_->GetStats().stores, 1u);
  EXPECT_EQ(store_->GetStats().cold_blocks, 1u);
  std::vector<uint8_t> out(kBlock);
  EXPECT_TRUE(store_->ReadInto(kNs, TestHash(42), out)->ok());
  EXPECT_EQ(out, TestPayload(42, kBlock));
}

// A staged lookup finds its cold hit being promoted by a concurrent read: the
// block is intact in RocksDB, so it is a hit (not yet hot), under the lease.
TEST_F(KvStoreConcurrencyTest, StagedLookupDuringAnotherPromotionStillHits) {
  Open({.hot_capacity_bytes = 4 * kBlock, .hot_slot_bytes = kBlock, .store_to_hot = false});
  ASSERT_TRUE(Put(1).ok());
  SyncPoint::Get()->LoadDependency({{"KvStoreEngine::Promote:AfterClaim", "KvStoreEngine::Lookup:AfterPin"},
                                    {"KvStoreEngine::Lookup:End", "KvStoreEngine::Promote:BeforeInstall"}});
  SyncPoint::Get()->EnableProcessing();
  LookupResult result;
  std::vector<uint8_t> out(kBlock);
  ReadResult read;
  std::thread reader([&] { read = *store_->ReadInto(kNs, TestHash(1), out); });
  std::thread looker([&] {
    std::vector<BlockHash> h{TestHash(1)};
    result = *store_->Lookup(kNs, h, {.take_lease = true, .stage_to_hot = true});
  });
  reader.join();
  looker.join();
  SyncPoint::Get()->DisableProcessing();
  EXPECT_TRUE(read.ok());
  EXPECT_EQ(out, TestPayload(1, kBlock));
  EXPECT_EQ(result.num_hits, 1);
  EXPECT_EQ(result.num_hot_hits, 0);
  EXPECT_NE(result.lease.value(), 0u);
  EXPECT_EQ(store_->GetStats().promotions, 1u);
  EXPECT_TRUE(store_->TEST_InHot(kNs, TestHash(1)));
  EXPECT_TRUE(store_->Release(result.lease));
}

// Several threads look up, load, store and release on a small key space with
// both tiers far smaller than it, for a bounded number of operations. Every
// served block must have its own bytes, leased blocks must stay readable,
// and the tiers must end within capacity. A third of the durable stores ask
// for wal where the store's default is none, so present blocks are written
// again (MakeDurable) beside evictions, reads and leases. With the parameter, even keys are
// stored with durability memory (the hot tier only: evicting one erases it),
// and a memory store may find every hot slot pinned by the others' leases.
class KvStoreMixedWorkloadTest : public KvStoreConcurrencyTest,
                                 public ::testing::WithParamInterface<bool> {};

TEST_P(KvStoreMixedWorkloadTest, MixedWorkloadUnderEvictionPressure) {
  const bool memory_keys = GetParam();
  constexpr uint64_t kKeys = 48;
  constexpr uint64_t kColdBlocks = 16;
  Open({.hot_capacity_bytes = 6 * kBlock,
        .hot_slot_bytes = kBlock,
        .cold_capacity_blocks = kColdBlocks,
        .durability = Durability::kNone});
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 400;
  std::atomic<int> served{0}, leased_reads_failed{0}, wrong_bytes{0}, memory_stored{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<uint8_t> out(kBlock);
      for (int op = 0; op < kOpsPerThread; ++op) {
        const uint64_t i = rng() % kKeys;
        switch (rng() % 4) {
          case 0: {
            auto p = TestPayload(i, kBlock);
            const bool memory = memory_keys && i % 2 == 0;
            const bool wal = rng() % 3 == 0;
            auto r = store_->Store(kNs, TestHash(i), p, Crc(p),
                                   memory ? std::optional(Durability::kMemory)
                                   : wal  ? std::optional(Durability::kWal)
                                          : std::nullopt);
            if (memory && !r.ok()) {
              ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
            } else {
              ASSERT_TRUE(r.ok()) << r.status();
              if (memory) memory_stored.fetch_add(1);
            }
            break;
          }
          case 1: {
            auto r = store_->ReadInto(kNs, TestHash(i), out);
            ASSERT_TRUE(r.ok()) << r.status();
            if (r->ok()) {
              served.fetch_add(1);
              if (out != TestPayload(i, kBlock)) wrong_bytes.fetch_add(1);
            }
            break;
          }
          default: {
            std::vector<BlockHash> hashes;
            for (uint64_t k = 0; k < 4; ++k) hashes.push_back(TestHash((i + k) % kKeys));
            auto r = store_->Lookup(kNs, hashes, {.take_lease = true, .stage_to_hot = op % 2 == 0});
            ASSERT_TRUE(r.ok()) << r.status();
            // Leased hits must stay readable until released.
            for (int32_t k = 0; k < r->num_hits; ++k) {
              auto rr = store_->ReadInto(kNs, hashes[k], out);
              if (!rr.ok() || !rr->ok()) {
                leased_reads_failed.fetch_add(1);
              } else if (out != TestPayload((i + k) % kKeys, kBlock)) {
                wrong_bytes.fetch_add(1);
              }
            }
            if (r->lease.value() != 0) {
              EXPECT_TRUE(store_->Release(r->lease));
            }
            break;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong_bytes.load(), 0);
  EXPECT_EQ(leased_reads_failed.load(), 0);
  EXPECT_GT(served.load(), 0);
  KvStoreStats s = store_->GetStats();
  EXPECT_LE(s.cold_blocks, kColdBlocks);
  EXPECT_LE(s.hot_blocks, 6u);
  EXPECT_EQ(s.active_leases, 0u);
  EXPECT_GT(s.evictions_cold, 0u);
  EXPECT_GT(s.evictions_hot, 0u);
  EXPECT_EQ(s.checksum_failures, 0u);
  EXPECT_GT(s.stores_made_durable, 0u);
  if (memory_keys) {
    EXPECT_GT(memory_stored.load(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Durability, KvStoreMixedWorkloadTest, ::testing::Bool(),
                         [](const auto& info) {
                           return std::string(info.param ? "NoneAndMemory" : "None");
                         });

}  // namespace
}  // namespace tandem::kvstore
