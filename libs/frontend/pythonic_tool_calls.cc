#include "pythonic_tool_calls.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "python_json.h"
#include "re2/re2.h"

namespace tandem::frontend::internal {
namespace {

// vLLM's TOOL_CALL_REGEX, matched at the start (re.match). Python's \w and
// \s on a str are Unicode's; RE2's are ASCII, so they are spelled out.
const RE2& ToolCallPattern() {
  static const RE2* re = [] {
    const std::string w = R"([\p{L}\p{N}_])";
    const std::string s = R"([\t\n\x0b\f\r\x1c-\x1f\x85\p{Z}])";
    const std::string name = "[a-zA-Z]+" + w + "*";
    const std::string pattern =
        absl::StrCat("(?s)^\\[(", name, "\\((", name, "=.*,", s, "*)*(", name, "=.*", s, ")?\\),",
                     s, "*)*(", name, "\\((", name, "=.*,", s, "*)*(", name, "=.*", s, "*)?\\)", s,
                     "*)+\\]");
    return new RE2(pattern);
  }();
  return *re;
}

constexpr std::string_view kPythonStart = "<|python_start|>";
constexpr std::string_view kPythonEnd = "<|python_end|>";

bool IsIdentifierStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool IsIdentifierChar(char c) { return IsIdentifierStart(c) || (c >= '0' && c <= '9'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool IsKeyword(std::string_view name) {
  static const char* const kKeywords[] = {
      "False", "None",   "True",    "and",      "as",       "assert", "async",  "await",
      "break", "class",  "continue", "def",     "del",      "elif",   "else",   "except",
      "finally", "for",  "from",    "global",   "if",       "import", "in",     "is",
      "lambda", "nonlocal", "not",  "or",       "pass",     "raise",  "return", "try",
      "while", "with",   "yield"};
  for (const char* k : kKeywords) {
    if (name == k) return true;
  }
  return false;
}

// One parsed expression: what vLLM's _get_parameter_value makes of it.
struct Expr {
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

// A recursive-descent reader of the Python vLLM's parsers meet (see the
// header for what it does not read). Every method returns nullopt on what
// Python would refuse or this does not read; then the answer is content.
class PyReader {
 public:
  PyReader(std::string_view text, bool ensure_ascii) : s_(text), ascii_(ensure_ascii) {}

  // The module: a list of calls first, then any statements this reads.
  std::optional<std::vector<ToolCall>> Module() {
    if (s_.find('\0') != std::string_view::npos) return std::nullopt;  // Python refuses it
    std::optional<Expr> first = Expression();
    if (!first || !first->calls || !EndOfStatement()) return std::nullopt;
    for (;;) {
      SkipBlankLines();
      if (eof_in_continuation_) return std::nullopt;
      if (AtEnd()) return first->calls;
      if (Peek() == ' ' || Peek() == '\t' || Peek() == '\f') return std::nullopt;  // an indent
      if (!Statement() || !EndOfStatement()) return std::nullopt;
    }
  }

 private:
  bool AtEnd() const { return i_ >= s_.size(); }
  char Peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }

  // Skips what separates tokens: spaces, comments and line continuations,
  // and inside brackets newlines too.
  void Space() {
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
  bool Eat(char c) {
    Space();
    if (Peek() != c) return false;
    ++i_;
    return true;
  }
  // A statement after the calls: expressions (a, *b), or assignments to
  // them (a = b = c, d); the parser takes what only the compiler refuses
  // (x = *1).
  // Also an augmented assignment (x += 1) and an annotated one (x: int = 1).
  bool Statement() {
    for (bool first = true;; first = false) {
      bool assignable = true;
      int count = 0;
      for (;; ++count) {  // one expression at least, a trailing comma allowed
        Space();
        if (Peek() == '*' && Peek(1) != '*') ++i_;
        std::optional<Expr> e = Expression();
        if (!e) return false;
        assignable = assignable && !e->IsLiteral() && !e->call;
        if (!Eat(',')) break;
        Space();
        if (AtEnd() || Peek() == '\n' || Peek() == '\r' || Peek() == ';' ||
            (Peek() == '=' && Peek(1) != '=')) {
          break;
        }
      }
      Space();
      if (first && count == 0 && assignable) {
        if (const size_t op = AugmentedAssignment(); op > 0) {
          i_ += op;
          return Statement();
        }
        if (Peek() == ':' && Peek(1) != '=') {  // an annotation, then maybe "= value"
          ++i_;
          if (!Expression()) return false;
          Space();
          if (Peek() != '=' || Peek(1) == '=') return true;
          ++i_;
          return Statement();
        }
      }
      if (Peek() != '=' || Peek(1) == '=') return true;
      if (!assignable) return false;  // Python cannot assign to a literal or a call
      ++i_;
    }
  }

  // The length of an augmented assignment's operator at i_ (+=, **=, ...),
  // or 0.
  size_t AugmentedAssignment() const {
    static constexpr std::string_view kOps[] = {
        "**=", "//=", ">>=", "<<=", "+=", "-=", "*=", "/=", "%=", "@=", "&=", "|=", "^="};
    for (const std::string_view op : kOps) {
      if (s_.substr(i_).starts_with(op)) return op.size();
    }
    return 0;
  }

  // After a top-level statement: the end of the text, a newline or a ";"
  // (which the next statement may follow on the same line).
  bool EndOfStatement() {
    Space();
    if (Peek() == ';') {
      ++i_;
      Space();
      return true;
    }
    return AtEnd() || Peek() == '\n' || Peek() == '\r';
  }
  void SkipBlankLines() {
    for (;;) {
      const size_t line = i_;
      Space();
      if (AtEnd()) return;
      if (Peek() == '\n' || Peek() == '\r') {
        ++i_;
        continue;
      }
      i_ = line;  // a statement: its indentation is the caller's to judge
      return;
    }
  }

  std::string Quoted(std::string_view text) const { return PyJsonQuote(text, ascii_); }

  std::optional<std::string> Name() {
    Space();
    if (!IsIdentifierStart(Peek())) return std::nullopt;
    const size_t start = i_;
    while (!AtEnd() && IsIdentifierChar(Peek())) ++i_;
    return std::string(s_.substr(start, i_ - start));
  }

  // A call's arguments after its "(", through the ")". false: not read.
  // *json: json.dumps of its keyword arguments, positional ones dropped;
  // nullopt when one is no literal (vLLM's _handle_single_tool raises).
  bool Arguments(std::optional<std::string>* json) {
    ++depth_;
    bool literal = true;
    std::vector<std::string> names, values;
    std::vector<bool> dumpable;
    while (!Eat(')')) {
      Space();
      if (Peek() == '*') {  // *args: dropped; **kwargs: vLLM reads no literal
        const bool kwargs = Peek(1) == '*';
        i_ += kwargs ? 2 : 1;
        if (!Expression()) return false;
        literal = literal && !kwargs;
        if (!Eat(',')) {
          if (!Eat(')')) return false;
          break;
        }
        continue;
      }
      const size_t start = i_;
      std::optional<std::string> name = Name();
      bool keyword = false;
      if (name) {
        Space();
        keyword = Peek() == '=' && Peek(1) != '=';
      }
      if (keyword) {
        ++i_;
        if (IsKeyword(*name)) return false;
        std::optional<Expr> value = Expression();
        if (!value) return false;
        literal = literal && value->IsLiteral();
        // A repeated keyword parses (only Python's compiler refuses it):
        // vLLM's dict keeps its first place and its last value.
        const auto seen = std::find(names.begin(), names.end(), *name);
        if (seen != names.end()) {
          values[static_cast<size_t>(seen - names.begin())] = std::move(value->json);
          dumpable[static_cast<size_t>(seen - names.begin())] = value->dumpable;
        } else {
          names.push_back(*std::move(name));
          values.push_back(std::move(value->json));
          dumpable.push_back(value->dumpable);
        }
      } else {
        i_ = start;
        if (!names.empty()) return false;  // positional after keyword
        if (!NamedExpression()) return false;
      }
      if (!Eat(',')) {
        if (!Eat(')')) return false;
        break;
      }
    }
    --depth_;
    json->reset();
    if (!literal || std::find(dumpable.begin(), dumpable.end(), false) != dumpable.end()) {
      return true;  // vLLM's _get_parameter_value or json.dumps raises
    }
    std::string out = "{";
    for (size_t k = 0; k < names.size(); ++k) {
      absl::StrAppend(&out, k > 0 ? ", " : "", Quoted(names[k]), ": ", values[k]);
    }
    *json = out + "}";
    return true;
  }

  // An operand, then binary operators, comparisons, boolean operators and
  // conditionals (a if b else c): with any of them, no literal.
  std::optional<Expr> Expression() {
    std::optional<Expr> e = Operand();
    bool operators = false, need_else = false;
    for (;;) {
      if (!e) return std::nullopt;
      const size_t op = BinaryOperator(need_else);
      if (op == 0) break;
      const std::string_view name = s_.substr(i_, op);
      need_else = name == "if" || (need_else && name != "else");
      i_ += op;
      operators = true;
      e = Operand(/*allow_not=*/name == "and" || name == "or" || name == "if" || name == "else");
    }
    if (need_else) return std::nullopt;  // "a if b" without its else
    return operators ? Expr{} : e;
  }

  // An expression, or name := expression where Python's grammar takes one
  // (positional arguments, displays, subscripts, parentheses).
  std::optional<Expr> NamedExpression() {
    std::optional<Expr> e = Expression();
    if (!e || !e->name) return e;
    Space();
    if (Peek() != ':' || Peek(1) != '=') return e;
    i_ += 2;
    if (!Expression()) return std::nullopt;
    return Expr{};
  }

  // The length of the binary operator at i_ (after the space before it),
  // or 0. `else` counts only after an `if`.
  size_t BinaryOperator(bool need_else) {
    Space();
    static constexpr std::string_view kSymbols[] = {
        "**", "//", "<<", ">>", "<=", ">=", "==", "!=", "+", "-",
        "*",  "/",  "%",  "@",  "&",  "|",  "^",  "<",  ">"};
    const std::string_view rest = s_.substr(i_);
    for (const std::string_view op : kSymbols) {
      if (!rest.starts_with(op)) continue;
      // An augmented assignment (+=, **=, <<=) is a statement, not an operator.
      const bool comparison = op == "<=" || op == ">=" || op == "==" || op == "!=";
      return !comparison && rest.size() > op.size() && rest[op.size()] == '=' ? 0 : op.size();
    }
    auto word = [&](std::string_view w) {
      return rest.starts_with(w) && (rest.size() == w.size() || !IsIdentifierChar(rest[w.size()]));
    };
    if (need_else && word("else")) return 4;
    // "not in" and "is not", the space between them Python's.
    for (const auto& [first, second] :
         {std::pair<std::string_view, std::string_view>{"not", "in"}, {"is", "not"}}) {
      if (!word(first)) continue;
      size_t k = first.size();
      while (k < rest.size() && (rest[k] == ' ' || rest[k] == '\t' || rest[k] == '\f')) ++k;
      if (rest.substr(k).starts_with(second) &&
          (rest.size() == k + second.size() || !IsIdentifierChar(rest[k + second.size()]))) {
        return k + second.size();
      }
    }
    for (const std::string_view w : {"and", "or", "in", "is", "if"}) {
      if (word(w)) return w.size();
    }
    return 0;
  }

  // A subscript after its "[", through the "]": slices (a:b:c, any part
  // left out) and expressions, separated by commas.
  bool Subscript() {
    auto item = [&](int unpack) {
      if (unpack == 2) return false;
      Space();
      if (Peek() != ':' && !NamedExpression()) return false;
      for (int colons = 0; colons < 2 && Eat(':'); ++colons) {
        Space();
        if (Peek() != ':' && Peek() != ',' && Peek() != ']' && !Expression()) return false;
      }
      return true;
    };
    Space();
    return Peek() != ']' && Items(']', item);  // a[] is no subscript
  }

  // A unary operator's operand, or an atom with its postfixes. `not`
  // starts one only where Python's grammar has an inversion: an
  // expression's start, after not, and, or, if, else.
  std::optional<Expr> Operand(bool allow_not = true) {
    // Python refuses more than 200 nested brackets (the tokenizer's
    // MAXLEVEL) and runs out of recursion on long chains of unary
    // operators; here the stack would: both are the answer's content.
    if (depth_ > kMaxNesting) return std::nullopt;
    struct Nest {
      int& n;
      explicit Nest(int& n) : n(++n) {}
      ~Nest() { --n; }
    } nest(recursion_);
    if (recursion_ > kMaxRecursion) return std::nullopt;
    Space();
    const char c = Peek();
    if ((c == '-' || c == '+' || c == '~') && Peek(1) != '=') {
      ++i_;
      if (!Operand(/*allow_not=*/false)) return std::nullopt;
      return Expr{};
    }
    if (allow_not && c == 'n' && s_.substr(i_, 3) == "not" && !IsIdentifierChar(Peek(3))) {
      i_ += 3;
      if (!Operand()) return std::nullopt;
      return Expr{};
    }
    std::optional<Expr> e = Atom();
    // Postfixes: a call of a plain name is a tool call; anything else
    // (attributes, subscripts, calls of those) is none.
    for (;;) {
      if (!e) return std::nullopt;
      Space();
      if (Peek() == '(') {
        ++i_;
        std::optional<std::string> arguments;
        if (!Arguments(&arguments)) return std::nullopt;
        Expr call;
        if (e->name && arguments) call.call = ToolCall{.name = *e->name, .arguments = *arguments};
        e = std::move(call);
        continue;
      } else if (Peek() == '.' && !IsDigit(Peek(1))) {
        ++i_;
        std::optional<std::string> attr = Name();
        if (!attr || IsKeyword(*attr)) return std::nullopt;
      } else if (Peek() == '[') {
        ++i_;
        if (!Subscript()) return std::nullopt;
      } else {
        return e;
      }
      e = Expr{};
    }
  }

  std::optional<Expr> Atom() {
    Space();
    const char c = Peek();
    if (c == '[') return ListDisplay();
    if (c == '{') return DictDisplay();
    if (c == '(') return Parenthesized();
    if (c == '"' || c == '\'') return Strings();
    if (IsDigit(c) || (c == '.' && IsDigit(Peek(1)))) return Number();
    if (s_.substr(i_, 3) == "...") {  // Ellipsis: no JSON
      i_ += 3;
      return Expr{.kind = Expr::Kind::kConstant, .key_identity = "E", .dumpable = false};
    }
    if (!IsIdentifierStart(c)) return std::nullopt;
    // A string's prefix, or a name.
    size_t n = 0;
    while (IsIdentifierChar(Peek(n))) ++n;
    if (n <= 2 && (Peek(n) == '"' || Peek(n) == '\'')) return Strings();
    std::optional<std::string> name = Name();
    if (*name == "True" || *name == "False") {
      const bool t = *name == "True";
      return Expr{.kind = Expr::Kind::kConstant,
                  .json = t ? "true" : "false",
                  .key_identity = t ? "n1" : "n0",
                  .key_text = t ? "true" : "false"};
    }
    if (*name == "None") {
      return Expr{
          .kind = Expr::Kind::kConstant, .json = "null", .key_identity = "N", .key_text = "null"};
    }
    if (IsKeyword(*name)) return std::nullopt;
    return Expr{.name = std::move(name)};
  }

  // Comma-separated items up to `close`, trailing comma allowed:
  // item(unpack) reads one, unpack being 1 after "*" and 2 after "**"
  // (which it has consumed).
  template <typename Item>
  bool Items(char close, const Item& item) {
    ++depth_;
    while (!Eat(close)) {
      Space();
      int unpack = 0;
      while (unpack < 2 && Peek() == '*') {
        ++unpack;
        ++i_;
      }
      if (!item(unpack)) return false;
      if (!Eat(',')) {
        if (!Eat(close)) return false;
        break;
      }
    }
    --depth_;
    return true;
  }

  std::optional<Expr> ListDisplay() {
    ++i_;
    Expr out{.kind = Expr::Kind::kLiteral, .json = "[", .calls = std::vector<ToolCall>()};
    int count = 0;
    const bool ok = Items(']', [&](int unpack) {
      std::optional<Expr> e = NamedExpression();
      if (!e || unpack == 2) return false;
      if (unpack == 1) e = Expr{};  // *x: no literal, no call
      if (!e->IsLiteral()) out.kind = Expr::Kind::kOther;
      out.dumpable = out.dumpable && e->dumpable;
      absl::StrAppend(&out.json, count++ > 0 ? ", " : "", e->json);
      if (!e->call) {
        out.calls.reset();
      } else if (out.calls) {
        out.calls->push_back(*std::move(e->call));
      }
      return true;
    });
    if (!ok) return std::nullopt;
    out.json += "]";
    if (out.kind == Expr::Kind::kOther) out.json.clear();
    if (out.calls && out.calls->empty()) out.calls.reset();
    return out;
  }

  // A dict (or a set, which is no literal vLLM reads). Keys that Python
  // holds equal (1, 1.0, True) are one key: the first one written, the
  // last value.
  std::optional<Expr> DictDisplay() {
    ++i_;
    if (Eat('}')) return Expr{.kind = Expr::Kind::kLiteral, .json = "{}"};
    struct Entry {
      std::string key, value;
      bool key_dumpable, value_dumpable;
    };
    std::vector<Entry> entries;
    std::map<std::string, size_t> index;                        // identity -> entry
    bool literal = true, is_set = false;
    bool first = true;
    const bool ok = Items('}', [&](int unpack) {
      std::optional<Expr> key = NamedExpression();  // a set's x := 1
      if (!key) return false;
      // **d unpacks into a dict (no literal: vLLM's keys hold a None), *s
      // into a set.
      const bool pair = unpack == 0 && Eat(':');
      const bool dict_item = pair || unpack == 2;
      if (first) is_set = !dict_item;
      first = false;
      if (dict_item == is_set) return false;  // a dict item in a set or the reverse
      if (is_set) return true;
      if (unpack == 2) {
        literal = false;
        return true;
      }
      std::optional<Expr> value = Expression();
      if (!value) return false;
      if (key->kind != Expr::Kind::kConstant || !value->IsLiteral()) {
        literal = false;
        return true;
      }
      auto [it, added] = index.emplace(key->key_identity, entries.size());
      if (added) {
        entries.push_back({key->key_text, value->json, key->dumpable, value->dumpable});
      } else {  // the first key stays
        entries[it->second].value = value->json;
        entries[it->second].value_dumpable = value->dumpable;
      }
      return true;
    });
    if (!ok) return std::nullopt;
    if (is_set || !literal) return Expr{};
    Expr out{.kind = Expr::Kind::kLiteral, .json = "{"};
    for (size_t k = 0; k < entries.size(); ++k) {
      absl::StrAppend(&out.json, k > 0 ? ", " : "", Quoted(entries[k].key), ": ",
                      entries[k].value);
      out.dumpable = out.dumpable && entries[k].key_dumpable && entries[k].value_dumpable;
    }
    out.json += "}";
    return out;
  }

  // (expression) is the expression; (), (a,), (*a,) and (a, b) are tuples.
  std::optional<Expr> Parenthesized() {
    ++i_;
    ++depth_;
    if (Eat(')')) {
      --depth_;
      return Expr{};
    }
    Space();
    const bool starred = Peek() == '*' && Peek(1) != '*';
    if (starred) ++i_;
    std::optional<Expr> e = NamedExpression();
    if (!e) return std::nullopt;
    if (!starred && Eat(')')) {
      --depth_;
      return e;
    }
    if (!Eat(',')) return std::nullopt;
    --depth_;
    auto item = [&](int unpack) { return unpack < 2 && NamedExpression().has_value(); };
    if (!Items(')', item)) return std::nullopt;
    return Expr{};
  }

  // One or more adjacent string literals, joined (Python's implicit
  // concatenation). Bytes and f-strings are not read.
  std::optional<Expr> Strings() {
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
      return Expr{.kind = Expr::Kind::kConstant, .key_identity = "b" + value, .dumpable = false};
    }
    return Expr{.kind = Expr::Kind::kConstant,
                .json = Quoted(value),
                .key_identity = "s" + value,
                .key_text = value};
  }

  bool String(bool raw, std::string* out) {
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
  bool Escape(std::string* out) {
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

  bool Hex(int digits, std::string* out) {
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
  std::optional<std::string> Digits(int base, bool after_prefix) {
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

  std::optional<Expr> Number() {
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
      return Expr{.kind = Expr::Kind::kConstant,
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
    return Expr{
        .kind = Expr::Kind::kConstant, .json = repr, .key_identity = identity, .key_text = repr};
  }

  std::optional<Expr> Integer(const std::string& digits, int base) {
    uint64_t value = 0;
    for (char c : digits) {
      const int d = IsDigit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
      if (value > (UINT64_MAX - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) {
        return std::nullopt;  // past 64 bits
      }
      value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    }
    const std::string decimal = absl::StrCat(value);
    return Expr{.kind = Expr::Kind::kConstant,
                .json = decimal,
                .key_identity = "n" + decimal,
                .key_text = decimal};
  }

  static constexpr int kMaxNesting = 200;
  static constexpr int kMaxRecursion = 1000;

  std::string_view s_;
  bool ascii_;
  size_t i_ = 0;
  int depth_ = 0;      // open brackets: newlines inside them separate nothing
  int recursion_ = 0;  // Expression() calls on the stack
  bool eof_in_continuation_ = false;
};

}  // namespace

ExtractedToolCalls ExtractPythonicToolCalls(std::string_view text, bool llama4) {
  std::string answer(text);
  if (llama4 && answer.starts_with(kPythonStart)) {
    answer.erase(0, kPythonStart.size());
    for (size_t at = answer.find(kPythonEnd); at != std::string::npos;
         at = answer.find(kPythonEnd, at)) {
      answer.erase(at, kPythonEnd.size());
    }
  }
  if (!RE2::PartialMatch(answer, ToolCallPattern())) return {.content = answer};
  std::optional<std::vector<ToolCall>> calls = PyReader(answer, /*ensure_ascii=*/llama4).Module();
  if (!calls) return {.content = answer};
  ExtractedToolCalls out;  // content null, as vLLM's
  out.calls = *std::move(calls);
  return out;
}

}  // namespace tandem::frontend::internal
