#include "tandem/grammar/token_mask.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace tandem::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes)
    : bytes_(std::move(token_bytes)) {
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (!bytes_[id].empty()) order_.push_back(static_cast<int32_t>(id));
    max_bytes_ = std::max(max_bytes_, bytes_[id].size());
  }
  std::sort(order_.begin(), order_.end(),
            [&](int32_t a, int32_t b) { return std::pair(bytes(a), a) < std::pair(bytes(b), b); });
  common_prefix_.assign(order_.size(), 0);
  for (size_t i = 1; i < order_.size(); ++i) {
    const std::string_view a = bytes(order_[i - 1]), b = bytes(order_[i]);
    const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
    common_prefix_[i] = static_cast<int32_t>(ia - a.begin());
  }
}

int32_t AllowedTokens(const JsonMatcher& matcher, const TokenVocabulary& vocab, TokenMask* mask) {
  mask->assign((static_cast<size_t>(vocab.size()) + 31) / 32, 0);
  // The matcher's frames, then what stepping the tokens pushes on them.
  FrameArena arena = matcher.arena();
  // states[d]: the stacks after the current token's first d bytes, valid
  // for d <= depth; marks[d]: the arena's size once states[d] was made.
  std::vector<std::vector<int32_t>> states(vocab.max_bytes() + 1);
  std::vector<size_t> marks(vocab.max_bytes() + 1);
  states[0].assign(matcher.tops().begin(), matcher.tops().end());
  marks[0] = arena.size();
  size_t depth = 0;
  int64_t refused_at = -1;  // the previous token's byte that no stack took
  int32_t allowed = 0;
  const std::span<const int32_t> order = vocab.order(), shared = vocab.common_prefix();
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t common = static_cast<size_t>(shared[i]);
    // A token that begins with a refused prefix is refused too.
    if (refused_at >= 0 && common > static_cast<size_t>(refused_at)) continue;
    refused_at = -1;
    depth = std::min(depth, common);
    arena.Truncate(marks[depth]);
    const std::string_view bytes = vocab.bytes(order[i]);
    while (depth < bytes.size()) {
      std::vector<int32_t>& next = states[depth + 1];
      next.clear();
      if (!StepBytes(matcher.schema(), arena, states[depth], static_cast<uint8_t>(bytes[depth]),
                     &next) ||
          next.empty()) {
        refused_at = static_cast<int64_t>(depth);
        break;
      }
      ++depth;
      marks[depth] = arena.size();
    }
    if (refused_at >= 0) continue;
    const int32_t id = order[i];
    (*mask)[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    ++allowed;
  }
  return allowed;
}

TokenMaskCache::TokenMaskCache(std::shared_ptr<const TokenVocabulary> vocab, size_t max_bytes)
    : vocab_(std::move(vocab)), max_bytes_(max_bytes) {}

int32_t TokenMaskCache::Allowed(const JsonMatcher& matcher, TokenMask* mask) {
  std::string key;
  const uint64_t schema = matcher.schema().id();
  key.append(reinterpret_cast<const char*>(&schema), sizeof(schema));
  matcher.AppendStateKey(&key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      *mask = it->second->mask;
      ++stats_.hits;
      return it->second->allowed;
    }
    ++stats_.misses;
  }
  Entry e{.key = std::move(key)};
  e.allowed = AllowedTokens(matcher, *vocab_, &e.mask);
  *mask = e.mask;
  const int32_t allowed = e.allowed;
  const size_t bytes = EntryBytes(e);
  if (bytes > max_bytes_) return allowed;
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.contains(e.key)) return allowed;  // another thread kept it meanwhile
  lru_.push_front(std::move(e));
  index_.emplace(lru_.front().key, lru_.begin());
  stats_.bytes += bytes;
  ++stats_.masks;
  while (stats_.bytes > max_bytes_) {
    const Entry& last = lru_.back();
    stats_.bytes -= EntryBytes(last);
    --stats_.masks;
    index_.erase(last.key);
    lru_.pop_back();
  }
  return allowed;
}

TokenMaskCache::Stats TokenMaskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace tandem::grammar
