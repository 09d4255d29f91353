// The pattern parser of structured outputs' regexes (regex.h says which
// patterns it holds): UTF-8 text to a syntax tree over codepoint ranges,
// which regex.cc builds an automaton from.
#include "regex_parse.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::grammar::internal {
namespace {

using Ast = RegexAst;

// Repetition counts above this are refused.
constexpr int64_t kMaxCount = 100000;
// Groups nested deeper are refused (the parser and the NFA recurse).
constexpr int kMaxDepth = 200;

Ranges Normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const Range& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

Ranges Complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const Range& x : Normalized(r)) {
    if (x.first > next) out.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return out;
}

const Ranges kDigits = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}};  // \t \n \v \f \r
const Ranges kJsonPatternSpace = {{'\t', '\r'}, {' ', ' '}};

bool IsHex(uint32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
uint32_t HexValue(uint32_t c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
bool IsAsciiAlnum(uint32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

class Parser {
 public:
  Parser(std::vector<uint32_t> cps, RegexDialect dialect)
      : cps_(std::move(cps)), json_(dialect == RegexDialect::kJsonStringPattern) {}

  absl::StatusOr<Ast> Parse() {
    size_t end = cps_.size();
    if (end > 0 && cps_[0] == '^') pos_ = 1;
    // A final unescaped '$' (an even run of backslashes before it).
    if (end > pos_ && cps_[end - 1] == '$') {
      size_t slashes = 0;
      while (end - 1 - slashes > pos_ && cps_[end - 2 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) --end;
    }
    end_ = end;
    Ast ast = Alternation();
    if (!error_.ok()) return error_;
    if (pos_ < end_) {
      Fail("')' without a '('");
      return error_;
    }
    return ast;
  }

 private:
  bool AtEnd() const { return pos_ >= end_ || !error_.ok(); }
  uint32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < end_ ? cps_[pos_ + ahead] : 0xFFFFFFFF;
  }
  // Records the first error; false, for `return Fail(...)`.
  bool Fail(std::string_view what) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("regex: ", std::string(what), " at character ", pos_ + 1));
    }
    return false;
  }

  Ast Alternation() {
    Ast alt{.op = Ast::kAlt};
    alt.kids.push_back(Concatenation());
    while (!AtEnd() && Peek() == '|') {
      ++pos_;
      alt.kids.push_back(Concatenation());
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  Ast Concatenation() {
    Ast cat{.op = Ast::kConcat};
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      Ast atom = Atom();
      if (!error_.ok()) break;
      cat.kids.push_back(Quantified(std::move(atom)));
    }
    if (cat.kids.size() == 1) return std::move(cat.kids[0]);
    return cat;
  }

  // `atom` with the quantifier that follows it, if any.
  Ast Quantified(Ast atom) {
    if (AtEnd()) return atom;
    int64_t min = 0, max = -1;
    const uint32_t c = Peek();
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      min = 1;
      ++pos_;
    } else if (c == '?') {
      max = 1;
      ++pos_;
    } else if (c == '{') {
      if (!Counts(&min, &max)) return atom;
    } else {
      return atom;
    }
    if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same strings
    if (!AtEnd() && (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{')) {
      Fail("two quantifiers in a row");
      return atom;
    }
    Ast rep{.op = Ast::kRepeat, .min = min, .max = max};
    rep.kids.push_back(std::move(atom));
    return rep;
  }

  // {n}, {n,}, {n,m} (xgrammar needs the n).
  bool Counts(int64_t* min, int64_t* max) {
    ++pos_;
    const auto number = [&](int64_t* out) {
      if (AtEnd() || Peek() < '0' || Peek() > '9') return false;
      *out = 0;
      while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
        *out = std::min(*out * 10 + (Peek() - '0'), kMaxCount + 1);
        ++pos_;
      }
      return true;
    };
    if (!number(min)) return Fail("'{' not followed by a count ({n}, {n,} or {n,m})");
    *max = *min;
    if (!AtEnd() && Peek() == ',') {
      ++pos_;
      *max = -1;
      if (!AtEnd() && Peek() != '}' && !number(max)) {
        return Fail("a malformed {n,m}");
      }
    }
    if (AtEnd() || Peek() != '}') return Fail("a '{' without its '}'");
    ++pos_;
    if (*min > kMaxCount || *max > kMaxCount) {
      return Fail(absl::StrCat("a count above ", kMaxCount));
    }
    if (*max >= 0 && *max < *min) return Fail("{n,m} with m below n");
    return true;
  }

  Ast Set(Ranges r) { return Ast{.op = Ast::kSet, .set = Normalized(std::move(r))}; }

  Ast Atom() {
    const uint32_t c = Peek();
    switch (c) {
      case '(':
        return Group();
      case '[':
        return Class();
      case '.':
        ++pos_;
        return Set({{0, kMaxCodepoint}});
      case '*':
      case '+':
      case '?':
      case '{':
        Fail("a quantifier with nothing before it to repeat");
        return {};
      case '^':
      case '$':
        Fail("'^' or '$' other than first or last in the pattern");
        return {};
      case '\\': {
        Ranges r;
        if (!Escape(/*in_class=*/false, &r)) return {};
        return Set(std::move(r));
      }
      case ']':
      case '}':
        if (json_) {
          Fail(absl::StrCat("a '", std::string(1, static_cast<char>(c)),
                            "' without its opening bracket (escape it)"));
          return {};
        }
        ++pos_;
        return Set({{c, c}});
      default:
        ++pos_;
        return Set({{c, c}});
    }
  }

  Ast Group() {
    if (++depth_ > kMaxDepth) {
      Fail(absl::StrCat("groups nested deeper than ", kMaxDepth));
      return {};
    }
    const size_t at = pos_;
    ++pos_;
    if (!AtEnd() && Peek() == '?') {
      ++pos_;
      if (Peek() == ':') {
        ++pos_;
      } else if (Peek() == '=' || Peek() == '!' ||
                 (Peek() == '<' && (Peek(1) == '=' || Peek(1) == '!'))) {
        pos_ = at;
        Fail("lookaround (?=, (?!, (?<=, (?<!");
        return {};
      } else if (Peek() == '<') {
        ++pos_;
        while (!AtEnd() && IsAsciiAlnum(Peek()) && !(Peek() >= '0' && Peek() <= '9')) ++pos_;
        if (AtEnd() || Peek() != '>') {
          pos_ = at;
          Fail("a malformed (?<name>...) group");
          return {};
        }
        ++pos_;
      } else {
        pos_ = at;
        Fail("a '(?' group other than (?:...) and (?<name>...) (flags, (?P...))");
        return {};
      }
    }
    Ast inner = Alternation();
    if (!error_.ok()) return {};
    if (AtEnd() || Peek() != ')') {
      Fail("a '(' without its ')'");
      return {};
    }
    ++pos_;
    --depth_;
    return inner;
  }

  Ast Class() {
    ++pos_;
    bool negated = false;
    if (!AtEnd() && Peek() == '^') {
      negated = true;
      ++pos_;
    }
    if (!AtEnd() && Peek() == ']') {
      Fail("an empty class '[]'");
      return {};
    }
    Ranges ranges;
    while (!AtEnd() && Peek() != ']') {
      uint32_t lo = 0;
      if (!ClassChar(&ranges, &lo)) return {};
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < end_) {
        if (lo == 0xFFFFFFFF) {
          Fail("a range with a class (\\d, \\w, \\s...) at its end");
          return {};
        }
        ++pos_;
        Ranges unused;
        uint32_t hi = 0;
        if (!ClassChar(&unused, &hi)) return {};
        if (hi == 0xFFFFFFFF) {
          Fail("a range with a class (\\d, \\w, \\s...) at its end");
          return {};
        }
        if (hi < lo) {
          Fail("a range whose end is below its start");
          return {};
        }
        ranges.back() = {lo, hi};
      }
    }
    if (AtEnd()) {
      Fail("a '[' without its ']'");
      return {};
    }
    ++pos_;
    return Set(negated ? Complement(ranges) : std::move(ranges));
  }

  // One member of a class, added to `ranges`; `*single` is the character, or
  // 0xFFFFFFFF for a class escape.
  bool ClassChar(Ranges* ranges, uint32_t* single) {
    const size_t before = ranges->size();
    if (Peek() == '\\') {
      if (!Escape(/*in_class=*/true, ranges)) return false;
    } else {
      ranges->push_back({Peek(), Peek()});
      ++pos_;
    }
    const bool one =
        ranges->size() == before + 1 && (*ranges)[before].first == (*ranges)[before].second;
    *single = one ? (*ranges)[before].first : 0xFFFFFFFF;
    return true;
  }

  // A backslash escape, appended to `out` as ranges.
  bool Escape(bool in_class, Ranges* out) {
    const size_t at = pos_;
    ++pos_;
    if (AtEnd()) return Fail("a '\\' at the end of the pattern");
    const uint32_t c = Peek();
    ++pos_;
    const auto add = [&](const Ranges& r) {
      out->insert(out->end(), r.begin(), r.end());
      return true;
    };
    const auto one = [&](uint32_t cp) { return add({{cp, cp}}); };
    switch (c) {
      case 'd':
        return add(kDigits);
      case 'D':
        return add(Complement(kDigits));
      case 'w':
        return add(kWord);
      case 'W':
        return add(Complement(kWord));
      case 's':
        return add(json_ ? kJsonPatternSpace : kSpace);
      case 'S':
        return add(Complement(json_ ? kJsonPatternSpace : kSpace));
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 't':
        return one('\t');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'a':
        return one('\a');
      case 'e':
        return one(0x1B);
      case '0':
        if (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
          pos_ = at;
          return Fail("an octal escape (\\0 followed by a digit)");
        }
        return one(0);
      case 'b':
        if (in_class) return one('\b');
        pos_ = at;
        return Fail("a word boundary (\\b)");
      case 'x':
        if (!IsHex(Peek()) || !IsHex(Peek(1)) || IsHex(Peek(2))) {
          pos_ = at;
          return Fail("\\x with other than two hex digits");
        }
        pos_ += 2;
        return one(HexValue(cps_[pos_ - 2]) * 16 + HexValue(cps_[pos_ - 1]));
      case 'u':
      case 'U': {
        if (c == 'U' && json_) {
          pos_ = at;
          return Fail("\\U in a JSON schema's pattern (write \\u{...})");
        }
        uint32_t cp = 0;
        if (c == 'u' && Peek() == '{') {
          ++pos_;
          size_t digits = 0;
          while (!AtEnd() && IsHex(Peek()) && digits < 7) {
            cp = cp * 16 + HexValue(Peek());
            ++pos_;
            ++digits;
          }
          if (digits == 0 || digits > 6 || AtEnd() || Peek() != '}') {
            pos_ = at;
            return Fail("a malformed \\u{...}");
          }
          ++pos_;
        } else {
          const size_t digits = c == 'u' ? 4 : 8;
          for (size_t i = 0; i < digits; ++i) {
            if (!IsHex(Peek())) {
              pos_ = at;
              return Fail(
                  absl::StrCat("\\", c == 'u' ? "u" : "U", " without ", digits, " hex digits"));
            }
            cp = cp * 16 + HexValue(Peek());
            ++pos_;
          }
        }
        if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
          pos_ = at;
          return Fail("an escape of a surrogate or of a value above U+10FFFF");
        }
        return one(cp);
      }
      case 'c':
        if (AtEnd() || !((Peek() | 0x20) >= 'a' && (Peek() | 0x20) <= 'z')) {
          pos_ = at;
          return Fail("\\c not followed by a letter");
        }
        ++pos_;
        return one(cps_[pos_ - 1] % 32);
      case 'p':
      case 'P':
        pos_ = at;
        return Fail("a Unicode property class (\\p, \\P)");
      case 'k':
        pos_ = at;
        return Fail("a back-reference (\\k)");
      default:
        if (c >= '1' && c <= '9') {
          pos_ = at;
          return Fail("a back-reference (\\1 to \\9)");
        }
        if (IsAsciiAlnum(c)) {
          pos_ = at;
          return Fail(absl::StrCat("the escape \\", std::string(1, static_cast<char>(c)),
                                   ", which dialects read differently"));
        }
        return one(c);  // \. \* \- \" and any other punctuation or character
    }
  }

  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  bool json_ = false;
  size_t end_ = 0;
  int depth_ = 0;
  absl::Status error_;
};

