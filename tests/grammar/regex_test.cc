// Regexes for structured outputs (libs/grammar/regex.h), checked against RE2,
// which we did not write: random patterns printed in both dialects, random
// texts, and the texts our automaton walks to.
#include "tandem/grammar/regex.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <re2/re2.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/grammar/token_mask.h"

namespace tandem::grammar {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const RegexDfa> Dfa(std::string_view pattern) {
  auto dfa = CompileRegex(pattern);
  EXPECT_TRUE(dfa.ok()) << pattern << ": " << dfa.status();
  return dfa.ok() ? *dfa : nullptr;
}

// The state after `text`, or kDead.
int32_t RunText(const RegexDfa& dfa, std::string_view text) {
  int32_t s = dfa.start();
  for (char c : text) {
    s = dfa.Next(s, static_cast<uint8_t>(c));
    if (s == RegexDfa::kDead) break;
  }
  return s;
}

bool FullMatch(std::string_view pattern, std::string_view text) {
  const auto dfa = Dfa(pattern);
  if (dfa == nullptr) return false;
  const int32_t s = RunText(*dfa, text);
  return s != RegexDfa::kDead && dfa->Accepting(s);
}

TEST(RegexTest, ReadsPatternsAsXgrammarDoes) {
  EXPECT_TRUE(FullMatch(R"(\d{3}-\d{4})", "555-1234"));
  EXPECT_FALSE(FullMatch(R"(\d{3}-\d{4})", "555-123"));
  EXPECT_FALSE(FullMatch(R"(\d{3}-\d{4})", "555-12345"));
  // The whole output matches; ^ and $ at the ends change nothing.
  EXPECT_TRUE(FullMatch("^(yes|no)$", "no"));
  EXPECT_FALSE(FullMatch("yes|no", "yesno"));
  // '.' takes any character, a newline and a 4-byte one included.
  EXPECT_TRUE(FullMatch("a.c", "a\nc"));
  EXPECT_TRUE(FullMatch("a.c",
                        "a\xF0\x9F\x98\x80"
                        "c"));
  EXPECT_FALSE(FullMatch("a.c",
                         "a\xF0\x9F\x98"
                         "c"));  // a cut character
  // \s is JavaScript's ASCII set and U+00A0.
  EXPECT_TRUE(FullMatch(R"(\s+)", " \t\n\r\f\v\xC2\xA0"));
  EXPECT_FALSE(FullMatch(R"(\s)", "\xE2\x80\x83"));  // U+2003
  EXPECT_TRUE(FullMatch(R"([^\s]+)", "\xE2\x80\x83x"));
  // Classes with ranges across UTF-8 lengths, negated, with - at an edge.
  EXPECT_TRUE(FullMatch("[a-\xE4\xB8\xAD]+", "z\xC3\xA9\xE4\xB8\xAD"));
  EXPECT_FALSE(FullMatch("[a-\xE4\xB8\xAD]", "\xE4\xB8\xAE"));
  EXPECT_TRUE(FullMatch("[-a]+", "-a-"));
  EXPECT_TRUE(FullMatch("[a-]+", "-a-"));
  EXPECT_TRUE(FullMatch(R"([^"\\]*)", "x'y"));
  EXPECT_FALSE(FullMatch(R"([^"\\]*)", "x\"y"));
  // Escapes.
  EXPECT_TRUE(FullMatch(R"(\x41\u00e9\u{1F600}\U0001F600\cJ\.\-\/)",
                        "A\xC3\xA9\xF0\x9F\x98\x80\xF0\x9F\x98\x80\n.-/"));
  EXPECT_TRUE(FullMatch(R"([\b])", "\b"));
  // Groups, named and not; empty branches; lazy quantifiers.
  EXPECT_TRUE(FullMatch("(?<year>[0-9]{4})-(?:0[1-9]|1[0-2])", "2026-12"));
  EXPECT_TRUE(FullMatch("a(|b)c", "ac"));
  EXPECT_TRUE(FullMatch("a+?b{1,2}?", "aab"));
  EXPECT_TRUE(FullMatch("x{2,}", "xxxxx"));
  EXPECT_FALSE(FullMatch("x{2,}", "x"));
  EXPECT_TRUE(FullMatch("x{0}y", "y"));
}

