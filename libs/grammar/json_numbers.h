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

// One side of a number's range: a bound and whether it is exclusive.
struct NumberBound {
  double value = 0;
  bool exclusive = false;
};

// A regex (RegexDialect::kText) whose matches are the numbers in the range
// written as xgrammar writes a bounded number (its FloatRangeRegex with
// precision 6): -?(0|[1-9][0-9]*)(\.[0-9]{1,6})?, no exponent, whose
// value lies in the range once each bound is moved to the grid of 10^-6
// (a bound whose shortest decimal has at most six fraction digits is that
// decimal, with its exclusiveness; any other moves inward to the nearest
// grid point and is inclusive); zero is 0 or 0.0...0 (up to six zeros), and
// -0.0...0 too where the range goes below zero (never "-0"). Empty when no
// number is in the range: the caller refuses it. Bounds must be finite and
// below 2^63 in magnitude.
std::string NumberRangeRegex(std::optional<NumberBound> lo, std::optional<NumberBound> hi);

}  // namespace tandem::grammar::internal
