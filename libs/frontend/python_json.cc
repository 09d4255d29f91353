#include "python_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tandem/common/nesting.h"
#include "tandem/common/utf8.h"

namespace tandem::frontend::internal {
namespace {

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Python's json scanner (py_scanstring, _scan_once) over UTF-8 bytes.
class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}

  std::optional<PyJson> Value(size_t* i) {
    // Python's scanner recurses and raises RecursionError about 1,000 deep;
    // the stack here would overflow first.
    const Nesting nest(depth_);
    if (depth_ > kMaxDepth || *i >= s_.size()) return std::nullopt;
    const char c = s_[*i];
    if (c == '"') {
      ++*i;
      PyJson v{.type = PyJson::Type::kString};
      if (!String(i, &v.text)) return std::nullopt;
      return v;
    }
    if (c == '{') return Object(i);
    if (c == '[') return Array(i);
    for (const auto& [word, type, text] :
         {std::tuple{"null", PyJson::Type::kNull, ""}, {"true", PyJson::Type::kBool, "true"},
          {"false", PyJson::Type::kBool, "false"}, {"NaN", PyJson::Type::kNumber, "NaN"},
          {"Infinity", PyJson::Type::kNumber, "Infinity"},
          {"-Infinity", PyJson::Type::kNumber, "-Infinity"}}) {
      if (s_.substr(*i).starts_with(word)) {
        *i += std::string_view(word).size();
        return PyJson{.type = type, .text = text};
      }
    }
    return Number(i);
  }

 private:
  void Space(size_t* i) const {
    while (*i < s_.size() && IsJsonSpace(s_[*i])) ++*i;
  }

  // NUMBER_RE = (-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?: an int without
  // a fraction or exponent (any size), else a float.
  std::optional<PyJson> Number(size_t* i) const {
    const size_t start = *i;
    size_t k = start;
    if (k < s_.size() && s_[k] == '-') ++k;
    if (k >= s_.size() || !IsDigit(s_[k])) return std::nullopt;
    if (s_[k] == '0') {
      ++k;
    } else {
      while (k < s_.size() && IsDigit(s_[k])) ++k;
    }
    const size_t int_end = k;
    bool is_float = false;
    if (k + 1 < s_.size() && s_[k] == '.' && IsDigit(s_[k + 1])) {
      k += 2;
      while (k < s_.size() && IsDigit(s_[k])) ++k;
      is_float = true;
    }
    if (k < s_.size() && (s_[k] == 'e' || s_[k] == 'E')) {
      size_t e = k + 1;
      if (e < s_.size() && (s_[e] == '+' || s_[e] == '-')) ++e;
      if (e < s_.size() && IsDigit(s_[e])) {
        while (e < s_.size() && IsDigit(s_[e])) ++e;
        k = e;
        is_float = true;
      }
    }
    *i = k;
    const std::string text(s_.substr(start, k - start));
    if (is_float) {
      return PyJson{.type = PyJson::Type::kNumber,
                    .text = PythonFloatRepr(std::strtod(text.c_str(), nullptr))};
    }
    // int("-0") is 0.
    std::string digits(s_.substr(start, int_end - start));
    if (digits == "-0") digits = "0";
    return PyJson{.type = PyJson::Type::kNumber, .text = std::move(digits)};
  }