TEST(RegexTest, RefusesWhatItCannotHoldByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a", "'(' without its ')'"},
      {std::string("ab\0c", 4), "a NUL character at 3"},
      {"a)", "')' without a '('"},
      {"[ab", "'[' without its ']'"},
      {"[]", "empty class"},
      {"*a", "nothing before it to repeat"},
      {"a**", "two quantifiers in a row"},
      {"a{2}{3}", "two quantifiers in a row"},
      {"a{", "'{' not followed by a count"},
      {"a{,3}", "'{' not followed by a count"},
      {"a{3,2}", "m below n"},
      {"a{2", "without its '}'"},
      {"a{200000}", "a count above"},
      {"a^b", "'^' or '$' other than first or last"},
      {"a$b", "'^' or '$' other than first or last"},
      {R"((a)\1)", "back-reference"},
      {R"(\k<x>)", "back-reference"},
      {"(?=a)", "lookaround"},
      {"(?<!a)b", "lookaround"},
      {"(?i)a", "'(?' group other than"},
      {"(?P<x>a)", "'(?' group other than"},
      {R"(\bword)", "word boundary"},
      {R"(\p{L})", "Unicode property class"},
      {R"(\Aa\z)", "the escape \\A"},
      {R"(\x4)", "\\x with other than two hex digits"},
      {R"(\x414)", "\\x with other than two hex digits"},
      {R"(\uD800)", "surrogate"},
      {R"(\u{110000})", "above U+10FFFF"},
      {R"(\u{1234567})", "malformed \\u{...}"},
      {R"(\012)", "octal"},
      {R"([z-a])", "end is below its start"},
      {R"([\d-z])", "a range with a class"},
      {"a\\", "at the end of the pattern"},
      {"a\xFF", "not valid UTF-8"},
      {"[^\\x00-\\u{10FFFF}]", "no string matches"},
      {"(a|b)*a(a|b){20}", "automaton states"},
      {std::string(300, '(') + "a" + std::string(300, ')'), "nested deeper than"},
      {"(a{1000}){1000}", "expands to more than"},
  };
  for (const auto& [pattern, message] : cases) {
    auto dfa = CompileRegex(pattern);
    ASSERT_FALSE(dfa.ok()) << pattern;
    EXPECT_EQ(dfa.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(dfa.status().message(), HasSubstr(message)) << pattern;
  }
  // The message says where.
  EXPECT_THAT(CompileRegex("ab(?=c)").status().message(), HasSubstr("at character 3"));
}

// A random pattern printed in xgrammar's dialect and RE2's, over characters
// of one to four UTF-8 bytes.
class PatternGen {
 public:
  PatternGen(uint32_t seed, RegexDialect dialect)
      : rng_(seed), json_(dialect == RegexDialect::kJsonStringPattern) {}

  void Next(std::string* ours, std::string* re2) {
    ours->clear();
    re2->clear();
    Alt(3, ours, re2);
  }

  static const std::vector<std::string>& Alphabet() {
    static const std::vector<std::string> chars = {"a",
                                                   "b",
                                                   "c",
                                                   "0",
                                                   "7",
                                                   "_",
                                                   " ",
                                                   "\n",
                                                   "-",
                                                   ".",
                                                   "\xC2\xA0",
                                                   "\xC3\xA9",
                                                   "\xC4\x81",
                                                   "\xE0\xA4\x85",
                                                   "\xE4\xB8\xAD",
                                                   "\xF0\x9F\x98\x80",
                                                   "\""};
    return chars;
  }

