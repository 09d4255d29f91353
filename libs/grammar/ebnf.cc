#include "tandem/grammar/ebnf.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tandem/common/status.h"
#include "tandem/grammar/regex.h"

namespace tandem::grammar {
// A named namespace, not an anonymous one: EbnfCompiler, a friend of Schema,
// keeps these types in its fields (GCC's -Wsubobject-linkage where the file
// is part of a unity build).
namespace ebnf {

using Kind = SchemaNode::Kind;

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
// xgrammar's bound on an integer in a grammar ({n,m}).
constexpr int64_t kMaxInteger = 1'000'000'000'000'000;

// ---- Tokens ----------------------------------------------------------------

enum class Tok : uint8_t {
  kName,      // an identifier
  kRuleName,  // an identifier that a ::= follows
  kBool,      // true, false (xgrammar's macro values: not a rule's name)
  kAssign,    // ::=
  kString,
  kClass,
  kLParen,
  kLookahead,  // (=
  kRParen,
  kLBrace,
  kRBrace,
  kPipe,
  kComma,
  kStar,
  kPlus,
  kQuestion,
  kEqual,
  kInteger,
  kEnd,
};

struct Token {
  Tok type = Tok::kEnd;
  int line = 1;
  int column = 1;
  std::string text;                // kName, kRuleName: the name
  std::vector<uint32_t> chars;     // kString: its characters
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // kClass
  bool negated = false;            // kClass
  int64_t value = 0;               // kInteger
};

absl::Status ErrorAt(int line, int column, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ", column ", column, ": ", what));
}

