// The KV-store engine's store path (kv_store.h): Store and StoreBatch, the
// rewrite of a present block a store asks more durability of, and the hot
// slots a batch's bytes are received into. kv_store.cc has the rest of the
// operations.
#include <algorithm>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kv_rocks.h"
#include "kv_store_impl.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/kvstore/sync_point.h"
#include "tandem/kvtypes/checksum.h"

namespace tandem::kvstore {

using Impl = KvStoreEngine::Impl;

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

// ---- KvStoreEngine: reserved hot slots ------------------------------------

HotSlots KvStoreEngine::ReserveHotSlots(std::string_view ns, std::span<const BlockHash> hashes,
                                        std::span<const uint64_t> sizes,
                                        std::optional<Durability> durability) {
  HotSlots h;
  h.impl_ = impl_.get();
  h.slots_ = impl_->ReserveHotSlots(ns, hashes, sizes, durability);
  h.bytes_.reserve(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    h.bytes_.push_back(impl_->SlotBytes(h.slots_[k], sizes[k]));
  }
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
  return static_cast<size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](int64_t s) { return s >= 0; }));
}

void HotSlots::Release() {
  if (impl_ != nullptr) impl_->ReleaseHotSlots(slots_);
  impl_ = nullptr;
  slots_.clear();
  bytes_.clear();
}

}  // namespace tandem::kvstore
