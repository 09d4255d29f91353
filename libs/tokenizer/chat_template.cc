#include "tandem/tokenizer/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace tandem::tokenizer {

using Json = nlohmann::ordered_json;

namespace {

// Parse and render errors; caught at the public boundary and turned into a
// Status.
struct TemplateError {
  absl::StatusCode code;
  std::string message;
};
[[noreturn]] void Fail(int line, const std::string& message,
                       absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  throw TemplateError{code, absl::StrCat("chat template: line ", line, ": ", message)};
}
[[noreturn]] void Unsupported(int line, const std::string& what) {
  Fail(line, absl::StrCat(what, " is not supported (use a built-in template)"),
       absl::StatusCode::kUnimplemented);
}

// ---- Lexing ----------------------------------------------------------------

struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp } kind;
  std::string text;  // name, string value or operator
  int64_t int_value = 0;
  double float_value = 0;
};

struct Piece {
  enum Kind { kText, kOutput, kStatement } kind;
  std::string text;
  std::vector<Token> tokens;
  int line = 1;
  bool strip_before = false;  // {%- / {{-
  bool strip_after = false;   // -%} / -}}
};

// What @huggingface/jinja (and transformers' environment, with trim_blocks
// and lstrip_blocks) does to the source before lexing.
std::string Preprocess(std::string_view source) {
  std::string s(source);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    // lstrip_blocks: blanks at the start of a line before {%, {# or {-.
    if (i == 0 || s[i - 1] == '\n') {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j + 1 < s.size() && s[j] == '{' &&
          (s[j + 1] == '%' || s[j + 1] == '#' || s[j + 1] == '-')) {
        i = j;
      }
    }
    // trim_blocks: the newline after %}, #} or -}.
    if (s[i] == '}' && i > 0 && (s[i - 1] == '%' || s[i - 1] == '#' || s[i - 1] == '-') &&
        i + 1 < s.size() && s[i + 1] == '\n') {
      out += '}';
      i += 2;
      continue;
    }
    out += s[i++];
  }
  return out;
}

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// Tokens of a tag starting at `i` (just after "{{" / "{%" and an optional
// "-"), up to its closing delimiter; `i` ends after it.
std::vector<Token> LexTag(const std::string& s, size_t& i, char close, int& line,
                          bool& strip_after) {
  std::vector<Token> tokens;
  int depth = 0;  // of { } inside the tag
  while (true) {
    while (i < s.size() && absl::ascii_isspace(s[i])) line += s[i++] == '\n';
    if (i >= s.size()) Fail(line, "unterminated tag");
    const char c = s[i];
    if (depth == 0) {
      if (c == '-' && i + 2 < s.size() && s[i + 1] == close && s[i + 2] == '}') {
        strip_after = true;
        i += 3;
        return tokens;
      }
      if (c == close && i + 1 < s.size() && s[i + 1] == '}') {
        i += 2;
        return tokens;
      }
    }
    if (IsNameStart(c)) {
      size_t j = i;
      while (j < s.size() && IsNameChar(s[j])) ++j;
      tokens.push_back({Token::kName, s.substr(i, j - i)});
      i = j;
    } else if (absl::ascii_isdigit(c)) {
      size_t j = i;
      while (j < s.size() && absl::ascii_isdigit(s[j])) ++j;
      if (j + 1 < s.size() && s[j] == '.' && absl::ascii_isdigit(s[j + 1])) {
        ++j;
        while (j < s.size() && absl::ascii_isdigit(s[j])) ++j;
        tokens.push_back({Token::kFloat, s.substr(i, j - i), 0, std::stod(s.substr(i, j - i))});
      } else {
        tokens.push_back({Token::kInt, s.substr(i, j - i), std::stoll(s.substr(i, j - i))});
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      while (j < s.size() && s[j] != c) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          value += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          line += s[j] == '\n';
          value += s[j];
        }
        ++j;
      }
      if (j >= s.size()) Fail(line, "unterminated string");
      tokens.push_back({Token::kString, std::move(value)});
      i = j + 1;
    } else {
      static const char* const kOps[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*",
                                         "/",  "%",  "~",  "<",  ">",  "|",  ".", ",", ":",
                                         "(",  ")",  "[",  "]",  "{",  "}",  "="};
      bool found = false;
      for (const char* op : kOps) {
        if (s.compare(i, std::strlen(op), op) == 0) {
          tokens.push_back({Token::kOp, op});
          i += std::strlen(op);
          depth += c == '{' ? 1 : c == '}' ? -1 : 0;
          found = true;
          break;
        }
      }
      if (!found) Fail(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
}

std::vector<Piece> Lex(std::string_view source) {
  const std::string s = Preprocess(source);
  std::vector<Piece> pieces;
  int line = 1;
  size_t i = 0;
  while (i < s.size()) {
    size_t open = s.find('{', i);
    while (open != std::string::npos && open + 1 < s.size() && s[open + 1] != '{' &&
           s[open + 1] != '%' && s[open + 1] != '#') {
      open = s.find('{', open + 1);
    }
    if (open == std::string::npos || open + 1 >= s.size()) open = s.size();
    if (open > i) {
      pieces.push_back({Piece::kText, s.substr(i, open - i), {}, line});
      line += static_cast<int>(std::count(s.begin() + i, s.begin() + open, '\n'));
    }
    if (open >= s.size()) break;
    const char kind = s[open + 1];
    i = open + 2;
    Piece piece{kind == '{' ? Piece::kOutput : Piece::kStatement, "", {}, line};
    if (i < s.size() && s[i] == '-') {
      piece.strip_before = true;
      ++i;
    }
    if (kind == '#') {
      const size_t end = s.find("#}", i);
      if (end == std::string::npos) Fail(line, "unterminated comment");
      piece.strip_after = end > i && s[end - 1] == '-';
      line += static_cast<int>(std::count(s.begin() + i, s.begin() + end, '\n'));
      i = end + 2;
      // A comment only strips whitespace around it.
      piece.kind = Piece::kText;
    } else {
      piece.tokens = LexTag(s, i, kind == '{' ? '}' : '%', line, piece.strip_after);
    }
    pieces.push_back(std::move(piece));
  }
  // Whitespace control.
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (pieces[k].strip_before && k > 0 && pieces[k - 1].kind == Piece::kText) {
      std::string& t = pieces[k - 1].text;
      t.erase(
          std::find_if(t.rbegin(), t.rend(), [](char c) { return !absl::ascii_isspace(c); }).base(),
          t.end());
    }
    if (pieces[k].strip_after && k + 1 < pieces.size() && pieces[k + 1].kind == Piece::kText) {
      std::string& t = pieces[k + 1].text;
      t.erase(t.begin(),
              std::find_if(t.begin(), t.end(), [](char c) { return !absl::ascii_isspace(c); }));
    }
  }
  return pieces;
}

// ---- Syntax tree -------------------------------------------------------------

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kAnd,
    kOr,
    kTernary,
    kList,
    kDict,
  } kind;
  int line = 0;
  Json value;                               // kLiteral
  std::string name;                         // kName, kAttr, kFilter, kTest, kBinary (the operator)
  bool negated = false;                     // kTest: `is not`
  std::vector<std::unique_ptr<Expr>> args;  // may hold nullptr (slice bounds)
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};
using ExprPtr = std::unique_ptr<Expr>;

}  // namespace