bool IsNameChar(char c, bool first) {
  return c == '_' || c == '-' || c == '.' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (!first && c >= '0' && c <= '9');
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  absl::StatusOr<std::vector<Token>> Run() {
    std::vector<Token> tokens;
    while (true) {
      SkipSpace();
      Token t;
      t.line = line_;
      t.column = column_;
      if (AtEnd()) {
        tokens.push_back(std::move(t));
        break;
      }
      TANDEM_RETURN_IF_ERROR(Next(&t));
      tokens.push_back(std::move(t));
    }
    // A name that ::= follows names a rule, and must begin its line.
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i].type != Tok::kAssign) continue;
      if (i == 0 || tokens[i - 1].type != Tok::kName) {
        return ErrorAt(tokens[i].line, tokens[i].column, "::= must follow a rule's name");
      }
      if (i >= 2 && tokens[i - 2].line == tokens[i - 1].line) {
        return ErrorAt(tokens[i - 1].line, tokens[i - 1].column,
                       "a rule's name must begin its line");
      }
      tokens[i - 1].type = Tok::kRuleName;
    }
    return tokens;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  void Advance(size_t n = 1) {
    for (size_t i = 0; i < n && !AtEnd(); ++i) {
      const char c = text_[pos_++];
      if (c == '\n' || (c == '\r' && Peek() != '\n')) {
        ++line_;
        column_ = 1;
      } else {
        ++column_;
      }
    }
  }
  absl::Status Error(absl::string_view what) const { return ErrorAt(line_, column_, what); }

  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        Advance();
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n' && Peek() != '\r') Advance();
      } else {
        return;
      }
    }
  }

  absl::Status Next(Token* t) {
    const char c = Peek();
    const auto one = [&](Tok type) {
      t->type = type;
      Advance();
      return absl::OkStatus();
    };
    switch (c) {
      case '(':
        if (Peek(1) == '=') {
          t->type = Tok::kLookahead;
          Advance(2);
          return absl::OkStatus();
        }
        return one(Tok::kLParen);
      case ')':
        return one(Tok::kRParen);
      case '{':
        return one(Tok::kLBrace);
      case '}':
        return one(Tok::kRBrace);
      case '|':
        return one(Tok::kPipe);
      case ',':
        return one(Tok::kComma);
      case '*':
        return one(Tok::kStar);
      case '+':
        return one(Tok::kPlus);
      case '?':
        return one(Tok::kQuestion);
      case '=':
        return one(Tok::kEqual);
      case ':':
        if (Peek(1) == ':' && Peek(2) == '=') {
          t->type = Tok::kAssign;
          Advance(3);
          return absl::OkStatus();
        }
        return Error("an unexpected ':' (a rule is name ::= body)");
      case '"':
        return String(t);
      case '[':
        return Class(t);
      default:
        break;
    }
    if (IsNameChar(c, true)) {
      const size_t start = pos_;
      while (!AtEnd() && IsNameChar(Peek(), pos_ == start)) Advance();
      t->text = std::string(text_.substr(start, pos_ - start));
      t->type = t->text == "true" || t->text == "false" ? Tok::kBool : Tok::kName;
      return absl::OkStatus();
    }
    if (c >= '0' && c <= '9') {
      t->type = Tok::kInteger;
      while (Peek() >= '0' && Peek() <= '9') {
        t->value = t->value * 10 + (Peek() - '0');
        if (t->value > kMaxInteger) return Error("an integer above 10^15");
        Advance();
      }
      return absl::OkStatus();
    }
    return Error(absl::StrFormat("an unexpected character '%c'", c));
  }

  // One character of a string or class, as UTF-8 or an escape; `in_class`
  // adds the class's escapes of punctuation.
  absl::StatusOr<uint32_t> Char(bool in_class) {
    const uint8_t b = static_cast<uint8_t>(Peek());
    if (b != '\\') {
      const int len = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3
                                 : b >= 0xF0 && b <= 0xF4   ? 4
                                                            : 0;
      if (len == 0) return Error("a byte that is not UTF-8");
      uint32_t cp = len == 1 ? b : b & (0x7F >> len);
      for (int i = 1; i < len; ++i) {
        const uint8_t cont = static_cast<uint8_t>(Peek(static_cast<size_t>(i)));
        if ((cont & 0xC0) != 0x80) return Error("a byte that is not UTF-8");
        cp = cp << 6 | (cont & 0x3F);
      }
      Advance(static_cast<size_t>(len));
      return cp;
    }
    const char e = Peek(1);
    static constexpr std::pair<char, uint32_t> kEscapes[] = {
        {'\'', '\''}, {'"', '"'},  {'?', '?'},  {'\\', '\\'}, {'a', '\a'}, {'b', '\b'}, {'f', '\f'},
        {'n', '\n'},  {'r', '\r'}, {'t', '\t'}, {'v', '\v'},  {'0', 0},    {'e', 0x1B}};
    static constexpr std::string_view kClassEscapes = "^$\\.*+?()[]{}|/-";
    if (in_class && kClassEscapes.find(e) != std::string_view::npos) {
      Advance(2);
      return static_cast<uint32_t>(e);
    }
    for (const auto& [from, to] : kEscapes) {
      if (e == from) {
        Advance(2);
        return to;
      }
    }
    uint64_t cp = 0;
    size_t digits = 0;
    if (e == 'x') {
      while (HexValue(Peek(2 + digits)) >= 0) {
        cp = cp * 16 + static_cast<uint64_t>(HexValue(Peek(2 + digits)));
        if (cp > kMaxCodepoint) return Error("an escape of a value above U+10FFFF");
        ++digits;
      }
      if (digits == 0) return Error("\\x without a hex digit");
    } else if (e == 'u' || e == 'U') {
      const size_t want = e == 'u' ? 4 : 8;
      for (; digits < want; ++digits) {
        const int v = HexValue(Peek(2 + digits));
        if (v < 0) return Error(absl::StrCat("\\", std::string(1, e), " without ", want, " hex digits"));
        cp = cp * 16 + static_cast<uint64_t>(v);
      }
    } else if (in_class && (e == 'd' || e == 'D' || e == 's' || e == 'S' || e == 'w' || e == 'W')) {
      return Error(absl::StrCat("\\", std::string(1, e),
                                " in a character class (xgrammar's EBNF has no class escapes)"));
    } else {
      return Error("an unknown escape");
    }
    if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return Error("an escape of a surrogate or of a value above U+10FFFF");
    }
    Advance(2 + digits);
    return static_cast<uint32_t>(cp);
  }

  absl::Status String(Token* t) {
    t->type = Tok::kString;
    Advance();  // "
    while (!AtEnd() && Peek() != '"' && Peek() != '\n' && Peek() != '\r') {
      TANDEM_ASSIGN_OR_RETURN(const uint32_t cp, Char(/*in_class=*/false));
      t->chars.push_back(cp);
    }
    if (Peek() != '"') return ErrorAt(t->line, t->column, "a string not closed on its line");
    Advance();
    return absl::OkStatus();
  }

  // [...]: a '-' between two characters (or dashes) is a range; elsewhere
  // it is itself. An escaped '-' is always itself.
  absl::Status Class(Token* t) {
    t->type = Tok::kClass;
    Advance();  // [
    if (Peek() == '^') {
      t->negated = true;
      Advance();
    }
    struct Item {
      uint32_t cp;
      bool dash;
    };
    std::vector<Item> items;
    while (!AtEnd() && Peek() != ']') {
      if (Peek() == '\n' || Peek() == '\r') return Error("a character class across lines");
      if (Peek() == '-') {
        items.push_back({'-', true});
        Advance();
        continue;
      }
      TANDEM_ASSIGN_OR_RETURN(const uint32_t cp, Char(/*in_class=*/true));
      items.push_back({cp, false});
    }
    if (AtEnd()) return ErrorAt(t->line, t->column, "a character class not closed");
    Advance();  // ]
    for (size_t i = 0; i < items.size(); ++i) {
      if (i + 2 < items.size() && items[i + 1].dash) {
        if (items[i].cp > items[i + 2].cp) {
          return ErrorAt(t->line, t->column, "a character range whose ends are reversed");
        }
        t->ranges.emplace_back(items[i].cp, items[i + 2].cp);
        i += 2;
      } else {
        t->ranges.emplace_back(items[i].cp, items[i].cp);
      }
    }
    if (t->ranges.empty() && !t->negated) {
      return ErrorAt(t->line, t->column, "an empty character class (it matches nothing)");
    }
    return absl::OkStatus();
  }

  std::string_view text_;
  size_t pos_ = 0;
  int line_ = 1;
  int column_ = 1;
};

