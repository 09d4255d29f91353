#include "tandem/grammar/regex.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "regex_parse.h"
#include "tandem/common/utf8.h"

namespace tandem::grammar {
namespace {

using internal::kMaxCodepoint;
using internal::Range;
using internal::Ranges;
using Ast = internal::RegexAst;

// Bound on what a pattern expands to before the DFA: the NFA's states
// (`(a{1000}){1000}` is refused, not built).
constexpr size_t kMaxNfaStates = 200000;
// Bounds on the subset construction's work (NFA states visited; 5M take
// about 0.1 s here): the scheduler compiles a request's grammar at admission
// on its engine loop, and the worker at the request's first step, so a
// pattern past it is refused instead of stalling them; and on the table it
// makes (1M entries, 4 MB: the worker keeps up to 256 compiled grammars).
constexpr size_t kMaxWork = 5'000'000;
constexpr size_t kMaxTable = size_t{1} << 20;

// A codepoint's UTF-8 bytes.
std::vector<uint8_t> Utf8(uint32_t cp) {
  std::string bytes;
  AppendUtf8(cp, &bytes);
  return {bytes.begin(), bytes.end()};
}

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

// The UTF-8 encodings of codepoints [lo, hi] (no surrogates, one encoded
// length) as sequences of byte ranges: split until the bytes after the
// first that differ each cover every continuation byte.
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>* out) {
  const size_t n = Utf8(lo).size();
  for (size_t i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::vector<uint8_t> a = Utf8(lo), b = Utf8(hi);
  ByteRanges seq;
  for (size_t i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

void SetSequences(const Ranges& set, std::vector<ByteRanges>* out) {
  static constexpr Range kPieces[] = {
      {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, kMaxCodepoint}};
  for (const Range& r : set) {
    for (const Range& p : kPieces) {
      const uint32_t lo = std::max(r.first, p.first), hi = std::min(r.second, p.second);
      if (lo <= hi) Utf8Sequences(lo, hi, out);
    }
  }
}

// Thompson's construction over bytes.
struct NfaState {
  std::vector<int32_t> eps;
  uint8_t lo = 1, hi = 0;  // a byte transition when lo <= hi
  int32_t next = -1;
};

class Nfa {
 public:
  bool overflowed() const { return overflowed_; }
  const std::vector<NfaState>& states() const { return states_; }

  // A fragment for `ast` from `start` to a new state, returned.
  int32_t Build(const Ast& ast, int32_t start) {
    if (overflowed_) return start;
    switch (ast.op) {
      case Ast::kSet: {
        const int32_t end = New();
        std::vector<ByteRanges> seqs;
        SetSequences(ast.set, &seqs);
        // Built from the end, sharing tails: every character's last
        // continuation bytes are one state, so the automaton does not tell
        // apart which lead byte began a character once it no longer matters.
        std::map<std::tuple<uint8_t, uint8_t, int32_t>, int32_t> tails;
        for (const ByteRanges& seq : seqs) {
          int32_t at = end;
          for (size_t i = seq.size(); i-- > 1;) {
            auto [it, fresh] = tails.emplace(std::tuple(seq[i].first, seq[i].second, at), -1);
            if (fresh) {
              it->second = New();
              if (overflowed_) return end;
              Byte(it->second, seq[i], at);
            }
            at = it->second;
          }
          Byte(start, seq[0], at);
          if (overflowed_) return end;
        }
        return end;
      }
      case Ast::kConcat: {
        int32_t at = start;
        for (const Ast& k : ast.kids) at = Build(k, at);
        return at;
      }
      case Ast::kAlt: {
        const int32_t end = New();
        for (const Ast& k : ast.kids) {
          const int32_t s = New();
          Eps(start, s);
          Eps(Build(k, s), end);
        }
        return end;
      }
      case Ast::kRepeat: {
        int32_t at = start;
        for (int64_t i = 0; i < ast.min && !overflowed_; ++i) at = Build(ast.kids[0], at);
        if (ast.max < 0) {
          // at -> loop -> body -> loop; loop -> end
          const int32_t loop = New(), end = New();
          Eps(at, loop);
          Eps(Build(ast.kids[0], loop), loop);
          Eps(loop, end);
          return end;
        }
        const int32_t end = New();
        for (int64_t i = ast.min; i < ast.max && !overflowed_; ++i) {
          Eps(at, end);
          at = Build(ast.kids[0], at);
        }
        Eps(at, end);
        return end;
      }
    }
    return start;
  }

  int32_t New() {
    if (states_.size() >= kMaxNfaStates) {
      overflowed_ = true;
      return 0;
    }
    states_.emplace_back();
    return static_cast<int32_t>(states_.size() - 1);
  }

 private:
  void Eps(int32_t from, int32_t to) {
    if (!overflowed_) states_[static_cast<size_t>(from)].eps.push_back(to);
  }
  // A state holds one byte transition; a second from the same state goes
  // through a new one.
  void Byte(int32_t from, std::pair<uint8_t, uint8_t> r, int32_t to) {
    NfaState& s = states_[static_cast<size_t>(from)];
    if (s.lo <= s.hi) {
      const int32_t via = New();
      if (overflowed_) return;
      states_[static_cast<size_t>(from)].eps.push_back(via);
      return Byte(via, r, to);
    }
    s.lo = r.first;
    s.hi = r.second;
    s.next = to;
  }

  std::vector<NfaState> states_;
  bool overflowed_ = false;
};

// Every character `ast` matches, less those JSON escapes in strings.
void WithoutJsonEscapes(Ast* ast) {
  if (ast->op == Ast::kSet) {
    Ranges kept;
    for (const Range& r : ast->set) {
      for (Range piece :
           {Range{r.first, std::min<uint32_t>(r.second, '"' - 1)},
            Range{std::max<uint32_t>(r.first, '"' + 1), std::min<uint32_t>(r.second, '\\' - 1)},
            Range{std::max<uint32_t>(r.first, '\\' + 1), r.second}}) {
        piece.first = std::max<uint32_t>(piece.first, 0x20);
        if (piece.first <= piece.second) kept.push_back(piece);
      }
    }
    ast->set = std::move(kept);
  }
  for (Ast& kid : ast->kids) WithoutJsonEscapes(&kid);
}

}  // namespace

// Subset construction, then the states that cannot reach a match removed.
class RegexDfaBuilder {
 public:
  static absl::StatusOr<std::shared_ptr<const RegexDfa>> Build(const Nfa& nfa, int32_t start,
                                                               int32_t final_state) {
    const std::vector<NfaState>& ns = nfa.states();
    auto dfa = std::make_shared<RegexDfa>();
    // Byte classes: bytes that every transition takes or refuses alike.
    std::array<bool, 257> boundary{};
    for (const NfaState& s : ns) {
      if (s.lo <= s.hi) {
        boundary[s.lo] = true;
        boundary[static_cast<size_t>(s.hi) + 1] = true;
      }
    }
    std::vector<uint8_t> representative;
    for (size_t b = 0; b < 256; ++b) {
      if (b == 0 || boundary[b]) representative.push_back(static_cast<uint8_t>(b));
      dfa->class_of_[b] = static_cast<uint8_t>(representative.size() - 1);
    }
    const size_t classes = representative.size();
    dfa->classes_ = classes;

    std::vector<uint32_t> seen(ns.size(), 0);
    uint32_t stamp = 0;
    const auto closure = [&](std::vector<int32_t> set) {
      ++stamp;
      std::vector<int32_t> stack = set;
      set.clear();
      for (int32_t s : stack) seen[static_cast<size_t>(s)] = stamp;
      while (!stack.empty()) {
        const int32_t s = stack.back();
        stack.pop_back();
        // Only the states that read a byte, and the final one, tell sets
        // apart: sets that differ in epsilon-only states are one state.
        const NfaState& st = ns[static_cast<size_t>(s)];
        if (st.lo <= st.hi || s == final_state) set.push_back(s);
        for (int32_t t : ns[static_cast<size_t>(s)].eps) {
          if (seen[static_cast<size_t>(t)] != stamp) {
            seen[static_cast<size_t>(t)] = stamp;
            stack.push_back(t);
          }
        }
      }
      std::sort(set.begin(), set.end());
      set.erase(std::unique(set.begin(), set.end()), set.end());
      return set;
    };

    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> sets;
    const auto intern = [&](std::vector<int32_t> set) -> int32_t {
      if (set.empty()) return RegexDfa::kDead;
      auto [it, fresh] = ids.emplace(set, static_cast<int32_t>(sets.size()));
      if (fresh) sets.push_back(std::move(set));
      return it->second;
    };
    intern(closure({start}));
    std::vector<int32_t> next;
    size_t work = 0;
    for (size_t d = 0; d < sets.size(); ++d) {
      work += sets[d].size() * classes;
      if (sets.size() > kMaxRegexStates || sets.size() * classes > kMaxTable || work > kMaxWork) {
        return absl::InvalidArgumentError(absl::StrCat(
            "regex: the pattern needs more than ", kMaxRegexStates,
            " automaton states, or as much work to build (a long counted repeat after an "
            "open-ended one, such as (a|b)*a(a|b){20}); simplify it"));
      }
      for (size_t c = 0; c < classes; ++c) {
        const uint8_t byte = representative[c];
        std::vector<int32_t> moved;
        for (int32_t s : sets[d]) {
          const NfaState& st = ns[static_cast<size_t>(s)];
          if (st.lo <= byte && byte <= st.hi) moved.push_back(st.next);
        }
        next.push_back(moved.empty() ? RegexDfa::kDead : intern(closure(std::move(moved))));
      }
    }
    const size_t n = sets.size();
    std::vector<uint8_t> accepting(n, 0), live(n, 0);
    for (size_t d = 0; d < n; ++d) {
      accepting[d] = std::binary_search(sets[d].begin(), sets[d].end(), final_state);
      live[d] = accepting[d];
    }
    // Live: a match is reachable. Found backwards from the accepting states.
    std::vector<std::vector<int32_t>> from(n);
    for (size_t d = 0; d < n; ++d) {
      for (size_t c = 0; c < classes; ++c) {
        const int32_t t = next[d * classes + c];
        if (t >= 0) from[static_cast<size_t>(t)].push_back(static_cast<int32_t>(d));
      }
    }
    std::vector<int32_t> queue;
    for (size_t d = 0; d < n; ++d) {
      if (live[d]) queue.push_back(static_cast<int32_t>(d));
    }
    while (!queue.empty()) {
      const int32_t t = queue.back();
      queue.pop_back();
      for (int32_t d : from[static_cast<size_t>(t)]) {
        if (!live[static_cast<size_t>(d)]) {
          live[static_cast<size_t>(d)] = 1;
          queue.push_back(d);
        }
      }
    }
    if (n == 0 || !live[0])
      return absl::InvalidArgumentError("regex: no string matches the pattern");
    // Dead states' transitions are removed; the states stay numbered.
    dfa->open_.assign(n, 0);
    for (size_t d = 0; d < n; ++d) {
      for (size_t c = 0; c < classes; ++c) {
        int32_t& t = next[d * classes + c];
        if (t >= 0 && !live[static_cast<size_t>(t)]) t = RegexDfa::kDead;
        if (t >= 0) dfa->open_[d] = 1;
      }
    }
    dfa->next_ = std::move(next);
    dfa->accepting_ = std::move(accepting);
    return std::shared_ptr<const RegexDfa>(std::move(dfa));
  }
};

absl::StatusOr<std::shared_ptr<const RegexDfa>> CompileRegex(std::string_view pattern,
                                                             RegexDialect dialect) {
  // vLLM refuses it before xgrammar's native reader sees it.
  if (const size_t nul = pattern.find('\0'); nul != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex: a NUL character at ", nul + 1, " (vLLM refuses one)"));
  }
  auto ast = internal::ParseRegex(pattern, dialect);
  if (!ast.ok()) return ast.status();
  if (dialect == RegexDialect::kJsonStringPattern) {
    // `"` body `"`.
    WithoutJsonEscapes(&*ast);
    Ast quoted{.op = Ast::kConcat};
    quoted.kids.push_back(Ast{.op = Ast::kSet, .set = {{'"', '"'}}});
    quoted.kids.push_back(*std::move(ast));
    quoted.kids.push_back(Ast{.op = Ast::kSet, .set = {{'"', '"'}}});
    *ast = std::move(quoted);
  }
  Nfa nfa;
  const int32_t start = nfa.New();
  const int32_t final_state = nfa.Build(*ast, start);
  if (nfa.overflowed()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "regex: the pattern expands to more than ", kMaxNfaStates,
        " automaton states before it is made deterministic (large counted repeats); simplify it"));
  }
  return RegexDfaBuilder::Build(nfa, start, final_state);
}

}  // namespace tandem::grammar
