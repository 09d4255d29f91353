// The KV-store engine (DESIGN §5): blocks of KV cache keyed by
// (namespace, 32-byte hash), kept in two tiers.
//
//  - Hot tier: a pinned host-memory arena (HostArena) cut into fixed-size
//    slots, least-recently-used eviction. A cache of the cold tier: evicting
//    a block from it keeps the block in the cold tier, except a block stored
//    with Durability::kMemory, which lives in its hot slot only and is gone
//    when evicted.
//  - Cold tier: RocksDB with blob files. Holds every other block (metadata,
//    payload and checksum, written in one atomic batch before a store is
//    acknowledged under the store's durability mode) and is read back after a
//    restart. Least-recently-used eviction by bytes and/or blocks; the access
//    order lives in memory and is rebuilt from store order on open.
//
// Blocks are immutable: storing a block that exists succeeds without
// rewriting it, also when several writers store the same block at once (one
// writes, the others wait for it and report `already_present`). Except for
// durability: a store that finds its block written with a weaker one (none,
// then wal or fsync; wal, then fsync) writes the same bytes again with its
// own before it is acknowledged, so `already_present` always carries the
// durability the store asked for (counted in stores_made_durable). A block
// held in memory only is not made durable that way: the store is refused.
//
// Every read is verified against the block's CRC32C (written by the writer),
// from either tier; a mismatch is a miss with reason kChecksum, the block is
// dropped from both tiers, and no byte of it is returned as data. By default
// the store verifies before the reader sees a byte. A reader that checksums
// the bytes anyway may verify them itself, end to end (ReadVerify::kReader):
// it then reports a mismatch with ReportCorrupt(), and the store checks the
// block again and drops it (a change to DESIGN §5: DESIGN-NOTES.md, "The
// KV-store's bulk port"). Reads of cold blocks
// promote them to the hot tier, as do lookups that ask to stage their hits; a
// block that cannot be promoted (hot tier off, block larger than a slot,
// every slot pinned, another thread promoting it) is still a hit and is
// served from the cold tier.
//
// Leases: Lookup() pins its leading hits until Release(), until their load
// completes (the service releases the lease after a Load), or until the lease
// expires (time from options.clock). A pinned block is never evicted from
// either tier.
//
// Thread-safe. One mutex guards the index; payload copies, checksums and
// RocksDB I/O run outside it.
//
// Sync points (see sync_point.h), in order of a store and a lookup (a
// StoreBatch passes the store's once per RocksDB write):
//   KvStoreEngine::Store:BeforeWrite, KvStoreEngine::Store:AfterWrite,
//   KvStoreEngine::EvictCold:BeforeSelect, KvStoreEngine::EvictCold:AfterSelect,
//   KvStoreEngine::EvictCold:BeforeDelete, KvStoreEngine::EvictCold:AfterDelete,
//   KvStoreEngine::Lookup:Start, KvStoreEngine::Lookup:AfterPin, KvStoreEngine::Lookup:End,
//   KvStoreEngine::Read:AfterVerify, KvStoreEngine::Promote:AfterClaim (a cold block's
//   promotion has claimed a hot slot), KvStoreEngine::Promote:BeforeInstall.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/common/block_hash.h"
#include "tandem/common/clock.h"
#include "tandem/common/ids.h"
#include "tandem/kvtypes/kv_types.h"