struct ChatTemplate::Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet } kind;
  int line = 0;
  std::string text;            // kText
  std::vector<ExprPtr> exprs;  // kOutput, kSet: [value]; kIf: conditions; kFor: [iterable, filter]
  std::vector<std::vector<std::unique_ptr<Node>>>
      bodies;                      // kIf: per branch (+ else); kFor: body, else
  std::vector<std::string> names;  // kFor: loop variables; kSet: target (name[, attribute])
};

namespace {

using Node = ChatTemplate::Node;
using NodeList = std::vector<std::unique_ptr<Node>>;

const std::set<std::string, std::less<>> kFilters = {
    "trim",       "length", "count",  "list",       "first",      "last",    "lower", "upper",
    "capitalize", "title",  "string", "int",        "join",       "default", "d",     "replace",
    "reverse",    "tojson", "items",  "selectattr", "rejectattr", "map"};
const std::set<std::string, std::less<>> kTests = {
    "defined",  "undefined", "none",    "string", "number", "integer", "mapping",
    "sequence", "iterable",  "boolean", "true",   "false",  "equalto", "eq",
    "==",       "ne",        "!=",      "odd",    "even",   "in"};

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& tokens, size_t pos, int line)
      : tokens_(tokens), pos_(pos), line_(line) {}

  ExprPtr Parse() { return Ternary(); }
  bool AtEnd() const { return pos_ >= tokens_.size(); }
  size_t pos() const { return pos_; }
  bool IsOp(std::string_view op) const {
    return !AtEnd() && tokens_[pos_].kind == Token::kOp && tokens_[pos_].text == op;
  }
  bool IsName(std::string_view name) const {
    return !AtEnd() && tokens_[pos_].kind == Token::kName && tokens_[pos_].text == name;
  }
  void Expect(std::string_view op) {
    if (!IsOp(op)) Fail(line_, absl::StrCat("expected '", std::string(op), "'", Where()));
    ++pos_;
  }
  std::string ExpectName() {
    if (AtEnd() || tokens_[pos_].kind != Token::kName)
      Fail(line_, absl::StrCat("expected a name", Where()));
    return tokens_[pos_++].text;
  }
  void ExpectEnd() {
    if (!AtEnd()) Fail(line_, absl::StrCat("unexpected", Where()));
  }
  std::string Where() const {
    return AtEnd() ? " at the end of the tag" : absl::StrCat(" at '", tokens_[pos_].text, "'");
  }
  // An `or` expression without the ternary (a for loop's `if` filter).
  ExprPtr ParseOr() { return Or(); }

 private:
  ExprPtr Make(Expr::Kind kind, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    e->name = std::move(name);
    return e;
  }
  ExprPtr Binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = Make(op == "and" ? Expr::kAnd : op == "or" ? Expr::kOr : Expr::kBinary, op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }
  ExprPtr Ternary() {
    ExprPtr then = Or();
    if (!IsName("if")) return then;
    ++pos_;
    auto e = Make(Expr::kTernary);
    e->args.push_back(std::move(then));
    e->args.push_back(Or());
    if (IsName("else")) {
      ++pos_;
      e->args.push_back(Ternary());
    } else {
      e->args.push_back(nullptr);
    }
    return e;
  }
  ExprPtr Or() {
    ExprPtr e = And();
    while (IsName("or")) {
      ++pos_;
      e = Binary("or", std::move(e), And());
    }
    return e;
  }
  ExprPtr And() {
    ExprPtr e = Not();
    while (IsName("and")) {
      ++pos_;
      e = Binary("and", std::move(e), Not());
    }
    return e;
  }
  ExprPtr Not() {
    if (IsName("not")) {
      ++pos_;
      auto e = Make(Expr::kNot);
      e->args.push_back(Not());
      return e;
    }
    return Compare();
  }
  ExprPtr Compare() {
    ExprPtr e = Add();
    while (true) {
      std::string op;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">=")) {
        op = tokens_[pos_++].text;
      } else if (IsName("in")) {
        ++pos_;
        op = "in";
      } else if (IsName("not") && pos_ + 1 < tokens_.size() && tokens_[pos_ + 1].text == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = Binary(op, std::move(e), Add());
    }
  }
  ExprPtr Add() {
    ExprPtr e = Concat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = tokens_[pos_++].text;
      e = Binary(op, std::move(e), Concat());
    }
    return e;
  }
  ExprPtr Concat() {
    ExprPtr e = Mul();
    while (IsOp("~")) {
      ++pos_;
      e = Binary("~", std::move(e), Mul());
    }
    return e;
  }
  ExprPtr Mul() {
    ExprPtr e = Unary();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = tokens_[pos_++].text;
      e = Binary(op, std::move(e), Unary());
    }
    return e;
  }
  ExprPtr Unary() {
    if (IsOp("-")) {
      ++pos_;
      auto e = Make(Expr::kNeg);
      e->args.push_back(Unary());
      return e;
    }
    if (IsOp("**")) Unsupported(line_, "'**'");
    return FilterAndTest(Postfix(Primary()));
  }
  void Arguments(Expr& e) {
    Expect("(");
    while (!IsOp(")")) {
      if (!AtEnd() && tokens_[pos_].kind == Token::kName && pos_ + 1 < tokens_.size() &&
          tokens_[pos_ + 1].kind == Token::kOp && tokens_[pos_ + 1].text == "=") {
        std::string key = tokens_[pos_].text;
        pos_ += 2;
        e.kwargs.emplace_back(std::move(key), Ternary());
      } else {
        e.args.push_back(Ternary());
      }
      if (!IsOp(",")) break;
      ++pos_;
    }
    Expect(")");
  }
  ExprPtr FilterAndTest(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        ++pos_;
        std::string name = ExpectName();
        if (!kFilters.contains(name)) Unsupported(line_, absl::StrCat("the filter '", name, "'"));
        auto f = Make(Expr::kFilter, name);
        f->args.push_back(std::move(e));
        if (IsOp("(")) Arguments(*f);
        e = std::move(f);
      } else if (IsName("is")) {
        ++pos_;
        auto t = Make(Expr::kTest);
        if (IsName("not")) {
          ++pos_;
          t->negated = true;
        }
        if (IsName("none") || IsName("true") || IsName("false") || IsName("in")) {
          t->name = tokens_[pos_++].text;
        } else if (IsOp("==") || IsOp("!=")) {
          t->name = tokens_[pos_++].text;
        } else {
          t->name = ExpectName();
        }
        if (!kTests.contains(t->name)) Unsupported(line_, absl::StrCat("the test '", t->name, "'"));
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          Arguments(*t);
        } else if (!AtEnd() &&
                   (tokens_[pos_].kind == Token::kString || tokens_[pos_].kind == Token::kInt ||
                    (tokens_[pos_].kind == Token::kName && !IsName("and") && !IsName("or") &&
                     !IsName("if") && !IsName("else")))) {
          t->args.push_back(Postfix(Primary()));  // `x is equalto 3`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  ExprPtr Postfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        ++pos_;
        auto a = Make(Expr::kAttr, ExpectName());
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        ++pos_;
        ExprPtr parts[3];
        int colons = 0;
        while (!IsOp("]")) {
          if (IsOp(":")) {
            ++pos_;
            if (++colons > 2) Fail(line_, "bad slice");
            continue;
          }
          if (parts[colons]) Fail(line_, absl::StrCat("expected ']'", Where()));
          parts[colons] = Ternary();
        }
        Expect("]");
        auto x = Make(colons ? Expr::kSlice : Expr::kIndex);
        x->args.push_back(std::move(e));
        if (colons == 0 && !parts[0]) Fail(line_, "empty subscript");
        for (int k = 0; k <= (colons ? 2 : 0); ++k) x->args.push_back(std::move(parts[k]));
        e = std::move(x);
      } else if (IsOp("(")) {
        auto c = Make(Expr::kCall);
        c->args.push_back(std::move(e));
        Arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprPtr Primary() {
    if (AtEnd()) Fail(line_, "expected an expression at the end of the tag");
    const Token& t = tokens_[pos_++];
    switch (t.kind) {
      case Token::kString: {
        auto e = Make(Expr::kLiteral);
        e->value = t.text;
        // Adjacent string literals concatenate.
        while (!AtEnd() && tokens_[pos_].kind == Token::kString)
          e->value = e->value.get<std::string>() + tokens_[pos_++].text;
        return e;
      }
      case Token::kInt: {
        auto e = Make(Expr::kLiteral);
        e->value = t.int_value;
        return e;
      }
      case Token::kFloat: {
        auto e = Make(Expr::kLiteral);
        e->value = t.float_value;
        return e;
      }
      case Token::kName: {
        auto e = Make(Expr::kLiteral);
        if (t.text == "true" || t.text == "True") {
          e->value = true;
        } else if (t.text == "false" || t.text == "False") {
          e->value = false;
        } else if (t.text == "none" || t.text == "None") {
          e->value = nullptr;
        } else {
          e = Make(Expr::kName, t.text);
        }
        return e;
      }
      case Token::kOp:
        break;
    }
    if (t.text == "(") {
      ExprPtr e = Ternary();
      if (IsOp(",")) Unsupported(line_, "a tuple");
      Expect(")");
      return e;
    }
    if (t.text == "[") {
      auto e = Make(Expr::kList);
      while (!IsOp("]")) {
        e->args.push_back(Ternary());
        if (!IsOp(",")) break;
        ++pos_;
      }
      Expect("]");
      return e;
    }
    if (t.text == "{") {
      auto e = Make(Expr::kDict);
      while (!IsOp("}")) {
        e->args.push_back(Ternary());
        Expect(":");
        e->args.push_back(Ternary());
        if (!IsOp(",")) break;
        ++pos_;
      }
      Expect("}");
      return e;
    }
    Fail(line_, absl::StrCat("unexpected '", t.text, "'"));
  }

  const std::vector<Token>& tokens_;
  size_t pos_;
  int line_;
};

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  NodeList ParseAll() {
    std::string end;
    NodeList body = ParseBody({}, &end);
    return body;
  }

 private:
  static std::string Keyword(const Piece& p) {
    return p.tokens.empty() || p.tokens[0].kind != Token::kName ? "" : p.tokens[0].text;
  }
  // Nodes up to a statement whose keyword is in `ends` (returned in *end and
  // consumed); to the end of the template when `ends` is empty.
  NodeList ParseBody(const std::set<std::string>& ends, std::string* end) {
    NodeList body;
    while (i_ < pieces_.size()) {
      const Piece& p = pieces_[i_];
      if (p.kind == Piece::kText) {
        if (!p.text.empty()) {
          auto n = std::make_unique<Node>();
          n->kind = Node::kText;
          n->text = p.text;
          body.push_back(std::move(n));
        }
        ++i_;
        continue;
      }
      if (p.kind == Piece::kOutput) {
        ExprParser ep(p.tokens, 0, p.line);
        auto n = std::make_unique<Node>();
        n->kind = Node::kOutput;
        n->line = p.line;
        n->exprs.push_back(ep.Parse());
        ep.ExpectEnd();
        body.push_back(std::move(n));
        ++i_;
        continue;
      }
      const std::string keyword = Keyword(p);
      if (ends.contains(keyword)) {
        *end = keyword;
        return body;
      }
      ++i_;
      if (keyword == "if") {
        body.push_back(ParseIf(p));
      } else if (keyword == "for") {
        body.push_back(ParseFor(p));
      } else if (keyword == "set") {
        body.push_back(ParseSet(p));
      } else if (keyword.empty()) {
        Fail(p.line, "empty statement");
      } else if (keyword == "elif" || keyword == "else" || keyword == "endif" ||
                 keyword == "endfor") {
        Fail(p.line, absl::StrCat("unexpected {% ", keyword, " %}"));
      } else {
        Unsupported(p.line, absl::StrCat("{% ", keyword, " %}"));
      }
    }
    if (!ends.empty()) {
      Fail(pieces_.empty() ? 1 : pieces_.back().line,
           absl::StrCat("missing {% ", *ends.rbegin(), " %}"));
    }
    return body;
  }
  std::unique_ptr<Node> ParseIf(const Piece& first) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kIf;
    n->line = first.line;
    const Piece* p = &first;
    while (true) {
      ExprParser ep(p->tokens, 1, p->line);
      n->exprs.push_back(ep.Parse());
      ep.ExpectEnd();
      std::string end;
      n->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end));
      p = &pieces_[i_++];
      if (end == "elif") continue;
      if (end == "else") {
        ExprParser(p->tokens, 1, p->line).ExpectEnd();
        n->bodies.push_back(ParseBody({"endif"}, &end));
        ++i_;
      }
      return n;
    }
  }
  std::unique_ptr<Node> ParseFor(const Piece& p) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kFor;
    n->line = p.line;
    ExprParser ep(p.tokens, 1, p.line);
    n->names.push_back(ep.ExpectName());
    while (ep.IsOp(",")) {
      ep.Expect(",");
      n->names.push_back(ep.ExpectName());
    }
    if (!ep.IsName("in")) Fail(p.line, "expected 'in' in {% for %}");
    ExprParser iter(p.tokens, ep.pos() + 1, p.line);
    n->exprs.push_back(iter.ParseOr());
    if (iter.IsName("if")) {
      ExprParser cond(p.tokens, iter.pos() + 1, p.line);
      n->exprs.push_back(cond.ParseOr());
      if (cond.IsName("recursive")) Unsupported(p.line, "a recursive loop");
      cond.ExpectEnd();
    } else {
      n->exprs.push_back(nullptr);
      if (iter.IsName("recursive")) Unsupported(p.line, "a recursive loop");
      iter.ExpectEnd();
    }
    std::string end;
    n->bodies.push_back(ParseBody({"else", "endfor"}, &end));
    ++i_;
    if (end == "else") {
      n->bodies.push_back(ParseBody({"endfor"}, &end));
      ++i_;
    }
    return n;
  }
  std::unique_ptr<Node> ParseSet(const Piece& p) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kSet;
    n->line = p.line;
    ExprParser ep(p.tokens, 1, p.line);
    n->names.push_back(ep.ExpectName());
    if (ep.IsOp(".")) {
      ep.Expect(".");
      n->names.push_back(ep.ExpectName());
    }
    if (ep.IsOp(",")) Unsupported(p.line, "{% set a, b = ... %}");
    if (ep.AtEnd()) Unsupported(p.line, "{% set %}...{% endset %}");
    ep.Expect("=");
    n->exprs.push_back(ep.Parse());
    ep.ExpectEnd();
    return n;
  }

  std::vector<Piece> pieces_;
  size_t i_ = 0;
};

