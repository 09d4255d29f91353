#include "tandem/kvstore/kv_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kv_rocks.h"
#include "kv_store_impl.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvstore/sync_point.h"
#include "tandem/kvtypes/checksum.h"

namespace tandem::kvstore {

using Impl = KvStoreEngine::Impl;

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
    return absl::InvalidArgumentError(
        absl::StrCat("KvStoreOptions.write_buffer_bytes ", write_buffer_bytes, " is under 1 MiB"));
  }
  if (durability == Durability::kMemory && hot_capacity_bytes == 0) {
    return absl::InvalidArgumentError(
        "KvStoreOptions: durability memory holds blocks in the hot tier only, and "
        "hot_capacity_bytes is 0");
  }
  if (default_lease_ttl_ms <= 0 || max_lease_ttl_ms < default_lease_ttl_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvStoreOptions: need 0 < default_lease_ttl_ms (", default_lease_ttl_ms,
                     ") <= max_lease_ttl_ms (", max_lease_ttl_ms, ")"));
  }
  return absl::OkStatus();
}

// ---- Impl: the operations ------------------------------------------------

absl::StatusOr<bool> Impl::CreateNamespace(const NamespaceSpec& spec) {
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
  TANDEM_RETURN_IF_ERROR(FromRocks(WriteToRocks(wo, &batch), "writing namespace " + spec.name));
  std::lock_guard<std::mutex> lock(mu_);
  namespaces_[spec.name] = NsInfo{spec, id};
  return true;
}

absl::StatusOr<NsInfo> Impl::Resolve(std::string_view ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ResolveLocked(ns);
}

absl::StatusOr<NsInfo> Impl::ResolveLocked(std::string_view ns) const {
  auto it = namespaces_.find(std::string(ns));
  if (it == namespaces_.end()) {
    return absl::NotFoundError(absl::StrCat("namespace '", std::string(ns),
                                            "' is not registered; CreateNamespace it first"));
  }
  return it->second;
}

absl::StatusOr<LookupResult> Impl::Lookup(std::string_view ns, std::span<const BlockHash> hashes,
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
    if (options.count_in_stats) ++stats_.lookups;
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
    if (options.count_in_stats) stats_.lookup_hits += hits.size();
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

Impl::Pinned Impl::PinLocked(Entry* e) {
  ++e->read_pins;
  return Pinned{e, e->hot_slot, e->size, e->checksum};
}

absl::StatusOr<ReadResult> Impl::Read(std::string_view ns, const BlockHash& hash, Sink sink,
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

absl::StatusOr<bool> Impl::ReportCorrupt(std::string_view ns, const BlockHash& hash) {
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

KvStoreStats Impl::GetStats() const {
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

ReadResult Impl::DropCorrupt(Entry* e, MissReason reason, const rocksdb::Status* failed) {
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

absl::StatusOr<ReadResult> Impl::Stage(Entry* e) {
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
absl::StatusOr<LookupResult> KvStoreEngine::Lookup(std::string_view ns,
                                                   std::span<const BlockHash> hashes,
                                                   const LookupOptions& options) {
  return impl_->Lookup(ns, hashes, options);
}
bool KvStoreEngine::Release(LeaseId lease) { return impl_->Release(lease); }
void KvStoreEngine::ExpireLeases() { impl_->ExpireLeases(); }
absl::StatusOr<StoreResult> KvStoreEngine::Store(std::string_view ns, const BlockHash& hash,
                                                 std::span<const uint8_t> payload,
                                                 uint32_t checksum,
                                                 std::optional<Durability> durability) {
  return impl_->Store(ns, hash, payload, checksum, durability);
}
std::vector<absl::StatusOr<StoreResult>> KvStoreEngine::StoreBatch(
    std::string_view ns, std::span<const StoreBlock> blocks, std::optional<Durability> durability) {
  return impl_->StoreBatch(ns, blocks, durability);
}
std::vector<absl::StatusOr<StoreResult>> KvStoreEngine::StoreBatch(
    std::string_view ns, std::span<const StoreBlock> blocks, std::optional<Durability> durability,
    HotSlots* reserved) {
  return impl_->StoreBatch(ns, blocks, durability, reserved ? &reserved->slots_ : nullptr);
}
absl::StatusOr<ReadResult> KvStoreEngine::Read(std::string_view ns, const BlockHash& hash,
                                               Sink sink, ReadVerify verify) {
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
KvStoreEngine::HotTierMemory KvStoreEngine::hot_tier_memory() const {
  return {.bytes = impl_->arena().memory(), .fd = impl_->arena().fd()};
}
const KvStoreOptions& KvStoreEngine::options() const { return impl_->options(); }

}  // namespace tandem::kvstore