namespace tandem::kvstore {

struct KvStoreOptions {
  // Directory of the RocksDB cold tier; created when missing. Required.
  std::string data_dir;
  // Bytes of the hot-tier arena. 0 disables the hot tier. Default 1 GiB.
  uint64_t hot_capacity_bytes = uint64_t{1} << 30;
  // Bytes per hot-tier slot; a block uses one slot, so blocks larger than
  // this are served from the cold tier only. Default 2 MiB.
  uint64_t hot_slot_bytes = uint64_t{2} << 20;
  // Payload bytes the cold tier may hold; 0 = unlimited. Default 0.
  uint64_t cold_capacity_bytes = 0;
  // Blocks the cold tier may hold; 0 = unlimited. Default 0.
  uint64_t cold_capacity_blocks = 0;
  // Durability of a store that does not ask for one. Default kWal.
  Durability durability = Durability::kWal;
  // Lease time-to-live when a lookup asks for 0. Default 30 s.
  int64_t default_lease_ttl_ms = 30'000;
  // Longest lease a lookup may ask for (longer requests are clamped). 10 min.
  int64_t max_lease_ttl_ms = 600'000;
  // Also place newly stored blocks in the hot tier. Default true.
  bool store_to_hot = true;
  // RocksDB's memtable (write buffer) size: the WAL grows to about this
  // before a flush, and reopening after a crash flushes it, so the disk needs
  // about twice this free beyond the blocks. Default 64 MiB; at least 1 MiB.
  uint64_t write_buffer_bytes = uint64_t{64} << 20;
  // Stores are refused (RESOURCE_EXHAUSTED, nothing written) while the data
  // directory's file system has less than this free: RocksDB itself must
  // never meet a full disk, since Debian's RocksDB 7.8 can abort the process
  // on a write after a failed WAL append. 0 = never refuse. Default 256 MiB.
  uint64_t min_free_disk_bytes = uint64_t{256} << 20;
  // Allocate the hot tier with cudaHostAlloc when a CUDA device is present.
  bool use_cuda_host_alloc = true;
  // mlock() the hot tier (failure is logged and ignored).
  bool lock_hot_memory = true;
  // Back the hot tier with a memfd, so that clients on this host can map it
  // and read blocks in place (the bulk port's local socket,
  // services/kvstore/bulk_load_server.h). Default false.
  bool share_hot_tier = false;
  // Time source for lease expiry; nullptr = SystemClock. Not owned.
  const Clock* clock = nullptr;

  [[nodiscard]] absl::Status Validate() const;
};

struct LookupOptions {
  // Pin the leading hits under a lease. Default true.
  bool take_lease = true;
  // Lease time-to-live; 0 = KvStoreOptions.default_lease_ttl_ms.
  int64_t lease_ttl_ms = 0;
  // Copy cold-tier hits into the hot tier before returning.
  bool stage_to_hot = false;
  // Counts in KvStoreStats' lookups and lookup_hits. A load on the local
  // socket pins its blocks with a lookup that is part of the load, not one
  // of the scheduler's lookups, and does not count.
  bool count_in_stats = true;
};

struct LookupResult {
  // Number of leading hashes present (stops at the first miss).
  int32_t num_hits = 0;
  // Of those, how many are in the hot tier when Lookup returns.
  int32_t num_hot_hits = 0;
  // Lease pinning the hits; LeaseId(0) when none was taken (or no hits).
  LeaseId lease{0};
};

struct StoreResult {
  // The block was already stored (by an earlier or a concurrent writer).
  bool already_present = false;
  // ... with different bytes (CRC32C differs): the first write wins, never
  // overwritten; counted (stores_mismatched) and logged. A hash names its
  // bytes, so this is a writer's bug or an attack, never a refresh.
  bool mismatched = false;
};

// One block of a StoreBatch.
struct StoreBlock {
  BlockHash hash;
  std::span<const uint8_t> payload;
  // The writer's CRC32C of `payload`.
  uint32_t checksum = 0;
  // The CRC32C of `payload` as received, when the caller computed it while
  // the bytes arrived (the bulk port does, piece by piece while they are in
  // cache): the store compares `checksum` with it instead of reading the
  // payload once more. Unset: the store computes it.
  std::optional<uint32_t> payload_crc;
  // Index into the HotSlots given to StoreBatch of the reserved slot that
  // `payload` lies in (it was received there), or -1. A block stored anew
  // keeps that slot instead of being copied into another.
  int32_t reserved_slot = -1;
};

class HotSlots;

// Who checks a read's bytes against the checksum written with them.
enum class ReadVerify {
  // The store, before the sink sees a byte: on a mismatch the sink is not
  // called and the read is a kChecksum miss.
  kStore,
  // The reader: the sink gets the bytes unverified, with the checksum
  // written with them. The reader must check them before using them and
  // call ReportCorrupt() when they do not match. (A corrupt block read
  // this way still reads as served; the reader's check is what catches it.)
  kReader,
};

struct ReadResult {
  MissReason miss = MissReason::kNone;
  // The verified checksum of the served block.
  uint32_t checksum = 0;
  // Served from the hot tier.
  bool from_hot = false;
  [[nodiscard]] bool ok() const { return miss == MissReason::kNone; }
};

class KvStoreEngine {
 public:
  // Receives a verified block: its payload (valid only during the call) and
  // its CRC32C, so a caller can send the checksum ahead of the bytes.
  using Sink = absl::FunctionRef<void(std::span<const uint8_t> payload, uint32_t checksum)>;

