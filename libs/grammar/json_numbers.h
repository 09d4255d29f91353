// JSON Schema's numeric bounds as xgrammar (vLLM's default backend) holds
// them: internal to libs/grammar (json_schema.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tandem::grammar::internal {

// A regex (RegexDialect::kText) whose matches are the integers in [lo, hi]
// written as xgrammar writes a bounded integer (its IntegerRangeRegex): no
// leading zero, no "-0", no fraction or exponent. nullopt: no bound on that
// side. Requires lo <= hi where both are given.
std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace tandem::grammar::internal
