// KvStoreEngine::Impl, private to libs/kvstore: the engine's state, with
// its methods defined out of line by concern, the way RocksDB splits DBImpl:
//
//   kv_store.cc        the operations: namespaces, Lookup, Store, Read,
//                      ReportCorrupt, stats; KvStoreEngine's forwarders
//   kv_index.cc        the index: LRU order of both tiers, hot slots and
//                      promotion, cold eviction, leases
//   kv_store_open.cc   opening: RocksDB's options, repair and salvage, the
//                      index rebuilt from the records
//   kv_cold_tier.cc    the cold tier's I/O: payload reads, writes, the stop
//                      after a write error, reopen and reconcile, disk room
//   kv_store_debug.cc  the TEST_ hooks
//
// The record format is kv_format.h; RocksDB's listener and logger kv_rocks.h;
// repair and salvage kv_repair.h. The behaviour is kv_store.h's.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kv_format.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "tandem/kvstore/host_arena.h"
#include "tandem/kvstore/kv_store.h"

namespace tandem::kvstore {

// A random lease id in [1, 2^52): where this process's ids begin.
inline uint64_t FirstLeaseId() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) | rd();
  return 1 + (r & ((uint64_t{1} << 52) - 2));
}

enum class EntryState { kWriting, kReady, kDeleting };

struct Entry {
  Key key;
  EntryState state = EntryState::kWriting;
  uint64_t size = 0;
  uint32_t checksum = 0;
  // Distinguishes this entry from a later one of the same key (leases).
  uint64_t gen = 0;
  int64_t hot_slot = -1;
  int32_t lease_pins = 0;
  int32_t read_pins = 0;
  bool promoting = false;
  bool erase_when_unpinned = false;
  bool in_hot_lru = false;
  bool in_cold_lru = false;
  // The durability its bytes have. kMemory: only in its hot slot, never in
  // RocksDB nor the cold tier's accounting; erased when the hot tier evicts
  // it. Otherwise how its RocksDB write was made (kNone: the memtable only),
  // so that a store asking for more writes it again (MakeDurable). Blocks
  // found in RocksDB on open have been recovered and flushed: kFsync.
  Durability durability = Durability::kFsync;
  [[nodiscard]] bool memory_only() const { return durability == Durability::kMemory; }
  std::list<Entry*>::iterator hot_it;
  std::list<Entry*>::iterator cold_it;
  [[nodiscard]] bool pinned() const { return lease_pins > 0 || read_pins > 0; }
};

struct Lease {
  std::vector<std::pair<Key, uint64_t>> blocks;  // key, entry generation
  int64_t expiry_nanos = 0;
};

struct NsInfo {
  NamespaceSpec spec;
  uint32_t id = 0;
};

class KvStoreEngine::Impl {
 public:
  explicit Impl(const KvStoreOptions& options)
      : opts_(options), clock_(options.clock ? options.clock : SystemClock::Get()) {}
  ~Impl();  // flushes and closes RocksDB (kv_store_open.cc)

