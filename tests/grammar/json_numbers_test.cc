// JSON schemas' numeric bounds (minimum, maximum and the exclusive ones) as
// xgrammar holds them, against texts parsed and compared as decimals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <charconv>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "grammar_test_util.h"
#include "tandem/grammar/json_schema.h"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

// Whether `text` is an integer as xgrammar writes one (no leading zero, no
// "-0") in [lo, hi]: parsed, not matched by a pattern (texts of at most 30
// digits).
bool IntegerIn(const std::string& text, std::optional<int64_t> lo, std::optional<int64_t> hi) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string digits = text.substr(negative ? 1 : 0);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  if (digits.size() > 1 && digits[0] == '0') return false;
  if (negative && digits == "0") return false;
  // Past 64 bits a side without a bound still holds it (xgrammar's
  // [1-9][0-9]*).
  __int128 v = 0;
  for (char c : digits) v = v * 10 + (c - '0');
  if (negative) v = -v;
  return (!lo || v >= *lo) && (!hi || v <= *hi);
}

TEST(JsonMatcherTest, IntegersHoldTheirBoundsAsXgrammarHoldsThem) {
  using Range = std::pair<std::optional<int64_t>, std::optional<int64_t>>;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  std::vector<Range> ranges = {{0, std::nullopt},
                               {std::nullopt, 0},
                               {1, std::nullopt},
                               {std::nullopt, -1},
                               {-7, 7},
                               {0, 0},
                               {5, 5},
                               {-5, -5},
                               {10, 99},
                               {9, 100},
                               {100, 999},
                               {-1000, -999},
                               {123, 4567},
                               {-4567, 123},
                               {1999, 20001},
                               {std::nullopt, 350},
                               {-350, std::nullopt},
                               {kMin, kMax},
                               {kMin, -1},
                               {kMax - 5, kMax},
                               {kMin, kMin + 3},
                               {1000000, std::nullopt}};
  std::mt19937_64 rng(5);
  for (int i = 0; i < 40; ++i) {
    const int64_t a = static_cast<int64_t>(rng() % 40000) - 20000;
    const int64_t b = a + static_cast<int64_t>(rng() % (i < 20 ? 300 : 30000));
    ranges.emplace_back(a, b);
  }
  // Texts around the bounds and powers of ten, and what is not an integer
  // as xgrammar writes one.
  std::vector<std::string> texts = {"-0",
                                    "00",
                                    "01",
                                    "-01",
                                    "1.0",
                                    "1e2",
                                    "+1",
                                    "-",
                                    "",
                                    "9223372036854775808",
                                    "-9223372036854775809"};
  for (int64_t v = -1100; v <= 1100; ++v) texts.push_back(std::to_string(v));
  // Stops at 10^18: one more step would overflow int64_t.
  int64_t p = 1;
  for (int e = 1; e <= 18; ++e) {
    p *= 10;
    for (int64_t v : {p - 1, p, p + 1, -p - 1, -p, -p + 1}) texts.push_back(std::to_string(v));
  }
  for (const auto& [lo, hi] : ranges) {
    for (int64_t v : {lo.value_or(0), hi.value_or(0)}) {
      for (int64_t d : {-2, -1, 0, 1, 2}) {
        if ((d < 0 && v < kMin - d) || (d > 0 && v > kMax - d)) continue;
        texts.push_back(std::to_string(v + d));
      }
    }
    for (int k = 0; k < 300; ++k) {
      texts.push_back(std::to_string(static_cast<int64_t>(rng() % 60000) - 30000));
    }
  }
  for (const auto& [lo, hi] : ranges) {
    Json schema = {{"type", "integer"}};
    if (lo) schema["minimum"] = *lo;
    if (hi) schema["maximum"] = *hi;
    const auto compiled = Compile(schema.dump());
    ASSERT_NE(compiled, nullptr) << schema.dump();
    for (const std::string& text : texts) {
      ASSERT_EQ(Matches(compiled, text), IntegerIn(text, lo, hi))
          << text << " in " << schema.dump();
    }
  }
  // Exclusive bounds, the strictest of each side, and bounds written as
  // floats; the integer ends where what holds it goes on.
  const auto held = Compile(R"({"type": "object", "properties": {
      "n": {"type": ["integer", "null"], "minimum": 2.0, "exclusiveMinimum": 2,
            "maximum": 1e2, "exclusiveMaximum": 12}},
      "required": ["n"]})");
  for (int v = -20; v <= 120; ++v) {
    EXPECT_EQ(Matches(held, "{\"n\": " + std::to_string(v) + "}"), v >= 3 && v <= 11) << v;
  }
  EXPECT_TRUE(Matches(held, R"({"n":null})"));
  EXPECT_TRUE(Matches(held, "{\"n\": 7 }"));
  EXPECT_TRUE(Begins(held, R"({"n": 1)"));  // 10 and 11 go on from it
  EXPECT_FALSE(Begins(held, R"({"n": 0)"));
  EXPECT_FALSE(Begins(held, R"({"n": 2)"));
  EXPECT_FALSE(Begins(held, R"({"n": -)"));
  EXPECT_FALSE(Begins(held, R"({"n": 3.)"));
}

