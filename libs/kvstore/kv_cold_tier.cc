#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "kv_repair.h"
#include "kv_rocks.h"
#include "kv_store_impl.h"
#include "tandem/common/logging.h"
#include "tandem/kvstore/sync_point.h"

namespace tandem::kvstore {

using Impl = KvStoreEngine::Impl;

void Impl::DeleteFromRocks(const std::vector<Key>& keys) {
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

bool Impl::IsUnreadable(const rocksdb::Status& s) {
  return !s.ok() && !s.IsNotFound() && !s.IsIncomplete() && !s.IsBusy() && !s.IsTryAgain();
}

rocksdb::Status Impl::GetPayload(const Key& key,
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

std::shared_lock<std::shared_mutex> Impl::ReadLock() const {
  if (reopen_waiting_.load()) {
    std::unique_lock<std::mutex> lock(gate_mu_);
    gate_cv_.wait(lock, [&] { return !reopen_waiting_.load(); });
  }
  return std::shared_lock<std::shared_mutex>(db_mu_);
}

rocksdb::Status Impl::ClosedStatus() {
  return rocksdb::Status::Incomplete(
      "RocksDB is closed: reopening it after a write error failed; retried on the next store");
}

rocksdb::Status Impl::WriteToRocks(const rocksdb::WriteOptions& wo, rocksdb::WriteBatch* batch,
                                   std::shared_lock<std::shared_mutex>* held) {
  if (write_stopped_.load()) {
    TryReopen();
    if (write_stopped_.load()) return WriteError();
  }
  std::shared_lock<std::shared_mutex> db_lock = ReadLock();
  if (db_ == nullptr) return WriteError();  // a reopen failed after our check
  const rocksdb::Status s = db_->Write(wo, batch);
  if (held != nullptr) *held = std::move(db_lock);
  // Incomplete: RocksDB has stopped writes after a background error (its
  // write controller's stop). OnRocksError has reported that error already;
  // this is in case a report is ever missed, for only a reopen ends it.
  if (s.IsIOError() || s.IsIncomplete()) StopWrites(s);
  return s;
}

void Impl::StopWrites(const rocksdb::Status& error) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (write_stopped_.load()) return;
  write_error_ = error;
  write_stopped_.store(true);
  TANDEM_LOG(ERROR) << "KV-store: RocksDB failed to write (" << error.ToString()
                    << "); stores are refused until it is reopened, once the disk has room";
}

rocksdb::Status Impl::WriteError() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return write_stopped_.load() ? write_error_ : rocksdb::Status::Busy("retry the write");
}

void Impl::TryReopen() {
  std::unique_lock<std::mutex> reopen_lock(reopen_mu_, std::try_to_lock);
  if (!reopen_lock.owns_lock() || !write_stopped_.load()) return;
  const int64_t now = NowSteadyNs();
  if (now - last_reopen_ns_ < 1'000'000'000) return;
  last_reopen_ns_ = now;
  const uint64_t room = std::min<uint64_t>(opts_.min_free_disk_bytes, 2 * opts_.write_buffer_bytes);
  if (FreeDiskBytes() < room) return;
  TANDEM_SYNC_POINT("KvStoreEngine::Reopen:Start");
  const rocksdb::Status was = WriteError();
  const rocksdb::Status r = Reopen();  // waits for the writes in flight
  if (!r.ok()) {
    TANDEM_LOG(ERROR) << "KV-store: reopening RocksDB after a write error failed (" << r.ToString()
                      << "); tried again in a second or more";
    return;
  }
  if (write_stopped_.load()) {  // StopWrites has logged the new error
    TANDEM_LOG(WARNING) << "KV-store: RocksDB reopened after: " << was.ToString()
                        << "; a new error stopped stores again";
  } else {
    TANDEM_LOG(WARNING) << "KV-store: RocksDB reopened; stores resume after: " << was.ToString();
  }
  TANDEM_SYNC_POINT("KvStoreEngine::Reopen:End");
}

void Impl::ResumeWrites() {
  std::lock_guard<std::mutex> lock(error_mu_);
  write_error_ = rocksdb::Status::OK();
  write_stopped_.store(false);
}

rocksdb::Status Impl::Reopen() {
  ExclusiveDb db_lock(this);
  if (db_ != nullptr) {
    const rocksdb::Status closed = db_->Close();
    if (!closed.ok()) TANDEM_LOG(WARNING) << "KV-store: closing RocksDB: " << closed.ToString();
    db_.reset();
  }
  // Before the new database opens, not after: its background threads may
  // report an error (a compaction on a disk filling again) while it opens
  // or reconciles, and that stop must not be cleared (it was, once: RocksDB
  // then refused every write while the store's own stop was off, so no
  // reopen came; its flushes and compactions stopped with it, and the disk
  // stayed full). Writes that see the stop lifted wait for db_mu_.
  ResumeWrites();
  rocksdb::Status s = OpenDb();
  if (s.ok()) s = ReconcileIndex();
  TANDEM_SYNC_POINT("KvStoreEngine::Reopen:Opened");
  if (!s.ok()) {  // closed until the next try
    if (db_ != nullptr) {
      (void)db_->Close();
      db_.reset();
    }
    StopWrites(s);
  }
  return s;
}

rocksdb::Status Impl::ReconcileIndex() {
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
      if (e != index_.end() && e->second.state == EntryState::kReady &&
          !e->second.memory_only()) {
        in_rocks.insert(key);
        e->second.durability = Durability::kFsync;  // recovered and flushed by the reopen
      } else {
        // Not indexed, being deleted, or being written: a store holds the
        // database from its write until its entry is ready or erased, so
        // a writing entry's store has not written yet, and what RocksDB
        // has under its key is left from an earlier write that failed. A
        // block held in memory only was never written by its store either.
        orphans.Delete(RocksKey(kMetaPrefix, key));
        orphans.Delete(RocksKey(kBlockPrefix, key));
      }
    }
    if (!it->status().ok()) return it->status();
    std::vector<Entry*> lost;
    for (auto& [key, e] : index_) {
      if (e.state == EntryState::kReady && !e.memory_only() && !in_rocks.contains(key)) {
        lost.push_back(&e);
      }
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
                          << " blocks it no longer has were forgotten and " << orphans.Count() / 2
                          << " it had that were not indexed are deleted";
    }
  }
  if (orphans.Count() == 0) return rocksdb::Status::OK();
  return db_->Write(WriteOptionsFor(opts_.durability), &orphans);
}

