// The KV-store's types that its clients share with it (DESIGN §5): the
// durability of a store, why a block was missed, a namespace's spec and the
// store's stats, with CRC32C in checksum.h beside this. Plain types without
// RocksDB, so the scheduler and the worker (through libs/kvconnector and
// libs/rpc) do not link the storage engine (libs/kvstore).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kvstore {

// When a store is acknowledged.
enum class Durability {
  // Written to RocksDB's memtable without the write-ahead log: lost on a
  // crash (flushed on a clean close).
  kNone,
  // Written to the write-ahead log (not fsynced): survives kill -9.
  kWal,
  // Write-ahead log fsynced before the ack: survives power loss.
  kFsync,
  // Held in the hot tier (host memory) only, never written to RocksDB: gone
  // when the hot tier evicts it and at any restart, as in a redis-server
  // without persistence. Acknowledged once copied into a hot slot, so stores
  // run at memory speed instead of the disk's. For KV blocks a miss only
  // costs a recompute; a store that finds no unpinned hot slot is refused.
  kMemory,
};
// "none" | "wal" | "fsync" | "memory".
[[nodiscard]] absl::StatusOr<Durability> ParseDurability(std::string_view name);
[[nodiscard]] const char* DurabilityName(Durability d);

// Why a block was not served.
enum class MissReason {
  kNone,      // served
  kNotFound,  // not in the store (never stored, evicted, or dropped)
  kChecksum,  // bytes did not match the writer's checksum; block dropped
};
[[nodiscard]] const char* MissReasonName(MissReason r);

// A namespace: every block in it has exactly `block_bytes` bytes laid out as
// `layout` says (e.g. "block-major/L5/KV2/B16/H4/D8/f32").
struct NamespaceSpec {
  // Non-empty, at most 128 bytes.
  std::string name;
  // Bytes per block; > 0 and at most 1 GiB.
  uint64_t block_bytes = 0;
  // Free-form description of the payload layout; at most 1024 bytes.
  std::string layout;

  [[nodiscard]] absl::Status Validate() const;
  bool operator==(const NamespaceSpec&) const = default;
};

// The store's counters, as its Stats RPC carries them.
struct KvStoreStats {
  uint64_t hot_blocks = 0;
  uint64_t hot_capacity_blocks = 0;
  uint64_t hot_slot_bytes = 0;
  uint64_t cold_blocks = 0;
  uint64_t cold_bytes = 0;
  uint64_t cold_capacity_bytes = 0;  // 0 = unlimited
  uint64_t lookups = 0;
  uint64_t lookup_hits = 0;    // blocks
  uint64_t loads = 0;          // block reads
  uint64_t blocks_loaded = 0;  // block reads served
  uint64_t load_misses = 0;
  uint64_t stores = 0;  // blocks written
  uint64_t stores_already_present = 0;
  uint64_t stores_mismatched = 0;  // ... of those, with other bytes (kept the first)
  // ... of those, written again because they were stored with a weaker
  // durability than the store asked for (none, then wal or fsync; wal, then fsync).
  uint64_t stores_made_durable = 0;
  uint64_t checksum_failures = 0;  // blocks found corrupt and dropped
  uint64_t corrupt_reports = 0;    // ReportCorrupt() calls (readers' mismatches)
  // Blocks (and unreadable records) the start-up repair dropped: damaged or
  // lost files (kv_repair.h).
  uint64_t blocks_dropped_at_open = 0;
  // Blocks dropped because reading them failed (a lost or damaged file).
  uint64_t load_failures = 0;
  uint64_t active_leases = 0;
  uint64_t leases_expired = 0;
  uint64_t evictions_hot = 0;
  uint64_t evictions_cold = 0;
  uint64_t promotions = 0;  // cold -> hot copies
};

}  // namespace tandem::kvstore