 private:
  size_t Pick(size_t n) { return rng_() % n; }
  void Both(std::string_view a, std::string_view b, std::string* ours, std::string* re2) {
    if (!json_) {
      ours->append(a);
    } else {
      // A JSON schema's pattern is printable ASCII: other characters as \u{...}.
      for (size_t i = 0; i < a.size();) {
        const auto c = static_cast<uint8_t>(a[i]);
        if (c < 0x80) {
          ours->push_back(a[i++]);
          continue;
        }
        const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        uint32_t cp = c & (0xFF >> (n + 1));
        for (size_t k = 1; k < n; ++k) cp = cp << 6 | (static_cast<uint8_t>(a[i + k]) & 0x3F);
        absl::StrAppend(ours, "\\u{", absl::Hex(cp), "}");
        i += n;
      }
    }
    re2->append(b);
  }
  void Both(std::string_view a, std::string* ours, std::string* re2) { Both(a, a, ours, re2); }

  void Alt(int depth, std::string* ours, std::string* re2) {
    const size_t n = 1 + (Pick(3) == 0 ? Pick(3) : 0);
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) Both("|", ours, re2);
      Concat(depth, ours, re2);
    }
  }
  void Concat(int depth, std::string* ours, std::string* re2) {
    const size_t n = Pick(4);
    for (size_t i = 0; i < n; ++i) {
      Atom(depth, ours, re2);
      Quantifier(ours, re2);
    }
  }
  void Quantifier(std::string* ours, std::string* re2) {
    static const char* kQuantifiers[] = {"*", "+", "?", "{2}", "{0,2}", "{1,}", "*?", "{1,3}?"};
    if (Pick(3) == 0) Both(kQuantifiers[Pick(std::size(kQuantifiers))], ours, re2);
  }
  void Atom(int depth, std::string* ours, std::string* re2) {
    const std::vector<std::string>& chars = Alphabet();
    switch (depth > 0 ? Pick(8) : Pick(6)) {
      case 0:
      case 1: {
        const std::string& c = chars[Pick(chars.size())];
        if (c == "." || c == "-") {
          Both("\\" + c, ours, re2);
        } else if (c == "\n") {
          Both("\\n", ours, re2);
        } else {
          Both(c, ours, re2);
        }
        return;
      }
      case 2:
        return Both(".", "(?s:.)", ours, re2);
      case 3: {
        // \s is [\t-\r \u00a0] in xgrammar's text dialect, [\t\n\f\r ] in RE2's.
        static const std::pair<const char*, const char*> kClasses[] = {
            {"\\d", "\\d"},
            {"\\D", "\\D"},
            {"\\w", "\\w"},
            {"\\W", "\\W"},
            {"\\s", "[\\t-\\r \\x{a0}]"},
            {"\\S", "[^\\t-\\r \\x{a0}]"}};
        const auto& [a, b] = kClasses[Pick(std::size(kClasses))];
        // xgrammar's JSON-pattern reader has no U+00A0 in \s.
        if (json_ && a[1] == 's') return Both(a, "[\\t-\\r ]", ours, re2);
        if (json_ && a[1] == 'S') return Both(a, "[^\\t-\\r ]", ours, re2);
        return Both(a, b, ours, re2);
      }
      case 4:
      case 5: {
        const bool negated = Pick(3) == 0;
        Both(negated ? "[^" : "[", ours, re2);
        const size_t n = 1 + Pick(3);
        for (size_t i = 0; i < n; ++i) {
          static const std::pair<const char*, const char*> kItems[] = {
              {"a", "a"},
              {"b-c", "b-c"},
              {"0-9", "0-9"},
              {"\\-", "\\-"},
              {"\\n", "\\n"},
              {"\\w", "\\w"},
              {"\xC3\xA9-\xE4\xB8\xAD", "\xC3\xA9-\xE4\xB8\xAD"},
              {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},
              {"\\s", "\\t-\\r \\x{a0}"}};
          const auto& [a, b] = kItems[Pick(std::size(kItems))];
          Both(a, json_ && a[1] == 's' ? "\\t-\\r " : b, ours, re2);
        }
        return Both("]", ours, re2);
      }
      default:
        Both(Pick(2) == 0 ? "(" : "(?:", "(?:", ours, re2);
        Alt(depth - 1, ours, re2);
        return Both(")", ours, re2);
    }
  }

  std::mt19937 rng_;
  bool json_;
};

