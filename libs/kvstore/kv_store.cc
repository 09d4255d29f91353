#include "tandem/kvstore/kv_store.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <list>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kv_format.h"
#include "kv_repair.h"
#include "kv_rocks.h"
#include "rocksdb/db.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/kvstore/host_arena.h"
#include "tandem/kvstore/sync_point.h"

namespace tandem::kvstore {
namespace {

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

}  // namespace

absl::Status KvStoreOptions::Validate() const {
  if (data_dir.empty()) return absl::InvalidArgumentError("KvStoreOptions.data_dir is empty");
  if (hot_capacity_bytes > 0 && hot_slot_bytes == 0) {
    return absl::InvalidArgumentError("KvStoreOptions.hot_slot_bytes must be > 0");
  }
  if (hot_capacity_bytes > 0 && hot_capacity_bytes < hot_slot_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvStoreOptions.hot_capacity_bytes ", hot_capacity_bytes,
                     " is smaller than one slot (hot_slot_bytes ", hot_slot_bytes, ")"));
  }
  if (write_buffer_bytes < (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvStoreOptions.write_buffer_bytes ", write_buffer_bytes, " is under 1 MiB"));
  }
  if (default_lease_ttl_ms <= 0 || max_lease_ttl_ms < default_lease_ttl_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvStoreOptions: need 0 < default_lease_ttl_ms (", default_lease_ttl_ms,
                     ") <= max_lease_ttl_ms (", max_lease_ttl_ms, ")"));
  }
  return absl::OkStatus();
}

class KvStoreEngine::Impl {
 public:
  explicit Impl(const KvStoreOptions& options)
      : opts_(options), clock_(options.clock ? options.clock : SystemClock::Get()) {}

  ~Impl() {
    if (db_ == nullptr) return;
    if (write_stopped_.load()) return;  // db_'s destructor closes it; a flush would fail
    rocksdb::FlushOptions fo;
    rocksdb::Status s = db_->Flush(fo);
    if (!s.ok()) TANDEM_LOG(ERROR) << "KV-store: flush on close failed: " << s.ToString();
    s = db_->Close();
    if (!s.ok()) TANDEM_LOG(ERROR) << "KV-store: close failed: " << s.ToString();
  }

  rocksdb::Options RocksOptions() {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.enable_blob_files = true;
    o.min_blob_size = 4096;
    o.blob_file_size = uint64_t{256} << 20;
    o.enable_blob_garbage_collection = true;
    o.compression = rocksdb::kNoCompression;
    o.blob_compression_type = rocksdb::kNoCompression;
    o.write_buffer_size = opts_.write_buffer_bytes;
    // No automatic recovery from a background error, and no Resume(): after
    // a failed write RocksDB 7.8 may keep the failed WAL writer (Resume()
    // switches to a new WAL only when the memtable has data), and the next
    // write or sync reaches it; Debian's build (its assertions on) then
    // aborts the process. RocksDB itself has since made WAL write errors
    // fatal (its PR 12995). WriteToRocks reopens the database instead.
    o.max_bgerror_resume_count = 0;
    // Nor RocksDB's other automatic recovery: after a "no space" error its
    // SstFileManager resumes the DB from a background thread as soon as it
    // sees any room.
    o.listeners.push_back(
        std::make_shared<OnRocksError>([this](const rocksdb::Status& e) { StopWrites(e); }));
    o.max_background_jobs = 2;
    o.info_log = std::make_shared<RocksLogger>();
    o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
    return o;
  }

  // Opens RocksDB into db_ (null before), repairing a directory it cannot
  // open (kv_repair.h); sets repaired_ when it did.
  rocksdb::Status OpenDb() {
    rocksdb::DB* db = nullptr;
    const std::string damage = NeedsRepairBeforeOpen(opts_.data_dir);
    rocksdb::Status opened = damage.empty()
                                 ? rocksdb::DB::Open(rocks_options_, opts_.data_dir, &db)
                                 : rocksdb::Status::Corruption(damage);
    if (IsDamage(opened)) {
      // The store is a cache: RocksDB's repair keeps the tables it can still
      // read, and the salvage after it drops what lost its payload.
      TANDEM_LOG(ERROR) << "KV-store: " << opts_.data_dir << " cannot be opened ("
                        << opened.ToString()
                        << "); repairing it: blocks that cannot be read are dropped";
      const rocksdb::Status repaired = rocksdb::RepairDB(opts_.data_dir, rocks_options_);
      if (!repaired.ok()) {
        TANDEM_LOG(ERROR) << "KV-store: repair of " << opts_.data_dir
                          << " failed: " << repaired.ToString();
      }
      repaired_ = true;
      opened = rocksdb::DB::Open(rocks_options_, opts_.data_dir, &db);
    }
    if (opened.ok()) db_.reset(db);
    return opened;
  }

  absl::Status Init() {
    std::error_code ec;
    std::filesystem::create_directories(opts_.data_dir, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("creating KV-store data dir ", opts_.data_dir, ": ", ec.message()));
    }
    TANDEM_RETURN_IF_ERROR(FinishInterruptedSalvage(opts_.data_dir));
    rocks_options_ = RocksOptions();
    TANDEM_RETURN_IF_ERROR(FromRocks(OpenDb(), "opening " + opts_.data_dir));