// ---- Evaluation --------------------------------------------------------------

// A value: JSON, or undefined.
struct Value {
  Json json;
  bool undefined = false;
  static Value Undefined() { return Value{nullptr, true}; }
};

bool Truthy(const Value& v) {
  if (v.undefined) return false;
  const Json& j = v.json;
  switch (j.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return j.get<int64_t>() != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0;
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
      return !j.empty();
    default:
      return false;
  }
}

// Python's json.dumps (", " and ": " separators, or "," and ": " with one
// item a line when indented; non-ASCII kept), as both transformers' and
// @huggingface/jinja's tojson write it.
std::string ToJson(const Json& j, int indent = -1, bool sort_keys = false, int depth = 0) {
  if (!j.is_array() && !j.is_object()) return j.dump();
  if (j.empty()) return j.is_array() ? "[]" : "{}";
  std::vector<std::string> parts;
  if (j.is_array()) {
    for (const Json& x : j) parts.push_back(ToJson(x, indent, sort_keys, depth + 1));
  } else {
    std::vector<std::pair<std::string, const Json*>> items;
    for (const auto& [k, x] : j.items()) items.emplace_back(k, &x);
    if (sort_keys) std::sort(items.begin(), items.end());
    for (const auto& [k, x] : items) {
      parts.push_back(absl::StrCat(Json(k).dump(), ": ", ToJson(*x, indent, sort_keys, depth + 1)));
    }
  }
  const char* open = j.is_array() ? "[" : "{";
  const char* close = j.is_array() ? "]" : "}";
  if (indent < 0) return absl::StrCat(open, absl::StrJoin(parts, ", "), close);
  const std::string inner = "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ');
  const std::string outer = "\n" + std::string(static_cast<size_t>(indent * depth), ' ');
  return absl::StrCat(open, inner, absl::StrJoin(parts, "," + inner), outer, close);
}

