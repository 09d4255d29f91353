// The Split pre-tokenizer's regular expressions on RE2 (private).
//
// tokenizer.json patterns are written for Oniguruma (the Rust `tokenizers`
// crate compiles them with it). RE2 is linear-time and already a Debian
// package, but differs in three ways this class bridges:
//   - `\s`/`\S` are ASCII in RE2 and Unicode White_Space in Oniguruma: they
//     are rewritten to the explicit White_Space class (U+0009-000D, U+0020,
//     U+0085, U+00A0, U+1680, U+2000-200A, U+2028, U+2029, U+202F, U+205F,
//     U+3000), inside character classes too. `\d`/`\D` become \p{Nd}/\P{Nd}.
//   - RE2 has no lookahead. Every pattern in use (GPT-2, Llama 3, Qwen2,
//     Mistral/Tekken, DeepSeek) has it only as the alternative pair
//     `\s+(?!\S)|\s+`, meaning "a whitespace run, minus its last character
//     when a non-space follows and the run is longer than one character".
//     That pair is compiled as a capturing `(\s+)`, and a match made by that
//     group which is followed by more text and is longer than one character
//     gives its last character back (which the next match then starts with).
//     For a run of one character before a non-space, Oniguruma's lookahead
//     fails and its next alternative `\s+` takes the same single character,
//     so the result is identical. Any other lookaround, atomic group or
//     possessive quantifier is an error naming it and its offset.
//   - Case-insensitive groups `(?i:...)` fold with Unicode simple case
//     folding in both engines.
// Measured on the Llama 3 pattern (tools/bench_tokenizer): see README.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace re2 {
class RE2;
}

namespace tandem::tokenizer::internal {

class SplitRegex {
 public:
  // Translates and compiles an Oniguruma pattern; INVALID_ARGUMENT naming the
  // construct and its offset when it is not supported.
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(std::string_view pattern);
  ~SplitRegex();

  // The non-empty matches of the pattern in `text`, left to right, as [begin,
  // end) byte offsets (what Oniguruma's find_iter yields).
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  // The RE2 pattern it compiled (for tests and error messages).
  const std::string& translated() const { return translated_; }

 private:
  SplitRegex() = default;
  std::unique_ptr<re2::RE2> re_;
  std::string translated_;
  bool has_lookahead_group_ = false;
};

// Translates an Oniguruma pattern to RE2 syntax without the lookahead rewrite
// (for Replace normalizers); `lookahead_group` (may be null) reports whether
// `\s+(?!\S)|\s+` was rewritten to a capturing group.
absl::StatusOr<std::string> TranslateOnigurumaToRe2(std::string_view pattern,
                                                    bool* lookahead_group);

}  // namespace tandem::tokenizer::internal
