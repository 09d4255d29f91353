// The tokens of the Python that vLLM's pythonic tool parsers read
// (pythonic_tool_calls.h): what separates tokens (spaces, comments, line
// continuations, and newlines inside brackets), names, and literals as
// Python reads them (string prefixes, escapes, triple quotes and adjacent
// literals; integers in four bases with underscores; floats; complex) with
// the JSON json.dumps writes for them. PyReader (pythonic_tool_calls.cc)
// builds the grammar on top.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/frontend/tool_calls.h"

namespace tandem::frontend::internal {

// One parsed expression: what vLLM's _get_parameter_value makes of it.
struct PyExpr {
  enum class Kind {
    kConstant,  // a str, int, float, True, False or None
    kLiteral,   // a list or dict of literals, with constant keys
    kOther,     // anything else Python parses (a name, a tuple, -1, ...)
  };
  Kind kind = Kind::kOther;
  std::string json;  // kConstant and kLiteral: json.dumps of the value
  // kConstant as a dict key: Python's identity of the key (1, 1.0 and True
  // are one key) and the string json.dumps writes for it.
  std::string key_identity, key_text;
  // False for a constant json.dumps cannot write (bytes, a complex number,
  // ...), or a literal holding one: it fails only where it is written.
  bool dumpable = true;
  std::optional<std::string> name;  // a plain name
  // A call of a plain name whose keyword arguments are literals: the name
  // and json.dumps of those arguments.
  std::optional<ToolCall> call;
  // A list whose every element is such a call: the calls.
  std::optional<std::vector<ToolCall>> calls;
  bool IsLiteral() const { return kind != Kind::kOther; }
};

// Reads tokens at s_[i_]; a method that returns nullopt (or false) met what
// Python would refuse or this does not read.
class PyLexer {
 public:
  // `ensure_ascii`: json.dumps' flag for the strings this writes.
  PyLexer(std::string_view text, bool ensure_ascii) : s_(text), ascii_(ensure_ascii) {}

 protected:
  static bool IsIdentifierStart(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           static_cast<unsigned char>(c) >= 0x80;
  }
  static bool IsIdentifierChar(char c) { return IsIdentifierStart(c) || IsDigit(c); }
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  static bool IsKeyword(std::string_view name);

  bool AtEnd() const { return i_ >= s_.size(); }
  char Peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }
  // Skips what separates tokens: spaces, comments and line continuations,
  // and inside brackets newlines too.
  void Space();
  // Space(), then `c` if it is next.
  bool Eat(char c) {
    Space();
    if (Peek() != c) return false;
    ++i_;
    return true;
  }
  std::optional<std::string> Name();
  // json.dumps of a string, with the reader's ensure_ascii.
  std::string Quoted(std::string_view text) const;
  // One or more adjacent string literals, joined (Python's implicit
  // concatenation); bytes are a constant json.dumps cannot write.
  std::optional<PyExpr> Strings();
  // An int, a float or a complex number (no JSON).
  std::optional<PyExpr> Number();

  std::string_view s_;
  bool ascii_;
  size_t i_ = 0;
  int depth_ = 0;                     // open brackets: newlines inside them separate nothing
  bool eof_in_continuation_ = false;  // Python: unexpected EOF

 private:
  bool String(bool raw, std::string* out);
  bool Escape(std::string* out);
  bool Hex(int digits, std::string* out);
  std::optional<std::string> Digits(int base, bool after_prefix);
  std::optional<PyExpr> Integer(const std::string& digits, int base);
};

}  // namespace tandem::frontend::internal
