#include "python_lexer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "python_json.h"
#include "tandem/common/utf8.h"

namespace tandem::frontend::internal {

bool PyLexer::IsKeyword(std::string_view name) {
  static const char* const kKeywords[] = {
      "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
      "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
      "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
      "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};
  for (const char* k : kKeywords) {
    if (name == k) return true;
  }
  return false;
}

std::string PyLexer::Quoted(std::string_view text) const { return PyJsonQuote(text, ascii_); }

// Skips what separates tokens: spaces, comments and line continuations,
// and inside brackets newlines too.
void PyLexer::Space() {
  while (!AtEnd()) {
    const char c = Peek();
    if (c == ' ' || c == '\t' || c == '\f' || (depth_ > 0 && (c == '\n' || c == '\r'))) {
      ++i_;
    } else if (c == '\\' && (Peek(1) == '\n' || Peek(1) == '\r')) {
      i_ += Peek(1) == '\r' && Peek(2) == '\n' ? 3 : 2;
      if (AtEnd()) eof_in_continuation_ = true;  // Python: unexpected EOF
    } else if (c == '#') {
      while (!AtEnd() && Peek() != '\n' && Peek() != '\r') ++i_;
    } else {
      return;
    }
  }
}

std::optional<std::string> PyLexer::Name() {
  Space();
  if (!IsIdentifierStart(Peek())) return std::nullopt;
  const size_t start = i_;
  while (!AtEnd() && IsIdentifierChar(Peek())) ++i_;
  return std::string(s_.substr(start, i_ - start));
}

// One or more adjacent string literals, joined (Python's implicit
// concatenation). Bytes and f-strings are not read.
std::optional<PyExpr> PyLexer::Strings() {
  std::string value;
  std::optional<bool> bytes;  // all str or all bytes: Python refuses a mix
  for (;;) {
    // Prefixes r, u, b, br and rb; f-strings are not read.
    std::string prefix;
    while (IsIdentifierChar(Peek())) {
      prefix += static_cast<char>(Peek() | 0x20);
      ++i_;
    }
    if (prefix != "" && prefix != "r" && prefix != "u" && prefix != "b" && prefix != "br" &&
        prefix != "rb") {
      return std::nullopt;
    }
    const bool is_bytes = prefix.find('b') != std::string::npos;
    if (bytes && *bytes != is_bytes) return std::nullopt;
    bytes = is_bytes;
    if (!String(prefix.find('r') != std::string::npos, &value)) return std::nullopt;
    Space();
    size_t n = 0;
    while (IsIdentifierChar(Peek(n))) ++n;
    if (n > 2 || (Peek(n) != '"' && Peek(n) != '\'')) break;
  }
  if (*bytes) {  // json.dumps cannot write bytes; as a key, equal only to bytes
    for (char c : value) {
      if (static_cast<unsigned char>(c) >= 0x80) return std::nullopt;  // ASCII only
    }
    return PyExpr{.kind = PyExpr::Kind::kConstant, .key_identity = "b" + value, .dumpable = false};
  }
  return PyExpr{.kind = PyExpr::Kind::kConstant,
                .json = Quoted(value),
                .key_identity = "s" + value,
                .key_text = value};
}

bool PyLexer::String(bool raw, std::string* out) {
  const char q = Peek();
  const bool triple = Peek(1) == q && Peek(2) == q;
  i_ += triple ? 3 : 1;
  for (;;) {
    if (AtEnd()) return false;
    const char c = Peek();
    if (c == q && (!triple || (Peek(1) == q && Peek(2) == q))) {
      i_ += triple ? 3 : 1;
      return true;
    }
    if ((c == '\n' || c == '\r') && !triple) return false;
    if (c != '\\') {
      *out += c;
      ++i_;
      continue;
    }
    if (raw) {  // the backslash stays, and keeps the next character in
      if (i_ + 1 >= s_.size()) return false;
      *out += c;
      *out += Peek(1);
      i_ += 2;
      continue;
    }
    if (!Escape(out)) return false;
  }
}

// A backslash escape of a plain string at i_.
bool PyLexer::Escape(std::string* out) {
  if (i_ + 1 >= s_.size()) return false;
  const char e = Peek(1);
  i_ += 2;
  switch (e) {
    case '\n':
      return true;
    case '\r':
      if (Peek() == '\n') ++i_;
      return true;
    case '\\':
    case '\'':
    case '"':
      *out += e;
      return true;
    case 'a':
      *out += '\a';
      return true;
    case 'b':
      *out += '\b';
      return true;
    case 'f':
      *out += '\f';
      return true;
    case 'n':
      *out += '\n';
      return true;
    case 'r':
      *out += '\r';
      return true;
    case 't':
      *out += '\t';
      return true;
    case 'v':
      *out += '\v';
      return true;
    case 'x':
      return Hex(2, out);
    case 'u':
      return Hex(4, out);
    case 'U':
      return Hex(8, out);
    case 'N':
      return false;  // \N{name}: no table of Unicode's names here
    default:
      break;
  }
  if (e >= '0' && e <= '7') {
    uint32_t cp = static_cast<uint32_t>(e - '0');
    for (int k = 0; k < 2 && Peek() >= '0' && Peek() <= '7'; ++k, ++i_) {
      cp = cp * 8 + static_cast<uint32_t>(Peek() - '0');
    }
    AppendUtf8(cp, out);
    return true;
  }
  *out += '\\';  // an unknown escape keeps its backslash
  --i_;
  return true;
}

bool PyLexer::Hex(int digits, std::string* out) {
  uint32_t cp = 0;
  for (int k = 0; k < digits; ++k) {
    const char h = Peek();
    int v = -1;
    if (IsDigit(h)) v = h - '0';
    if (h >= 'a' && h <= 'f') v = h - 'a' + 10;
    if (h >= 'A' && h <= 'F') v = h - 'A' + 10;
    if (v < 0) return false;
    cp = cp * 16 + static_cast<uint32_t>(v);
    ++i_;
  }
  // Surrogates (a lone half is no UTF-8) and past Unicode: not read.
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  AppendUtf8(cp, out);
  return true;
}

// Digits with single underscores between them, in base `base` (after
// 0x, 0o or 0b one underscore may lead). nullopt: an underscore that
// no digit follows.
std::optional<std::string> PyLexer::Digits(int base, bool after_prefix) {
  auto digit = [&](char c) {
    if (base == 16) return IsDigit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
    return c >= '0' && c < static_cast<char>('0' + std::min(base, 10));
  };
  std::string digits;
  if (after_prefix && Peek() == '_' && digit(Peek(1))) ++i_;
  while (digit(Peek())) {
    digits += Peek();
    ++i_;
    if (Peek() == '_') {
      if (!digit(Peek(1))) return std::nullopt;  // 1_ or 1__2
      ++i_;
    }
  }
  return digits;
}

std::optional<PyExpr> PyLexer::Number() {
  std::string text;  // as strtod reads it
  bool is_float = false;
  if (Peek() == '0' && std::string_view("xXoObB").find(Peek(1)) != std::string_view::npos) {
    const char p = static_cast<char>(Peek(1) | 0x20);
    const int base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
    i_ += 2;
    std::optional<std::string> digits = Digits(base, /*after_prefix=*/true);
    if (!digits || digits->empty() || IsIdentifierChar(Peek()) || IsDigit(Peek())) {
      return std::nullopt;
    }
    return Integer(*digits, base);
  }
  std::optional<std::string> whole = Digits(10, false);
  if (!whole) return std::nullopt;
  text = *whole;
  if (Peek() == '.') {
    ++i_;
    is_float = true;
    std::optional<std::string> fraction = Digits(10, false);
    if (!fraction || (whole->empty() && fraction->empty())) return std::nullopt;
    text += "." + *fraction;
  }
  if (Peek() == 'e' || Peek() == 'E') {
    const size_t k = Peek(1) == '+' || Peek(1) == '-' ? 2 : 1;
    if (!IsDigit(Peek(k))) return std::nullopt;
    const std::string sign = k == 2 ? std::string(1, Peek(1)) : "";
    i_ += k;
    std::optional<std::string> exponent = Digits(10, false);
    if (!exponent) return std::nullopt;
    is_float = true;
    text += "e" + sign + *exponent;
  }
  if (Peek() == 'j' || Peek() == 'J') {  // complex: no JSON; 0j is the key 0
    ++i_;
    if (IsIdentifierChar(Peek())) return std::nullopt;
    const bool zero = std::strtod(text.c_str(), nullptr) == 0.0;
    return PyExpr{.kind = PyExpr::Kind::kConstant,
                  .key_identity = zero ? "n0" : "c" + text,
                  .dumpable = false};
  }
  if (IsIdentifierChar(Peek())) return std::nullopt;  // 1abc
  if (!is_float) {
    // Python refuses leading zeros on a non-zero integer (0777).
    if (whole->size() > 1 && (*whole)[0] == '0' &&
        whole->find_first_not_of('0') != std::string::npos) {
      return std::nullopt;
    }
    return Integer(*whole, 10);
  }
  const double value = std::strtod(text.c_str(), nullptr);
  const std::string repr = PythonFloatRepr(value);
  std::string identity = "f" + repr;
  if (std::isfinite(value) && value == std::floor(value) && std::abs(value) < 9.2e18) {
    identity = absl::StrCat("n", static_cast<int64_t>(value));  // 1.0 is the key 1
  }
  return PyExpr{
      .kind = PyExpr::Kind::kConstant, .json = repr, .key_identity = identity, .key_text = repr};
}

std::optional<PyExpr> PyLexer::Integer(const std::string& digits, int base) {
  uint64_t value = 0;
  for (char c : digits) {
    const int d = IsDigit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
    if (value > (UINT64_MAX - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) {
      return std::nullopt;  // past 64 bits
    }
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  const std::string decimal = absl::StrCat(value);
  return PyExpr{.kind = PyExpr::Kind::kConstant,
                .json = decimal,
                .key_identity = "n" + decimal,
                .key_text = decimal};
}

}  // namespace tandem::frontend::internal