// ---- Expressions -------------------------------------------------------------

struct Expr {
  enum class Op : uint8_t { kText, kClass, kRef, kSeq, kAlt, kRepeat };
  Op op = Op::kSeq;
  std::vector<uint32_t> chars;                        // kText
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // kClass
  bool negated = false;                               // kClass
  int32_t rule = -1;                                  // kRef
  std::vector<Expr> items;                            // kSeq, kAlt; kRepeat: one
  int64_t min = 0, max = -1;                          // kRepeat (-1: unbounded)
  bool has_ref = false;                               // names a rule somewhere
};

struct Rule {
  std::string name;
  Expr body;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<std::vector<Rule>> Run() {
    std::vector<Rule> rules;
    for (const Token& t : tokens_) {
      if (t.type != Tok::kRuleName) continue;
      if (ids_.contains(t.text)) {
        return ErrorAt(t.line, t.column, absl::StrCat("rule '", t.text, "' is defined twice"));
      }
      ids_.emplace(t.text, static_cast<int32_t>(rules.size()));
      rules.push_back({.name = t.text});
    }
    if (!ids_.contains("root")) return absl::InvalidArgumentError("there is no rule 'root'");
    while (Peek().type != Tok::kEnd) {
      if (Peek().type != Tok::kRuleName) return Error("a rule's name ::= was expected");
      const int32_t id = ids_.at(Peek().text);
      pos_ += 2;  // the name and ::=
      TANDEM_ASSIGN_OR_RETURN(rules[static_cast<size_t>(id)].body, Choices());
      if (Peek().type == Tok::kLookahead) {
        return Error("a lookahead assertion (= ...) (not served)");
      }
    }
    return rules;
  }

 private:
  const Token& Peek() const { return tokens_[pos_]; }
  absl::Status Error(absl::string_view what) const {
    return ErrorAt(Peek().line, Peek().column, what);
  }

