// Regular expressions for structured outputs (vLLM's structured_outputs.regex),
// compiled to a deterministic automaton over UTF-8 bytes that JsonMatcher
// (json_matcher.h) steps a byte at a time.
//
// The dialect is xgrammar's (vLLM's default backend), which reads a pattern
// as JavaScript does, and the whole output must match it:
// - literals (any UTF-8), `.` (any character, newline included), classes
//   `[a-z]`, `[^...]`, `\d \D \w \W \s \S` (ASCII digits and word
//   characters; \s is [\f\n\r\t\v \u00a0]), in classes too;
// - groups `(...)`, `(?:...)`, `(?<name>...)`; alternation `|` (an empty
//   branch matches the empty string);
// - `* + ? {n} {n,} {n,m}`, each optionally lazy (`*?`: the same strings);
// - escapes \n \r \t \f \v \0 \a \b (in a class) \e, \xHH, \uHHHH,
//   \u{H...}, \UHHHHHHHH, \cX, and a backslash before any other
//   punctuation for the character itself;
// - `^` first and `$` last in the pattern (the output is matched whole
//   either way).
// Refused by name, never approximated: back-references, lookaround, word
// boundaries, \p{...}, flags and other `(?` groups, `^`/`$` elsewhere, a
// backslash before a letter or digit not listed above (\A, \Z, \z, \h...,
// which other dialects read differently), \x with other than two hex
// digits, two quantifiers in a row, an empty class, a malformed `{...}`, a
// pattern no string matches, and one whose automaton needs more than
// kMaxRegexStates states or as much work to build (`(a|b)*a(a|b){20}`;
// `.{0,5000}`, eight states a character, is held).
//
// Written here: RE2 (packaged) exposes no automaton to step a byte at a
// time, nor whether a prefix can still be completed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::grammar {

inline constexpr size_t kMaxRegexStates = 65536;

class RegexDfa {
 public:
  static constexpr int32_t kDead = -1;

  int32_t start() const { return 0; }
  // The state after `byte` from `state`, or kDead when no match can follow.
  int32_t Next(int32_t state, uint8_t byte) const {
    return next_[static_cast<size_t>(state) * classes_ + class_of_[byte]];
  }
  // The bytes read so far are a whole match.
  bool Accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // Some byte may follow.
  bool Open(int32_t state) const { return open_[static_cast<size_t>(state)] != 0; }
  size_t states() const { return accepting_.size(); }

 private:
  friend class RegexDfaBuilder;
  std::array<uint8_t, 256> class_of_{};  // bytes no transition tells apart share a class
  size_t classes_ = 0;
  std::vector<int32_t> next_;  // states() x classes_
  std::vector<uint8_t> accepting_;
  std::vector<uint8_t> open_;
};

// Which of xgrammar's two readers a pattern is read as.
enum class RegexDialect : uint8_t {
  // structured_outputs.regex (xgrammar's RegexToEBNF): as above.
  kText,
  // A JSON schema's `pattern` (xgrammar's RegexFSMBuilder with the JSON
  // string's forbidden characters): the automaton reads a JSON string, `"`,
  // a body the pattern matches whole, `"`, where no character of the body
  // is one JSON escapes (control characters, '"', '\\'), so the body is the
  // string's value with no escape in it. \s is [\t-\r ] (no U+00A0) and,
  // those removed, a space; a stray ']' or '}' and \U are refused (that
  // reader refuses the first and reads \U as the letter).
  kJsonStringPattern,
};

// `pattern` compiled. INVALID_ARGUMENT naming what is refused and where (the
// character's position, from 1).
[[nodiscard]] absl::StatusOr<std::shared_ptr<const RegexDfa>> CompileRegex(
    std::string_view pattern, RegexDialect dialect = RegexDialect::kText);

}  // namespace tandem::grammar
