#include "json_numbers.h"

#include <charconv>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::grammar::internal {
namespace {

// Magnitudes are digit strings without a leading zero ("0" for zero), so
// that |INT64_MIN| needs no wider type.
std::string Magnitude(int64_t v) {
  std::string s = std::to_string(v);
  return s[0] == '-' ? s.substr(1) : s;
}

bool All(std::string_view s, char c) { return s.find_first_not_of(c) == std::string_view::npos; }

std::string Digits(size_t n) { return n == 0 ? "" : absl::StrCat("[0-9]{", n, "}"); }

std::string Class(char lo, char hi) {
  return lo == hi ? std::string(1, lo)
                  : absl::StrCat("[", std::string(1, lo), "-", std::string(1, hi), "]");
}

// The digit strings of a's length from a to b (a <= b, same length), as
// alternatives.
void SameLength(std::string_view a, std::string_view b, const std::string& prefix,
                std::vector<std::string>* out) {
  if (a.empty()) {
    out->push_back(prefix);
    return;
  }
  if (a[0] == b[0]) return SameLength(a.substr(1), b.substr(1), prefix + a[0], out);
  const std::string_view a_rest = a.substr(1), b_rest = b.substr(1);
  char first = a[0], last = b[0];
  // a's first digit with a tail above zeros, and b's with a tail below
  // nines, are their own ranges; the digits between take any tail.
  if (!All(a_rest, '0')) {
    SameLength(a_rest, std::string(a_rest.size(), '9'), prefix + a[0], out);
    ++first;
  }
  const bool b_alone = !All(b_rest, '9');
  if (b_alone) --last;
  if (first <= last) out->push_back(prefix + Class(first, last) + Digits(a_rest.size()));
  if (b_alone) SameLength(std::string(b_rest.size(), '0'), b_rest, prefix + b[0], out);
}

// The magnitudes from lo to hi (hi nullopt: no end), as alternatives.
std::vector<std::string> Magnitudes(const std::string& lo, const std::optional<std::string>& hi) {
  std::vector<std::string> out;
  const size_t longest = hi ? hi->size() : lo.size();
  for (size_t n = lo.size(); n <= longest; ++n) {
    const std::string a = n == lo.size() ? lo : "1" + std::string(n - 1, '0');
    const std::string b = hi && n == hi->size() ? *hi : std::string(n, '9');
    SameLength(a, b, "", &out);
  }
  if (!hi) out.push_back(absl::StrCat("[1-9][0-9]{", lo.size(), ",}"));
  return out;
}

bool Below(const std::string& a, const std::string& b) {
  return a.size() != b.size() ? a.size() < b.size() : a < b;
}

}  // namespace

std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> parts;
  // Negatives: the magnitudes from |min(hi, -1)| to |lo|.
  if (!lo || *lo < 0) {
    const std::string from = hi && *hi < 0 ? Magnitude(*hi) : "1";
    const std::optional<std::string> to =
        lo ? std::optional<std::string>(Magnitude(*lo)) : std::nullopt;
    if (!to || !Below(*to, from)) {
      parts.push_back(absl::StrCat("-(", absl::StrJoin(Magnitudes(from, to), "|"), ")"));
    }
  }
  if ((!lo || *lo <= 0) && (!hi || *hi >= 0)) parts.push_back("0");
  if (!hi || *hi > 0) {
    const std::string from = lo && *lo > 1 ? std::to_string(*lo) : "1";
    const std::optional<std::string> to =
        hi ? std::optional<std::string>(std::to_string(*hi)) : std::nullopt;
    if (!to || !Below(*to, from)) {
      for (std::string& p : Magnitudes(from, to)) parts.push_back(std::move(p));
    }
  }
  return absl::StrCat("(", absl::StrJoin(parts, "|"), ")");
}

namespace {

constexpr int64_t kGrid = 1000000;  // 10^6: six fraction digits

// `v` * 10^6 on the grid, moved inward (up for a lower bound, down for an
// upper one) where v is not on it, and past it where it is but exclusive.
__int128 OnGrid(const NumberBound& b, bool lower) {
  char buf[400];
  // The shortest decimal that reads back as the double.
  const auto shortest = std::to_chars(buf, buf + sizeof(buf), b.value, std::chars_format::fixed);
  const std::string_view text(buf, static_cast<size_t>(shortest.ptr - buf));
  const size_t dot = text.find('.');
  const size_t fraction = dot == std::string_view::npos ? 0 : text.size() - dot - 1;
  const bool negative = text[0] == '-';
  const auto scaled = [&](std::string_view t) {  // a fixed decimal of <= 6 digits, times 10^6
    const size_t d = t.find('.');
    __int128 v = 0;
    for (char c : t.substr(negative ? 1 : 0,
                           d == std::string_view::npos ? t.npos : d - (negative ? 1 : 0))) {
      v = v * 10 + (c - '0');
    }
    std::string frac(d == std::string_view::npos ? "" : t.substr(d + 1));
    frac.resize(6, '0');
    for (char c : frac) v = v * 10 + (c - '0');
    return negative ? -v : v;
  };
  if (fraction <= 6) {
    const __int128 v = scaled(text);
    return b.exclusive ? (lower ? v + 1 : v - 1) : v;
  }
  // Off the grid: the nearest grid point, then inward.
  const auto rounded = std::to_chars(buf, buf + sizeof(buf), b.value, std::chars_format::fixed, 6);
  const std::string_view r(buf, static_cast<size_t>(rounded.ptr - buf));
  const __int128 v = scaled(r);
  const double back = std::strtod(std::string(r).c_str(), nullptr);
  if (lower && back < b.value) return v + 1;
  if (!lower && back > b.value) return v - 1;
  return v;
}

std::string Integer(__int128 v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v > 0);
  return s;
}