  absl::StatusOr<Expr> Choices() {
    Expr alt{.op = Expr::Op::kAlt};
    while (true) {
      TANDEM_ASSIGN_OR_RETURN(Expr seq, Sequence());
      alt.has_ref |= seq.has_ref;
      alt.items.push_back(std::move(seq));
      if (Peek().type != Tok::kPipe) break;
      ++pos_;
    }
    if (alt.items.size() == 1) return std::move(alt.items[0]);
    return alt;
  }

  absl::StatusOr<Expr> Sequence() {
    Expr seq{.op = Expr::Op::kSeq};
    do {
      TANDEM_ASSIGN_OR_RETURN(Expr e, Quantified());
      seq.has_ref |= e.has_ref;
      seq.items.push_back(std::move(e));
    } while (Peek().type != Tok::kPipe && Peek().type != Tok::kRParen &&
             Peek().type != Tok::kLookahead && Peek().type != Tok::kRuleName &&
             Peek().type != Tok::kEnd);
    if (seq.items.size() == 1) return std::move(seq.items[0]);
    return seq;
  }

  absl::StatusOr<Expr> Quantified() {
    TANDEM_ASSIGN_OR_RETURN(Expr e, Element());
    int64_t min = 0, max = -1;
    switch (Peek().type) {
      case Tok::kStar:
        ++pos_;
        break;
      case Tok::kPlus:
        ++pos_;
        min = 1;
        break;
      case Tok::kQuestion:
        ++pos_;
        max = 1;
        break;
      case Tok::kLBrace: {
        ++pos_;
        if (Peek().type != Tok::kInteger) return Error("an integer was expected after {");
        min = max = tokens_[pos_++].value;
        if (Peek().type == Tok::kComma) {
          ++pos_;
          max = -1;
          if (Peek().type == Tok::kInteger) {
            max = tokens_[pos_++].value;
            if (max < min) return Error("a repetition {n,m} with m below n");
          }
        }
        if (Peek().type != Tok::kRBrace) return Error("} was expected");
        ++pos_;
        break;
      }
      default:
        return e;
    }
    Expr r{.op = Expr::Op::kRepeat, .min = min, .max = max, .has_ref = e.has_ref};
    r.items.push_back(std::move(e));
    return r;
  }