  // The operations (kv_store.cc): namespaces, lookups, stores, reads, stats.
  absl::StatusOr<bool> CreateNamespace(const NamespaceSpec& spec);
  absl::StatusOr<NsInfo> Resolve(std::string_view ns) const;
  absl::StatusOr<NsInfo> ResolveLocked(std::string_view ns) const;
  absl::StatusOr<LookupResult> Lookup(std::string_view ns, std::span<const BlockHash> hashes,
                                      const LookupOptions& options);
  absl::StatusOr<StoreResult> Store(std::string_view ns, const BlockHash& hash,
                                    std::span<const uint8_t> payload, uint32_t checksum,
                                    std::optional<Durability> durability);
  // `reserved`: HotSlots' slot per block (-1: none), or null. The slots of
  // the blocks stored anew are taken out of it (set to -1).
  std::vector<absl::StatusOr<StoreResult>> StoreBatch(std::string_view ns,
                                                      std::span<const StoreBlock> blocks,
                                                      std::optional<Durability> durability,
                                                      std::vector<int64_t>* reserved = nullptr);
  // ReserveHotSlots' slot per size (-1: none) and their bytes; their return.
  std::vector<int64_t> ReserveHotSlots(std::string_view ns, std::span<const BlockHash> hashes,
                                       std::span<const uint64_t> sizes,
                                       std::optional<Durability> durability);
  [[nodiscard]] std::span<uint8_t> SlotBytes(int64_t slot, uint64_t size) const;
  void ReleaseHotSlots(std::span<const int64_t> slots);
  absl::StatusOr<ReadResult> Read(std::string_view ns, const BlockHash& hash, Sink sink,
                                  ReadVerify verify);
  absl::StatusOr<bool> ReportCorrupt(std::string_view ns, const BlockHash& hash);
  KvStoreStats GetStats() const;

  // The index (kv_index.cc): both tiers' LRU order, hot slots and promotion,
  // cold eviction, leases. Every *Locked method runs under mu_.
  bool Release(LeaseId lease);
  void ExpireLeases();

  // Opening (kv_store_open.cc): RocksDB's options, repair and salvage, the
  // index rebuilt from the records.
  rocksdb::Options RocksOptions();
  // Opens RocksDB into db_ (null before), repairing a directory it cannot
  // open (kv_repair.h); sets repaired_ when it did.
  rocksdb::Status OpenDb();
  absl::Status Init();
  // Replaces the database by a copy of its intact blocks (kv_repair.h), so
  // that the index rebuilt from it and RocksDB agree.
  absl::Status SalvageAndReopen();

  // Test hooks (kv_store_debug.cc), behind KvStoreEngine::TEST_*.
  bool InTier(std::string_view ns, const BlockHash& hash, bool hot) const;
  absl::Status CorruptHot(std::string_view ns, const BlockHash& hash, uint64_t offset);
  absl::Status CheckColdTier() const;
  absl::Status WaitForBackgroundWork(int64_t timeout_ms);
  absl::Status CorruptCold(std::string_view ns, const BlockHash& hash, uint64_t offset);
  void ReportBackgroundError(std::string_view message) {
    StopWrites(rocksdb::Status::IOError(message));
  }

  const KvStoreOptions& options() const { return opts_; }
  const HostArena& arena() const { return *arena_; }

 private:
  // A read-pinned entry and what a reader needs of it, copied under mu_.
  struct Pinned {
    Entry* e;
    int64_t slot;
    uint64_t size;
    uint32_t checksum;
  };
  Pinned PinLocked(Entry* e);