std::string ToString(const Value& v) {
  if (v.undefined || v.json.is_null()) return "";
  const Json& j = v.json;
  if (j.is_string()) return j.get<std::string>();
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  return ToJson(j);
}

// The characters (code points) of UTF-8 text, as Python's str indexes,
// slices and measures it.
std::vector<std::string> Chars(const std::string& s) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    chars.push_back(s.substr(i, n));
    i += n;
  }
  return chars;
}

bool IsInt(const Json& j) { return j.is_number_integer() || j.is_number_unsigned(); }

std::string Strip(std::string s, bool left, bool right, const std::optional<std::string>& chars) {
  auto strip_it = [&](char c) {
    return chars ? chars->find(c) != std::string::npos : absl::ascii_isspace(c);
  };
  if (right) {
    while (!s.empty() && strip_it(s.back())) s.pop_back();
  }
  if (left) {
    size_t k = 0;
    while (k < s.size() && strip_it(s[k])) ++k;
    s.erase(0, k);
  }
  return s;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
    start = !absl::ascii_isalnum(c);
  }
  return out;
}

class Renderer {
 public:
  explicit Renderer(const ChatTemplateInputs& inputs) {
    scopes_.emplace_back();
    auto& globals = scopes_.back();
    if (inputs.extra_context.is_object()) {
      for (const auto& [k, v] : inputs.extra_context.items()) globals[k] = Value{v};
    }
    globals["messages"] = Value{inputs.messages};
    globals["add_generation_prompt"] = Value{inputs.add_generation_prompt};
    globals["bos_token"] = Value{inputs.bos_token};
    globals["eos_token"] = Value{inputs.eos_token};
  }

