// KvStoreTest: an engine over a temporary directory with a fake clock, and
// the helpers its tests share (kv_store_test.cc, memory_tier_test.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/kvstore/kv_store.h"
#include "test_util.h"

namespace tandem::kvstore::testing {

constexpr uint64_t kBlock = 4096;
constexpr char kNs[] = "model-a";

class KvStoreTest : public ::testing::Test {
 protected:
  KvStoreOptions Options() {
    return KvStoreOptions{.data_dir = dir_.path(),
                          .hot_capacity_bytes = 3 * kBlock,
                          .hot_slot_bytes = kBlock,
                          .lock_hot_memory = false,
                          .clock = &clock_};
  }
  void Open(const KvStoreOptions& options) {
    store_.reset();
    auto s = KvStoreEngine::Open(options);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    ASSERT_TRUE(
        store_->CreateNamespace({.name = kNs, .block_bytes = kBlock, .layout = "test"}).ok());
  }
  void Put(uint64_t i, const char* ns = kNs, uint8_t tag = 0) {
    auto p = TestPayload(i, kBlock, tag);
    auto r = store_->Store(ns, TestHash(i), p, Crc(p));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // Reads block i and checks its bytes; returns the result.
  ReadResult Get(uint64_t i, const char* ns = kNs, uint8_t tag = 0) {
    std::vector<uint8_t> out(kBlock);
    auto r = store_->ReadInto(ns, TestHash(i), out);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok() && r->ok()) {
      EXPECT_EQ(out, TestPayload(i, kBlock, tag)) << "block " << i;
    }
    return r.ok() ? *r : ReadResult{.miss = MissReason::kNotFound};
  }
  int32_t Hits(std::vector<uint64_t> ids, LookupOptions o = {.take_lease = false}) {
    std::vector<BlockHash> hashes;
    for (uint64_t i : ids) hashes.push_back(TestHash(i));
    auto r = store_->Lookup(kNs, hashes, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->num_hits : -1;
  }

  TempDir dir_;
  FakeClock clock_{1'000'000'000};
  std::unique_ptr<KvStoreEngine> store_;
};

}  // namespace tandem::kvstore::testing
