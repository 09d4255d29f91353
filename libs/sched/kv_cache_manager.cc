#include "tandem/sched/kv_cache_manager.h"

#include <algorithm>

#include "tandem/common/logging.h"

namespace tandem::sched {
KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_caching)
    : block_size_(block_size), enable_caching_(enable_caching), pool_(num_blocks, enable_caching) {}

PrefixHit KvCacheManager::FindPrefixHit(const Request& request) const {
  PrefixHit hit;
  if (!enable_caching_) return hit;
  const size_t max_blocks = std::min<size_t>(
      static_cast<size_t>((request.num_tokens() - 1) / block_size_), request.block_hashes.size());
  for (size_t i = 0; i < max_blocks; ++i) {
    std::optional<int32_t> b = pool_.Lookup(request.block_hashes[i]);
    if (!b) break;
    hit.block_ids.push_back(*b);
  }
  hit.num_tokens = static_cast<int32_t>(hit.block_ids.size()) * block_size_;
  return hit;
}

int32_t KvCacheManager::NumBlocksToCover(const Request& request, int32_t num_tokens) const {
  return std::max(
      0, CeilDiv(num_tokens, block_size_) - static_cast<int32_t>(request.block_ids.size()));
}

namespace {
int32_t TotalTokens(const Request& request, const SlotRequest& slots) {
  return request.num_computed_tokens + (slots.hit ? slots.hit->num_tokens : 0) +
         slots.num_external_tokens + slots.num_new_tokens + slots.num_lookahead_tokens;
}
}  // namespace

int32_t KvCacheManager::NumFreeBlocksNeeded(const Request& request,
                                            const SlotRequest& slots) const {
  int32_t num_hit_blocks = 0;
  int32_t num_evictable = 0;
  if (slots.hit) {
    num_hit_blocks = static_cast<int32_t>(slots.hit->block_ids.size());
    for (int32_t b : slots.hit->block_ids) num_evictable += pool_.ref_count(b) == 0 ? 1 : 0;
  }
  const int32_t num_new_blocks =
      NumBlocksToCover(request, TotalTokens(request, slots)) - num_hit_blocks;
  return std::max(0, num_new_blocks) + num_evictable;
}

int32_t KvCacheManager::AllocateSlots(Request* request, const SlotRequest& slots) {
  TANDEM_DCHECK(CanAllocateSlots(*request, slots));
  const int32_t total = TotalTokens(*request, slots);
  if (slots.hit) {
    TANDEM_CHECK(request->block_ids.empty()) << "prefix hit for a request holding blocks";
    for (int32_t b : slots.hit->block_ids) {
      pool_.Touch(b);
      request->block_ids.push_back(b);
    }
    request->num_cached_blocks = static_cast<int32_t>(slots.hit->block_ids.size());
  }
  const int32_t first_new = static_cast<int32_t>(request->block_ids.size());
  pool_.Allocate(NumBlocksToCover(*request, total), &request->block_ids);
  return first_new;
}

void KvCacheManager::CacheBlocks(Request* request, int32_t num_tokens,
                                 std::vector<int32_t>* published) {
  if (!enable_caching_) return;
  num_tokens = std::min(num_tokens, request->num_tokens());
  const int32_t num_full =
      std::min(num_tokens / block_size_, static_cast<int32_t>(request->block_ids.size()));
  if (num_full <= request->num_cached_blocks) return;
  if (static_cast<int32_t>(request->block_hashes.size()) < num_full) {
    ExtendBlockHashes(request->root_hash, request->all_token_ids, block_size_,
                      &request->block_hashes);
  }
  for (int32_t i = request->num_cached_blocks; i < num_full; ++i) {
    const int32_t b = request->block_ids[i];
    if (!pool_.is_cached(b) && pool_.CacheBlock(b, request->block_hashes[i]) &&
        published != nullptr) {
      published->push_back(b);
    }
  }
  request->num_cached_blocks = num_full;
}

void KvCacheManager::FreeBlocks(Request* request) {
  pool_.FreeReversed(request->block_ids);
  request->block_ids.clear();
  request->num_cached_blocks = 0;
  request->num_blocks_sent = 0;
}

}  // namespace tandem::sched
