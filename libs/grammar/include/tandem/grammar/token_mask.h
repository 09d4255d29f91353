// Which tokens a JsonMatcher accepts next: the mask structured outputs put
// on a step's logits (as vLLM applies xgrammar's bitmask).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "tandem/grammar/json_matcher.h"

namespace tandem::grammar {

// A model's vocabulary as bytes: each id's text when decoded alone
// (tokenizer::PieceBytes); an empty entry is never allowed (special tokens,
// EOS: stop tokens are the caller's, allowed exactly when the document is
// complete). Sorted once, so that a mask steps each prefix the tokens share
// once (a trie walked in order) and skips every token that starts with a
// refused prefix.
class TokenVocabulary {
 public:
  explicit TokenVocabulary(std::vector<std::string> token_bytes);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  std::string_view bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  // Ids with bytes, by their bytes; common_prefix()[i] is the length of the
  // prefix order()[i] shares with order()[i - 1] (0 for i = 0).
  std::span<const int32_t> order() const { return order_; }
  std::span<const int32_t> common_prefix() const { return common_prefix_; }
  size_t max_bytes() const { return max_bytes_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> order_;
  std::vector<int32_t> common_prefix_;
  size_t max_bytes_ = 0;
};

// One bit per id (bit id % 32 of word id / 32), as vLLM's bitmask.
using TokenMask = std::vector<uint32_t>;
inline bool MaskAllows(std::span<const uint32_t> mask, int32_t id) {
  return (mask[static_cast<size_t>(id) / 32] >> (id % 32) & 1u) != 0;
}

// Sets in `mask` (resized to the vocabulary, cleared first) the ids whose
// bytes `matcher` accepts next: those for which matcher.Accept(bytes(id))
// would return true. Returns how many.
int32_t AllowedTokens(const JsonMatcher& matcher, const TokenVocabulary& vocab, TokenMask* mask);

// AllowedTokens over one vocabulary, the masks kept by the matcher's state
// (its schema's id and JsonMatcher::AppendStateKey): a state met again (the
// inside of a string, the place between two members, a regex's automaton
// state), in this request or another of the same schema, costs a lookup
// instead of a walk of the vocabulary. xgrammar keeps masks by the
// automaton's node alone, with the tokens that depend on the stack checked
// again; here the whole state is the key, so a hit is exact. The least
// recently used masks go once they take more than `max_bytes`.
// Thread-safe; two threads that miss the same state both walk.
class TokenMaskCache {
 public:
  TokenMaskCache(std::shared_ptr<const TokenVocabulary> vocab, size_t max_bytes);

  const TokenVocabulary& vocabulary() const { return *vocab_; }
  // AllowedTokens(matcher, vocabulary(), mask).
  int32_t Allowed(const JsonMatcher& matcher, TokenMask* mask);

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    size_t masks = 0;  // kept now
    size_t bytes = 0;  // their keys and masks
  };
  Stats stats() const;

 private:
  struct Entry {
    std::string key;
    TokenMask mask;
    int32_t allowed = 0;
  };
  size_t EntryBytes(const Entry& e) const { return e.key.size() + e.mask.size() * 4; }

  const std::shared_ptr<const TokenVocabulary> vocab_;
  const size_t max_bytes_;
  mutable std::mutex mu_;
  // Most recently used first.
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string_view, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::grammar
