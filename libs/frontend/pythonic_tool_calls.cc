#include "pythonic_tool_calls.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python_lexer.h"
#include "re2/re2.h"
#include "tandem/common/nesting.h"

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

using Expr = PyExpr;

// A recursive-descent reader of the Python vLLM's parsers meet (see the
// header for what it does not read). Every method returns nullopt on what
// Python would refuse or this does not read; then the answer is content.
class PyReader : public PyLexer {
 public:
  using PyLexer::PyLexer;

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
    const Nesting nest(recursion_);
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

  static constexpr int kMaxNesting = 200;
  static constexpr int kMaxRecursion = 1000;

  int recursion_ = 0;  // Expression() calls on the stack
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
