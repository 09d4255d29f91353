// Grammars for structured outputs (libs/grammar/ebnf.h): xgrammar's EBNF
// read on hand-checked documents, what is refused by name, and random
// grammars whose documents the matcher must take exactly as a recognizer
// written here over the grammar's own terms (the sets of ends each rule can
// reach from each position) does, with the token masks equal to Accept.
#include "tandem/grammar/ebnf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grammar_test_util.h"
#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/token_mask.h"

namespace tandem::grammar {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Schema> Ebnf(std::string_view text) {
  auto schema = CompileEbnfDocument(text);
  EXPECT_TRUE(schema.ok()) << text << ": " << schema.status();
  return schema.ok() ? *schema : nullptr;
}

TEST(EbnfTest, ReadsXgrammarsSyntax) {
  const auto yes_no = Ebnf(R"(root ::= "yes" | "no")");
  EXPECT_TRUE(Matches(yes_no, "yes"));
  EXPECT_TRUE(Matches(yes_no, "no"));
  EXPECT_FALSE(Matches(yes_no, "yesno"));
  EXPECT_FALSE(Matches(yes_no, "ye"));
  EXPECT_TRUE(Begins(yes_no, "ye"));

  // A rule used before it is defined, names with dots and dashes, comments,
  // a body across lines, recursion.
  const auto list = Ebnf(
      "# a list\n"
      "root ::= item (\", \" item)*  # items\n"
      "item ::=\n"
      "  my.word-1 | \"[\" root \"]\"\n"
      "my.word-1 ::= [a-z]+\n");
  EXPECT_TRUE(Matches(list, "a, bc, [d, [e]]"));
  EXPECT_FALSE(Matches(list, "a,b"));
  EXPECT_FALSE(Matches(list, "[a"));
  EXPECT_TRUE(Begins(list, "[a"));
  EXPECT_FALSE(Matches(list, ""));
  EXPECT_FALSE(Begins(list, "A"));

  // Escapes in strings: C's, \x with any number of hex digits, \u, \U, and
  // UTF-8 as itself.
  const auto escapes = Ebnf(R"(root ::= "\x41\xe9\u00e9\U0001F600\t\"\\\e" "é")");
  EXPECT_TRUE(Matches(escapes, "A\xC3\xA9\xC3\xA9\xF0\x9F\x98\x80\t\"\\\x1B\xC3\xA9"));
  EXPECT_FALSE(Matches(escapes, "A\xE9"));

  // Classes: ranges; a dash first or last is itself, an escaped bracket is
  // one; a negated class takes any other character, several bytes long.
  const auto classes = Ebnf(R"(root ::= [-a-c\]] [^"\\]+ [x-])");
  EXPECT_TRUE(Matches(classes, "-\xC3\xA9 x"));
  EXPECT_TRUE(Matches(classes, "]ab-"));
  EXPECT_FALSE(Matches(classes, "dab-"));
  EXPECT_FALSE(Matches(classes, "a\"x"));
  EXPECT_FALSE(Matches(classes, "a\xC3x"));  // not a character

  // Repetitions, of text alone and of parts that name a rule.
  const auto counted = Ebnf("root ::= [a]{3} | [b]{2,} | [c]{0,1}");
  for (const char* doc : {"aaa", "bb", "bbbbb", "", "c"}) EXPECT_TRUE(Matches(counted, doc)) << doc;
  for (const char* doc : {"aa", "aaaa", "b", "cc"}) EXPECT_FALSE(Matches(counted, doc)) << doc;
  const auto items = Ebnf("root ::= (\"ab\" digit){2,3} \"!\"?\ndigit ::= [0-9]");
  for (const char* doc : {"ab1ab2", "ab1ab2!", "ab1ab2ab3", "ab1ab2ab3!"}) {
    EXPECT_TRUE(Matches(items, doc)) << doc;
  }
  for (const char* doc : {"ab1", "ab1!", "ab1ab2ab3ab4", "ab1ab"}) {
    EXPECT_FALSE(Matches(items, doc)) << doc;
  }