// -1, 0 or 1 as decimal texts a and b ("-12.5", "0.001") compare by value.
int CompareDecimal(std::string a, std::string b) {
  const auto split = [](std::string& t, bool* negative) {
    *negative = !t.empty() && t[0] == '-';
    if (*negative) t.erase(0, 1);
    const size_t dot = t.find('.');
    std::string frac = dot == std::string::npos ? "" : t.substr(dot + 1);
    std::string whole = t.substr(0, dot);
    whole.erase(0, std::min(whole.find_first_not_of('0'), whole.size()));
    frac.erase(frac.find_last_not_of('0') + 1);
    return std::pair(whole, frac);
  };
  bool na = false, nb = false;
  auto [wa, fa] = split(a, &na);
  auto [wb, fb] = split(b, &nb);
  const bool za = wa.empty() && fa.empty(), zb = wb.empty() && fb.empty();
  if (za) na = false;
  if (zb) nb = false;
  if (na != nb) return na ? -1 : 1;
  int magnitude = 0;
  if (wa.size() != wb.size()) {
    magnitude = wa.size() < wb.size() ? -1 : 1;
  } else if (wa != wb) {
    magnitude = wa < wb ? -1 : 1;
  } else if (fa != fb) {
    magnitude = fa < fb ? -1 : 1;
  }
  return na ? -magnitude : magnitude;
}

// A bound's value as a decimal text: its shortest decimal where that has at
// most six fraction digits (xgrammar reads the bound as that decimal), else
// its exact binary value.
std::string BoundText(double v) {
  char buf[600];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
  std::string shortest(buf, r.ptr);
  const size_t dot = shortest.find('.');
  if (dot == std::string::npos || shortest.size() - dot - 1 <= 6) return shortest;
  r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed, 400);
  return std::string(buf, r.ptr);
}

struct Bound {
  double value;
  bool exclusive;
};

// Whether `text` is a number as xgrammar writes a bounded one (no exponent,
// at most six fraction digits, "-0" never, "-0.0" where the range's lower
// bound is below zero) within [lo, hi]: by comparing decimals, not by a
// pattern.
bool NumberIn(const std::string& text, std::optional<Bound> lo, std::optional<Bound> hi) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string body = text.substr(negative ? 1 : 0);
  const size_t dot = body.find('.');
  const std::string whole = body.substr(0, dot);
  const std::string frac = dot == std::string::npos ? "" : body.substr(dot + 1);
  const auto digits = [](const std::string& d) {
    return !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(whole) || (whole.size() > 1 && whole[0] == '0')) return false;
  if (dot != std::string::npos && (!digits(frac) || frac.size() > 6)) return false;
  const bool zero = whole == "0" && frac.find_first_not_of('0') == std::string::npos;
  if (zero && negative && (frac.empty() || (lo && lo->value >= 0))) return false;
  if (lo) {
    const int c = CompareDecimal(text, BoundText(lo->value));
    if (c < 0 || (c == 0 && lo->exclusive)) return false;
  }
  if (hi) {
    const int c = CompareDecimal(text, BoundText(hi->value));
    if (c > 0 || (c == 0 && hi->exclusive)) return false;
  }
  return true;
}