  void Render(const NodeList& nodes, std::string& out) {
    for (const auto& n : nodes) {
      switch (n->kind) {
        case Node::kText:
          out += n->text;
          break;
        case Node::kOutput:
          out += ToString(Eval(*n->exprs[0]));
          break;
        case Node::kIf: {
          size_t k = 0;
          while (k < n->exprs.size() && !Truthy(Eval(*n->exprs[k]))) ++k;
          if (k < n->bodies.size()) Render(n->bodies[k], out);
          break;
        }
        case Node::kFor:
          RenderFor(*n, out);
          break;
        case Node::kSet: {
          Value v = Eval(*n->exprs[0]);
          if (n->names.size() == 1) {
            scopes_.back()[n->names[0]] = std::move(v);
          } else {
            Value* target = Lookup(n->names[0]);
            if (target == nullptr || !target->json.is_object()) {
              Fail(n->line, absl::StrCat("'", n->names[0], "' is not a namespace"));
            }
            target->json[n->names[1]] = std::move(v.json);
          }
          break;
        }
      }
    }
  }

 private:
  Value* Lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return &found->second;
    }
    return nullptr;
  }

  std::vector<Json> Items(const Value& v, int line) {
    if (v.undefined || v.json.is_null()) return {};
    if (v.json.is_array()) return std::vector<Json>(v.json.begin(), v.json.end());
    if (v.json.is_object()) {  // a dict iterates over its keys
      std::vector<Json> keys;
      for (const auto& [k, x] : v.json.items()) keys.push_back(k);
      return keys;
    }
    if (v.json.is_string()) {
      std::vector<Json> chars;
      for (std::string& c : Chars(v.json.get<std::string>())) chars.push_back(std::move(c));
      return chars;
    }
    Fail(line, absl::StrCat("cannot iterate over ", ToJson(v.json)));
  }

  void RenderFor(const Node& n, std::string& out) {
    std::vector<Json> items = Items(Eval(*n.exprs[0]), n.line);
    scopes_.emplace_back();
    auto bind = [&](const Json& item) {
      auto& scope = scopes_.back();
      if (n.names.size() == 1) {
        scope[n.names[0]] = Value{item};
        return;
      }
      if (!item.is_array() || item.size() != n.names.size()) {
        Fail(n.line,
             absl::StrCat("cannot unpack ", ToJson(item), " into ", n.names.size(), " names"));
      }
      for (size_t k = 0; k < n.names.size(); ++k) scope[n.names[k]] = Value{item[k]};
    };
    if (n.exprs[1]) {  // `for x in xs if cond`: the loop sees only what passes
      std::vector<Json> kept;
      for (const Json& item : items) {
        bind(item);
        if (Truthy(Eval(*n.exprs[1]))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < length; ++k) {
      scopes_.back().clear();
      bind(items[k]);
      Json loop = {{"index", k + 1},         {"index0", k},
                   {"revindex", length - k}, {"revindex0", length - k - 1},
                   {"first", k == 0},        {"last", k == length - 1},
                   {"length", length}};
      loop["previtem"] = k > 0 ? items[k - 1] : Json();
      loop["nextitem"] = k + 1 < length ? items[k + 1] : Json();
      scopes_.back()["loop"] = Value{std::move(loop)};
      Render(n.bodies[0], out);
    }
    scopes_.pop_back();
    if (length == 0 && n.bodies.size() > 1) Render(n.bodies[1], out);
  }

  Value Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral:
        return Value{e.value};
      case Expr::kName:
      case Expr::kAttr:
      case Expr::kIndex: {
        if (const Ref r = Resolve(e); r.resolved)
          return r.json ? Value{*r.json} : Value::Undefined();
        const Value base = Eval(*e.args[0]);
        return GetItem(base, e.kind == Expr::kAttr ? Json(e.name) : Eval(*e.args[1]).json, e.line);
      }
      case Expr::kSlice:
        return Slice(e);
      case Expr::kCall:
        return Call(e);
      case Expr::kFilter:
        return Filter(e);
      case Expr::kTest: {
        const bool result = Test(e.name, Eval(*e.args[0]),
                                 e.args.size() > 1 ? Eval(*e.args[1]) : Value::Undefined(), e.line);
        return Value{result != e.negated};
      }
      case Expr::kNot:
        return Value{!Truthy(Eval(*e.args[0]))};
      case Expr::kNeg: {
        const Value v = Eval(*e.args[0]);
        if (IsInt(v.json)) return Value{-v.json.get<int64_t>()};
        if (v.json.is_number()) return Value{-v.json.get<double>()};
        Fail(e.line, "'-' of a value that is not a number");
      }
      case Expr::kAnd: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? Eval(*e.args[1]) : a;
      }
      case Expr::kOr: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? a : Eval(*e.args[1]);
      }
      case Expr::kTernary:
        if (Truthy(Eval(*e.args[1]))) return Eval(*e.args[0]);
        return e.args[2] ? Eval(*e.args[2]) : Value::Undefined();
      case Expr::kBinary:
        return BinaryOp(e.name, Eval(*e.args[0]), Eval(*e.args[1]), e.line);
      case Expr::kList: {
        Json list = Json::array();
        for (const auto& x : e.args) list.push_back(Eval(*x).json);
        return Value{std::move(list)};
      }
      case Expr::kDict: {
        Json dict = Json::object();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          dict[ToString(Eval(*e.args[k]))] = Eval(*e.args[k + 1]).json;
        }
        return Value{std::move(dict)};
      }
    }
    Fail(e.line, "bad expression");
  }

  // j[key] (or j.key) in place; nullptr when undefined. Not for strings.
  static const Json* Item(const Json& j, const Json& key, int line) {
    if (j.is_null()) return nullptr;
    if (j.is_object()) {
      if (!key.is_string()) return nullptr;
      auto it = j.find(key.get<std::string>());
      return it == j.end() ? nullptr : &*it;
    }
    if (j.is_array() && IsInt(key)) {
      int64_t k = key.get<int64_t>();
      if (k < 0) k += static_cast<int64_t>(j.size());
      if (k < 0 || k >= static_cast<int64_t>(j.size())) return nullptr;
      return &j[static_cast<size_t>(k)];
    }
    if (j.is_array() && key.is_string()) return nullptr;
    Fail(line, absl::StrCat("cannot index ", ToJson(j), " with ", ToJson(key)));
  }

  static Value GetItem(const Value& v, const Json& key, int line) {
    if (v.undefined) return Value::Undefined();
    const Json& j = v.json;
    if (j.is_string()) {
      if (!IsInt(key)) return Value::Undefined();
      const std::vector<std::string> chars = Chars(j.get<std::string>());
      int64_t k = key.get<int64_t>();
      if (k < 0) k += static_cast<int64_t>(chars.size());
      if (k < 0 || k >= static_cast<int64_t>(chars.size())) return Value::Undefined();
      return Value{chars[static_cast<size_t>(k)]};
    }
    const Json* item = Item(j, key, line);
    return item ? Value{*item} : Value::Undefined();
  }

  // A chain of names, attributes and items resolved in place, so that
  // `messages[i].content` copies the content, not `messages`.
  struct Ref {
    bool resolved = false;       // false: not such a chain (or a string index)
    const Json* json = nullptr;  // nullptr: undefined
  };
  Ref Resolve(const Expr& e) {
    if (e.kind == Expr::kName) {
      const Value* v = Lookup(e.name);
      return {true, v && !v->undefined ? &v->json : nullptr};
    }
    if (e.kind != Expr::kAttr && e.kind != Expr::kIndex) return {};
    const Ref base = Resolve(*e.args[0]);
    if (!base.resolved || (base.json && base.json->is_string())) return {};
    if (!base.json) return {true, nullptr};
    const Json key = e.kind == Expr::kAttr ? Json(e.name) : Eval(*e.args[1]).json;
    if (e.kind == Expr::kIndex && base.json->is_array() && key.is_string()) return {};
    return {true, Item(*base.json, key, e.line)};
  }

  Value Slice(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    auto bound = [&](int k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      const Value b = Eval(*e.args[k]);
      if (b.undefined || b.json.is_null()) return std::nullopt;
      if (!IsInt(b.json)) Fail(e.line, "a slice bound is not an integer");
      return b.json.get<int64_t>();
    };
    const std::optional<int64_t> start = bound(1), stop = bound(2), step_opt = bound(3);
    const int64_t step = step_opt.value_or(1);
    if (step == 0) Fail(e.line, "slice step is zero");
    const bool is_string = v.json.is_string();
    if (!is_string && !v.json.is_array())
      Fail(e.line, "cannot slice a value that is not a list or string");
    const std::vector<std::string> chars =
        is_string ? Chars(v.json.get<std::string>()) : std::vector<std::string>();
    const int64_t size = static_cast<int64_t>(is_string ? chars.size() : v.json.size());
    // Python's slice.indices().
    auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
      if (!x) return dflt;
      int64_t k = *x < 0 ? *x + size : *x;
      if (step > 0) return std::clamp<int64_t>(k, 0, size);
      return std::clamp<int64_t>(k, -1, size - 1);
    };
    const int64_t lo = clamp(start, step > 0 ? 0 : size - 1);
    const int64_t hi = clamp(stop, step > 0 ? size : -1);
    Json out = is_string ? Json("") : Json::array();
    std::string s;
    for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) {
      if (is_string) {
        s += chars[static_cast<size_t>(k)];
      } else {
        out.push_back(v.json[static_cast<size_t>(k)]);
      }
    }
    return is_string ? Value{s} : Value{out};
  }

  std::vector<Value> Args(const Expr& e, size_t from) {
    std::vector<Value> args;
    for (size_t k = from; k < e.args.size(); ++k) args.push_back(Eval(*e.args[k]));
    return args;
  }

  Value Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<Value> args = Args(e, 1);
    if (callee.kind == Expr::kName) {
      if (callee.name == "raise_exception") {
        Fail(e.line, absl::StrCat("raise_exception: ", args.empty() ? "" : ToString(args[0])));
      }
      if (callee.name == "namespace") {
        Json ns = Json::object();
        for (const auto& [k, x] : e.kwargs) ns[k] = Eval(*x).json;
        return Value{std::move(ns)};
      }
      if (callee.name == "range") {
        std::vector<int64_t> b;
        for (const Value& a : args) {
          if (!IsInt(a.json)) Fail(e.line, "range() of a value that is not an integer");
          b.push_back(a.json.get<int64_t>());
        }
        if (b.empty() || b.size() > 3) Fail(e.line, "range() takes 1 to 3 arguments");
        const int64_t start = b.size() > 1 ? b[0] : 0, stop = b.size() > 1 ? b[1] : b[0];
        const int64_t step = b.size() > 2 ? b[2] : 1;
        if (step == 0) Fail(e.line, "range() step is zero");
        Json out = Json::array();
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(k);
        return Value{std::move(out)};
      }
      Unsupported(e.line, absl::StrCat("the function '", callee.name, "'"));
    }
    if (callee.kind != Expr::kAttr) Fail(e.line, "call of something that is not a function");
    const Value self = Eval(*callee.args[0]);
    const std::string& m = callee.name;
    auto str_arg = [&](size_t k) -> std::optional<std::string> {
      if (k >= args.size() || args[k].json.is_null()) return std::nullopt;
      return ToString(args[k]);
    };
    if (self.json.is_string()) {
      const std::string& s = self.json.get_ref<const std::string&>();
      if (m == "strip") return Value{Strip(s, true, true, str_arg(0))};
      if (m == "lstrip") return Value{Strip(s, true, false, str_arg(0))};
      if (m == "rstrip") return Value{Strip(s, false, true, str_arg(0))};
      if (m == "upper") return Value{absl::AsciiStrToUpper(s)};
      if (m == "lower") return Value{absl::AsciiStrToLower(s)};
      if (m == "title") return Value{Title(s)};
      if (m == "startswith" && str_arg(0)) return Value{s.starts_with(*str_arg(0))};
      if (m == "endswith" && str_arg(0)) return Value{s.ends_with(*str_arg(0))};
      if (m == "replace" && args.size() == 2) {
        return Value{absl::StrReplaceAll(s, {{ToString(args[0]), ToString(args[1])}})};
      }
      if (m == "split") {
        Json out = Json::array();
        if (str_arg(0)) {
          for (auto part : absl::StrSplit(s, *str_arg(0))) out.push_back(std::string(part));
        } else {
          for (auto part : absl::StrSplit(s, absl::ByAnyChar(" \t\n\r\f\v"), absl::SkipEmpty())) {
            out.push_back(std::string(part));
          }
        }
        return Value{std::move(out)};
      }
    }
    if (self.json.is_object()) {
      if (m == "items" || m == "keys" || m == "values") {
        Json out = Json::array();
        for (const auto& [k, x] : self.json.items()) {
          out.push_back(m == "items" ? Json::array({k, x}) : m == "keys" ? Json(k) : x);
        }
        return Value{std::move(out)};
      }
      if (m == "get" && !args.empty()) {
        Value v = GetItem(self, args[0].json, e.line);
        return v.undefined ? (args.size() > 1 ? args[1] : Value{nullptr}) : v;
      }
    }
    Unsupported(e.line, absl::StrCat("the method '", m, "'"));
  }

  Value Filter(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    std::vector<Value> args = Args(e, 1);
    const std::string& f = e.name;
    auto kwarg = [&](const std::string& name) -> std::optional<Value> {
      for (const auto& [k, x] : e.kwargs) {
        if (k == name) return Eval(*x);
      }
      return std::nullopt;
    };
    if (f == "default" || f == "d") {
      const bool boolean = args.size() > 1 && Truthy(args[1]);
      if (v.undefined || (boolean && !Truthy(v))) return args.empty() ? Value{""} : args[0];
      return v;
    }
    if (f == "length" || f == "count") {
      if (v.json.is_string())
        return Value{static_cast<int64_t>(Chars(v.json.get<std::string>()).size())};
      if (v.json.is_array() || v.json.is_object())
        return Value{static_cast<int64_t>(v.json.size())};
      Fail(e.line, "length of a value that is neither a string nor a collection");
    }
    if (f == "string") return Value{ToString(v)};
    if (f == "tojson") {
      for (const auto& [k, x] : e.kwargs) {
        if (k != "indent" && k != "sort_keys")
          Unsupported(e.line, absl::StrCat("tojson(", k, "=)"));
      }
      const std::optional<Value> indent = args.empty() ? kwarg("indent") : args[0];
      if (indent && !indent->undefined && !indent->json.is_null() && !IsInt(indent->json)) {
        Fail(e.line, "tojson indent is not an integer");
      }
      const std::optional<Value> sort_keys = kwarg("sort_keys");
      return Value{ToJson(v.json, indent && IsInt(indent->json) ? indent->json.get<int>() : -1,
                          sort_keys && Truthy(*sort_keys))};
    }
    if (f == "trim") return Value{Strip(ToString(v), true, true, std::nullopt)};
    if (f == "lower") return Value{absl::AsciiStrToLower(ToString(v))};
    if (f == "upper") return Value{absl::AsciiStrToUpper(ToString(v))};
    if (f == "title") return Value{Title(ToString(v))};
    if (f == "capitalize") {
      std::string s = absl::AsciiStrToLower(ToString(v));
      if (!s.empty()) s[0] = absl::ascii_toupper(s[0]);
      return Value{s};
    }
    if (f == "replace" && args.size() == 2) {
      return Value{absl::StrReplaceAll(ToString(v), {{ToString(args[0]), ToString(args[1])}})};
    }
    if (f == "int") {
      if (IsInt(v.json)) return v;
      if (v.json.is_number()) return Value{static_cast<int64_t>(v.json.get<double>())};
      int64_t x = 0;
      return Value{absl::SimpleAtoi(ToString(v), &x) ? x : 0};
    }
    if (f == "items") {
      if (!v.json.is_object()) Fail(e.line, "items of a value that is not a mapping");
      Json out = Json::array();
      for (const auto& [k, x] : v.json.items()) out.push_back(Json::array({k, x}));
      return Value{std::move(out)};
    }
    std::vector<Json> items = Items(v, e.line);
    if (f == "list") return Value{Json(items)};
    if (f == "first") return items.empty() ? Value::Undefined() : Value{items.front()};
    if (f == "last") return items.empty() ? Value::Undefined() : Value{items.back()};
    if (f == "reverse") {
      if (v.json.is_string()) {
        std::vector<std::string> chars = Chars(v.json.get<std::string>());
        std::reverse(chars.begin(), chars.end());
        return Value{absl::StrJoin(chars, "")};
      }
      std::reverse(items.begin(), items.end());
      return Value{Json(items)};
    }
    if (f == "join") {
      std::vector<std::string> parts;
      for (const Json& x : items) parts.push_back(ToString(Value{x}));
      return Value{absl::StrJoin(parts, args.empty() ? "" : ToString(args[0]))};
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (args.empty()) Fail(e.line, absl::StrCat(f, " needs an attribute"));
      const Json attr = args[0].json;
      Json out = Json::array();
      for (const Json& x : items) {
        const Value a = GetItem(Value{x}, attr, e.line);
        const bool pass =
            args.size() > 1
                ? Test(ToString(args[1]), a, args.size() > 2 ? args[2] : Value::Undefined(), e.line)
                : Truthy(a);
        if (pass == (f == "selectattr")) out.push_back(x);
      }
      return Value{std::move(out)};
    }
    if (f == "map") {
      const std::optional<Value> attr = kwarg("attribute");
      if (!attr) Unsupported(e.line, "map() without attribute=");
      Json out = Json::array();
      for (const Json& x : items) {
        Value a = GetItem(Value{x}, attr->json, e.line);
        if (a.undefined) a = kwarg("default").value_or(Value{nullptr});
        out.push_back(a.json);
      }
      return Value{std::move(out)};
    }
    Unsupported(e.line, absl::StrCat("the filter '", f, "' here"));
  }

  bool Test(const std::string& t, const Value& v, const Value& arg, int line) {
    const Json& j = v.json;
    if (t == "defined") return !v.undefined;
    if (t == "undefined") return v.undefined;
    if (v.undefined) return false;
    if (t == "none") return j.is_null();
    if (t == "string") return j.is_string();
    if (t == "number") return j.is_number();
    if (t == "integer") return IsInt(j);
    if (t == "boolean") return j.is_boolean();
    if (t == "true") return j.is_boolean() && j.get<bool>();
    if (t == "false") return j.is_boolean() && !j.get<bool>();
    if (t == "mapping") return j.is_object();
    if (t == "sequence" || t == "iterable") return j.is_array() || j.is_string() || j.is_object();
    if (t == "equalto" || t == "eq" || t == "==") return !arg.undefined && j == arg.json;
    if (t == "ne" || t == "!=") return arg.undefined || j != arg.json;
    if (t == "odd" || t == "even") {
      if (!IsInt(j)) Fail(line, absl::StrCat("'", t, "' of a value that is not an integer"));
      return (j.get<int64_t>() % 2 != 0) == (t == "odd");
    }
    if (t == "in") return Contains(arg, v, line);
    Unsupported(line, absl::StrCat("the test '", t, "'"));
  }

  static bool Contains(const Value& haystack, const Value& needle, int line) {
    const Json& h = haystack.json;
    if (h.is_string())
      return h.get_ref<const std::string&>().find(ToString(needle)) != std::string::npos;
    if (h.is_array()) return std::find(h.begin(), h.end(), needle.json) != h.end();
    if (h.is_object()) return needle.json.is_string() && h.contains(needle.json.get<std::string>());
    if (haystack.undefined || h.is_null()) return false;
    Fail(line, "'in' of a value that is not a string or collection");
  }

  static Value BinaryOp(const std::string& op, const Value& a, const Value& b, int line) {
    const Json &x = a.json, &y = b.json;
    if (op == "==") return Value{a.undefined == b.undefined && x == y};
    if (op == "!=") return Value{!(a.undefined == b.undefined && x == y)};
    if (op == "in") return Value{Contains(b, a, line)};
    if (op == "not in") return Value{!Contains(b, a, line)};
    if (op == "~") return Value{ToString(a) + ToString(b)};
    if (op == "+" && (x.is_string() || y.is_string())) return Value{ToString(a) + ToString(b)};
    if (op == "+" && x.is_array() && y.is_array()) {
      Json out = x;
      out.insert(out.end(), y.begin(), y.end());
      return Value{std::move(out)};
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (!((x.is_number() && y.is_number()) || (x.is_string() && y.is_string()))) {
        Fail(line, absl::StrCat("cannot compare ", ToJson(x), " ", op, " ", ToJson(y)));
      }
      const bool lt = x < y, gt = y < x;
      return Value{op == "<" ? lt : op == ">" ? gt : op == "<=" ? !gt : !lt};
    }
    if (!x.is_number() || !y.is_number() || x.is_boolean() || y.is_boolean()) {
      Fail(line, absl::StrCat("'", op, "' of ", ToJson(x), " and ", ToJson(y)));
    }
    if (IsInt(x) && IsInt(y) && op != "/") {
      const int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
      if (op == "+") return Value{p + q};
      if (op == "-") return Value{p - q};
      if (op == "*") return Value{p * q};
      if (q == 0) Fail(line, "division by zero");
      // Python's floor division and modulo.
      int64_t d = p / q, r = p % q;
      if (r != 0 && ((r < 0) != (q < 0))) {
        --d;
        r += q;
      }
      return Value{op == "//" ? d : r};
    }
    const double p = x.get<double>(), q = y.get<double>();
    if (op == "+") return Value{p + q};
    if (op == "-") return Value{p - q};
    if (op == "*") return Value{p * q};
    if (q == 0) Fail(line, "division by zero");
    if (op == "/") return Value{p / q};
    if (op == "//") return Value{std::floor(p / q)};
    return Value{p - q * std::floor(p / q)};
  }

  std::vector<std::map<std::string, Value>> scopes_;
};