  // The empty text: ( ) and "".
  const auto empty = Ebnf("root ::= ( ) | \"\" x\nx ::= \"x\"");
  EXPECT_TRUE(Matches(empty, ""));
  EXPECT_TRUE(Matches(empty, "x"));
  EXPECT_FALSE(Matches(empty, "xx"));
}

TEST(EbnfTest, CompleteAndOpenFollowTheRules) {
  JsonMatcher tail(Ebnf("root ::= \"a\" b\nb ::= \"b\"?"));
  EXPECT_FALSE(tail.Complete());
  ASSERT_TRUE(tail.Accept("a"));
  EXPECT_TRUE(tail.Complete());
  EXPECT_TRUE(tail.Open());
  ASSERT_TRUE(tail.Accept("b"));
  EXPECT_TRUE(tail.Complete());
  EXPECT_FALSE(tail.Open());

  JsonMatcher nothing(Ebnf("root ::= \"\""));
  EXPECT_TRUE(nothing.Complete());
  EXPECT_FALSE(nothing.Open());

  // A sequence of rules that may each be empty: complete before any byte.
  JsonMatcher optional(Ebnf("root ::= x x\nx ::= \"a\"?"));
  EXPECT_TRUE(optional.Complete());
  EXPECT_TRUE(optional.Open());
  ASSERT_TRUE(optional.Accept("aa"));
  EXPECT_TRUE(optional.Complete());
  EXPECT_FALSE(optional.Open());
  EXPECT_FALSE(optional.Accept("a"));

  // A counted repetition's frame: complete from its minimum, closed at its
  // maximum.
  JsonMatcher counted(Ebnf("root ::= x{2,3}\nx ::= \"1\""));
  ASSERT_TRUE(counted.Accept("1"));
  EXPECT_FALSE(counted.Complete());
  ASSERT_TRUE(counted.Accept("1"));
  EXPECT_TRUE(counted.Complete());
  EXPECT_TRUE(counted.Open());
  ASSERT_TRUE(counted.Accept("1"));
  EXPECT_TRUE(counted.Complete());
  EXPECT_FALSE(counted.Open());
}

TEST(EbnfTest, RefusesWhatItCannotHoldByName) {
  std::string deep = "root ::= r0\n";
  for (int i = 0; i < 40; ++i) absl::StrAppend(&deep, "r", i, " ::= r", i + 1, " \"x\" | \"y\"\n");
  deep += "r40 ::= \"z\"\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"start: \"a\"", "Lark"},
      {"# root ::= x\nstart: \"a\"", "Lark"},
      {"rooot ::= \"a\"", "no rule 'root'"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"root ::= x", "rule 'x' is not defined"},
      {"root ::= root \"a\" | \"b\"", "left recursion"},
      {"root ::= a\na ::= b \"x\"\nb ::= root | \"y\"", "left recursion"},
      {"root ::= x root \"a\" | \"b\"\nx ::= \"c\"?", "left recursion"},
      {"root ::= a\na ::= b\nb ::= a", "left recursion"},
      {"root ::= \"a\" (= \"b\")", "lookahead"},
      {"root ::= TagDispatch((\"<a>\", x))\nx ::= \"y\"", "TagDispatch"},
      {R"(root ::= [\d])", "\\d in a character class"},
      {R"(root ::= "\uD800")", "surrogate"},
      {R"(root ::= "\x110000")", "above U+10FFFF"},
      {"root ::= [z-a]", "reversed"},
      {"root ::= []", "empty character class"},
      {"root ::= x*\nx ::= \"a\"?", "repeats something that may be empty"},
      {"root ::= \"a\" x ::= \"b\"", "must begin its line"},
      {"root ::= \"abc", "not closed on its line"},
      {"root ::= [abc", "not closed"},
      {"root ::= \"a\" \"b\" )", "a rule's name ::= was expected"},
      {"root ::= \"a\"**", "an element"},
      {"root ::= [a]{3,2}", "below n"},
      {R"(root ::= "\q")", "unknown escape"},
      {"root ::= \"a\" : \"b\"", "unexpected ':'"},
      {"root ::= true", "an element"},
      {deep, "nests rules more than 64 deep"},
  };
  for (const auto& [text, why] : cases) {
    const auto compiled = CompileEbnfDocument(text);
    EXPECT_FALSE(compiled.ok()) << text;
    EXPECT_THAT(compiled.status().message(), HasSubstr(why)) << text;
  }
  // Where a lexer's error is.
  EXPECT_THAT(CompileEbnfDocument("root ::= \"a\"\n  | [z-a]").status().message(),
              HasSubstr("line 2, column 5"));
  // Forty rules deep is held where each level reads a byte first.
  std::string nested = "root ::= r0\n";
  for (int i = 0; i < 40; ++i) absl::StrAppend(&nested, "r", i, " ::= \"x\" r", i + 1, " | \"y\"\n");
  nested += "r40 ::= \"z\"\n";
  EXPECT_TRUE(CompileEbnfDocument(nested).ok());
}