  absl::StatusOr<Expr> Element() {
    const Token& t = Peek();
    switch (t.type) {
      case Tok::kLParen: {
        ++pos_;
        if (Peek().type == Tok::kRParen) {
          ++pos_;
          return Expr{.op = Expr::Op::kText};
        }
        TANDEM_ASSIGN_OR_RETURN(Expr e, Choices());
        if (Peek().type != Tok::kRParen) return Error(") was expected");
        ++pos_;
        return e;
      }
      case Tok::kString:
        ++pos_;
        return Expr{.op = Expr::Op::kText, .chars = t.chars};
      case Tok::kClass:
        ++pos_;
        return Expr{.op = Expr::Op::kClass, .ranges = t.ranges, .negated = t.negated};
      case Tok::kName: {
        if (t.text == "TagDispatch") return Error("TagDispatch (not served)");
        const auto it = ids_.find(t.text);
        if (it == ids_.end()) return Error(absl::StrCat("rule '", t.text, "' is not defined"));
        ++pos_;
        return Expr{.op = Expr::Op::kRef, .rule = it->second, .has_ref = true};
      }
      default:
        return Error("an element (a string, a class, a rule's name or a group) was expected");
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  absl::flat_hash_map<std::string, int32_t> ids_;
};

// ---- Nodes --------------------------------------------------------------------

// A rule-free expression as a pattern of regex.h's text dialect.
void AppendPattern(const Expr& e, std::string* out) {
  const auto cp = [out](uint32_t c) { absl::StrAppendFormat(out, "\\u{%x}", c); };
  switch (e.op) {
    case Expr::Op::kText:
      out->append("(?:");
      for (uint32_t c : e.chars) cp(c);
      out->append(")");
      return;
    case Expr::Op::kClass:
      if (e.negated && e.ranges.empty()) {
        out->append(".");  // [^]: any character (the dialect's '.' takes newlines)
        return;
      }
      out->append(e.negated ? "[^" : "[");
      for (const auto& [lo, hi] : e.ranges) {
        cp(lo);
        if (hi != lo) {
          out->push_back('-');
          cp(hi);
        }
      }
      out->append("]");
      return;
    case Expr::Op::kSeq:
    case Expr::Op::kAlt:
      out->append("(?:");
      for (size_t i = 0; i < e.items.size(); ++i) {
        if (i > 0 && e.op == Expr::Op::kAlt) out->push_back('|');
        AppendPattern(e.items[i], out);
      }
      out->append(")");
      return;
    case Expr::Op::kRepeat:
      out->append("(?:");
      AppendPattern(e.items[0], out);
      out->append(")");
      if (e.max < 0) {
        absl::StrAppend(out, "{", e.min, ",}");
      } else {
        absl::StrAppend(out, "{", e.min, ",", e.max, "}");
      }
      return;
    case Expr::Op::kRef:
      return;  // not in a rule-free expression
  }
}

class EbnfCompiler {
 public:
  absl::StatusOr<std::shared_ptr<const Schema>> Run(std::vector<Rule> rules) {
    rules_ = std::move(rules);
    schema_ = std::make_shared<Schema>();
    std::vector<int32_t> body(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      rule_ = static_cast<int32_t>(r);
      TANDEM_ASSIGN_OR_RETURN(body[r], Compile(rules_[r].body));
    }
    // A reference to rule r is -2 - r until every body is compiled; a body
    // that is a bare reference is the body it names.
    std::vector<int32_t> resolved(rules_.size(), -1);
    for (size_t r = 0; r < rules_.size(); ++r) {
      int32_t at = body[r];
      for (size_t hops = 0; at < -1; ++hops) {
        if (hops > rules_.size()) {
          return RuleError(static_cast<int32_t>(r),
                           "reaches itself before reading a character (left recursion; not "
                           "served)");
        }
        at = body[static_cast<size_t>(-2 - at)];
      }
      resolved[r] = at;
    }
    const auto fix = [&](int32_t& i) {
      if (i < -1) i = resolved[static_cast<size_t>(-2 - i)];
    };
    for (SchemaNode& n : schema_->nodes_) {
      for (int32_t& e : n.elements) fix(e);
      for (int32_t& a : n.alternatives) fix(a);
      fix(n.items);
    }
    schema_->root_ = resolved[static_cast<size_t>(RootRule())];
    Analyze();
    TANDEM_RETURN_IF_ERROR(NoEmptyLoops());
    TANDEM_RETURN_IF_ERROR(NoLeftRecursion());
    return std::shared_ptr<const Schema>(std::move(schema_));
  }

 private:
  int32_t RootRule() const {
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (rules_[r].name == "root") return static_cast<int32_t>(r);
    }
    return 0;
  }

  absl::Status RuleError(int32_t rule, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("rule '", rules_[static_cast<size_t>(rule)].name, "' ", what));
  }

  int32_t Add(SchemaNode node) {
    schema_->nodes_.push_back(std::move(node));
    origin_.push_back(rule_);
    return static_cast<int32_t>(schema_->nodes_.size() - 1);
  }
  SchemaNode& node(int32_t i) { return schema_->nodes_[static_cast<size_t>(i)]; }

