#include <list>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "tandem/grammar/json_schema.h"

namespace tandem::grammar {
namespace {

using Compiled = absl::StatusOr<std::shared_ptr<const Schema>>;

// The grammar's field, its whitespace and its text; a choice's strings each
// with its length, so that no two lists share a key.
std::string Key(const SamplingParams& params) {
  std::string key =
      absl::StrCat(params.GrammarField(), params.disable_any_whitespace ? " compact:" : ":");
  if (!params.choice.empty()) {
    for (const std::string& c : params.choice) absl::StrAppend(&key, c.size(), ":", c);
  } else {
    key += !params.regex.empty()     ? params.regex
           : !params.grammar.empty() ? params.grammar
                                     : params.json_schema;
  }
  return key;
}

class Kept {
 public:
  Compiled Get(const SamplingParams& params) {
    std::string key = Key(params);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = index_.find(key); it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        ++stats_.hits;
        return it->second->second;
      }
      ++stats_.misses;
    }
    // Compiled unlocked: a long compile holds up no other grammar.
    Compiled compiled = CompileGrammar(params);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) return it->second->second;
    lru_.emplace_front(std::move(key), compiled);
    index_.emplace(lru_.front().first, lru_.begin());
    if (lru_.size() > kKeptGrammars) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return compiled;
  }

  KeptGrammarStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, Compiled>> lru_;  // most recently used first
  absl::flat_hash_map<std::string_view, std::list<std::pair<std::string, Compiled>>::iterator>
      index_;
  KeptGrammarStats stats_;
};

Kept& TheKept() {
  static Kept* kept = new Kept();
  return *kept;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Schema>> CompileGrammarKept(const SamplingParams& params) {
  return TheKept().Get(params);
}

KeptGrammarStats KeptGrammars() { return TheKept().stats(); }

}  // namespace tandem::grammar
