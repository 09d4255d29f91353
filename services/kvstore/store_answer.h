// What both Store paths (the gRPC stream and the bulk port's store
// connections) do with the blocks of a batch that arrived whole and passed
// the per-block checks: one StoreBatch (one RocksDB write) and a status per
// block.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "tandem/kvstore/kv_store.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvstore_service {

struct StoreAnswerOptions {
  // Tests only: every n-th newly stored block is corrupted in the hot tier
  // or on disk after it was acknowledged (KvStoreServiceOptions'
  // debug_corrupt_*_every); `debug_new_blocks` counts them across batches.
  int32_t debug_corrupt_hot_every = 0;
  int32_t debug_corrupt_cold_every = 0;
  std::atomic<uint64_t>* debug_new_blocks = nullptr;
  // Hot slots some blocks were received into (StoreBlock::reserved_slot).
  kvstore::HotSlots* reserved = nullptr;
};

// What a batch stored anew (blocks not already present).
struct StoredCounts {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
};

// Stores `blocks` into `ns` with `durability` and sets statuses[k] (ok and
// already_present, or the block's code and error) for blocks[k].
StoredCounts AnswerStoreBatch(kvstore::KvStoreEngine* store, const std::string& ns,
                              std::optional<kvstore::Durability> durability,
                              std::span<const kvstore::StoreBlock> blocks,
                              std::span<v1::BlockStatus* const> statuses,
                              const StoreAnswerOptions& options);

}  // namespace tandem::kvstore_service
