// The scheduler's picture of the worker's KV blocks: reference counts, the
// free queue and the prefix cache (DESIGN §3 "Prefix caching").
//
// Block 0 is the null block: never handed out, never freed.
// Free queue (allocation pops the head):
//   - a freed block without a hash goes to the head (reused first);
//   - a freed hashed block goes to the tail and keeps its hash until it is
//     popped for reuse, which evicts the hash (LRU).
// Callers free a request's blocks tail first, so the end of a chain is
// evicted before its start.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "tandem/common/block_hash.h"

namespace tandem::sched {

class BlockPool {
 public:
  static constexpr int32_t kNullBlock = 0;

  // `num_blocks` includes the null block; >= 2.
  BlockPool(int32_t num_blocks, bool enable_caching);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  [[nodiscard]] int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Blocks that can be handed out: all but the null block.
  [[nodiscard]] int32_t num_usable_blocks() const { return num_blocks() - 1; }
  [[nodiscard]] int32_t num_free_blocks() const { return num_free_; }
  // Fraction of usable blocks referenced by requests, 0-1.
  [[nodiscard]] double usage() const;

  // Pops `n` blocks from the head of the free queue (evicting their hashes),
  // each with reference count 1, appended to `out`. Requires n <= free.
  void Allocate(int32_t n, std::vector<int32_t>* out);
  // Takes one more reference (a prefix-cache hit); leaves the free queue when
  // it was free.
  void Touch(int32_t block);
  // Drops one reference of each block, in the given order (pass a request's
  // table reversed: tail first).
  void Free(std::span<const int32_t> blocks);
  void FreeReversed(std::span<const int32_t> blocks);

  // The block holding `hash`, if cached.
  [[nodiscard]] std::optional<int32_t> Lookup(const BlockHash& hash) const;
  // Publishes `block` (referenced, unhashed) under `hash`. Returns false and
  // leaves it unhashed when another block already holds that hash.
  bool CacheBlock(int32_t block, const BlockHash& hash);
  // Removes `block`'s hash (its KV was never written): later lookups miss it.
  // A free block moves to the head of the free queue. No-op when unhashed.
  void Uncache(int32_t block);
  [[nodiscard]] bool is_cached(int32_t block) const { return blocks_[block].cached; }
  [[nodiscard]] int32_t ref_count(int32_t block) const { return blocks_[block].ref_count; }
  [[nodiscard]] int32_t num_cached_blocks() const { return static_cast<int32_t>(cached_.size()); }
  // The free queue from head (next allocated) to tail; for tests.
  [[nodiscard]] std::vector<int32_t> FreeQueueForTest() const;
  // The prefix cache maps each hash to the one block flagged with it, and
  // back; the message names the first block that breaks it. For tests.
  [[nodiscard]] absl::Status CheckCacheConsistency() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1;  // free-queue links; -1 = not in the queue
    int32_t next = -1;
    bool cached = false;
    BlockHash hash;
  };
  void Unlink(int32_t b);
  void PushFront(int32_t b);
  void PushBack(int32_t b);

  bool enable_caching_;
  std::vector<Block> blocks_;
  // Sentinel of the circular free list (index blocks_.size() in links).
  int32_t head_ = -1;
  int32_t tail_ = -1;
  int32_t num_free_ = 0;
  absl::flat_hash_map<BlockHash, int32_t> cached_;
};

}  // namespace tandem::sched
