#include "tandem/kvstore/kv_store.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>
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

absl::Status Impl::CheckPayloadSize(const NsInfo& info, const StoreBlock& block) {
  if (block.payload.size() == info.spec.block_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "block ", block.hash.ToHex(), ": payload has ", block.payload.size(),
      " bytes; blocks of namespace '", info.spec.name, "' have ", info.spec.block_bytes));
}

absl::Status Impl::CheckPayloadChecksum(const StoreBlock& block) {
  const uint32_t actual = block.payload_crc ? *block.payload_crc : Crc32c(block.payload);
  if (actual == block.checksum) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("block ", block.hash.ToHex(), ": writer's checksum ",
                                          block.checksum, " does not match the payload's CRC32C ",
                                          actual));
}

StoreResult Impl::PresentLocked(Entry* e, uint32_t checksum) {
  TouchLocked(e);
  ++stats_.stores_already_present;
  if (e->checksum == checksum) return StoreResult{.already_present = true};
  ++stats_.stores_mismatched;
  return StoreResult{.already_present = true, .mismatched = true};
}

void Impl::LogMismatch(const NsInfo& info, const StoreBlock& block, uint32_t kept) {
  TANDEM_LOG(WARNING) << "store of block " << block.hash.ToHex() << " in namespace '"
                      << info.spec.name << "' with other bytes (CRC32C " << block.checksum
                      << ", stored " << kept << "): kept the first write";
}

absl::StatusOr<StoreResult> Impl::Store(std::string_view ns, const BlockHash& hash,
                                        std::span<const uint8_t> payload, uint32_t checksum,
                                        std::optional<Durability> durability) {
  const StoreBlock block{.hash = hash, .payload = payload, .checksum = checksum};
  const Durability d = durability.value_or(opts_.durability);
  TANDEM_ASSIGN_OR_RETURN(NsInfo info, Resolve(ns));
  TANDEM_RETURN_IF_ERROR(CheckPayloadSize(info, block));
  if (d != Durability::kMemory) TANDEM_RETURN_IF_ERROR(CheckDiskRoom());
  TANDEM_RETURN_IF_ERROR(CheckPayloadChecksum(block));
  const Key key{info.id, hash};
  Claim claim{.block = 0};
  {
    std::unique_lock<std::mutex> lock(mu_);
    ExpireLeasesLocked(clock_->NowNanos());
    for (;;) {
      auto it = index_.find(key);
      if (it == index_.end()) {
        claim.e = &index_[key];
        claim.e->key = key;
        claim.e->gen = next_gen_++;
        break;
      }
      if (it->second.state == EntryState::kReady) {
        Entry* e = &it->second;
        TANDEM_RETURN_IF_ERROR(CheckNoUpgradeLocked(*e, d, hash));
        const bool rewrite = NeedsRewriteLocked(*e, d, checksum);
        const StoreResult r = PresentLocked(e, checksum);
        const uint32_t kept = e->checksum;
        const Claim present{.block = 0, .e = e, .seq = rewrite ? next_seq_++ : 0};
        if (rewrite) ++e->read_pins;
        lock.unlock();
        if (r.mismatched) LogMismatch(info, block, kept);
        if (rewrite) TANDEM_RETURN_IF_ERROR(MakeDurable({&present, 1}, {&block, 1}, d)[0]);
        return r;
      }
      // Another writer (or an eviction) owns the key: wait for it.
      cv_.wait(lock);
    }
    claim.seq = next_seq_++;
  }
  std::vector<absl::Status> written = WriteClaimed({&claim, 1}, {&block, 1}, d);
  TANDEM_RETURN_IF_ERROR(written[0]);
  return StoreResult{};
}