  // After the opening quote, through the closing one.
  bool String(size_t* i, std::string* out) const {
    for (;;) {
      if (*i >= s_.size()) return false;
      const char c = s_[*i];
      if (c == '"') {
        ++*i;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return false;  // strict: no control characters
      if (c != '\\') {
        *out += c;
        ++*i;
        continue;
      }
      if (*i + 1 >= s_.size()) return false;
      const char e = s_[*i + 1];
      *i += 2;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          *out += e;
          continue;
        case 'b':
          *out += '\b';
          continue;
        case 'f':
          *out += '\f';
          continue;
        case 'n':
          *out += '\n';
          continue;
        case 'r':
          *out += '\r';
          continue;
        case 't':
          *out += '\t';
          continue;
        case 'u':
          break;
        default:
          return false;
      }
      std::optional<uint32_t> cp = Hex4(*i);
      if (!cp) return false;
      *i += 4;
      if (*cp >= 0xD800 && *cp <= 0xDBFF && *i + 1 < s_.size() && s_[*i] == '\\' &&
          s_[*i + 1] == 'u') {  // a pair's halves join
        std::optional<uint32_t> low = Hex4(*i + 2);
        if (low && *low >= 0xDC00 && *low <= 0xDFFF) {
          *i += 6;
          *cp = 0x10000 + ((*cp - 0xD800) << 10) + (*low - 0xDC00);
        }
      }
      // A lone half stays, as Python keeps it, written as its three bytes
      // (WTF-8: no UTF-8 text holds them); json.dumps' result would then
      // not encode, so PyJsonDumps refuses it.
      AppendUtf8(*cp, out);
    }
  }

  std::optional<uint32_t> Hex4(size_t at) const {
    if (at + 4 > s_.size()) return std::nullopt;
    uint32_t v = 0;
    for (size_t k = at; k < at + 4; ++k) {
      const char h = s_[k];
      int d = -1;
      if (IsDigit(h)) d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) return std::nullopt;
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // Whether s_[*i] is `c`; if so, steps past it.
  bool Take(size_t* i, char c) const {
    if (*i >= s_.size() || s_[*i] != c) return false;
    ++*i;
    return true;
  }
  // Take(i, c) and the whitespace after it.
  bool TakeThenSpace(size_t* i, char c) const {
    if (!Take(i, c)) return false;
    Space(i);
    return true;
  }

  std::optional<PyJson> Object(size_t* i) {
    TakeThenSpace(i, '{');
    PyJson out{.type = PyJson::Type::kObject};
    if (Take(i, '}')) return out;
    // dict(pairs): a repeated key keeps its first place, takes the last value.
    std::unordered_map<std::string, size_t> index;
    for (;;) {
      std::string key;
      if (!Take(i, '"') || !String(i, &key)) return std::nullopt;
      Space(i);
      if (!TakeThenSpace(i, ':')) return std::nullopt;
      std::optional<PyJson> value = Value(i);
      if (!value) return std::nullopt;
      if (auto [it, added] = index.try_emplace(key, out.members.size()); !added) {
        out.members[it->second].value = *std::move(value);
      } else {
        out.members.push_back({std::move(key), *std::move(value)});
      }
      Space(i);
      if (Take(i, '}')) return out;
      if (!TakeThenSpace(i, ',')) return std::nullopt;
    }
  }

  std::optional<PyJson> Array(size_t* i) {
    TakeThenSpace(i, '[');
    PyJson out{.type = PyJson::Type::kArray};
    if (Take(i, ']')) return out;
    for (;;) {
      std::optional<PyJson> value = Value(i);
      if (!value) return std::nullopt;
      out.items.push_back(*std::move(value));
      Space(i);
      if (Take(i, ']')) return out;
      if (!TakeThenSpace(i, ',')) return std::nullopt;
    }
  }

  static constexpr int kMaxDepth = 1000;

  std::string_view s_;
  int depth_ = 0;  // Value() calls on the stack
};

// The next code point of valid UTF-8 at s[*i] (U+FFFD for a bad byte).
uint32_t NextCodePoint(std::string_view s, size_t* i) {
  const unsigned char c = static_cast<unsigned char>(s[*i]);
  const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || *i + static_cast<size_t>(n) > s.size()) {
    ++*i;
    return 0xFFFD;
  }
  uint32_t cp = n == 1 ? c : c & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  *i += static_cast<size_t>(n);
  return cp;
}

// Whether `s` holds a lone surrogate (WTF-8's ED A0..BF).
bool HasLoneSurrogate(std::string_view s) {
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (static_cast<unsigned char>(s[i]) == 0xED &&
        (static_cast<unsigned char>(s[i + 1]) & 0xE0) == 0xA0) {
      return true;
    }
  }
  return false;
}