// Fractions of 1 to 6 digits (and none, where lo is 0) whose value times
// 10^6 is in [lo, hi], 0 <= lo <= hi < 10^6.
std::vector<std::string> Fractions(int64_t lo, int64_t hi) {
  std::vector<std::string> out;
  if (lo == 0) out.push_back("");
  int64_t unit = kGrid;
  for (int k = 1; k <= 6; ++k) {
    unit /= 10;  // what the k-th digit is worth
    const int64_t first = (lo + unit - 1) / unit, last = hi / unit;
    if (first > last) continue;
    std::string a = std::to_string(first), b = std::to_string(last);
    a.insert(0, static_cast<size_t>(k) - a.size(), '0');
    b.insert(0, static_cast<size_t>(k) - b.size(), '0');
    std::vector<std::string> digits;
    SameLength(a, b, "", &digits);
    out.push_back(absl::StrCat("\\.(", absl::StrJoin(digits, "|"), ")"));
  }
  return out;
}

void WithFractions(const std::string& integer, int64_t lo, int64_t hi,
                   std::vector<std::string>* out) {
  for (const std::string& f : Fractions(lo, hi)) out->push_back(integer + f);
}

// A side of a range on the grid of 10^-6, times 10^6 (GCC cannot see
// through std::optional<__int128>).
struct Scaled {
  bool bounded = false;
  __int128 v = 0;
};

// Magnitudes from lo to hi (10^6 times, lo >= 1).
std::vector<std::string> DecimalMagnitudes(__int128 lo, Scaled hi) {
  std::vector<std::string> out;
  const __int128 int_lo = lo / kGrid;
  const int64_t frac_lo = static_cast<int64_t>(lo % kGrid);
  if (hi.bounded && hi.v / kGrid == int_lo) {
    WithFractions(Integer(int_lo), frac_lo, static_cast<int64_t>(hi.v % kGrid), &out);
    return out;
  }
  WithFractions(Integer(int_lo), frac_lo, kGrid - 1, &out);
  if (!hi.bounded || hi.v / kGrid - 1 >= int_lo + 1) {
    const std::optional<std::string> last =
        hi.bounded ? std::optional<std::string>(Integer(hi.v / kGrid - 1)) : std::nullopt;
    const std::string any = "(\\.[0-9]{1,6})?";
    for (const std::string& m : Magnitudes(Integer(int_lo + 1), last)) {
      out.push_back(absl::StrCat("(", m, ")", any));
    }
  }
  if (hi.bounded) WithFractions(Integer(hi.v / kGrid), 0, static_cast<int64_t>(hi.v % kGrid), &out);
  return out;
}

}  // namespace

std::string NumberRangeRegex(std::optional<NumberBound> lo, std::optional<NumberBound> hi) {
  const Scaled low{lo.has_value(), lo ? OnGrid(*lo, /*lower=*/true) : 0};
  const Scaled high{hi.has_value(), hi ? OnGrid(*hi, /*lower=*/false) : 0};
  if (low.bounded && high.bounded && low.v > high.v) return "";
  std::vector<std::string> parts;
  // Negatives: the magnitudes from max(-high, 1) to -low.
  if (!low.bounded || low.v < 0) {
    const __int128 from = high.bounded && high.v < 0 ? -high.v : 1;
    for (const std::string& m : DecimalMagnitudes(from, {low.bounded, -low.v})) {
      parts.push_back("-" + m);
    }
  }
  if ((!low.bounded || low.v <= 0) && (!high.bounded || high.v >= 0)) {
    parts.push_back("0(\\.0{1,6})?");
    // xgrammar's -0.0 ... -0.000000, where the range's bound is below zero
    // before it is moved to the grid.
    if (!lo || lo->value < 0) parts.push_back("-0\\.0{1,6}");
  }
  if (!high.bounded || high.v > 0) {
    const __int128 from = low.bounded && low.v > 1 ? low.v : 1;
    for (const std::string& m : DecimalMagnitudes(from, high)) parts.push_back(m);
  }
  if (parts.empty()) return "";
  return absl::StrCat("(", absl::StrJoin(parts, "|"), ")");
}

}  // namespace tandem::grammar::internal