std::vector<absl::StatusOr<StoreResult>> Impl::StoreBatch(std::string_view ns,
                                                          std::span<const StoreBlock> blocks,
                                                          std::optional<Durability> durability,
                                                          std::vector<int64_t>* reserved) {
  const size_t n = blocks.size();
  std::vector<absl::StatusOr<StoreResult>> results(n, StoreResult{});
  absl::StatusOr<NsInfo> info = Resolve(ns);
  if (!info.ok()) {
    for (auto& r : results) r = info.status();
    return results;
  }
  // Each block's checks in Store's order; one disk-room check for the batch.
  const Durability d = durability.value_or(opts_.durability);
  std::optional<absl::Status> room;
  if (d == Durability::kMemory) room = absl::OkStatus();  // nothing reaches the disk
  std::vector<size_t> valid;
  valid.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    absl::Status s = CheckPayloadSize(*info, blocks[i]);
    if (s.ok()) {
      if (!room) room = CheckDiskRoom();
      s = *room;
    }
    if (s.ok()) s = CheckPayloadChecksum(blocks[i]);
    if (s.ok()) {
      valid.push_back(i);
    } else {
      results[i] = std::move(s);
    }
  }
  std::vector<Claim> claims;
  std::vector<Claim> rewrites;  // present with a weaker durability, read-pinned
  std::unordered_set<const Entry*> rewriting;  // ... once each
  std::vector<size_t> deferred;
  std::vector<std::pair<size_t, uint32_t>> mismatched;  // block, checksum kept
  {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLeasesLocked(clock_->NowNanos());
    for (size_t i : valid) {
      const Key key{info->id, blocks[i].hash};
      auto it = index_.find(key);
      if (it == index_.end()) {
        Entry* e = &index_[key];
        e->key = key;
        e->gen = next_gen_++;
        claims.push_back(Claim{.block = i, .e = e, .seq = next_seq_++});
        continue;
      }
      if (it->second.state == EntryState::kReady) {
        if (absl::Status s = CheckNoUpgradeLocked(it->second, d, blocks[i].hash); !s.ok()) {
          results[i] = std::move(s);
          continue;
        }
        if (NeedsRewriteLocked(it->second, d, blocks[i].checksum) &&
            rewriting.insert(&it->second).second) {
          ++it->second.read_pins;
          rewrites.push_back(Claim{.block = i, .e = &it->second, .seq = next_seq_++});
        }
        results[i] = PresentLocked(&it->second, blocks[i].checksum);
        if (results[i]->mismatched) mismatched.emplace_back(i, it->second.checksum);
        continue;
      }
      // Another writer (this batch too, for a hash it has twice) or an
      // eviction owns the key. Waiting for it while holding this batch's
      // claims could deadlock with another batch: the block is stored alone
      // after this batch's write, as Store() would, waiting with nothing held.
      deferred.push_back(i);
    }
  }
  for (const auto& [i, kept] : mismatched) LogMismatch(*info, blocks[i], kept);
  if (!claims.empty()) {
    std::vector<absl::Status> written = WriteClaimed(claims, blocks, d, reserved);
    for (size_t k = 0; k < claims.size(); ++k) {
      if (!written[k].ok()) results[claims[k].block] = std::move(written[k]);
    }
  }
  if (!rewrites.empty()) {
    std::vector<absl::Status> written = MakeDurable(rewrites, blocks, d);
    for (size_t k = 0; k < rewrites.size(); ++k) {
      if (!written[k].ok()) results[rewrites[k].block] = std::move(written[k]);
    }
  }
  for (size_t i : deferred) {
    results[i] = Store(ns, blocks[i].hash, blocks[i].payload, blocks[i].checksum, durability);
  }
  return results;
}

rocksdb::WriteBatch Impl::BlocksBatch(std::span<const Claim> claims,
                                      std::span<const StoreBlock> blocks) {
  rocksdb::WriteBatch batch;
  for (const Claim& c : claims) {
    const StoreBlock& b = blocks[c.block];
    batch.Put(RocksKey(kMetaPrefix, c.e->key),
              EncodeMeta(Meta{.checksum = b.checksum, .size = b.payload.size(), .seq = c.seq}));
    batch.Put(RocksKey(kBlockPrefix, c.e->key),
              rocksdb::Slice(reinterpret_cast<const char*>(b.payload.data()), b.payload.size()));
  }
  return batch;
}