TEST(EbnfTest, AListReadsOnWithoutGrowingTheStackAndNestingIsBounded) {
  // The last element goes straight on to what follows the rule.
  JsonMatcher list(Ebnf("root ::= \"a\" root | \"b\""));
  ASSERT_TRUE(list.Accept(std::string(5000, 'a')));
  EXPECT_LT(list.arena().size(), 8u);
  ASSERT_TRUE(list.Accept("b"));
  EXPECT_TRUE(list.Complete());

  // Each '(' opens a frame that waits for its ')'.
  JsonMatcher nested(Ebnf("root ::= \"(\" root \")\" | \"x\""));
  ASSERT_TRUE(nested.Accept(std::string(900, '(')));
  EXPECT_FALSE(nested.Accept(std::string(200, '(')));
  EXPECT_TRUE(nested.overflowed());
  ASSERT_TRUE(nested.Accept("x" + std::string(900, ')')));
  EXPECT_TRUE(nested.Complete());
}

TEST(EbnfTest, AGrammarIsCompiledFromItsField) {
  auto compiled = CompileGrammar({.grammar = "root ::= \"a\" root | \"b\""});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_TRUE(Matches(*compiled, "aab"));
  EXPECT_THAT(CompileGrammar({.grammar = "root ::= root"}).status().message(),
              HasSubstr("left recursion"));
  SamplingParams two{.regex = "a", .grammar = "root ::= \"a\""};
  EXPECT_THAT(two.Validate(100).message(), HasSubstr("more than one of"));
  EXPECT_STREQ(SamplingParams{.grammar = "root ::= \"a\""}.GrammarField(), "grammar");
}

// ---- Random grammars against a recognizer --------------------------------

// A grammar's expression, as the test writes it.
struct G {
  enum Op { kText, kClass, kRef, kSeq, kAlt, kRep } op = kText;
  std::string text;    // kText; kClass: its characters
  bool negated = false;
  int rule = 0;
  std::vector<G> items;
  int min = 0, max = -1;
};

class RandomGrammar {
 public:
  explicit RandomGrammar(uint32_t seed) : rng_(seed) {
    const int count = Pick(1, 4);
    for (int r = 0; r < count; ++r) rules_.push_back(Expr(0, count));
  }

  std::string Text() const {
    std::string out;
    for (size_t r = 0; r < rules_.size(); ++r) {
      absl::StrAppend(&out, Name(static_cast<int>(r)), " ::= ", Print(rules_[r]), "\n");
    }
    return out;
  }

  // The positions after a match of rule `r` that starts at `pos`.
  const std::set<size_t>& Ends(int r, size_t pos, const std::string& s) {
    const auto key = std::make_pair(r, pos);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    memo_[key] = {};  // a left-recursive grammar is refused before this runs
    std::set<size_t> ends = EndsOf(rules_[static_cast<size_t>(r)], pos, s);
    return memo_[key] = std::move(ends);
  }
  bool Recognizes(const std::string& s) {
    memo_.clear();
    return Ends(0, 0, s).contains(s.size());
  }

