#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "kv_repair.h"
#include "kv_rocks.h"
#include "kv_store_impl.h"
#include "rocksdb_crc32c.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"

namespace tandem::kvstore {

using Impl = KvStoreEngine::Impl;

Impl::~Impl() {
  if (db_ == nullptr) return;
  if (write_stopped_.load()) return;  // db_'s destructor closes it; a flush would fail
  rocksdb::FlushOptions fo;
  rocksdb::Status s = db_->Flush(fo);
  if (!s.ok()) TANDEM_LOG(ERROR) << "KV-store: flush on close failed: " << s.ToString();
  s = db_->Close();
  if (!s.ok()) TANDEM_LOG(ERROR) << "KV-store: close failed: " << s.ToString();
}

rocksdb::Options Impl::RocksOptions() {
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

rocksdb::Status Impl::OpenDb() {
  rocksdb::DB* db = nullptr;
  const std::string damage = NeedsRepairBeforeOpen(opts_.data_dir);
  rocksdb::Status opened = damage.empty() ? rocksdb::DB::Open(rocks_options_, opts_.data_dir, &db)
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

absl::Status Impl::Init() {
  std::error_code ec;
  std::filesystem::create_directories(opts_.data_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("creating KV-store data dir ", opts_.data_dir, ": ", ec.message()));
  }
  TANDEM_RETURN_IF_ERROR(FinishInterruptedSalvage(opts_.data_dir));
  rocks_options_ = RocksOptions();
  // Also what keeps rocksdb_crc32c.cc linked in (see there).
  TANDEM_LOG(INFO) << "KV-store: RocksDB's checksums: " << rocksdb::crc32c::IsFastCrc32Supported();
  TANDEM_RETURN_IF_ERROR(FromRocks(OpenDb(), "opening " + opts_.data_dir));

  HostArenaOptions ao{.slot_bytes = opts_.hot_slot_bytes,
                      .num_slots = opts_.hot_capacity_bytes > 0
                                       ? opts_.hot_capacity_bytes / opts_.hot_slot_bytes
                                       : 0,
                      .use_cuda_host_alloc = opts_.use_cuda_host_alloc,
                      .lock_memory = opts_.lock_hot_memory,
                      .shareable = opts_.share_hot_tier};
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

absl::Status Impl::SalvageAndReopen() {
  absl::StatusOr<SalvageCounts> counts = SalvageInto(db_.get(), opts_.data_dir, rocks_options_);
  const rocksdb::Status closed = db_->Close();
  db_.reset();
  if (!counts.ok()) {
    return absl::Status(counts.status().code(), absl::StrCat("salvaging ", opts_.data_dir, ": ",
                                                             counts.status().message()));
  }
  if (!closed.ok()) TANDEM_LOG(WARNING) << "KV-store: closing RocksDB: " << closed.ToString();
  TANDEM_RETURN_IF_ERROR(InstallSalvage(opts_.data_dir));
  TANDEM_RETURN_IF_ERROR(FromRocks(OpenDb(), "opening the salvaged " + opts_.data_dir));
  stats_.blocks_dropped_at_open = counts->blocks_dropped + counts->records_dropped;
  TANDEM_LOG(WARNING) << "KV-store: salvaged " << opts_.data_dir << ": kept " << counts->namespaces
                      << " namespaces and " << counts->blocks_kept << " blocks; dropped "
                      << counts->blocks_dropped << " blocks and " << counts->records_dropped
                      << " unreadable records; stepped over " << counts->ranges_skipped
                      << " damaged key ranges";
  return absl::OkStatus();
}

absl::Status Impl::ScanStatus(const rocksdb::Status& s, absl::string_view what) const {
  const std::string context = absl::StrCat("scanning the ", what, " in ", opts_.data_dir);
  if (IsDamage(s)) return absl::DataLossError(absl::StrCat(context, ": ", s.ToString()));
  return FromRocks(s, context);
}

absl::Status Impl::Rebuild() {
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

}  // namespace tandem::kvstore