std::vector<absl::Status> Impl::WriteClaimed(std::span<const Claim> claims,
                                             std::span<const StoreBlock> blocks, Durability d,
                                             std::vector<int64_t>* reserved) {
  TANDEM_SYNC_POINT("KvStoreEngine::Store:BeforeWrite");
  // Durability memory: the hot tier only, so no RocksDB write, and a block
  // that gets no slot is refused instead of kept cold.
  const bool memory = d == Durability::kMemory;
  std::vector<absl::Status> statuses(claims.size());
  // The database stays open (no reopen) until the entries are ready or gone:
  // a reopen in between could lose a write without the WAL and still see
  // the entries writing (see ReconcileIndex).
  std::shared_lock<std::shared_mutex> db_held;
  if (!memory) {
    rocksdb::WriteBatch batch = BlocksBatch(claims, blocks);
    rocksdb::Status s = WriteToRocks(WriteOptionsFor(d), &batch, &db_held);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t k = 0; k < claims.size(); ++k) {
        statuses[k] =
            FromRocks(s, absl::StrCat("writing block ", blocks[claims[k].block].hash.ToHex()));
        EraseLocked(claims[k].e);
      }
      return statuses;
    }
    TANDEM_SYNC_POINT("KvStoreEngine::Store:AfterWrite");
  }
  std::vector<int64_t> slots(claims.size(), -1);
  std::vector<bool> in_place(claims.size(), false);  // received into its reserved slot
  if (memory || opts_.store_to_hot) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t k = 0; k < claims.size(); ++k) {
      const StoreBlock& b = blocks[claims[k].block];
      const int32_t r = b.reserved_slot;
      if (reserved != nullptr && r >= 0 && static_cast<size_t>(r) < reserved->size() &&
          (*reserved)[r] >= 0) {
        slots[k] = std::exchange((*reserved)[r], -1);
        in_place[k] = true;
      } else if (b.payload.size() <= arena_->slot_bytes()) {
        slots[k] = AcquireHotSlotLocked();
      }
      if (memory && slots[k] < 0) {
        statuses[k] = NoHotSlotLocked(b);
        EraseLocked(claims[k].e);
      }
    }
  }
  for (size_t k = 0; k < claims.size(); ++k) {
    const std::span<const uint8_t> payload = blocks[claims[k].block].payload;
    if (slots[k] >= 0 && !in_place[k]) {
      std::memcpy(arena_->slot(slots[k]), payload.data(), payload.size());
    }
  }
  Key last;  // the last block stored, spared by the eviction below as Store spares its own
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t k = 0; k < claims.size(); ++k) {
      if (statuses[k].ok())
        MarkStoredLocked(claims[k].e, blocks[claims[k].block], slots[k], d);
    }
    if (!memory) last = claims.back().e->key;  // a refused claim's entry is gone
    cv_.notify_all();
  }
  if (!memory) {
    db_held.unlock();
    EvictColdIfNeeded(&last);
  }
  return statuses;
}

std::vector<int64_t> Impl::ReserveHotSlots(std::string_view ns, std::span<const BlockHash> hashes,
                                           std::span<const uint64_t> sizes,
                                           std::optional<Durability> durability) {
  std::vector<int64_t> slots(sizes.size(), -1);
  if (durability.value_or(opts_.durability) != Durability::kMemory && !opts_.store_to_hot) {
    return slots;  // a store would not place them in the hot tier
  }
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<NsInfo> info = ResolveLocked(ns);
  if (!info.ok()) return slots;
  // The batch's blocks the store has are pinned while the slots are taken:
  // evicting one (a block held in memory only would be gone) would change
  // what the batch finds.
  std::vector<Entry*> present;
  std::vector<bool> absent(sizes.size(), false);
  for (size_t k = 0; k < sizes.size() && k < hashes.size(); ++k) {
    auto it = index_.find(Key{info->id, hashes[k]});
    if (it == index_.end()) {
      absent[k] = true;
    } else {
      ++it->second.read_pins;
      present.push_back(&it->second);
    }
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (!absent[k] || sizes[k] == 0 || sizes[k] > arena_->slot_bytes()) continue;
    slots[k] = AcquireHotSlotLocked();
    if (slots[k] < 0) break;  // every slot pinned or taken
  }
  for (Entry* e : present) --e->read_pins;  // none was doomed meanwhile: mu_ is held
  return slots;
}

std::span<uint8_t> Impl::SlotBytes(int64_t slot, uint64_t size) const {
  if (slot < 0) return {};
  return {arena_->slot(slot), static_cast<size_t>(size)};
}

void Impl::ReleaseHotSlots(std::span<const int64_t> slots) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t s : slots) {
    if (s >= 0) free_slots_.push_back(s);
  }
  cv_.notify_all();
}

absl::Status Impl::NoHotSlotLocked(const StoreBlock& b) const {
  if (arena_->num_slots() == 0) {
    return absl::FailedPreconditionError(
        "durability memory holds blocks in the hot tier only, and this KV-store has none "
        "(--hot-capacity-bytes 0)");
  }
  if (b.payload.size() > arena_->slot_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block ", b.hash.ToHex(), " of ", b.payload.size(), " bytes does not fit a hot slot (",
        arena_->slot_bytes(), " bytes), and durability memory holds blocks only there"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "no hot slot for block ", b.hash.ToHex(), ": all ", arena_->num_slots(),
      " are pinned by reads or leases or taken by this batch, and durability memory holds "
      "blocks only there"));
}