  // A rule-free expression as one automaton.
  absl::StatusOr<int32_t> Pattern(const std::vector<const Expr*>& parts, bool alternatives) {
    std::string pattern = "(?:";
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i > 0 && alternatives) pattern.push_back('|');
      AppendPattern(*parts[i], &pattern);
    }
    pattern.push_back(')');
    auto dfa = CompileRegex(pattern);
    if (!dfa.ok()) {
      return RuleError(rule_, absl::StrCat("holds text that cannot be compiled: ",
                                           dfa.status().message()));
    }
    return Add({.kind = Kind::kRegex, .regex = *std::move(dfa)});
  }

  // The node of `e` (or -2 - rule for a bare reference).
  absl::StatusOr<int32_t> Compile(const Expr& e) {
    if (!e.has_ref) return Pattern({&e}, false);
    switch (e.op) {
      case Expr::Op::kRef:
        return -2 - e.rule;
      case Expr::Op::kSeq: {
        // Runs of rule-free elements are one automaton each.
        std::vector<int32_t> elements;
        std::vector<const Expr*> run;
        const auto flush = [&]() -> absl::Status {
          if (run.empty()) return absl::OkStatus();
          TANDEM_ASSIGN_OR_RETURN(const int32_t n, Pattern(run, false));
          elements.push_back(n);
          run.clear();
          return absl::OkStatus();
        };
        for (const Expr& item : e.items) {
          if (!item.has_ref) {
            run.push_back(&item);
            continue;
          }
          TANDEM_RETURN_IF_ERROR(flush());
          TANDEM_ASSIGN_OR_RETURN(const int32_t n, Compile(item));
          elements.push_back(n);
        }
        TANDEM_RETURN_IF_ERROR(flush());
        if (elements.size() == 1) return elements[0];
        return Add({.kind = Kind::kSequence, .elements = std::move(elements)});
      }
      case Expr::Op::kAlt: {
        // The rule-free alternatives are one automaton.
        std::vector<int32_t> alternatives;
        std::vector<const Expr*> free;
        for (const Expr& item : e.items) {
          if (!item.has_ref) {
            free.push_back(&item);
            continue;
          }
          TANDEM_ASSIGN_OR_RETURN(const int32_t n, Compile(item));
          alternatives.push_back(n);
        }
        if (!free.empty()) {
          TANDEM_ASSIGN_OR_RETURN(const int32_t n, Pattern(free, true));
          alternatives.push_back(n);
        }
        if (alternatives.size() == 1) return alternatives[0];
        return Add({.kind = Kind::kUnion, .alternatives = std::move(alternatives)});
      }
      case Expr::Op::kRepeat: {
        TANDEM_ASSIGN_OR_RETURN(const int32_t item, Compile(e.items[0]));
        if (e.min == 1 && e.max == 1) return item;
        return Add({.kind = Kind::kRepeat, .items = item, .min_items = e.min, .max_items = e.max});
      }
      default:
        return absl::InternalError("a rule-free expression outside a pattern");
    }
  }

  bool Nullable(int32_t i) { return NodeNullable(node(i)); }
  bool Opens(int32_t i) { return NodeOpens(node(i)); }

  // nullable, opens and nullable_from of the grammar's nodes: the least
  // fixed point (a rule that recurses with no way out matches nothing).
  void Analyze() {
    for (SchemaNode& n : schema_->nodes_) {
      if (n.kind != Kind::kRegex) n.opens = false;
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < schema_->nodes_.size(); ++i) {
        SchemaNode& n = schema_->nodes_[i];
        bool nullable = false, opens = false;
        switch (n.kind) {
          case Kind::kSequence:
            nullable = true;
            for (int32_t e : n.elements) {
              opens |= nullable && Opens(e);
              nullable &= Nullable(e);
            }
            break;
          case Kind::kUnion:
            for (int32_t a : n.alternatives) {
              nullable |= Nullable(a);
              opens |= Opens(a);
            }
            break;
          case Kind::kRepeat:
            nullable = n.min_items == 0 || Nullable(n.items);
            opens = n.max_items != 0 && Opens(n.items);
            break;
          default:
            continue;
        }
        if (nullable != n.nullable || opens != n.opens) {
          n.nullable = nullable;
          n.opens = opens;
          changed = true;
        }
      }
    }
    for (SchemaNode& n : schema_->nodes_) {
      if (n.kind != Kind::kSequence) continue;
      n.nullable_from = static_cast<int32_t>(n.elements.size());
      while (n.nullable_from > 0 && Nullable(n.elements[static_cast<size_t>(n.nullable_from - 1)])) {
        --n.nullable_from;
      }
    }
  }

  // A repetition of something that may be empty could go round without
  // reading a byte.
  absl::Status NoEmptyLoops() {
    for (size_t i = 0; i < schema_->nodes_.size(); ++i) {
      const SchemaNode& n = schema_->nodes_[i];
      if (n.kind == Kind::kRepeat && (n.max_items < 0 || n.max_items > 1) && Nullable(n.items)) {
        return RuleError(origin_[i],
                         "repeats something that may be empty and holds a rule (not served)");
      }
    }
    return absl::OkStatus();
  }

  // The nodes a node may begin with before reading a byte.
  std::vector<int32_t> FirstNodes(int32_t i) {
    const SchemaNode& n = node(i);
    std::vector<int32_t> out;
    switch (n.kind) {
      case Kind::kSequence:
        for (int32_t e : n.elements) {
          out.push_back(e);
          if (!Nullable(e)) break;
        }
        break;
      case Kind::kUnion:
        out = n.alternatives;
        break;
      case Kind::kRepeat:
        if (n.max_items != 0) out.push_back(n.items);
        break;
      default:
        break;
    }
    return out;
  }

  // No node reaches itself before a byte is read, and no chain of them is
  // deeper than kMaxGrammarNesting (the matcher's bound).
  absl::Status NoLeftRecursion() {
    const size_t count = schema_->nodes_.size();
    std::vector<uint8_t> state(count, 0);  // 0 new, 1 on the path, 2 done
    std::vector<int32_t> height(count, 0);  // the longest chain from the node
    std::vector<std::vector<int32_t>> first(count);
    for (size_t i = 0; i < count; ++i) first[i] = FirstNodes(static_cast<int32_t>(i));
    std::vector<std::pair<int32_t, size_t>> path;
    for (size_t s = 0; s < count; ++s) {
      if (state[s] != 0) continue;
      path.emplace_back(static_cast<int32_t>(s), 0);
      state[s] = 1;
      while (!path.empty()) {
        auto& [at, next] = path.back();
        const std::vector<int32_t>& kids = first[static_cast<size_t>(at)];
        if (next < kids.size()) {
          const int32_t kid = kids[next++];
          if (state[static_cast<size_t>(kid)] == 1) {
            return RuleError(origin_[static_cast<size_t>(kid)],
                             "reaches itself before reading a character (left recursion; "
                             "not served)");
          }
          if (state[static_cast<size_t>(kid)] == 0) {
            state[static_cast<size_t>(kid)] = 1;
            path.emplace_back(kid, 0);
          }
          continue;
        }
        int32_t h = 0;
        for (int32_t kid : kids) h = std::max(h, height[static_cast<size_t>(kid)]);
        const bool composite = node(at).kind != Kind::kRegex;
        height[static_cast<size_t>(at)] = h + (composite ? 1 : 0);
        if (height[static_cast<size_t>(at)] > kMaxGrammarNesting) {
          return RuleError(origin_[static_cast<size_t>(at)],
                           absl::StrCat("nests rules more than ", kMaxGrammarNesting,
                                        " deep before reading a character"));
        }
        state[static_cast<size_t>(at)] = 2;
        path.pop_back();
      }
    }
    return absl::OkStatus();
  }

  std::vector<Rule> rules_;
  std::shared_ptr<Schema> schema_;
  std::vector<int32_t> origin_;  // each node's rule, for messages
  int32_t rule_ = 0;             // the rule being compiled
};

}  // namespace ebnf

namespace {

// vLLM's grammar_is_likely_lark: no line holds "::=" outside a comment
// ('#' or "//" to the end of the line).
bool LooksLikeLark(std::string_view text) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    line = line.substr(0, std::min(line.find('#'), line.find("//")));
    if (line.find("::=") != std::string_view::npos) return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Schema>> CompileEbnfDocument(std::string_view text) {
  if (LooksLikeLark(text)) {
    return absl::InvalidArgumentError(
        "the grammar has no rule (name ::= body); a Lark grammar is not served, only "
        "xgrammar's EBNF");
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<ebnf::Token> tokens, ebnf::Lexer(text).Run());
  TANDEM_ASSIGN_OR_RETURN(std::vector<ebnf::Rule> rules, ebnf::Parser(std::move(tokens)).Run());
  return ebnf::EbnfCompiler().Run(std::move(rules));
}

}  // namespace tandem::grammar
