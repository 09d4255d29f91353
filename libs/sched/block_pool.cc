#include "tandem/sched/block_pool.h"

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"

namespace tandem::sched {

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching)
    : enable_caching_(enable_caching), blocks_(static_cast<size_t>(num_blocks)) {
  TANDEM_CHECK_GE(num_blocks, 2) << "block 0 is the null block";
  blocks_[kNullBlock].ref_count = 1;  // never free
  for (int32_t b = 1; b < num_blocks; ++b) PushBack(b);
}

double BlockPool::usage() const {
  return 1.0 - static_cast<double>(num_free_) / static_cast<double>(num_usable_blocks());
}

void BlockPool::Unlink(int32_t b) {
  Block& blk = blocks_[b];
  if (blk.prev >= 0)
    blocks_[blk.prev].next = blk.next;
  else
    head_ = blk.next;
  if (blk.next >= 0)
    blocks_[blk.next].prev = blk.prev;
  else
    tail_ = blk.prev;
  blk.prev = blk.next = -1;
  --num_free_;
}

void BlockPool::PushFront(int32_t b) {
  Block& blk = blocks_[b];
  blk.prev = -1;
  blk.next = head_;
  if (head_ >= 0)
    blocks_[head_].prev = b;
  else
    tail_ = b;
  head_ = b;
  ++num_free_;
}

void BlockPool::PushBack(int32_t b) {
  Block& blk = blocks_[b];
  blk.next = -1;
  blk.prev = tail_;
  if (tail_ >= 0)
    blocks_[tail_].next = b;
  else
    head_ = b;
  tail_ = b;
  ++num_free_;
}

void BlockPool::Allocate(int32_t n, std::vector<int32_t>* out) {
  TANDEM_CHECK_LE(n, num_free_) << "allocating more blocks than are free";
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = head_;
    Unlink(b);
    Block& blk = blocks_[b];
    if (blk.cached) {  // eviction
      cached_.erase(blk.hash);
      blk.cached = false;
    }
    blk.ref_count = 1;
    out->push_back(b);
  }
}

void BlockPool::Touch(int32_t b) {
  Block& blk = blocks_[b];
  if (blk.ref_count == 0) Unlink(b);
  ++blk.ref_count;
}

void BlockPool::Free(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    Block& blk = blocks_[b];
    TANDEM_CHECK_GT(blk.ref_count, 0) << "double free of block " << b;
    TANDEM_CHECK(b != kNullBlock) << "freeing the null block";
    if (--blk.ref_count == 0) {
      if (blk.cached)
        PushBack(b);
      else
        PushFront(b);
    }
  }
}

void BlockPool::FreeReversed(std::span<const int32_t> blocks) {
  for (size_t i = blocks.size(); i-- > 0;) Free(blocks.subspan(i, 1));
}

std::optional<int32_t> BlockPool::Lookup(const BlockHash& hash) const {
  if (!enable_caching_) return std::nullopt;
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

bool BlockPool::CacheBlock(int32_t b, const BlockHash& hash) {
  if (!enable_caching_) return false;
  Block& blk = blocks_[b];
  TANDEM_CHECK_GT(blk.ref_count, 0) << "caching an unreferenced block";
  if (blk.cached) return blk.hash == hash;
  auto [it, inserted] = cached_.try_emplace(hash, b);
  if (!inserted) return false;
  blk.cached = true;
  blk.hash = hash;
  return true;
}

void BlockPool::Uncache(int32_t b) {
  Block& blk = blocks_[b];
  if (!blk.cached) return;
  cached_.erase(blk.hash);
  blk.cached = false;
  if (blk.ref_count == 0) {  // reused first, as any free unhashed block
    Unlink(b);
    PushFront(b);
  }
}

absl::Status BlockPool::CheckCacheConsistency() const {
  size_t num_cached = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const Block& blk = blocks_[b];
    if (!blk.cached) continue;
    ++num_cached;
    auto it = cached_.find(blk.hash);
    if (it == cached_.end() || it->second != b) {
      return absl::InternalError(absl::StrCat("block ", b,
                                              " is flagged cached but its hash maps to ",
                                              it == cached_.end() ? -1 : it->second));
    }
  }
  if (num_cached != cached_.size()) {
    return absl::InternalError(
        absl::StrCat(cached_.size(), " cached hashes but ", num_cached, " blocks flagged cached"));
  }
  return absl::OkStatus();
}

std::vector<int32_t> BlockPool::FreeQueueForTest() const {
  std::vector<int32_t> out;
  for (int32_t b = head_; b >= 0; b = blocks_[b].next) out.push_back(b);
  return out;
}

}  // namespace tandem::sched