  // A store's checks before it claims its key, in this order: size, disk
  // room, checksum.
  static absl::Status CheckPayloadSize(const NsInfo& info, const StoreBlock& block);
  static absl::Status CheckPayloadChecksum(const StoreBlock& block);
  // The result of storing a block whose entry is ready (counted); logs a
  // mismatch with LogMismatch, outside mu_.
  StoreResult PresentLocked(Entry* e, uint32_t checksum);
  static void LogMismatch(const NsInfo& info, const StoreBlock& block, uint32_t kept);
  // A key a store claimed (its entry is kWriting) and the block's seq.
  struct Claim {
    size_t block;  // index into the caller's blocks
    Entry* e;
    uint64_t seq;
  };
  // Writes the claimed blocks in one RocksDB write, places them in the hot
  // tier and marks them ready, or erases them all when the write fails (its
  // error for each). One status per claim. With Durability::kMemory there is
  // no write: each block must get a hot slot, or its claim is erased with
  // NoHotSlotLocked's error.
  // Each claim's metadata and payload records, in one batch.
  static rocksdb::WriteBatch BlocksBatch(std::span<const Claim> claims,
                                         std::span<const StoreBlock> blocks);
  // A block whose reserved_slot names a slot still in `reserved` keeps it
  // (its payload is there already) instead of getting one and a copy.
  std::vector<absl::Status> WriteClaimed(std::span<const Claim> claims,
                                         std::span<const StoreBlock> blocks, Durability d,
                                         std::vector<int64_t>* reserved = nullptr);
  // Why a block stored with Durability::kMemory got no hot slot: no hot tier
  // or a block larger than a slot (FAILED_PRECONDITION), or every slot
  // pinned (RESOURCE_EXHAUSTED).
  absl::Status NoHotSlotLocked(const StoreBlock& b) const;
  // Marks a claimed entry ready with `b`'s size and checksum, in hot slot
  // `slot` (-1: none), in the LRU, and counts the store.
  void MarkStoredLocked(Entry* e, const StoreBlock& b, int64_t slot, Durability d);
  // True when a store with durability `d` that finds block `e` ready must
  // write it again: it is in RocksDB with a weaker write (kNone before kWal
  // before kFsync) and the store brings the same bytes.
  static bool NeedsRewriteLocked(const Entry& e, Durability d, uint32_t checksum);
  // Writes ready blocks again, with durability `d`, in one RocksDB write:
  // each claim's entry is read-pinned by the caller (so not evicted
  // meanwhile) and unpinned here. On success each entry has durability `d`
  // and is counted in stores_made_durable; on failure each gets the error
  // (the block stays stored with its weaker durability). One status per claim.
  std::vector<absl::Status> MakeDurable(std::span<const Claim> present,
                                        std::span<const StoreBlock> blocks, Durability d);
  // FAILED_PRECONDITION when a store with durability `d` finds block `e` held
  // in memory only: it would be acknowledged without reaching the disk.
  static absl::Status CheckNoUpgradeLocked(const Entry& e, Durability d, const BlockHash& hash);

  // The operations, continued.
  // Drops a read-pinned entry whose bytes failed verification, vanished, or
  // could not be read (`failed`, the read's status), and returns the miss.
  ReadResult DropCorrupt(Entry* e, MissReason reason, const rocksdb::Status* failed = nullptr);
  // Reads a cold block (read-pinned by the caller), verifies it and copies it
  // to the hot tier when it can; unpins it. A served result means the block
  // is intact; from_hot says whether it is in the hot tier now.
  absl::StatusOr<ReadResult> Stage(Entry* e);

  // The index, continued.
  void InsertLruLocked(Entry* e);
  void TouchLocked(Entry* e);
  // A free slot, or the least-recently-used unpinned hot block's; -1 if none.
  int64_t AcquireHotSlotLocked();
  // Takes a ready entry out of both tiers' accounting; it stays in the index
  // (state kDeleting) until EraseLocked.
  void DoomLocked(Entry* e);
  void EraseLocked(Entry* e);
  void Unpin(Entry* e);
  // Copies verified bytes of a read-pinned entry into a hot slot. True when
  // the entry is in the hot tier afterwards.
  bool Promote(Entry* e, std::span<const uint8_t> data);
  void EvictColdIfNeeded(const Key* exclude);
  void ExpireLeasesLocked(int64_t now);
  bool ReleaseLocked(uint64_t id);

  // Opening, continued.
  // DATA_LOSS for damaged records (Init salvages), other errors as they are.
  absl::Status ScanStatus(const rocksdb::Status& s, absl::string_view what) const;
  absl::Status Rebuild();

