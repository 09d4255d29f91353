// Per-request block tables on top of the BlockPool: prefix lookup, slot
// allocation (Can/Do), caching of full blocks with known ids, freeing.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/sched/block_pool.h"
#include "tandem/sched/request.h"

namespace tandem::sched {

// ceil(a / b) for a >= 0, b > 0: the blocks that a tokens take.
inline constexpr int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

// A prefix-cache hit: leading blocks of a request found in the cache.
struct PrefixHit {
  std::vector<int32_t> block_ids;
  int32_t num_tokens = 0;  // block_ids.size() * block_size
};

// What one allocation asks for. The request's table grows to cover
// num_computed_tokens + num_new_computed_tokens + num_external_tokens +
// num_new_tokens + num_lookahead_tokens.
struct SlotRequest {
  int32_t num_new_tokens = 0;
  // Leading tokens hit in the prefix cache (the blocks of `hit`).
  const PrefixHit* hit = nullptr;
  // Tokens to be loaded by the connector, after the hit.
  int32_t num_external_tokens = 0;
  // Extra slots beyond the new tokens, for tokens a worker writes ahead of
  // the scheduler (speculative decoding). They are never cached. The
  // Scheduler asks for none: Tandem has no speculative decoding yet.
  int32_t num_lookahead_tokens = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_caching);

  // Longest run of the request's leading full-block hashes that are cached,
  // at most num_tokens - 1 tokens (the last token is always computed).
  [[nodiscard]] PrefixHit FindPrefixHit(const Request& request) const;

  // Blocks that `slots` would take out of the free queue: new blocks plus
  // the hit's cached blocks that sit there unreferenced.
  [[nodiscard]] int32_t NumFreeBlocksNeeded(const Request& request, const SlotRequest& slots) const;
  // Can: whether the pool can give what `slots` needs now.
  [[nodiscard]] bool CanAllocateSlots(const Request& request, const SlotRequest& slots) const {
    return NumFreeBlocksNeeded(request, slots) <= pool_.num_free_blocks();
  }
  // Do: takes the hit's blocks and new blocks; requires CanAllocateSlots.
  // Returns the index in request->block_ids of the first new block.
  int32_t AllocateSlots(Request* request, const SlotRequest& slots);
  // New blocks the request's table needs to cover `num_tokens` tokens.
  [[nodiscard]] int32_t NumBlocksToCover(const Request& request, int32_t num_tokens) const;

  // Publishes the request's full blocks among its first `num_tokens` tokens
  // (whose ids must be known) in the prefix cache. Appends the blocks this
  // call published to `published` when given.
  void CacheBlocks(Request* request, int32_t num_tokens, std::vector<int32_t>* published = nullptr);
  // Releases the whole table, tail first; hashed blocks stay cached.
  void FreeBlocks(Request* request);

  [[nodiscard]] int32_t block_size() const { return block_size_; }
  [[nodiscard]] bool caching_enabled() const { return enable_caching_; }
  [[nodiscard]] BlockPool& pool() { return pool_; }
  [[nodiscard]] const BlockPool& pool() const { return pool_; }

 private:
  int32_t block_size_;
  bool enable_caching_;
  BlockPool pool_;
};

}  // namespace tandem::sched