// Random texts, and texts our automaton walks to, agree with RE2's full match;
// a text RE2 matches never passes through a dead state of ours, and a live
// state always has a way to a match (the walk ends in one).
// Whether `text` has a character a JSON string must escape.
bool HasJsonEscape(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    return static_cast<uint8_t>(c) < 0x20 || c == '"' || c == '\\';
  });
}

// In the JSON-pattern dialect the automaton reads `"` text `"`, and takes
// exactly the texts RE2 matches that need no escape.
class RegexDialectTest : public ::testing::TestWithParam<RegexDialect> {};

TEST_P(RegexDialectTest, MatchesWhatRe2MatchesOnRandomPatterns) {
  const bool json = GetParam() == RegexDialect::kJsonStringPattern;
  PatternGen gen(11, GetParam());
  std::mt19937 rng(5);
  const std::vector<std::string>& alphabet = PatternGen::Alphabet();
  const std::string quote = json ? "\"" : "";
  int matched = 0, walked = 0, too_large = 0, unmatchable = 0;
  for (int round = 0; round < 400; ++round) {
    std::string ours, theirs;
    gen.Next(&ours, &theirs);
    const RE2 re(theirs);
    ASSERT_TRUE(re.ok()) << theirs << ": " << re.error();
    auto compiled = CompileRegex(ours, GetParam());
    if (!compiled.ok() && absl::StrContains(compiled.status().message(), "automaton states")) {
      ++too_large;  // a documented bound (nested counted repeats), not a reading
      continue;
    }
    if (!compiled.ok() && json &&
        absl::StrContains(compiled.status().message(), "no string matches")) {
      ++unmatchable;  // every match needs an escape (a newline, a '"')
      continue;
    }
    ASSERT_TRUE(compiled.ok()) << ours << ": " << compiled.status();
    const std::shared_ptr<const RegexDfa> dfa = *compiled;
    for (int t = 0; t < 60; ++t) {
      std::string text;
      const size_t len = rng() % 7;
      for (size_t i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
      const int32_t s = RunText(*dfa, quote + text + quote);
      const bool ours_match = s != RegexDfa::kDead && dfa->Accepting(s);
      ASSERT_EQ(ours_match, RE2::FullMatch(text, re) && !(json && HasJsonEscape(text)))
          << "pattern " << ours << " (RE2: " << theirs << ") text '" << text << "'";
      matched += ours_match;
    }
    // Walks: random bytes among those that keep a state live, to a match.
    for (int w = 0; w < 5; ++w) {
      std::string text;
      int32_t s = dfa->start();
      while (dfa->Open(s) && !(dfa->Accepting(s) && rng() % 3 == 0) && text.size() < 40) {
        std::vector<uint8_t> next;
        for (int b = 0; b < 256; ++b) {
          if (dfa->Next(s, static_cast<uint8_t>(b)) != RegexDfa::kDead) {
            next.push_back(static_cast<uint8_t>(b));
          }
        }
        ASSERT_FALSE(next.empty());
        const uint8_t b = next[rng() % next.size()];
        text += static_cast<char>(b);
        s = dfa->Next(s, b);
      }
      if (!dfa->Accepting(s)) continue;  // cut at 40 bytes
      ++walked;
      if (json) {
        ASSERT_TRUE(text.size() >= 2 && text.front() == '"' && text.back() == '"') << text;
        text = text.substr(1, text.size() - 2);
        ASSERT_FALSE(HasJsonEscape(text)) << "pattern " << ours << " walked to '" << text << "'";
      }
      ASSERT_TRUE(RE2::FullMatch(text, re)) << "pattern " << ours << " walked to '" << text << "'";
    }
  }
  EXPECT_GT(matched, 1000);
  EXPECT_GT(walked, 1000);
  EXPECT_LE(too_large, 8);
  EXPECT_LE(unmatchable, 40);
}

INSTANTIATE_TEST_SUITE_P(BothReaders, RegexDialectTest,
                         ::testing::Values(RegexDialect::kText, RegexDialect::kJsonStringPattern));

TEST(RegexDocumentTest, TheMatcherAndTheMaskFollowThePattern) {
  auto compiled = CompileRegexDocument(R"(\d{1,3}(,\d{3})*(\.\d+)?)");
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  JsonMatcher m(*compiled);
  EXPECT_FALSE(m.Complete());
  EXPECT_TRUE(m.Open());
  EXPECT_FALSE(m.Accept("x"));
  ASSERT_TRUE(m.Accept("12"));
  EXPECT_TRUE(m.Complete());
  EXPECT_FALSE(m.Accept(",12x"));  // refused whole: nothing changes
  ASSERT_TRUE(m.Accept(",345"));
  EXPECT_TRUE(m.Complete());
  const TokenVocabulary vocab(
      {"", "1", "12", "1234", ",", ",000", ".", ".5", "a", " ", ",00", "5."});
  TokenMask mask;
  // The mask is what Accept takes.
  std::vector<int32_t> expected;
  for (int32_t id = 1; id < vocab.size(); ++id) {
    JsonMatcher copy = m;
    if (copy.Accept(vocab.bytes(id))) expected.push_back(id);
  }
  EXPECT_EQ(AllowedTokens(m, vocab, &mask), std::ssize(expected));
  for (int32_t id : expected) EXPECT_TRUE(MaskAllows(mask, id)) << vocab.bytes(id);
  // ",000" and ",00" begin another group of three; "1" would make "345" four
  // digits long.
  EXPECT_TRUE(MaskAllows(mask, 5));
  EXPECT_TRUE(MaskAllows(mask, 10));
  EXPECT_FALSE(MaskAllows(mask, 1));
  EXPECT_TRUE(MaskAllows(mask, 7));  // .5
  // After a fraction's digit the document may end or take more digits only.
  ASSERT_TRUE(m.Accept(".5"));
  EXPECT_TRUE(m.Complete());
  EXPECT_TRUE(m.Open());
}

TEST(RegexDocumentTest, APatternThatMatchesOnlyTheEmptyTextIsAClosedDocument) {
  auto compiled = CompileRegexDocument("^$");
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  JsonMatcher m(*compiled);
  EXPECT_TRUE(m.Complete());
  EXPECT_FALSE(m.Open());
  auto optional = CompileRegexDocument("(ab)?");
  ASSERT_TRUE(optional.ok());
  JsonMatcher o(*optional);
  EXPECT_TRUE(o.Complete());
  EXPECT_TRUE(o.Open());
  ASSERT_TRUE(o.Accept("ab"));
  EXPECT_TRUE(o.Complete());
  EXPECT_FALSE(o.Open());
}

TEST(RegexDocumentTest, AGrammarIsCompiledFromItsField) {
  auto regex = CompileGrammar({.regex = "a+"});
  ASSERT_TRUE(regex.ok()) << regex.status();
  EXPECT_EQ((*regex)->node((*regex)->root()).kind, SchemaNode::Kind::kRegex);
  auto choice = CompileGrammar({.choice = {"x"}});
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ((*choice)->node((*choice)->root()).kind, SchemaNode::Kind::kLiteral);
  EXPECT_THAT(CompileGrammar({.regex = "(?=a)"}).status().message(), HasSubstr("lookaround"));
  EXPECT_THAT(CompileGrammar({.json_schema = "{"}).status().message(),
              HasSubstr("json_schema is not valid JSON"));
}

}  // namespace
}  // namespace tandem::grammar
