#include "json_numbers.h"

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
  return lo == hi ? std::string(1, lo) : absl::StrCat("[", std::string(1, lo), "-",
                                                      std::string(1, hi), "]");
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

}  // namespace tandem::grammar::internal