    HostArenaOptions ao{.slot_bytes = opts_.hot_slot_bytes,
                        .num_slots = opts_.hot_capacity_bytes > 0
                                         ? opts_.hot_capacity_bytes / opts_.hot_slot_bytes
                                         : 0,
                        .use_cuda_host_alloc = opts_.use_cuda_host_alloc,
                        .lock_memory = opts_.lock_hot_memory};
    TANDEM_ASSIGN_OR_RETURN(arena_, HostArena::Create(ao));
    for (int64_t i = static_cast<int64_t>(arena_->num_slots()) - 1; i >= 0; --i) {
      free_slots_.push_back(i);
    }
    if (!repaired_) {
      // Every table block (metadata, and payloads small enough to sit in the
      // tables) before the index is built: a damaged block found later
      // would fail its reads and every compaction over it.
      absl::Status scanned = ScanStatus(db_->VerifyChecksum(), "table files");
      if (scanned.ok()) scanned = Rebuild();
      if (!absl::IsDataLoss(scanned)) return scanned;
      TANDEM_LOG(ERROR) << "KV-store: the start-up scan of " << opts_.data_dir
                        << " met damaged records (" << scanned.message()
                        << "); salvaging every intact block";
      namespaces_.clear();
      index_.clear();
      next_ns_id_ = next_seq_ = next_gen_ = 1;
    }
    // After a repair, or over damaged tables: keep only what reads back.
    TANDEM_RETURN_IF_ERROR(SalvageAndReopen());
    return Rebuild();
  }

  // Replaces the database by a copy of its intact blocks (kv_repair.h), so
  // that the index rebuilt from it and RocksDB agree.
  absl::Status SalvageAndReopen() {
    absl::StatusOr<SalvageCounts> counts = SalvageInto(db_.get(), opts_.data_dir, rocks_options_);
    const rocksdb::Status closed = db_->Close();
    db_.reset();
    if (!counts.ok()) {
      return absl::Status(counts.status().code(),
                          absl::StrCat("salvaging ", opts_.data_dir, ": ", counts.status().message()));
    }
    if (!closed.ok()) TANDEM_LOG(WARNING) << "KV-store: closing RocksDB: " << closed.ToString();
    TANDEM_RETURN_IF_ERROR(InstallSalvage(opts_.data_dir));
    TANDEM_RETURN_IF_ERROR(FromRocks(OpenDb(), "opening the salvaged " + opts_.data_dir));
    stats_.blocks_dropped_at_open = counts->blocks_dropped + counts->records_dropped;
    TANDEM_LOG(WARNING) << "KV-store: salvaged " << opts_.data_dir << ": kept "
                        << counts->namespaces << " namespaces and " << counts->blocks_kept
                        << " blocks; dropped " << counts->blocks_dropped << " blocks and "
                        << counts->records_dropped << " unreadable records; stepped over "
                        << counts->ranges_skipped << " damaged key ranges";
    return absl::OkStatus();
  }

  // ---- namespaces --------------------------------------------------------

  absl::StatusOr<bool> CreateNamespace(const NamespaceSpec& spec) {
    TANDEM_RETURN_IF_ERROR(spec.Validate());
    std::lock_guard<std::mutex> create_lock(ns_create_mu_);
    uint32_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = namespaces_.find(spec.name);
      if (it != namespaces_.end()) {
        const NamespaceSpec& have = it->second.spec;
        if (have == spec) return false;
        return absl::AlreadyExistsError(
            absl::StrCat("namespace '", spec.name, "' exists with block_bytes=", have.block_bytes,
                         " layout='", have.layout, "'; requested block_bytes=", spec.block_bytes,
                         " layout='", spec.layout, "'"));
      }
      id = next_ns_id_++;
    }
    std::string value;
    PutU32(&value, id);
    PutU64(&value, spec.block_bytes);
    value += spec.layout;
    TANDEM_RETURN_IF_ERROR(CheckDiskRoom());
    rocksdb::WriteOptions wo;
    wo.sync = true;
    rocksdb::WriteBatch batch;
    batch.Put(std::string(1, kNamespacePrefix) + spec.name, value);
    batch.Put(std::string(1, kNamespaceCopyPrefix) + spec.name, value);
    TANDEM_RETURN_IF_ERROR(
        FromRocks(WriteToRocks(wo, &batch), "writing namespace " + spec.name));
    std::lock_guard<std::mutex> lock(mu_);
    namespaces_[spec.name] = NsInfo{spec, id};
    return true;
  }

  absl::StatusOr<NsInfo> Resolve(std::string_view ns) const {
    std::lock_guard<std::mutex> lock(mu_);
    return ResolveLocked(ns);
  }

  absl::StatusOr<NsInfo> ResolveLocked(std::string_view ns) const {
    auto it = namespaces_.find(std::string(ns));
    if (it == namespaces_.end()) {
      return absl::NotFoundError(absl::StrCat("namespace '", std::string(ns),
                                              "' is not registered; CreateNamespace it first"));
    }
    return it->second;
  }

  // ---- lookups and leases ------------------------------------------------

  absl::StatusOr<LookupResult> Lookup(std::string_view ns, std::span<const BlockHash> hashes,
                                      const LookupOptions& options) {
    TANDEM_SYNC_POINT("KvStoreEngine::Lookup:Start");
    LookupResult result;
    std::vector<std::pair<int32_t, Entry*>> to_stage;
    std::vector<bool> hot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      TANDEM_ASSIGN_OR_RETURN(NsInfo info, ResolveLocked(ns));
      const int64_t now = clock_->NowNanos();
      ExpireLeasesLocked(now);
      ++stats_.lookups;
      std::vector<Entry*> hits;
      for (const BlockHash& h : hashes) {
        auto it = index_.find(Key{info.id, h});
        if (it == index_.end() || it->second.state != EntryState::kReady) break;
        Entry* e = &it->second;
        TouchLocked(e);
        hot.push_back(e->hot_slot >= 0);
        if (e->hot_slot < 0 && options.stage_to_hot) {
          ++e->read_pins;
          to_stage.emplace_back(static_cast<int32_t>(hits.size()), e);
        }
        hits.push_back(e);
      }
      result.num_hits = static_cast<int32_t>(hits.size());
      stats_.lookup_hits += hits.size();
      if (options.take_lease && !hits.empty()) {
        const uint64_t id = next_lease_++;
        int64_t ttl = options.lease_ttl_ms > 0 ? options.lease_ttl_ms : opts_.default_lease_ttl_ms;
        ttl = std::min(ttl, opts_.max_lease_ttl_ms);
        Lease lease;
        lease.expiry_nanos = now + ttl * 1'000'000;
        for (Entry* e : hits) {
          ++e->lease_pins;
          lease.blocks.emplace_back(e->key, e->gen);
        }
        lease_expiry_.emplace(lease.expiry_nanos, id);
        leases_.emplace(id, std::move(lease));
        result.lease = LeaseId(id);
      }
    }
    TANDEM_SYNC_POINT("KvStoreEngine::Lookup:AfterPin");
    for (auto& [pos, e] : to_stage) {
      if (pos >= result.num_hits) {
        Unpin(e);
        continue;
      }
      absl::StatusOr<ReadResult> staged = Stage(e);
      if (staged.ok() && staged->ok()) {
        // Intact; when it could not be promoted (no hot tier, too large for
        // a slot, every slot pinned, or another thread promoting it) it is
        // still a hit, and its load reads it from the cold tier.
        hot[pos] = staged->from_hot;
      } else {
        // The block is gone (or unreadable): the prefix ends before it.
        result.num_hits = pos;
      }
    }
    for (int32_t i = 0; i < result.num_hits; ++i) result.num_hot_hits += hot[i] ? 1 : 0;
    TANDEM_SYNC_POINT("KvStoreEngine::Lookup:End");
    return result;
  }

  bool Release(LeaseId lease) {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLeasesLocked(clock_->NowNanos());
    return ReleaseLocked(lease.value());
  }

  void ExpireLeases() {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLeasesLocked(clock_->NowNanos());
  }

  // ---- stores ------------------------------------------------------------

  absl::StatusOr<StoreResult> Store(std::string_view ns, const BlockHash& hash,
                                    std::span<const uint8_t> payload, uint32_t checksum,
                                    std::optional<Durability> durability) {
    TANDEM_ASSIGN_OR_RETURN(NsInfo info, Resolve(ns));
    if (payload.size() != info.spec.block_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block ", hash.ToHex(), ": payload has ", payload.size(), " bytes; blocks of namespace '",
          info.spec.name, "' have ", info.spec.block_bytes));
    }
    TANDEM_RETURN_IF_ERROR(CheckDiskRoom());
    const uint32_t actual = Crc32c(payload);
    if (actual != checksum) {
      return absl::DataLossError(absl::StrCat("block ", hash.ToHex(), ": writer's checksum ",
                                              checksum, " does not match the payload's CRC32C ",
                                              actual));
    }
    const Key key{info.id, hash};
    Entry* e = nullptr;
    uint64_t seq;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ExpireLeasesLocked(clock_->NowNanos());
      for (;;) {
        auto it = index_.find(key);
        if (it == index_.end()) {
          e = &index_[key];
          e->key = key;
          e->gen = next_gen_++;
          break;
        }
        if (it->second.state == EntryState::kReady) {
          TouchLocked(&it->second);
          ++stats_.stores_already_present;
          if (it->second.checksum == checksum) return StoreResult{.already_present = true};
          ++stats_.stores_mismatched;
          const uint32_t kept = it->second.checksum;
          lock.unlock();
          TANDEM_LOG(WARNING) << "store of block " << hash.ToHex() << " in namespace '"
                              << info.spec.name << "' with other bytes (CRC32C " << checksum
                              << ", stored " << kept << "): kept the first write";
          return StoreResult{.already_present = true, .mismatched = true};
        }
        // Another writer (or an eviction) owns the key: wait for it.
        cv_.wait(lock);
      }
      seq = next_seq_++;
    }
    TANDEM_SYNC_POINT("KvStoreEngine::Store:BeforeWrite");
    rocksdb::WriteBatch batch;
    batch.Put(RocksKey(kMetaPrefix, key),
              EncodeMeta(Meta{.checksum = checksum, .size = payload.size(), .seq = seq}));
    batch.Put(RocksKey(kBlockPrefix, key),
              rocksdb::Slice(reinterpret_cast<const char*>(payload.data()), payload.size()));
    // The database stays open (no reopen) until the entry is ready or gone:
    // a reopen in between could lose a write without the WAL and still see
    // the entry writing (see ReconcileIndex).
    std::shared_lock<std::shared_mutex> db_held;
    rocksdb::Status s =
        WriteToRocks(WriteOptionsFor(durability.value_or(opts_.durability)), &batch, &db_held);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      EraseLocked(e);
      return FromRocks(s, absl::StrCat("writing block ", hash.ToHex()));
    }
    TANDEM_SYNC_POINT("KvStoreEngine::Store:AfterWrite");
    int64_t slot = -1;
    if (opts_.store_to_hot && payload.size() <= arena_->slot_bytes()) {
      std::lock_guard<std::mutex> lock(mu_);
      slot = AcquireHotSlotLocked();
    }
    if (slot >= 0) std::memcpy(arena_->slot(slot), payload.data(), payload.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      e->state = EntryState::kReady;
      e->size = payload.size();
      e->checksum = checksum;
      e->hot_slot = slot;
      InsertLruLocked(e);
      ++stats_.stores;
      cv_.notify_all();
    }
    db_held.unlock();
    EvictColdIfNeeded(&key);
    return StoreResult{};
  }

  // ---- reads -------------------------------------------------------------

  // A read-pinned entry and what a reader needs of it, copied under mu_.
  struct Pinned {
    Entry* e;
    int64_t slot;
    uint64_t size;
    uint32_t checksum;
  };
  Pinned PinLocked(Entry* e) {
    ++e->read_pins;
    return Pinned{e, e->hot_slot, e->size, e->checksum};
  }

  absl::StatusOr<ReadResult> Read(std::string_view ns, const BlockHash& hash, Sink sink,
                                  ReadVerify verify) {
    Pinned p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      TANDEM_ASSIGN_OR_RETURN(NsInfo info, ResolveLocked(ns));
      ExpireLeasesLocked(clock_->NowNanos());
      ++stats_.loads;
      auto it = index_.find(Key{info.id, hash});
      if (it == index_.end() || it->second.state != EntryState::kReady) {
        ++stats_.load_misses;
        return ReadResult{.miss = MissReason::kNotFound};
      }
      TouchLocked(&it->second);
      p = PinLocked(&it->second);
    }
    // Plain names, not a structured binding: lambdas below use them, and
    // clang 14 (the fuzz build) cannot capture bindings.
    Entry* const e = p.e;
    const int64_t slot = p.slot;
    const uint64_t size = p.size;
    const uint32_t checksum = p.checksum;
    const bool check = verify == ReadVerify::kStore;
    ReadResult result{.checksum = checksum};
    if (slot >= 0) {
      std::span<const uint8_t> data(arena_->slot(slot), size);
      if (check && Crc32c(data) != checksum) return DropCorrupt(e, MissReason::kChecksum);
      TANDEM_SYNC_POINT("KvStoreEngine::Read:AfterVerify");
      sink(data, checksum);
      result.from_hot = true;
    } else {
      bool corrupt = false;
      rocksdb::Status s = GetPayload(e->key, [&](std::span<const uint8_t> data) {
        if (data.size() != size || (check && Crc32c(data) != checksum)) {
          corrupt = true;
          return;
        }
        TANDEM_SYNC_POINT("KvStoreEngine::Read:AfterVerify");
        sink(data, checksum);
        Promote(e, data);
      });
      if (s.IsNotFound()) return DropCorrupt(e, MissReason::kNotFound);
      if (IsUnreadable(s)) return DropCorrupt(e, MissReason::kNotFound, &s);
      if (!s.ok()) {
        Unpin(e);
        return FromRocks(s, absl::StrCat("reading block ", hash.ToHex()));
      }
      if (corrupt) return DropCorrupt(e, MissReason::kChecksum);
    }
    Unpin(e);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.blocks_loaded;
    return result;
  }

  absl::StatusOr<bool> ReportCorrupt(std::string_view ns, const BlockHash& hash) {
    Pinned p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      TANDEM_ASSIGN_OR_RETURN(NsInfo info, ResolveLocked(ns));
      ++stats_.corrupt_reports;
      auto it = index_.find(Key{info.id, hash});
      if (it == index_.end() || it->second.state != EntryState::kReady) return false;
      p = PinLocked(&it->second);
    }
    // Plain names, not a structured binding: lambdas below use them, and
    // clang 14 (the fuzz build) cannot capture bindings.
    Entry* const e = p.e;
    const int64_t slot = p.slot;
    const uint64_t size = p.size;
    const uint32_t checksum = p.checksum;
    bool intact;
    rocksdb::Status unreadable;
    if (slot >= 0) {
      intact = Crc32c(std::span<const uint8_t>(arena_->slot(slot), size)) == checksum;
    } else {
      intact = false;
      rocksdb::Status s = GetPayload(e->key, [&](std::span<const uint8_t> data) {
        intact = data.size() == size && Crc32c(data) == checksum;
      });
      if (!s.ok() && !s.IsNotFound() && !IsUnreadable(s)) {
        Unpin(e);
        return FromRocks(s, absl::StrCat("verifying reported block ", hash.ToHex()));
      }
      if (IsUnreadable(s)) unreadable = s;
    }
    if (intact) {
      TANDEM_LOG(WARNING) << "KV-store: a reader reported block " << hash.ToHex()
                          << " corrupt, but it verifies here; kept";
      Unpin(e);
      return false;
    }
    DropCorrupt(e, MissReason::kChecksum, unreadable.ok() ? nullptr : &unreadable);
    return true;
  }

  // ---- stats and tests ---------------------------------------------------

  KvStoreStats GetStats() const {
    std::lock_guard<std::mutex> lock(mu_);
    KvStoreStats s = stats_;
    s.hot_blocks = hot_lru_.size();
    s.hot_capacity_blocks = arena_->num_slots();
    s.hot_slot_bytes = arena_->slot_bytes();
    s.cold_blocks = cold_blocks_;
    s.cold_bytes = cold_bytes_;
    s.cold_capacity_bytes = opts_.cold_capacity_bytes;
    s.active_leases = leases_.size();
    return s;
  }

  const KvStoreOptions& options() const { return opts_; }

  bool InTier(std::string_view ns, const BlockHash& hash, bool hot) const {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<NsInfo> info = ResolveLocked(ns);
    if (!info.ok()) return false;
    auto it = index_.find(Key{info->id, hash});
    if (it == index_.end() || it->second.state != EntryState::kReady) return false;
    return hot ? it->second.hot_slot >= 0 : true;
  }

  absl::Status CorruptHot(std::string_view ns, const BlockHash& hash, uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    TANDEM_ASSIGN_OR_RETURN(NsInfo info, ResolveLocked(ns));
    auto it = index_.find(Key{info.id, hash});
    if (it == index_.end() || it->second.hot_slot < 0 || offset >= it->second.size) {
      return absl::FailedPreconditionError("block is not in the hot tier or offset out of range");
    }
    arena_->slot(it->second.hot_slot)[offset] ^= 0x5A;
    return absl::OkStatus();
  }

  absl::Status CheckColdTier() const {
    std::vector<std::string> problems;
    auto problem = [&](const Key& k, absl::string_view what) {
      if (problems.size() < 5) {
        problems.push_back(absl::StrCat("ns ", k.ns, " block ", k.hash.ToHex(), ": ", what));
      }
    };
    std::unordered_set<Key, KeyHasher> with_meta;
    std::shared_lock<std::shared_mutex> db_lock = ReadLock();
    if (db_ == nullptr) return FromRocks(ClosedStatus(), "checking the cold tier");
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    const std::string meta_prefix(1, kMetaPrefix);
    for (it->Seek(meta_prefix); it->Valid() && it->key().starts_with(meta_prefix); it->Next()) {
      Key key;
      Meta meta;
      if (!ParseRocksKey(it->key(), &key) || !DecodeMeta(it->value(), &meta)) {
        problems.push_back("unreadable metadata record");
        continue;
      }
      with_meta.insert(key);
      std::string value;
      rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), RocksKey(kBlockPrefix, key), &value);
      if (s.IsNotFound()) {
        problem(key, "metadata without a payload");
      } else if (!s.ok()) {
        problem(key, s.ToString());
      } else if (value.size() != meta.size ||
                 Crc32cExtend(0, reinterpret_cast<const uint8_t*>(value.data()), value.size()) !=
                     meta.checksum) {
        problem(key, "payload does not match its metadata");
      }
      std::lock_guard<std::mutex> lock(mu_);
      auto e = index_.find(key);
      if (e == index_.end() || e->second.state != EntryState::kReady) {
        problem(key, "in RocksDB but not in the index");
      }
    }
    TANDEM_RETURN_IF_ERROR(FromRocks(it->status(), "scanning metadata"));
    const std::string block_prefix(1, kBlockPrefix);
    for (it->Seek(block_prefix); it->Valid() && it->key().starts_with(block_prefix); it->Next()) {
      Key key;
      if (!ParseRocksKey(it->key(), &key)) {
        problems.push_back("unreadable payload key");
        continue;
      }
      if (!with_meta.contains(key)) problem(key, "payload without metadata");
    }
    TANDEM_RETURN_IF_ERROR(FromRocks(it->status(), "scanning payloads"));
    {
      std::lock_guard<std::mutex> lock(mu_);
      uint64_t ready = 0;
      for (const auto& [key, e] : index_) ready += e.state == EntryState::kReady ? 1 : 0;
      if (ready != with_meta.size()) {
        problems.push_back(
            absl::StrCat("index has ", ready, " blocks, RocksDB ", with_meta.size()));
      }
    }
    if (problems.empty()) return absl::OkStatus();
    return absl::DataLossError(absl::StrJoin(problems, "; "));
  }

  absl::Status CorruptCold(std::string_view ns, const BlockHash& hash, uint64_t offset) {
    TANDEM_ASSIGN_OR_RETURN(NsInfo info, Resolve(ns));
    const std::string key = RocksKey(kBlockPrefix, Key{info.id, hash});
    std::string value;
    TANDEM_RETURN_IF_ERROR(FromRocks(
        GetPayload(Key{info.id, hash},
                   [&](std::span<const uint8_t> data) { value.assign(data.begin(), data.end()); }),
        "reading"));
    if (offset >= value.size()) return absl::OutOfRangeError("offset past the payload");
    value[offset] = static_cast<char>(value[offset] ^ 0x5A);
    // Through WriteToRocks like every write: a plain Put after a failed WAL
    // write aborts the process (see there).
    TANDEM_RETURN_IF_ERROR(CheckDiskRoom());
    rocksdb::WriteBatch batch;
    batch.Put(key, value);
    return FromRocks(WriteToRocks(rocksdb::WriteOptions(), &batch), "rewriting");
  }

 private:
  // DATA_LOSS for damaged records (Init salvages), other errors as they are.
  absl::Status ScanStatus(const rocksdb::Status& s, absl::string_view what) const {
    const std::string context = absl::StrCat("scanning the ", what, " in ", opts_.data_dir);
    if (IsDamage(s)) return absl::DataLossError(absl::StrCat(context, ": ", s.ToString()));
    return FromRocks(s, context);
  }

  absl::Status Rebuild() {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    const std::string ns_prefix(1, kNamespacePrefix);
    for (it->Seek(ns_prefix); it->Valid() && it->key().starts_with(ns_prefix); it->Next()) {
      const rocksdb::Slice v = it->value();
      if (v.size() < 12) {
        return absl::DataLossError(absl::StrCat("corrupt namespace record ", it->key().ToString()));
      }
      NsInfo info;
      info.id = GetU32(v.data());
      info.spec.name = it->key().ToString().substr(1);
      info.spec.block_bytes = GetU64(v.data() + 4);
      info.spec.layout.assign(v.data() + 12, v.size() - 12);
      next_ns_id_ = std::max(next_ns_id_, info.id + 1);
      namespaces_[info.spec.name] = std::move(info);
    }
    TANDEM_RETURN_IF_ERROR(ScanStatus(it->status(), "namespace records"));
    std::vector<std::pair<uint64_t, Entry*>> by_seq;
    const std::string meta_prefix(1, kMetaPrefix);
    for (it->Seek(meta_prefix); it->Valid() && it->key().starts_with(meta_prefix); it->Next()) {
      Key key;
      Meta meta;
      if (!ParseRocksKey(it->key(), &key) || !DecodeMeta(it->value(), &meta)) {
        TANDEM_LOG(WARNING) << "KV-store: skipping unreadable metadata record";
        continue;
      }
      Entry& e = index_[key];
      e.key = key;
      e.state = EntryState::kReady;
      e.size = meta.size;
      e.checksum = meta.checksum;
      e.gen = next_gen_++;
      next_seq_ = std::max(next_seq_, meta.seq + 1);
      by_seq.emplace_back(meta.seq, &e);
    }
    TANDEM_RETURN_IF_ERROR(ScanStatus(it->status(), "block metadata"));
    std::sort(by_seq.begin(), by_seq.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [seq, e] : by_seq) InsertLruLocked(e);
    }
    TANDEM_LOG(INFO) << "KV-store: opened " << opts_.data_dir << " with " << namespaces_.size()
                     << " namespaces, " << cold_blocks_ << " blocks (" << cold_bytes_
                     << " bytes); hot tier " << arena_->num_slots() << " slots of "
                     << arena_->slot_bytes() << " bytes";
    EvictColdIfNeeded(nullptr);
    return absl::OkStatus();
  }

  void InsertLruLocked(Entry* e) {
    e->cold_it = cold_lru_.insert(cold_lru_.begin(), e);
    e->in_cold_lru = true;
    cold_bytes_ += e->size;
    ++cold_blocks_;
    if (e->hot_slot >= 0) {
      e->hot_it = hot_lru_.insert(hot_lru_.begin(), e);
      e->in_hot_lru = true;
    }
  }

  void TouchLocked(Entry* e) {
    if (e->in_cold_lru) cold_lru_.splice(cold_lru_.begin(), cold_lru_, e->cold_it);
    if (e->in_hot_lru) hot_lru_.splice(hot_lru_.begin(), hot_lru_, e->hot_it);
  }

  // A free slot, or the least-recently-used unpinned hot block's; -1 if none.
  int64_t AcquireHotSlotLocked() {
    if (!free_slots_.empty()) {
      const int64_t slot = free_slots_.back();
      free_slots_.pop_back();
      return slot;
    }
    for (auto it = hot_lru_.rbegin(); it != hot_lru_.rend(); ++it) {
      Entry* e = *it;
      if (e->pinned()) continue;
      const int64_t slot = e->hot_slot;
      hot_lru_.erase(e->hot_it);
      e->in_hot_lru = false;
      e->hot_slot = -1;
      ++stats_.evictions_hot;
      return slot;
    }
    return -1;
  }

  // Takes a ready entry out of both tiers' accounting; it stays in the index
  // (state kDeleting) until EraseLocked.
  void DoomLocked(Entry* e) {
    if (e->state != EntryState::kReady) return;
    e->state = EntryState::kDeleting;
    cold_bytes_ -= e->size;
    --cold_blocks_;
    if (e->in_cold_lru) cold_lru_.erase(e->cold_it);
    e->in_cold_lru = false;
    if (e->in_hot_lru) hot_lru_.erase(e->hot_it);
    e->in_hot_lru = false;
  }

  void EraseLocked(Entry* e) {
    if (e->in_cold_lru) cold_lru_.erase(e->cold_it);
    if (e->in_hot_lru) hot_lru_.erase(e->hot_it);
    if (e->hot_slot >= 0) free_slots_.push_back(e->hot_slot);
    index_.erase(e->key);
    cv_.notify_all();
  }

  void Unpin(Entry* e) {
    std::lock_guard<std::mutex> lock(mu_);
    --e->read_pins;
    if (e->erase_when_unpinned && e->read_pins == 0) EraseLocked(e);
  }

  void DeleteFromRocks(const std::vector<Key>& keys) {
    rocksdb::WriteBatch batch;
    for (const Key& k : keys) {
      batch.Delete(RocksKey(kMetaPrefix, k));
      batch.Delete(RocksKey(kBlockPrefix, k));
    }
    rocksdb::Status s = WriteToRocks(WriteOptionsFor(opts_.durability), &batch);
    // The index no longer has them; a failed delete only means they may come
    // back (intact) after a restart.
    if (!s.ok()) TANDEM_LOG(ERROR) << "KV-store: deleting blocks failed: " << s.ToString();
  }

  // Whether reading a block failed for good: its file is lost or damaged (or
  // an I/O error), not because the database is closed for a reopen. Such a
  // block is dropped, so that a store can write it again (issue 29).
  static bool IsUnreadable(const rocksdb::Status& s) {
    return !s.ok() && !s.IsNotFound() && !s.IsIncomplete() && !s.IsBusy() && !s.IsTryAgain();
  }

  // Drops a read-pinned entry whose bytes failed verification, vanished, or
  // could not be read (`failed`, the read's status), and returns the miss.
  ReadResult DropCorrupt(Entry* e, MissReason reason, const rocksdb::Status* failed = nullptr) {
    bool doomed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed != nullptr) ++stats_.load_failures;
      if (reason == MissReason::kChecksum) ++stats_.checksum_failures;
      ++stats_.load_misses;
      if (e->state == EntryState::kReady) {
        DoomLocked(e);
        doomed = true;
      }
    }
    if (doomed) {
      TANDEM_LOG(WARNING) << "KV-store: dropping block " << e->key.hash.ToHex() << " ("
                          << (failed != nullptr ? "reading it failed: " + failed->ToString()
                                                : std::string(MissReasonName(reason)))
                          << ")";
      DeleteFromRocks({e->key});
      std::lock_guard<std::mutex> lock(mu_);
      e->erase_when_unpinned = true;
    }
    Unpin(e);
    return ReadResult{.miss = reason};
  }

  // Reads a cold block (read-pinned by the caller), verifies it and copies it
  // to the hot tier when it can; unpins it. A served result means the block
  // is intact; from_hot says whether it is in the hot tier now.
  absl::StatusOr<ReadResult> Stage(Entry* e) {
    bool corrupt = false;
    ReadResult result{.checksum = e->checksum};
    rocksdb::Status s = GetPayload(e->key, [&](std::span<const uint8_t> data) {
      corrupt = data.size() != e->size || Crc32c(data) != e->checksum;
      if (!corrupt) result.from_hot = Promote(e, data);
    });
    if (s.IsNotFound()) return DropCorrupt(e, MissReason::kNotFound);
    if (IsUnreadable(s)) return DropCorrupt(e, MissReason::kNotFound, &s);
    if (!s.ok()) {
      Unpin(e);
      return FromRocks(s, "staging a block");
    }
    if (corrupt) return DropCorrupt(e, MissReason::kChecksum);
    Unpin(e);
    return result;
  }

  // Calls `use` with block `key`'s payload in RocksDB (valid only during the
  // call). NotFound when RocksDB has no payload; Incomplete while a reopen
  // has failed. `use` may block (a send to a slow reader): it runs with the
  // database unlocked unless RocksDB pinned the bytes in its own memory.
  rocksdb::Status GetPayload(const Key& key,
                             absl::FunctionRef<void(std::span<const uint8_t>)> use) {
    std::shared_lock<std::shared_mutex> db_lock = ReadLock();
    if (db_ == nullptr) return ClosedStatus();
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(PayloadReadOptions(), db_->DefaultColumnFamily(),
                                 RocksKey(kBlockPrefix, key), &value);
    if (!s.ok()) return s;
    // Blob values (every payload of 4 KiB and more) are the slice's own
    // bytes; only bytes pinned in RocksDB's caches need the database open.
    if (!value.IsPinned()) db_lock.unlock();
    use(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(value.data()), value.size()));
    return s;
  }

  // Shared use of db_. New readers wait while a reopen waits for its
  // exclusive lock: std::shared_mutex (glibc's rwlock) prefers readers, and
  // a steady stream of reads would keep a reopen waiting.
  std::shared_lock<std::shared_mutex> ReadLock() const {
    if (reopen_waiting_.load()) {
      std::unique_lock<std::mutex> lock(gate_mu_);
      gate_cv_.wait(lock, [&] { return !reopen_waiting_.load(); });
    }
    return std::shared_lock<std::shared_mutex>(db_mu_);
  }
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
  static rocksdb::Status ClosedStatus() {
    return rocksdb::Status::Incomplete(
        "RocksDB is closed: reopening it after a write error failed; retried on the next store");
  }

  // Copies verified bytes of a read-pinned entry into a hot slot. True when
  // the entry is in the hot tier afterwards.
  bool Promote(Entry* e, std::span<const uint8_t> data) {
    int64_t slot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (e->hot_slot >= 0) return true;
      if (e->promoting || e->state != EntryState::kReady || data.size() > arena_->slot_bytes()) {
        return false;
      }
      slot = AcquireHotSlotLocked();
      if (slot < 0) return false;
      e->promoting = true;
    }
    TANDEM_SYNC_POINT("KvStoreEngine::Promote:AfterClaim");
    std::memcpy(arena_->slot(slot), data.data(), data.size());
    TANDEM_SYNC_POINT("KvStoreEngine::Promote:BeforeInstall");
    std::lock_guard<std::mutex> lock(mu_);
    e->promoting = false;
    if (e->state != EntryState::kReady) {
      free_slots_.push_back(slot);
      return false;
    }
    e->hot_slot = slot;
    e->hot_it = hot_lru_.insert(hot_lru_.begin(), e);
    e->in_hot_lru = true;
    ++stats_.promotions;
    return true;
  }

  void EvictColdIfNeeded(const Key* exclude) {
    if (opts_.cold_capacity_bytes == 0 && opts_.cold_capacity_blocks == 0) return;
    TANDEM_SYNC_POINT("KvStoreEngine::EvictCold:BeforeSelect");
    std::vector<Key> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto over = [&] {
        return (opts_.cold_capacity_bytes > 0 && cold_bytes_ > opts_.cold_capacity_bytes) ||
               (opts_.cold_capacity_blocks > 0 && cold_blocks_ > opts_.cold_capacity_blocks);
      };
      auto it = cold_lru_.end();
      while (over() && it != cold_lru_.begin()) {
        --it;
        Entry* e = *it;
        if (e->pinned() || e->state != EntryState::kReady || (exclude && e->key == *exclude)) {
          continue;
        }
        auto next = std::next(it);  // DoomLocked erases `it`
        DoomLocked(e);
        victims.push_back(e->key);
        it = next;
      }
    }
    if (victims.empty()) return;
    TANDEM_SYNC_POINT("KvStoreEngine::EvictCold:AfterSelect");
    TANDEM_SYNC_POINT("KvStoreEngine::EvictCold:BeforeDelete");
    DeleteFromRocks(victims);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Key& k : victims) {
        auto it = index_.find(k);
        if (it != index_.end() && it->second.state == EntryState::kDeleting) {
          EraseLocked(&it->second);
        }
      }
      stats_.evictions_cold += victims.size();
    }
    TANDEM_SYNC_POINT("KvStoreEngine::EvictCold:AfterDelete");
  }

  void ExpireLeasesLocked(int64_t now) {
    while (!lease_expiry_.empty() && lease_expiry_.begin()->first <= now) {
      const uint64_t id = lease_expiry_.begin()->second;
      ReleaseLocked(id);
      ++stats_.leases_expired;
    }
  }

  bool ReleaseLocked(uint64_t id) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return false;
    for (const auto& [key, gen] : it->second.blocks) {
      auto e = index_.find(key);
      if (e != index_.end() && e->second.gen == gen && e->second.lease_pins > 0) {
        --e->second.lease_pins;
      }
    }
    lease_expiry_.erase({it->second.expiry_nanos, id});
    leases_.erase(it);
    return true;
  }

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
                               std::shared_lock<std::shared_mutex>* held = nullptr) {
    if (write_stopped_.load()) {
      TryReopen();
      if (write_stopped_.load()) return WriteError();
    }
    std::shared_lock<std::shared_mutex> db_lock = ReadLock();
    if (db_ == nullptr) return WriteError();  // a reopen failed after our check
    const rocksdb::Status s = db_->Write(wo, batch);
    if (held != nullptr) *held = std::move(db_lock);
    if (!s.ok() && s.IsIOError()) StopWrites(s);
    return s;
  }

  // Stops writes after `error` (the first one is kept and reported). Called
  // by WriteToRocks and by RocksDB's background threads (OnRocksError).
  void StopWrites(const rocksdb::Status& error) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (write_stopped_.load()) return;
    write_error_ = error;
    write_stopped_.store(true);
    TANDEM_LOG(ERROR) << "KV-store: RocksDB failed to write (" << error.ToString()
                      << "); stores are refused until it is reopened, once the disk has room";
  }
  rocksdb::Status WriteError() const {
    std::lock_guard<std::mutex> lock(error_mu_);
    return write_stopped_.load() ? write_error_ : rocksdb::Status::Busy("retry the write");
  }

  // Reopens RocksDB while writes are stopped: by one thread at a time, at
  // most once a second, and once the disk has room for the reopen, which
  // flushes what the WAL holds (twice the write buffer, and no more than
  // min_free_disk_bytes): a store that filled its own disk with garbage that
  // only compactions reclaim gets them back this way, while its stores are
  // still refused below min_free_disk_bytes.
  void TryReopen() {
    std::unique_lock<std::mutex> reopen_lock(reopen_mu_, std::try_to_lock);
    if (!reopen_lock.owns_lock() || !write_stopped_.load()) return;
    const int64_t now = NowSteadyNs();
    if (now - last_reopen_ns_ < 1'000'000'000) return;
    last_reopen_ns_ = now;
    const uint64_t room =
        std::min<uint64_t>(opts_.min_free_disk_bytes, 2 * opts_.write_buffer_bytes);
    if (FreeDiskBytes() < room) return;
    TANDEM_SYNC_POINT("KvStoreEngine::Reopen:Start");
    const rocksdb::Status r = Reopen();  // waits for the writes in flight
    if (!r.ok()) {
      TANDEM_LOG(ERROR) << "KV-store: reopening RocksDB after a write error failed ("
                        << r.ToString() << "); tried again in a second or more";
      return;
    }
    std::lock_guard<std::mutex> lock(error_mu_);
    TANDEM_LOG(WARNING) << "KV-store: RocksDB reopened; stores resume after: "
                        << write_error_.ToString();
    write_stopped_.store(false);
    TANDEM_SYNC_POINT("KvStoreEngine::Reopen:End");
  }

  // Closes and opens the database (writes are stopped; the exclusive lock
  // waits for those in flight, and for stores that wrote but have not yet
  // marked their entry ready or erased it), then makes the index and RocksDB agree
  // again: blocks RocksDB has that the index does not (a delete that failed,
  // a write that landed although it reported an error) are deleted, and
  // blocks the index has that RocksDB lost (durability kNone writes in the
  // memtable that could not be flushed) are forgotten. Reads wait while it
  // runs. A directory found corrupt is repaired, as at startup.
  rocksdb::Status Reopen() {
    ExclusiveDb db_lock(this);
    if (db_ != nullptr) {
      const rocksdb::Status closed = db_->Close();
      if (!closed.ok()) TANDEM_LOG(WARNING) << "KV-store: closing RocksDB: " << closed.ToString();
      db_.reset();
    }
    rocksdb::Status s = OpenDb();
    if (s.ok()) s = ReconcileIndex();
    if (!s.ok() && db_ != nullptr) {  // the new database failed: closed until the next try
      (void)db_->Close();
      db_.reset();
    }
    return s;
  }

  // Reopen's second half, with db_ held exclusively.
  rocksdb::Status ReconcileIndex() {
    std::unordered_set<Key, KeyHasher> in_rocks;
    rocksdb::WriteBatch orphans;
    {
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
      const std::string meta_prefix(1, kMetaPrefix);
      std::lock_guard<std::mutex> lock(mu_);
      for (it->Seek(meta_prefix); it->Valid() && it->key().starts_with(meta_prefix); it->Next()) {
        Key key;
        if (!ParseRocksKey(it->key(), &key)) continue;
        auto e = index_.find(key);
        if (e != index_.end() && e->second.state == EntryState::kReady) {
          in_rocks.insert(key);
        } else {
          // Not indexed, being deleted, or being written: a store holds the
          // database from its write until its entry is ready or erased, so
          // a writing entry's store has not written yet, and what RocksDB
          // has under its key is left from an earlier write that failed.
          orphans.Delete(RocksKey(kMetaPrefix, key));
          orphans.Delete(RocksKey(kBlockPrefix, key));
        }
      }
      if (!it->status().ok()) return it->status();
      std::vector<Entry*> lost;
      for (auto& [key, e] : index_) {
        if (e.state == EntryState::kReady && !in_rocks.contains(key)) lost.push_back(&e);
      }
      for (Entry* e : lost) {  // as DropCorrupt: erased now, or by the last reader
        DoomLocked(e);
        if (e->read_pins == 0) {
          EraseLocked(e);
        } else {
          e->erase_when_unpinned = true;
        }
      }
      if (!lost.empty() || orphans.Count() > 0) {
        TANDEM_LOG(WARNING) << "KV-store: after reopening RocksDB, " << lost.size()
                            << " blocks it no longer has were forgotten and "
                            << orphans.Count() / 2 << " it had that were not indexed are deleted";
      }
    }
    if (orphans.Count() == 0) return rocksdb::Status::OK();
    return db_->Write(WriteOptionsFor(opts_.durability), &orphans);
  }

  // RESOURCE_EXHAUSTED while the data directory has less than
  // min_free_disk_bytes free. A statvfs per store: about a microsecond, next
  // to a block write of 64 KiB and more. Tries the reopen first while
  // writes are stopped (see TryReopen).
  absl::Status CheckDiskRoom() {
    if (write_stopped_.load()) TryReopen();
    if (opts_.min_free_disk_bytes == 0) return absl::OkStatus();
    const uint64_t free = FreeDiskBytes();
    if (free >= opts_.min_free_disk_bytes) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "the KV-store's disk is full: ", free >> 20, " MiB free under ", opts_.data_dir,
        ", below --min-free-disk-bytes (", opts_.min_free_disk_bytes >> 20,
        " MiB); stores are refused until there is room"));
  }
  uint64_t FreeDiskBytes() const {
    struct statvfs st {};
    if (statvfs(opts_.data_dir.c_str(), &st) != 0) return UINT64_MAX;
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }

  static int64_t NowSteadyNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

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
  std::mutex reopen_mu_;          // one TryReopen at a time; guards the one below
  int64_t last_reopen_ns_ = 0;    // when a reopen was last tried
  mutable std::mutex error_mu_;   // guards the one below
  rocksdb::Status write_error_;   // the error that stopped writes
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
  uint64_t next_lease_ = 1;
  uint64_t next_seq_ = 1;
  uint64_t next_gen_ = 1;
  uint64_t cold_bytes_ = 0;
  uint64_t cold_blocks_ = 0;
  KvStoreStats stats_;
};