  // Opens (or creates) the store in options.data_dir and rebuilds the index
  // from the cold tier. A damaged directory does not stop it: RocksDB's
  // repair where RocksDB cannot open it, and a copy of the intact blocks
  // where any table block fails its checksum; blocks that do not read back
  // intact are dropped, logged and counted (stats blocks_dropped_at_open;
  // kv_repair.h). A block whose read fails later (a lost or damaged file)
  // is dropped by that read, so that a store can write it again.
  static absl::StatusOr<std::unique_ptr<KvStoreEngine>> Open(const KvStoreOptions& options);
  // Flushes the memtable (so kNone stores survive a clean close) and closes.
  ~KvStoreEngine();
  KvStoreEngine(const KvStoreEngine&) = delete;
  KvStoreEngine& operator=(const KvStoreEngine&) = delete;

  // Registers a namespace (persisted). Returns true when created, false when
  // it exists with the same spec; ALREADY_EXISTS when it exists with another.
  absl::StatusOr<bool> CreateNamespace(const NamespaceSpec& spec);
  // NOT_FOUND for an unknown namespace.
  [[nodiscard]] absl::StatusOr<NamespaceSpec> GetNamespace(std::string_view name) const;

  // Counts the leading hashes present and (options.take_lease) pins them.
  // NOT_FOUND for an unknown namespace.
  absl::StatusOr<LookupResult> Lookup(std::string_view ns, std::span<const BlockHash> hashes,
                                      const LookupOptions& options = {});
  // Unpins a lease's blocks. False when the lease is unknown or expired.
  bool Release(LeaseId lease);
  // Expires leases past their deadline (also done by every other call).
  void ExpireLeases();

  // Stores one block. `checksum` is the writer's CRC32C of `payload`.
  // NOT_FOUND: unknown namespace; INVALID_ARGUMENT: payload size differs from
  // the namespace's block size; DATA_LOSS: checksum does not match payload.
  // Nothing is stored on error. `durability` defaults to the store's.
  absl::StatusOr<StoreResult> Store(std::string_view ns, const BlockHash& hash,
                                    std::span<const uint8_t> payload, uint32_t checksum,
                                    std::optional<Durability> durability = std::nullopt);

  // Stores blocks[i] for every i with the result N Store() calls in that
  // order would give each (a bad block fails only itself; a hash given twice
  // is already_present the second time), writing the new blocks with one
  // RocksDB write (one WAL record) instead of one each. Blocks whose hash
  // another writer or an eviction holds at that moment are stored after it,
  // one by one, as Store() stores them. Where the hot tier has fewer free or
  // evictable slots than the batch has new blocks, the first ones get them.
  std::vector<absl::StatusOr<StoreResult>> StoreBatch(
      std::string_view ns, std::span<const StoreBlock> blocks,
      std::optional<Durability> durability = std::nullopt);
  // StoreBatch whose blocks may lie in slots of `reserved` (StoreBlock's
  // reserved_slot): the new ones keep their slots, the rest of `reserved`
  // is left to go back when it is destroyed.
  std::vector<absl::StatusOr<StoreResult>> StoreBatch(std::string_view ns,
                                                      std::span<const StoreBlock> blocks,
                                                      std::optional<Durability> durability,
                                                      HotSlots* reserved);
  // Takes a hot slot for each block k of a batch for `ns` (hashes[k],
  // payload sizes[k]; 0 for a block that needs none) that the store does
  // not have and that a StoreBatch with `durability` would place in the hot
  // tier (durability memory, or store_to_hot; a block that fits a slot), as
  // far as free or evictable slots go, evicting as a store does but never
  // one of the batch's own blocks. The caller receives the bytes into them
  // and stores the batch with StoreBatch(..., &slots). None for an unknown
  // namespace.
  HotSlots ReserveHotSlots(std::string_view ns, std::span<const BlockHash> hashes,
                           std::span<const uint64_t> sizes, std::optional<Durability> durability);