 private:
  int Pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  static std::string Name(int r) { return r == 0 ? "root" : absl::StrCat("r-", r); }

  G Expr(int depth, int rules) {
    const int op = depth >= 3 ? Pick(0, 2) : Pick(0, 5);
    G g;
    switch (op) {
      case 0: {
        g.op = G::kText;
        const int n = Pick(0, 2);
        for (int i = 0; i < n; ++i) g.text.push_back(static_cast<char>('a' + Pick(0, 2)));
        return g;
      }
      case 1:
        g.op = G::kClass;
        g.negated = Pick(0, 3) == 0;
        for (char c : {'a', 'b', 'c'}) {
          if (Pick(0, 1) == 1) g.text.push_back(c);
        }
        if (g.text.empty()) g.text = "b";
        return g;
      case 2:
        g.op = G::kRef;
        g.rule = Pick(0, rules - 1);
        return g;
      case 3:
      case 4:
        g.op = op == 3 ? G::kSeq : G::kAlt;
        for (int i = Pick(2, 3); i > 0; --i) g.items.push_back(Expr(depth + 1, rules));
        return g;
      default: {
        g.op = G::kRep;
        g.items.push_back(Expr(depth + 1, rules));
        const int kind = Pick(0, 4);
        g.min = kind == 1 ? 1 : kind == 4 ? Pick(0, 2) : 0;
        g.max = kind == 2 ? 1 : kind == 4 ? g.min + Pick(0, 2) : kind == 3 ? Pick(1, 2) : -1;
        if (kind == 3) g.min = g.max;
        return g;
      }
    }
  }

  static std::string Print(const G& g) {
    switch (g.op) {
      case G::kText:
        return absl::StrCat("\"", g.text, "\"");
      case G::kClass:
        return absl::StrCat("[", g.negated ? "^" : "", g.text, "]");
      case G::kRef:
        return Name(g.rule);
      case G::kSeq:
      case G::kAlt: {
        std::string out = "(";
        for (size_t i = 0; i < g.items.size(); ++i) {
          if (i > 0) out += g.op == G::kAlt ? " | " : " ";
          out += Print(g.items[i]);
        }
        return out + ")";
      }
      case G::kRep: {
        const std::string item = absl::StrCat("(", Print(g.items[0]), ")");
        if (g.min == 0 && g.max == -1) return item + "*";
        if (g.min == 1 && g.max == -1) return item + "+";
        if (g.min == 0 && g.max == 1) return item + "?";
        if (g.max == -1) return absl::StrCat(item, "{", g.min, ",}");
        return absl::StrCat(item, "{", g.min, ",", g.max, "}");
      }
    }
    return "";
  }

  std::set<size_t> EndsOf(const G& g, size_t pos, const std::string& s) {
    switch (g.op) {
      case G::kText:
        if (s.compare(pos, g.text.size(), g.text) == 0) return {pos + g.text.size()};
        return {};
      case G::kClass:
        if (pos < s.size() && (g.text.find(s[pos]) != std::string::npos) != g.negated) {
          return {pos + 1};
        }
        return {};
      case G::kRef:
        return Ends(g.rule, pos, s);
      case G::kSeq: {
        std::set<size_t> at = {pos};
        for (const G& item : g.items) {
          std::set<size_t> next;
          for (size_t p : at) next.merge(EndsOf(item, p, s));
          at = std::move(next);
        }
        return at;
      }
      case G::kAlt: {
        std::set<size_t> out;
        for (const G& item : g.items) out.merge(EndsOf(item, pos, s));
        return out;
      }
      case G::kRep: {
        std::set<size_t> out, at = {pos};
        if (g.min == 0) out.insert(pos);
        // Past the minimum, a round that reaches no new end adds nothing.
        for (int k = 1; g.max < 0 || k <= g.max; ++k) {
          std::set<size_t> next;
          for (size_t p : at) next.merge(EndsOf(g.items[0], p, s));
          if (k >= g.min) {
            const size_t before = out.size();
            out.insert(next.begin(), next.end());
            if (out.size() == before && k > g.min + static_cast<int>(s.size())) break;
          }
          if (next.empty()) break;
          at = std::move(next);
        }
        return out;
      }
    }
    return {};
  }

