#include "chat_template_parser.h"

#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/nesting.h"

namespace tandem::tokenizer::internal::jinja {
namespace {

const std::set<std::string, std::less<>> kFilters = {
    "trim",       "length", "count",  "list",       "first",      "last",    "lower", "upper",
    "capitalize", "title",  "string", "int",        "join",       "default", "d",     "replace",
    "reverse",    "tojson", "items",  "selectattr", "rejectattr", "map"};
const std::set<std::string, std::less<>> kTests = {
    "defined",  "undefined", "none",    "string", "number", "integer", "mapping",
    "sequence", "iterable",  "boolean", "true",   "false",  "equalto", "eq",
    "==",       "ne",        "!=",      "odd",    "even",   "in"};

// Bounds on a template's shape, so that parsing and rendering it (both
// recursive) stay well inside a thread's stack whatever its source: an
// expression's depth is at most its tag's token count. Real templates'
// tags hold tens of tokens and nest blocks a few deep.
constexpr size_t kMaxTagTokens = 1024;
constexpr int kMaxBlockDepth = 64;

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& tokens, size_t pos, int line)
      : tokens_(tokens), pos_(pos), line_(line) {
    if (tokens.size() > kMaxTagTokens) {
      Fail(line, absl::StrCat("a tag of ", tokens.size(), " tokens; at most ", kMaxTagTokens));
    }
  }

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
    const Nesting nesting(depth_);
    if (depth_ > kMaxBlockDepth + 1) {
      Fail(i_ < pieces_.size() ? pieces_[i_].line : 1,
           absl::StrCat("blocks nested more than ", kMaxBlockDepth, " deep"));
    }
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
  int depth_ = 0;  // ParseBody calls on the stack
};

}  // namespace

NodeList ParseTemplate(std::vector<Piece> pieces) {
  return TemplateParser(std::move(pieces)).ParseAll();
}

}  // namespace tandem::tokenizer::internal::jinja