// false: a string or key holds a lone surrogate.
bool Dump(const PyJson& v, bool ascii, std::string* out) {
  switch (v.type) {
    case PyJson::Type::kNull:
      *out += "null";
      return true;
    case PyJson::Type::kBool:
    case PyJson::Type::kNumber:
      *out += v.text;
      return true;
    case PyJson::Type::kString:
      *out += PyJsonQuote(v.text, ascii);
      return !HasLoneSurrogate(v.text);
    case PyJson::Type::kArray:
      *out += '[';
      for (size_t k = 0; k < v.items.size(); ++k) {
        if (k > 0) *out += ", ";
        if (!Dump(v.items[k], ascii, out)) return false;
      }
      *out += ']';
      return true;
    case PyJson::Type::kObject:
      *out += '{';
      for (size_t k = 0; k < v.members.size(); ++k) {
        if (k > 0) *out += ", ";
        if (HasLoneSurrogate(v.members[k].key)) return false;
        *out += PyJsonQuote(v.members[k].key, ascii);
        *out += ": ";
        if (!Dump(v.members[k].value, ascii, out)) return false;
      }
      *out += '}';
      return true;
  }
  return false;
}

}  // namespace

const PyJson* PyJson::Find(std::string_view key) const {
  for (const auto& [k, v] : members) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::optional<std::pair<PyJson, size_t>> PyJsonRawDecode(std::string_view text, size_t pos) {
  size_t i = pos;
  std::optional<PyJson> v = Scanner(text).Value(&i);
  if (!v) return std::nullopt;
  return std::pair{*std::move(v), i};
}

std::optional<PyJson> PyJsonLoads(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && IsJsonSpace(text[i])) ++i;
  std::optional<PyJson> v = Scanner(text).Value(&i);
  while (i < text.size() && IsJsonSpace(text[i])) ++i;
  if (!v || i != text.size()) return std::nullopt;  // "Extra data"
  return v;
}

std::optional<std::string> PyJsonDumps(const PyJson& value, bool ensure_ascii) {
  std::string out;
  if (!Dump(value, ensure_ascii, &out)) return std::nullopt;
  return out;
}

bool PyJsonHasLoneSurrogate(std::string_view utf8) { return HasLoneSurrogate(utf8); }

std::string PyJsonQuote(std::string_view utf8, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < utf8.size();) {
    const char c = utf8[i];
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      default:
        break;
    }
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", u);
      ++i;
    } else if (!ensure_ascii || u < 0x7F) {
      out += c;
      ++i;
    } else {  // ensure_ascii: everything past '~' as \u escapes, pairs past U+FFFF
      const uint32_t cp = NextCodePoint(utf8, &i);
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        absl::StrAppendFormat(&out, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        absl::StrAppendFormat(&out, "\\u%04x", cp);
      }
    }
  }
  return out + "\"";
}

std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  // The shortest digits that read back, as d.ddde+XX.
  const auto [end, ec] =
      std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(end - buf));
  std::string sign;
  if (sci.front() == '-') {
    sign = "-";
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int exponent = std::atoi(std::string(sci.substr(e + 1)).c_str());
  const int point = exponent + 1;  // the digits read as 0.d1d2... * 10^point
  if (point <= -4 || point > 16) {
    std::string mantissa = digits.substr(0, 1);
    if (digits.size() > 1) mantissa += "." + digits.substr(1);
    return absl::StrCat(sign, mantissa, "e", exponent < 0 ? "-" : "+",
                        std::abs(exponent) < 10 ? "0" : "", std::abs(exponent));
  }
  if (point <= 0) {
    return absl::StrCat(sign, "0.", std::string(static_cast<size_t>(-point), '0'), digits);
  }
  if (static_cast<size_t>(point) >= digits.size()) {
    return absl::StrCat(sign, digits, std::string(static_cast<size_t>(point) - digits.size(), '0'),
                        ".0");
  }
  return absl::StrCat(sign, digits.substr(0, static_cast<size_t>(point)), ".",
                      digits.substr(static_cast<size_t>(point)));
}

}  // namespace tandem::frontend::internal
