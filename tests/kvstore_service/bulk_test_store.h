// The store the bulk port tests serve (bulk_load_test, bulk_store_test,
// bulk_tls_test): a hot tier that holds every test block, and their
// namespaces.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../kvstore/test_util.h"
#include "absl/status/statusor.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/kvtypes/checksum.h"

namespace tandem::testutil {

inline constexpr uint64_t kBulkBlock = 64 << 10;
inline constexpr uint64_t kBulkBigBlock = (5 << 20) / 2;  // 2.5 MiB: many reads per block

// Opens a store in `dir` (32 MiB hot tier of 4 MiB slots, unlocked, shared
// memory with `share_hot_tier`) with the namespaces `namespaces` (name,
// block bytes).
inline absl::StatusOr<std::unique_ptr<kvstore::KvStoreEngine>> OpenBulkTestStore(
    const std::string& dir, const std::vector<std::pair<std::string, uint64_t>>& namespaces,
    bool share_hot_tier = false) {
  auto store = kvstore::KvStoreEngine::Open({.data_dir = dir,
                                             .hot_capacity_bytes = 32 << 20,
                                             .hot_slot_bytes = 4 << 20,
                                             .lock_hot_memory = false,
                                             .share_hot_tier = share_hot_tier});
  if (!store.ok()) return store.status();
  for (const auto& [name, bytes] : namespaces) {
    absl::StatusOr<bool> created = (*store)->CreateNamespace({.name = name, .block_bytes = bytes});
    if (!created.ok()) return created.status();
  }
  return store;
}

// A store that takes a call and stalls: Hook() goes in
// BulkLoadServerOptions::debug_before_load / debug_before_store; while `on`,
// each call it sees is counted in `stalled` and waits at `gate` until the
// test opens it (as the gate's destructor does).
struct StallSwitch {
  std::atomic<bool> on{false};
  std::atomic<int> stalled{0};
  tandem::testing::Gate gate;
  std::function<void()> Hook() {
    return [this] {
      if (!on) return;
      ++stalled;
      gate.Pass();
    };
  }
};

// Stores test block `id` (kvstore::testing::TestPayload) of `size` bytes.
inline absl::Status PutTestBlock(kvstore::KvStoreEngine* store, const std::string& ns, uint64_t id,
                                 uint64_t size) {
  const std::vector<uint8_t> p = kvstore::testing::TestPayload(id, size);
  return store->Store(ns, kvstore::testing::TestHash(id), p, kvstore::Crc32c(p)).status();
}

}  // namespace tandem::testutil