  // Reads one block: on a hit calls `sink` once with the payload (valid only
  // during the call; the block stays pinned, so the sink may block, e.g. on a
  // socket send, without the block being evicted), verified first unless
  // `verify` is kReader. A miss is a result, not an error; errors are
  // NOT_FOUND (unknown namespace) and I/O failures.
  absl::StatusOr<ReadResult> Read(std::string_view ns, const BlockHash& hash, Sink sink,
                                  ReadVerify verify = ReadVerify::kStore);
  // A reader's report that a block read with ReadVerify::kReader failed its
  // checksum. The report is not trusted: the store verifies the block itself
  // and drops it when it is corrupt. True when it was dropped; false when it
  // is intact or no longer stored. NOT_FOUND: unknown namespace.
  absl::StatusOr<bool> ReportCorrupt(std::string_view ns, const BlockHash& hash);
  // Read() into `dst`, which must have the namespace's block size.
  absl::StatusOr<ReadResult> ReadInto(std::string_view ns, const BlockHash& hash,
                                      std::span<uint8_t> dst);

  // The hot tier's memory and its memfd (-1 unless options.share_hot_tier);
  // the payload a Read() sink gets for a hot block lies inside it.
  struct HotTierMemory {
    std::span<const std::byte> bytes;
    int fd = -1;
  };
  [[nodiscard]] HotTierMemory hot_tier_memory() const;

  [[nodiscard]] KvStoreStats GetStats() const;
  [[nodiscard]] const KvStoreOptions& options() const;

  // Benchmarks: flushes RocksDB's memtable and waits (up to `timeout_ms`)
  // until no flush or compaction runs or is pending, so that one timed trial
  // does not pay for the background work an earlier one left.
  // DEADLINE_EXCEEDED when it is still busy then.
  absl::Status WaitForBackgroundWork(int64_t timeout_ms);

  // Tests only. Where a block is, and fault injection: flip one byte of the
  // block's payload in the hot-tier slot, or rewrite its RocksDB payload
  // with one byte flipped (as silent media corruption would).
  [[nodiscard]] bool TEST_InHot(std::string_view ns, const BlockHash& hash) const;
  [[nodiscard]] bool TEST_InCold(std::string_view ns, const BlockHash& hash) const;
  absl::Status TEST_CorruptHot(std::string_view ns, const BlockHash& hash, uint64_t offset);
  absl::Status TEST_CorruptCold(std::string_view ns, const BlockHash& hash, uint64_t offset);
  // Scans the cold tier: OK when every metadata record has a payload of the
  // recorded size and checksum, every payload has a metadata record, and the
  // index holds exactly those blocks (and the ones held in memory only).
  // DATA_LOSS naming the first mismatches
  // otherwise. Call it while no store is in progress.
  [[nodiscard]] absl::Status TEST_CheckColdTier() const;
  // What RocksDB's listener does at a background error (a failed flush or
  // compaction): stops writes until the next reopen.
  void TEST_ReportBackgroundError(std::string_view message);

  class Impl;

 private:
  explicit KvStoreEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Hot-tier slots reserved for a store batch's blocks before their bytes
// arrive (KvStoreEngine::ReserveHotSlots), so that they are received straight
// into the slots they will be served from: for 2 MiB blocks in memory the
// copy from a receive buffer into the slot cost a third of the bulk port's
// store time on the 2-core VM. Slots StoreBatch did not keep go back to the
// hot tier when this is destroyed, which must happen before the engine is.
// Move-only; one thread at a time.
class HotSlots {
 public:
  HotSlots() = default;
  HotSlots(HotSlots&& other) noexcept;
  HotSlots& operator=(HotSlots&& other) noexcept;
  HotSlots(const HotSlots&) = delete;
  HotSlots& operator=(const HotSlots&) = delete;
  ~HotSlots();

  // Block k's slot, as long as its payload; empty when it got none.
  [[nodiscard]] std::span<uint8_t> slot(size_t k) const {
    return k < bytes_.size() ? bytes_[k] : std::span<uint8_t>();
  }
  // How many blocks got a slot.
  [[nodiscard]] size_t num_reserved() const;

 private:
  friend class KvStoreEngine;
  void Release();

  KvStoreEngine::Impl* impl_ = nullptr;
  std::vector<int64_t> slots_;  // per block: its slot, or -1 (none, or kept by StoreBatch)
  std::vector<std::span<uint8_t>> bytes_;
};

}  // namespace tandem::kvstore
