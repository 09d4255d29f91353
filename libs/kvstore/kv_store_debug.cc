#include <chrono>
#include <thread>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kv_rocks.h"
#include "kv_store_impl.h"
#include "tandem/common/status.h"
#include "tandem/kvtypes/checksum.h"

namespace tandem::kvstore {

using Impl = KvStoreEngine::Impl;

bool Impl::InTier(std::string_view ns, const BlockHash& hash, bool hot) const {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<NsInfo> info = ResolveLocked(ns);
  if (!info.ok()) return false;
  auto it = index_.find(Key{info->id, hash});
  if (it == index_.end() || it->second.state != EntryState::kReady) return false;
  return hot ? it->second.hot_slot >= 0 : !it->second.memory_only();
}

absl::Status Impl::CorruptHot(std::string_view ns, const BlockHash& hash, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_ASSIGN_OR_RETURN(NsInfo info, ResolveLocked(ns));
  auto it = index_.find(Key{info.id, hash});
  if (it == index_.end() || it->second.hot_slot < 0 || offset >= it->second.size) {
    return absl::FailedPreconditionError("block is not in the hot tier or offset out of range");
  }
  arena_->slot(it->second.hot_slot)[offset] ^= 0x5A;
  return absl::OkStatus();
}

absl::Status Impl::CheckColdTier() const {
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
    for (const auto& [key, e] : index_) {
      ready += e.state == EntryState::kReady && !e.memory_only() ? 1 : 0;  // the cold tier's
    }
    if (ready != with_meta.size()) {
      problems.push_back(
          absl::StrCat("index has ", ready, " blocks on disk, RocksDB ", with_meta.size()));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrJoin(problems, "; "));
}

absl::Status Impl::CorruptCold(std::string_view ns, const BlockHash& hash, uint64_t offset) {
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

absl::Status Impl::WaitForBackgroundWork(int64_t timeout_ms) {
  std::shared_lock<std::shared_mutex> db_lock = ReadLock();
  if (db_ == nullptr) return FromRocks(ClosedStatus(), "waiting for RocksDB's background work");
  rocksdb::FlushOptions flush;
  flush.wait = true;
  TANDEM_RETURN_IF_ERROR(FromRocks(db_->Flush(flush), "flushing the memtable"));
  const int64_t deadline = NowSteadyNs() + timeout_ms * 1'000'000;
  for (;;) {
    uint64_t flushes = 0, compactions = 0, pending = 0;
    db_->GetIntProperty("rocksdb.num-running-flushes", &flushes);
    db_->GetIntProperty("rocksdb.num-running-compactions", &compactions);
    db_->GetIntProperty("rocksdb.compaction-pending", &pending);
    if (flushes == 0 && compactions == 0 && pending == 0) return absl::OkStatus();
    if (NowSteadyNs() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("RocksDB still runs ", flushes, " flushes and ", compactions,
                       " compactions (", pending, " pending) after ", timeout_ms, " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

absl::Status KvStoreEngine::WaitForBackgroundWork(int64_t timeout_ms) {
  return impl_->WaitForBackgroundWork(timeout_ms);
}

// ---- KvStoreEngine's TEST_ hooks --------------------------------------

bool KvStoreEngine::TEST_InHot(std::string_view ns, const BlockHash& hash) const {
  return impl_->InTier(ns, hash, /*hot=*/true);
}
bool KvStoreEngine::TEST_InCold(std::string_view ns, const BlockHash& hash) const {
  return impl_->InTier(ns, hash, /*hot=*/false);
}
absl::Status KvStoreEngine::TEST_CorruptHot(std::string_view ns, const BlockHash& hash,
                                            uint64_t offset) {
  return impl_->CorruptHot(ns, hash, offset);
}
absl::Status KvStoreEngine::TEST_CheckColdTier() const { return impl_->CheckColdTier(); }
void KvStoreEngine::TEST_ReportBackgroundError(std::string_view message) {
  impl_->ReportBackgroundError(message);
}
absl::Status KvStoreEngine::TEST_CorruptCold(std::string_view ns, const BlockHash& hash,
                                             uint64_t offset) {
  return impl_->CorruptCold(ns, hash, offset);
}

}  // namespace tandem::kvstore