  // The cold tier's I/O (kv_cold_tier.cc): payload reads, writes, the stop
  // after a write error, reopen and reconcile, disk room.
  void DeleteFromRocks(const std::vector<Key>& keys);
  // Whether reading a block failed for good: its file is lost or damaged (or
  // an I/O error), not because the database is closed for a reopen. Such a
  // block is dropped, so that a store can write it again (issue 29).
  static bool IsUnreadable(const rocksdb::Status& s);
  // Calls `use` with block `key`'s payload in RocksDB (valid only during the
  // call). NotFound when RocksDB has no payload; Incomplete while a reopen
  // has failed. `use` may block (a send to a slow reader): it runs with the
  // database unlocked unless RocksDB pinned the bytes in its own memory.
  rocksdb::Status GetPayload(const Key& key, absl::FunctionRef<void(std::span<const uint8_t>)> use);
  // Shared use of db_. New readers wait while a reopen waits for its
  // exclusive lock: std::shared_mutex (glibc's rwlock) prefers readers, and
  // a steady stream of reads would keep a reopen waiting.
  std::shared_lock<std::shared_mutex> ReadLock() const;
  static rocksdb::Status ClosedStatus();
  // db_->Write, and the way out of RocksDB's stopped state. After a write
  // error (a full disk, a failed WAL write, flush or compaction) no write
  // goes to RocksDB until the database has been closed and opened again:
  // RocksDB 7.8 keeps using a WAL writer that failed (its Resume() included,
  // see RocksOptions), and Debian's build (its assertions on) aborts the
  // process there. Writes fail at once with the error meanwhile, and
  // TryReopen, called by every write and every disk-room check, reopens the
  // database once the disk has room for it. The store takes writes again
  // without a restart; reads wait only for the reopen itself.
  //
  // Concurrent writes keep RocksDB's group commit: a write that races the
  // stop cannot reach the failed WAL writer, because RocksDB records a WAL
  // write's error (a hard error: the database stops) before the next write
  // group starts, and that group then fails without touching the WAL. (Stop
  // 24 had serialized the writes on a wrong diagnosis; the abort it chased
  // was the LOG file's, see RocksLogger. Serialized, fsync stores from 4-8
  // threads were about 20% slower: bench_kvstore_engine.)
  //
  // With `held`, the database's shared lock comes back in it, still held,
  // so that no reopen runs until the caller has recorded what it wrote.
  rocksdb::Status WriteToRocks(const rocksdb::WriteOptions& wo, rocksdb::WriteBatch* batch,
                               std::shared_lock<std::shared_mutex>* held = nullptr);
  // Stops writes after `error` (the first one is kept and reported). Called
  // by WriteToRocks and by RocksDB's background threads (OnRocksError).
  void StopWrites(const rocksdb::Status& error);
  // Lifts the stop: by Reopen, once the failed database is closed.
  void ResumeWrites();
  rocksdb::Status WriteError() const;
  // Reopens RocksDB while writes are stopped: by one thread at a time, at
  // most once a second, and once the disk has room for the reopen, which
  // flushes what the WAL holds (twice the write buffer, and no more than
  // min_free_disk_bytes): a store that filled its own disk with garbage that
  // only compactions reclaim gets them back this way, while its stores are
  // still refused below min_free_disk_bytes.
  void TryReopen();
  // Closes and opens the database (writes are stopped; the exclusive lock
  // waits for those in flight, and for stores that wrote but have not yet
  // marked their entry ready or erased it), then makes the index and RocksDB agree
  // again: blocks RocksDB has that the index does not (a delete that failed,
  // a write that landed although it reported an error) are deleted, and
  // blocks the index has that RocksDB lost (durability kNone writes in the
  // memtable that could not be flushed) are forgotten. Reads wait while it
  // runs. A directory found corrupt is repaired, as at startup.
  rocksdb::Status Reopen();
  // Reopen's second half, with db_ held exclusively.
  rocksdb::Status ReconcileIndex();
  // RESOURCE_EXHAUSTED while the data directory has less than
  // min_free_disk_bytes free. A statvfs per store: about a microsecond, next
  // to a block write of 64 KiB and more. Tries the reopen first while
  // writes are stopped (see TryReopen), and when the disk is short, the
  // compaction of ReclaimDisk.
  absl::Status CheckDiskRoom();
  // Compacts the whole database, so that RocksDB drops what evictions
  // deleted and the blob files that then hold nothing live: by one thread at
  // a time, while writes run, and at most once a second or ten times as
  // long as the last one took. A store refused below min_free_disk_bytes
  // would otherwise leave nothing to trigger a compaction: its flushes start
  // them, and a store that has filled its disk with garbage takes no more
  // writes (CI's disk-full test ended so, 57 MiB of blob files for 24 MiB of
  // blocks). Without blob garbage collection: relocating the live blobs of
  // old files needs the room that is missing.
  void ReclaimDisk();
  uint64_t FreeDiskBytes() const;
  static int64_t NowSteadyNs();