// Built-in templates: the chat_template strings the models ship.
constexpr std::string_view kLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
constexpr std::string_view kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% "
    "endif %}";
constexpr std::string_view kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}"
    "{% endif %}";

}  // namespace

std::string_view ChatTemplate::BuiltinSource(std::string_view name) {
  if (name == "llama-2") return kLlama2;
  if (name == "llama-3") return kLlama3;
  if (name == "chatml") return kChatml;
  return {};
}

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  try {
    auto root = std::make_shared<Node>();
    root->bodies.push_back(TemplateParser(Lex(source)).ParseAll());
    return ChatTemplate(std::move(root));
  } catch (const TemplateError& e) {
    return absl::Status(e.code, e.message);
  }
}

absl::StatusOr<ChatTemplate> ChatTemplate::Builtin(std::string_view name) {
  const std::string_view source = BuiltinSource(name);
  if (source.empty()) {
    return absl::NotFoundError(absl::StrCat("no built-in chat template '", std::string(name),
                                            "' (llama-2, llama-3, chatml)"));
  }
  return Parse(source);
}

absl::StatusOr<ChatTemplate> ChatTemplate::Select(std::string_view choice,
                                                  const Tokenizer& tokenizer) {
  constexpr char kHint[] = "; pass --chat-template llama-2|llama-3|chatml or a Jinja file";
  if (!BuiltinSource(choice).empty()) return Builtin(choice);
  std::string source, where;
  if (!choice.empty()) {
    std::ifstream in{std::string(choice), std::ios::binary};
    if (!in) {
      return absl::NotFoundError(absl::StrCat("--chat-template ", std::string(choice),
                                              ": neither a built-in template (llama-2, llama-3, "
                                              "chatml) nor a readable file"));
    }
    source.assign(std::istreambuf_iterator<char>(in), {});
    where = std::string(choice);
  } else if (tokenizer.chat_template()) {
    source = *tokenizer.chat_template();
    where = "the tokenizer's chat template (chat_template.jinja or tokenizer_config.json)";
  } else {
    return absl::FailedPreconditionError(absl::StrCat("the tokenizer has no chat_template", kHint));
  }
  absl::StatusOr<ChatTemplate> t = Parse(source);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(where, ": ", t.status().message(),
                                                        choice.empty() ? kHint : ""));
  }
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  try {
    std::string out;
    Renderer(inputs).Render(root_->bodies[0], out);
    return out;
  } catch (const TemplateError& e) {
    return absl::Status(e.code, e.message);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

}  // namespace tandem::tokenizer
