// structured_outputs' regexes parsed (regex_parse.cc): internal to
// libs/grammar.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/grammar/regex.h"

namespace tandem::grammar::internal {

using Range = std::pair<uint32_t, uint32_t>;  // codepoints, inclusive
using Ranges = std::vector<Range>;

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// The pattern's syntax tree.
struct RegexAst {
  enum Op : uint8_t { kSet, kConcat, kAlt, kRepeat };
  Op op = kConcat;  // kConcat with no kids: the empty string
  Ranges set;       // kSet: sorted, disjoint
  std::vector<RegexAst> kids;
  int64_t min = 0, max = -1;  // kRepeat; -1: unbounded
};

// `pattern` parsed; INVALID_ARGUMENT naming what is refused and where.
[[nodiscard]] absl::StatusOr<RegexAst> ParseRegex(std::string_view pattern, RegexDialect dialect);

}  // namespace tandem::grammar::internal
