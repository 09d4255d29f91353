#include <algorithm>
#include <cstring>
#include <iterator>

#include "kv_store_impl.h"
#include "tandem/kvstore/sync_point.h"

namespace tandem::kvstore {

using Impl = KvStoreEngine::Impl;

bool Impl::Release(LeaseId lease) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked(clock_->NowNanos());
  return ReleaseLocked(lease.value());
}

void Impl::ExpireLeases() {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked(clock_->NowNanos());
}

void Impl::InsertLruLocked(Entry* e) {
  if (!e->memory_only()) {
    e->cold_it = cold_lru_.insert(cold_lru_.begin(), e);
    e->in_cold_lru = true;
    cold_bytes_ += e->size;
    ++cold_blocks_;
  }
  if (e->hot_slot >= 0) {
    e->hot_it = hot_lru_.insert(hot_lru_.begin(), e);
    e->in_hot_lru = true;
  }
}

void Impl::TouchLocked(Entry* e) {
  if (e->in_cold_lru) cold_lru_.splice(cold_lru_.begin(), cold_lru_, e->cold_it);
  if (e->in_hot_lru) hot_lru_.splice(hot_lru_.begin(), hot_lru_, e->hot_it);
}

int64_t Impl::AcquireHotSlotLocked() {
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
    // Its slot was its only copy. Not a claimed entry of the caller's
    // (those are kWriting, outside the LRU), so erasing it here is safe.
    if (e->memory_only()) EraseLocked(e);
    return slot;
  }
  return -1;
}

void Impl::DoomLocked(Entry* e) {
  if (e->state != EntryState::kReady) return;
  e->state = EntryState::kDeleting;
  if (!e->memory_only()) {
    cold_bytes_ -= e->size;
    --cold_blocks_;
  }
  if (e->in_cold_lru) cold_lru_.erase(e->cold_it);
  e->in_cold_lru = false;
  if (e->in_hot_lru) hot_lru_.erase(e->hot_it);
  e->in_hot_lru = false;
}

void Impl::EraseLocked(Entry* e) {
  if (e->in_cold_lru) cold_lru_.erase(e->cold_it);
  if (e->in_hot_lru) hot_lru_.erase(e->hot_it);
  if (e->hot_slot >= 0) free_slots_.push_back(e->hot_slot);
  index_.erase(e->key);
  cv_.notify_all();
}

void Impl::Unpin(Entry* e) {
  std::lock_guard<std::mutex> lock(mu_);
  --e->read_pins;
  if (e->erase_when_unpinned && e->read_pins == 0) EraseLocked(e);
}

bool Impl::Promote(Entry* e, std::span<const uint8_t> data) {
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

void Impl::EvictColdIfNeeded(const Key* exclude) {
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

void Impl::ExpireLeasesLocked(int64_t now) {
  while (!lease_expiry_.empty() && lease_expiry_.begin()->first <= now) {
    const uint64_t id = lease_expiry_.begin()->second;
    ReleaseLocked(id);
    ++stats_.leases_expired;
  }
}

bool Impl::ReleaseLocked(uint64_t id) {
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

}  // namespace tandem::kvstore