  // Exclusive use of db_ (Reopen), with the gate above closed meanwhile.
  class ExclusiveDb {
   public:
    explicit ExclusiveDb(Impl* impl) : impl_(impl) {
      impl_->reopen_waiting_.store(true);
      lock_ = std::unique_lock<std::shared_mutex>(impl_->db_mu_);
    }
    ~ExclusiveDb() {
      lock_.unlock();
      {
        std::lock_guard<std::mutex> gate(impl_->gate_mu_);
        impl_->reopen_waiting_.store(false);
      }
      impl_->gate_cv_.notify_all();
    }

   private:
    Impl* const impl_;
    std::unique_lock<std::shared_mutex> lock_;
  };

  const KvStoreOptions opts_;
  const Clock* const clock_;
  rocksdb::Options rocks_options_;
  bool repaired_ = false;  // OpenDb ran RocksDB's repair
  // Shared by every use of db_, exclusive while Reopen replaces it.
  mutable std::shared_mutex db_mu_;
  std::unique_ptr<rocksdb::DB> db_;
  // ReadLock's gate: closed while a reopen waits for db_mu_.
  std::atomic<bool> reopen_waiting_{false};
  mutable std::mutex gate_mu_;
  mutable std::condition_variable gate_cv_;
  // WriteToRocks' stop after a write error. Lock order: reopen_mu_,
  // db_mu_, mu_; error_mu_ is a leaf.
  std::atomic<bool> write_stopped_{false};
  std::mutex reopen_mu_;         // one TryReopen at a time; guards the one below
  int64_t last_reopen_ns_ = 0;   // when a reopen was last tried
  std::mutex reclaim_mu_;        // one ReclaimDisk at a time; guards the one below
  int64_t next_reclaim_ns_ = 0;  // when ReclaimDisk may run again
  mutable std::mutex error_mu_;  // guards the one below
  rocksdb::Status write_error_;  // the error that stopped writes
  std::unique_ptr<HostArena> arena_;

  std::mutex ns_create_mu_;  // serializes CreateNamespace
  mutable std::mutex mu_;    // guards everything below
  std::condition_variable cv_;
  std::unordered_map<std::string, NsInfo> namespaces_;
  uint32_t next_ns_id_ = 1;
  // Node-based so Entry pointers stay valid while the map grows.
  std::unordered_map<Key, Entry, KeyHasher> index_;
  std::list<Entry*> hot_lru_;   // front = most recently used
  std::list<Entry*> cold_lru_;  // front = most recently used
  std::vector<int64_t> free_slots_;
  std::unordered_map<uint64_t, Lease> leases_;
  std::set<std::pair<int64_t, uint64_t>> lease_expiry_;
  // Lease ids start at a random point below 2^52 (exact in JSON), not at 1:
  // a restarted store must not hand out again an id that a client still
  // holds from before the restart, whose stale Release would unpin someone
  // else's blocks.
  uint64_t next_lease_ = FirstLeaseId();
  uint64_t next_seq_ = 1;
  uint64_t next_gen_ = 1;
  uint64_t cold_bytes_ = 0;
  uint64_t cold_blocks_ = 0;
  KvStoreStats stats_;
};

}  // namespace tandem::kvstore
