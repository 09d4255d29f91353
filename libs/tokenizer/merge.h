// The pair-merging loop shared by llama2.c's score BPE and Hugging Face's
// rank BPE (private).
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

namespace tandem::tokenizer::internal {

// A merge of two adjacent symbols: `id` replaces them. Smaller `priority`
// merges first.
template <typename Priority>
struct Merge {
  Priority priority;
  int32_t id;
};

// Repeatedly merges the adjacent pair with the smallest priority - the
// leftmost one among equals - until no adjacent pair has a merge.
// `lookup(left_id, right_id)` returns std::optional<Merge<Priority>>.
//
// This is what llama2.c's encode does by rescanning every pair after each
// merge (O(n^2)); a heap of candidate pairs keyed by (priority, position of
// the left symbol) picks the same pair in O(log n), because merging never
// reorders symbols, so "leftmost" is "smallest original position".
template <typename Priority, typename Lookup>
void MergePairs(std::vector<int32_t>* symbols, const Lookup& lookup) {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  std::vector<int32_t>& sym = *symbols;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    Priority priority;
    int left;
    int right;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    bool operator>(const Candidate& o) const {
      if (priority != o.priority) return o.priority < priority;
      return left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::optional<Merge<Priority>> m = lookup(sym[left], sym[right]);
    if (m) heap.push(Candidate{m->priority, left, right, sym[left], sym[right], m->id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale: one side merged away or into something else since the push.
    if (dead[c.left] || dead[c.right] || next[c.left] != c.right || sym[c.left] != c.left_id ||
        sym[c.right] != c.right_id) {
      continue;
    }
    sym[c.left] = c.merged_id;
    dead[c.right] = true;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    consider(prev[c.left], c.left);
    consider(c.left, next[c.left]);
  }
  int out = 0;
  for (int i = 0; i < n; ++i) {
    if (!dead[i]) sym[out++] = sym[i];
  }
  sym.resize(out);
}

}  // namespace tandem::tokenizer::internal