absl::Status Impl::CheckDiskRoom() {
  if (write_stopped_.load()) TryReopen();
  if (opts_.min_free_disk_bytes == 0) return absl::OkStatus();
  uint64_t free = FreeDiskBytes();
  if (free >= opts_.min_free_disk_bytes) return absl::OkStatus();
  ReclaimDisk();
  free = FreeDiskBytes();
  if (free >= opts_.min_free_disk_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("the KV-store's disk is full: ", free >> 20, " MiB free under ", opts_.data_dir,
                   ", below --min-free-disk-bytes (", opts_.min_free_disk_bytes >> 20,
                   " MiB); stores are refused until there is room"));
}

void Impl::ReclaimDisk() {
  std::unique_lock<std::mutex> reclaim_lock(reclaim_mu_, std::try_to_lock);
  if (!reclaim_lock.owns_lock() || write_stopped_.load()) return;
  const int64_t start = NowSteadyNs();
  if (start < next_reclaim_ns_) return;
  const uint64_t free_before = FreeDiskBytes();
  rocksdb::Status s;
  {
    std::shared_lock<std::shared_mutex> db_lock = ReadLock();
    if (db_ == nullptr) return;
    rocksdb::CompactRangeOptions cro;
    cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
    cro.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kDisable;
    s = db_->CompactRange(cro, nullptr, nullptr);
  }
  const int64_t took = NowSteadyNs() - start;
  next_reclaim_ns_ = start + std::max<int64_t>(1'000'000'000, 10 * took);
  const uint64_t free_after = FreeDiskBytes();
  if (!s.ok()) {
    TANDEM_LOG(WARNING) << "KV-store: compacting to reclaim disk space failed: " << s.ToString();
  } else if (free_after > free_before) {
    TANDEM_LOG(INFO) << "KV-store: the disk was short; a compaction of " << took / 1'000'000
                     << " ms freed " << ((free_after - free_before) >> 10) << " KiB";
  }
}

uint64_t Impl::FreeDiskBytes() const {
  struct statvfs st {};
  if (statvfs(opts_.data_dir.c_str(), &st) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

int64_t Impl::NowSteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace tandem::kvstore