// ---- KvStoreEngine -------------------------------------------------------

absl::StatusOr<std::unique_ptr<KvStoreEngine>> KvStoreEngine::Open(const KvStoreOptions& options) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(options);
  TANDEM_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<KvStoreEngine>(new KvStoreEngine(std::move(impl)));
}

KvStoreEngine::KvStoreEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvStoreEngine::~KvStoreEngine() = default;

absl::StatusOr<bool> KvStoreEngine::CreateNamespace(const NamespaceSpec& spec) {
  return impl_->CreateNamespace(spec);
}
absl::StatusOr<NamespaceSpec> KvStoreEngine::GetNamespace(std::string_view name) const {
  TANDEM_ASSIGN_OR_RETURN(NsInfo info, impl_->Resolve(name));
  return info.spec;
}
absl::StatusOr<LookupResult> KvStoreEngine::Lookup(std::string_view ns, std::span<const BlockHash> hashes,
                                             const LookupOptions& options) {
  return impl_->Lookup(ns, hashes, options);
}
bool KvStoreEngine::Release(LeaseId lease) { return impl_->Release(lease); }
void KvStoreEngine::ExpireLeases() { impl_->ExpireLeases(); }
absl::StatusOr<StoreResult> KvStoreEngine::Store(std::string_view ns, const BlockHash& hash,
                                           std::span<const uint8_t> payload, uint32_t checksum,
                                           std::optional<Durability> durability) {
  return impl_->Store(ns, hash, payload, checksum, durability);
}
absl::StatusOr<ReadResult> KvStoreEngine::Read(std::string_view ns, const BlockHash& hash, Sink sink,
                                         ReadVerify verify) {
  return impl_->Read(ns, hash, sink, verify);
}
absl::StatusOr<bool> KvStoreEngine::ReportCorrupt(std::string_view ns, const BlockHash& hash) {
  return impl_->ReportCorrupt(ns, hash);
}
absl::StatusOr<ReadResult> KvStoreEngine::ReadInto(std::string_view ns, const BlockHash& hash,
                                             std::span<uint8_t> dst) {
  bool size_ok = true;
  auto copy = [&](std::span<const uint8_t> d, uint32_t) {
    if (d.size() != dst.size()) {
      size_ok = false;
      return;
    }
    std::memcpy(dst.data(), d.data(), d.size());
  };
  TANDEM_ASSIGN_OR_RETURN(ReadResult r, impl_->Read(ns, hash, copy, ReadVerify::kStore));
  if (!size_ok) {
    return absl::InvalidArgumentError(absl::StrCat("ReadInto: destination has ", dst.size(),
                                                   " bytes, block ", hash.ToHex(),
                                                   " has more or fewer"));
  }
  return r;
}
KvStoreStats KvStoreEngine::GetStats() const { return impl_->GetStats(); }
const KvStoreOptions& KvStoreEngine::options() const { return impl_->options(); }
bool KvStoreEngine::TEST_InHot(std::string_view ns, const BlockHash& hash) const {
  return impl_->InTier(ns, hash, /*hot=*/true);
}
bool KvStoreEngine::TEST_InCold(std::string_view ns, const BlockHash& hash) const {
  return impl_->InTier(ns, hash, /*hot=*/false);
}
absl::Status KvStoreEngine::TEST_CorruptHot(std::string_view ns, const BlockHash& hash, uint64_t offset) {
  return impl_->CorruptHot(ns, hash, offset);
}
absl::Status KvStoreEngine::TEST_CheckColdTier() const { return impl_->CheckColdTier(); }
absl::Status KvStoreEngine::TEST_CorruptCold(std::string_view ns, const BlockHash& hash,
                                       uint64_t offset) {
  return impl_->CorruptCold(ns, hash, offset);
}

}  // namespace tandem::kvstore