  std::mt19937 rng_;
  std::vector<G> rules_;
  std::map<std::pair<int, size_t>, std::set<size_t>> memo_;
};

TEST(EbnfTest, RandomGrammarsTakeWhatTheirRecognizerTakes) {
  const TokenVocabulary vocab({"", "a", "b", "c", "ab", "ba", "abc", "cc", "aa", "bca", "x"});
  std::mt19937 rng(7);
  int compiled = 0, refused = 0, matched = 0, masks = 0, overflowed = 0, texts_seen = 0;
  for (uint32_t seed = 0; seed < 1500; ++seed) {
    RandomGrammar grammar(seed);
    const std::string text = grammar.Text();
    auto schema = CompileEbnfDocument(text);
    if (!schema.ok()) {
      // Only what the header lists as refused.
      EXPECT_THAT(schema.status().message(),
                  ::testing::AnyOf(HasSubstr("left recursion"), HasSubstr("may be empty")))
          << text;
      ++refused;
      continue;
    }
    ++compiled;
    // Every text up to four letters of a, b, c, and some longer ones.
    std::vector<std::string> texts = {""};
    for (size_t i = 0; i < texts.size() && texts.size() < 121; ++i) {
      if (texts[i].size() < 4) {
        for (char c : {'a', 'b', 'c'}) texts.push_back(texts[i] + c);
      }
    }
    for (int i = 0; i < 30; ++i) {
      std::string t;
      for (int n = std::uniform_int_distribution<int>(5, 12)(rng); n > 0; --n) {
        t.push_back(static_cast<char>('a' + rng() % 3));
      }
      texts.push_back(t);
    }
    texts_seen += static_cast<int>(texts.size());
    for (const std::string& t : texts) {
      const bool expected = grammar.Recognizes(t);
      JsonMatcher whole(*schema);
      const bool accepted = whole.Accept(t);
      if (!accepted && whole.overflowed()) {
        ++overflowed;  // readings that stay apart for long: refused, never wrong
        continue;
      }
      ASSERT_EQ(accepted && whole.Complete(), expected) << text << "text: '" << t << "'";
      matched += expected ? 1 : 0;
      // A document's prefixes begin it, and each prefix's mask is what
      // Accept takes.
      if (!expected) continue;
      for (size_t cut = 0; cut <= t.size(); cut += 2) {
        JsonMatcher m(*schema);
        ASSERT_TRUE(m.Accept(t.substr(0, cut))) << text << "prefix: '" << t.substr(0, cut) << "'";
        TokenMask mask;
        AllowedTokens(m, vocab, &mask);
        for (int32_t id = 1; id < vocab.size(); ++id) {
          JsonMatcher copy = m;
          ASSERT_EQ(MaskAllows(mask, id), copy.Accept(vocab.bytes(id)))
              << text << "prefix: '" << t.substr(0, cut) << "' token '" << vocab.bytes(id) << "'";
        }
        ++masks;
      }
    }
  }
  // The grammars are mostly held, and their documents are not all empty.
  EXPECT_GT(compiled, 600);
  EXPECT_GT(matched, 3000);
  EXPECT_GT(masks, 7000);
  EXPECT_LT(overflowed, texts_seen / 20);
  std::cout << compiled << " grammars compiled, " << refused << " refused; " << matched
            << " documents, " << masks << " masks checked; " << overflowed << " of "
            << texts_seen << " texts too ambiguous\n";
}

}  // namespace
}  // namespace tandem::grammar