// The pattern as codepoints; INVALID_ARGUMENT when it is not UTF-8.
absl::StatusOr<std::vector<uint32_t>> Codepoints(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = b < 0x80                 ? 1
               : b >= 0xC2 && b <= 0xDF ? 2
               : b >= 0xE0 && b <= 0xEF ? 3
               : b >= 0xF0 && b <= 0xF4 ? 4
                                        : 0;
    uint32_t cp = n == 1 ? b : n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      ok = (c & 0xC0) == 0x80;
      cp = cp << 6 | (c & 0x3F);
    }
    const uint32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : n == 4 ? 0x10000 : 0;
    if (!ok || cp < min || cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return absl::InvalidArgumentError(
          absl::StrCat("regex: the pattern is not valid UTF-8 (byte ", i + 1, ")"));
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

}  // namespace

absl::StatusOr<RegexAst> ParseRegex(std::string_view pattern, RegexDialect dialect) {
  auto cps = Codepoints(pattern);
  if (!cps.ok()) return cps.status();
  if (dialect == RegexDialect::kJsonStringPattern) {
    // xgrammar reads any other pattern with its text reader, which keeps
    // '"', '\' and control characters in the value (not JSON).
    for (size_t i = 0; i < cps->size(); ++i) {
      if ((*cps)[i] < 0x20 || (*cps)[i] > 0x7E) {
        return absl::InvalidArgumentError(
            absl::StrCat("regex: a character other than printable ASCII at character ", i + 1,
                         " (in a JSON schema's pattern, write it as \\u escape)"));
      }
    }
  }
  return Parser(std::move(*cps), dialect).Parse();
}

}  // namespace tandem::grammar::internal