void Impl::MarkStoredLocked(Entry* e, const StoreBlock& b, int64_t slot, Durability d) {
  e->state = EntryState::kReady;
  e->size = b.payload.size();
  e->checksum = b.checksum;
  e->hot_slot = slot;
  e->durability = d;
  InsertLruLocked(e);
  ++stats_.stores;
}

absl::Status Impl::CheckNoUpgradeLocked(const Entry& e, Durability d, const BlockHash& hash) {
  if (!e.memory_only() || d == Durability::kMemory) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("block ", hash.ToHex(),
                   " is held in memory only (stored with durability "
                   "memory); a store with durability ",
                   DurabilityName(d), " cannot make it durable"));
}

bool Impl::NeedsRewriteLocked(const Entry& e, Durability d, uint32_t checksum) {
  // The order of the RocksDB writes' guarantees; kMemory asks for none of them.
  auto rank = [](Durability x) {
    return x == Durability::kFsync ? 2 : x == Durability::kWal ? 1 : 0;
  };
  return !e.memory_only() && d != Durability::kMemory && rank(e.durability) < rank(d) &&
         e.checksum == checksum;
}

std::vector<absl::Status> Impl::MakeDurable(std::span<const Claim> present,
                                            std::span<const StoreBlock> blocks, Durability d) {
  rocksdb::WriteBatch batch = BlocksBatch(present, blocks);
  // Held until the entries are updated, as WriteClaimed holds it (a reopen
  // in between would reconcile the index against this write).
  std::shared_lock<std::shared_mutex> db_held;
  const rocksdb::Status s = WriteToRocks(WriteOptionsFor(d), &batch, &db_held);
  std::vector<absl::Status> statuses(present.size());
  std::vector<Key> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t k = 0; k < present.size(); ++k) {
      Entry* e = present[k].e;
      if (!s.ok()) {
        statuses[k] = FromRocks(s, absl::StrCat("writing block ", blocks[present[k].block].hash.ToHex(),
                                                " again with durability ", DurabilityName(d),
                                                " (it was stored with ", DurabilityName(e->durability),
                                                ")"));
      } else if (e->state == EntryState::kReady) {
        e->durability = d;
        ++stats_.stores_made_durable;
      } else {
        // Dropped as corrupt while this write ran: its deletion may have
        // come first. Still pinned, so no new writer has the key yet.
        dropped.push_back(e->key);
      }
    }
  }
  db_held.unlock();  // (DeleteFromRocks takes it again)
  if (!dropped.empty()) DeleteFromRocks(dropped);
  for (const Claim& c : present) Unpin(c.e);
  return statuses;
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
HotSlots KvStoreEngine::ReserveHotSlots(std::string_view ns, std::span<const BlockHash> hashes,
                                        std::span<const uint64_t> sizes,
                                        std::optional<Durability> durability) {
  HotSlots h;
  h.impl_ = impl_.get();
  h.slots_ = impl_->ReserveHotSlots(ns, hashes, sizes, durability);
  h.bytes_.reserve(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) h.bytes_.push_back(impl_->SlotBytes(h.slots_[k], sizes[k]));
  return h;
}

// ---- HotSlots ---------------------------------------------------------------

HotSlots::HotSlots(HotSlots&& other) noexcept
    : impl_(std::exchange(other.impl_, nullptr)),
      slots_(std::move(other.slots_)),
      bytes_(std::move(other.bytes_)) {}

HotSlots& HotSlots::operator=(HotSlots&& other) noexcept {
  if (this != &other) {
    Release();
    impl_ = std::exchange(other.impl_, nullptr);
    slots_ = std::move(other.slots_);
    bytes_ = std::move(other.bytes_);
  }
  return *this;
}

HotSlots::~HotSlots() { Release(); }

size_t HotSlots::num_reserved() const {
  return static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(), [](int64_t s) { return s >= 0; }));
}

void HotSlots::Release() {
  if (impl_ != nullptr) impl_->ReleaseHotSlots(slots_);
  impl_ = nullptr;
  slots_.clear();
  bytes_.clear();
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