TEST(JsonMatcherTest, NumbersHoldTheirBoundsAsXgrammarHoldsThem) {
  using Range = std::pair<std::optional<Bound>, std::optional<Bound>>;
  const std::vector<Range> ranges = {
      {Bound{0, false}, Bound{1, false}},
      {Bound{0, true}, Bound{1, true}},
      {Bound{-1.5, false}, Bound{2.25, true}},
      {Bound{0.1, false}, Bound{0.3, false}},
      {Bound{0.1 + 0.2, false}, Bound{1, false}},  // 0.30000000000000004: off the grid
      {Bound{1e-7, false}, Bound{1e-5, false}},
      {Bound{-1e-9, true}, Bound{0.5, false}},
      {Bound{-5, false}, Bound{-1e-7, false}},
      {Bound{-0.0000015, false}, Bound{0, true}},
      {Bound{0, false}, std::nullopt},
      {std::nullopt, Bound{0, true}},
      {std::nullopt, Bound{-2.5, false}},
      {Bound{1234.5678, false}, std::nullopt},
      {Bound{5, false}, Bound{5, false}},
      {Bound{-3.25, false}, Bound{-3.25, false}},
      {Bound{99.999999, false}, Bound{100.000001, false}},
      {Bound{-123.4567891, false}, Bound{4567.125, false}},
      {Bound{1e12, false}, Bound{1e12 + 0.5, true}},
      {Bound{-1e15, false}, Bound{-1e15 + 3, false}},
  };
  std::mt19937_64 rng(3);
  for (const auto& [lo, hi] : ranges) {
    Json schema = {{"type", "number"}};
    if (lo) schema[lo->exclusive ? "exclusiveMinimum" : "minimum"] = lo->value;
    if (hi) schema[hi->exclusive ? "exclusiveMaximum" : "maximum"] = hi->value;
    const auto compiled = Compile(schema.dump());
    ASSERT_NE(compiled, nullptr) << schema.dump();
    std::vector<std::string> texts = {"0",         "0.0",  "0.000000", "0.0000000", "-0",  "-0.0",
                                      "-0.000000", "00.5", "1.",       ".5",        "1e2", "+1",
                                      "01",        "-",    "1.5e0",    "-0.5",      "0.5", "2.25"};
    const double a = lo ? lo->value : (hi ? hi->value - 50 : -50);
    const double b = hi ? hi->value : a + 100;
    for (double v : {a, b}) {
      for (int k = -3; k <= 3; ++k) {
        for (int digits : {0, 1, 3, 6, 7}) {
          char buf[64];
          const auto r =
              std::to_chars(buf, buf + sizeof(buf), v + k * 1e-6 * (digits == 7 ? 0.1 : 1),
                            std::chars_format::fixed, digits);
          texts.emplace_back(buf, r.ptr);
        }
      }
    }
    for (int i = 0; i < 400; ++i) {
      const double v = a - 2 + (b - a + 4) * std::uniform_real_distribution<double>(0, 1)(rng);
      char buf[64];
      const auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed,
                                   static_cast<int>(rng() % 8));
      texts.emplace_back(buf, r.ptr);
    }
    int in = 0;
    for (const std::string& text : texts) {
      const bool expected = NumberIn(text, lo, hi);
      in += expected ? 1 : 0;
      ASSERT_EQ(Matches(compiled, text), expected) << text << " in " << schema.dump();
    }
    EXPECT_GT(in, 0) << schema.dump();
  }
  // Bounds no number of six fraction digits meets.
  for (const char* empty : {R"({"type": "number", "minimum": 2, "maximum": 1})",
                            R"({"type": "number", "minimum": 1, "exclusiveMaximum": 1})",
                            R"({"type": "number", "minimum": 1.0000001, "maximum": 1.0000009})"}) {
    const auto refused = CompileJsonSchema(Json::parse(empty));
    ASSERT_FALSE(refused.ok()) << empty;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no number")) << empty;
  }
  // A number in an object ends where the object goes on.
  const auto held = Compile(R"({"type": "object", "properties": {
      "p": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["p"]})");
  EXPECT_TRUE(Matches(held, R"({"p": 0.25})"));
  EXPECT_TRUE(Matches(held, R"({"p":1.000000 })"));
  EXPECT_FALSE(Begins(held, R"({"p": 1.0000001)"));
  EXPECT_FALSE(Begins(held, R"({"p": 2)"));
}

}  // namespace
}  // namespace tandem::grammar
