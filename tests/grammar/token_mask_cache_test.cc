// Token masks kept by grammar state (TokenMaskCache): a kept mask is the one
// a walk of the vocabulary gives, for every state the walks reach. And
// grammars kept compiled by their text (CompileGrammarKept).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar_test_util.h"
#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/grammar/token_mask.h"

namespace tandem::grammar {
namespace {

std::shared_ptr<const TokenVocabulary> SharedVocabulary() {
  return std::make_shared<const TokenVocabulary>(TestVocabulary());
}

// Walks of random tokens drawn from the masks, each mask from the cache
// checked against AllowedTokens; returns the masks compared.
int CompareOnRandomWalks(TokenMaskCache& cache,
                         const std::vector<std::shared_ptr<const Schema>>& schemas,
                         int walks_per_schema, uint32_t seed) {
  std::mt19937 rng(seed);
  int compared = 0;
  for (const auto& schema : schemas) {
    for (int walk = 0; walk < walks_per_schema; ++walk) {
      JsonMatcher m(schema);
      std::string doc;
      for (int step = 0; step < 60 && m.Open(); ++step) {
        TokenMask kept, walked;
        const int32_t count = cache.Allowed(m, &kept);
        EXPECT_EQ(count, AllowedTokens(m, cache.vocabulary(), &walked)) << doc;
        EXPECT_EQ(kept, walked) << "after " << doc;
        if (kept != walked) return compared;
        ++compared;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < cache.vocabulary().size(); ++id) {
          if (MaskAllows(kept, id)) allowed.push_back(id);
        }
        if (allowed.empty() || (m.Complete() && rng() % 4 == 0)) break;
        const int32_t id = allowed[rng() % allowed.size()];
        EXPECT_TRUE(m.Accept(cache.vocabulary().bytes(id)));
        doc += cache.vocabulary().bytes(id);
      }
    }
  }
  return compared;
}

TEST(TokenMaskCacheTest, AKeptMaskIsTheWalkedMask) {
  // Strings and arrays whose counts are read (bounds) and not, nested
  // objects, an anyOf, a patterned string, raw regexes and choices: states
  // that recur and states that differ only in a count a bound reads.
  const std::vector<std::shared_ptr<const Schema>> schemas = {
      Compile(R"({"type": "object", "properties": {
          "name": {"type": "string", "minLength": 2, "maxLength": 5},
          "note": {"type": "string", "minLength": 3},
          "free": {"type": "string"},
          "tags": {"type": "array", "items": {"type": "string", "maxLength": 2},
                   "minItems": 2, "maxItems": 4},
          "any": {"type": "array", "items": {"type": ["integer", "null"]}, "minItems": 1},
          "kid": {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"},
                                                                   {"type": "number"}]}}}},
        "required": ["name", "note", "free", "tags", "any", "kid"]})"),
      AnyJsonObject(),
      Compile(R"({"type": "array", "items": {"type": "string", "pattern": "[a-c]{1,3}[0-9]?"}})"),
      *CompileRegexDocument("(ab|a{2,4}c)*[0-9]{0,3}"),
      *CompileChoices({"abc", "ab", "name", "nam"})};
  TokenMaskCache cache(SharedVocabulary(), size_t{64} << 20);
  const int compared = CompareOnRandomWalks(cache, schemas, 60, 11);
  const TokenMaskCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.hits + stats.misses, compared);
  // States recur: the inside of a string, the place after a comma.
  EXPECT_GT(stats.hits, stats.misses);
  EXPECT_EQ(stats.masks, static_cast<size_t>(stats.misses));
}

TEST(TokenMaskCacheTest, SchemasNeverShareAMask) {
  // Before their first byte both documents are the root frame alone.
  TokenMaskCache cache(SharedVocabulary(), size_t{64} << 20);
  const JsonMatcher a(*CompileRegexDocument("a"));
  const JsonMatcher b(*CompileRegexDocument("b"));
  TokenMask mask;
  cache.Allowed(a, &mask);
  EXPECT_TRUE(MaskAllows(mask, 37));   // "a"
  EXPECT_FALSE(MaskAllows(mask, 38));  // "b"
  cache.Allowed(b, &mask);
  EXPECT_FALSE(MaskAllows(mask, 37));
  EXPECT_TRUE(MaskAllows(mask, 38));
  EXPECT_EQ(cache.stats().hits, 0);
}

TEST(TokenMaskCacheTest, KeepsAtMostItsBytesTheLatestUsedFirst) {
  const auto vocab = SharedVocabulary();
  JsonMatcher m(*CompileRegexDocument("[a-z]{0,20}"));
  std::vector<JsonMatcher> states;  // the automaton after 1, 2, ... 6 letters
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(m.Accept("a"));
    states.push_back(m);
  }
  TokenMask mask;
  TokenMaskCache probe(vocab, size_t{1} << 20);
  probe.Allowed(states[0], &mask);
  const size_t entry = probe.stats().bytes;  // each state's key is as long
  ASSERT_GT(entry, mask.size() * 4);
  // Room for three and a half.
  TokenMaskCache cache(vocab, 3 * entry + entry / 2);
  for (const JsonMatcher& s : states) cache.Allowed(s, &mask);
  EXPECT_EQ(cache.stats().bytes, 3 * entry);
  EXPECT_EQ(cache.stats().masks, 3u);
  EXPECT_EQ(cache.stats().misses, 6);
  // The last three are kept, the first three went.
  cache.Allowed(states[5], &mask);
  cache.Allowed(states[3], &mask);
  EXPECT_EQ(cache.stats().hits, 2);
  cache.Allowed(states[0], &mask);
  EXPECT_EQ(cache.stats().misses, 7);
  // states[4], the least recently used, went for it.
  cache.Allowed(states[3], &mask);
  cache.Allowed(states[4], &mask);
  EXPECT_EQ(cache.stats().hits, 3);
  EXPECT_EQ(cache.stats().misses, 8);
  // 0 bytes: nothing is kept, every mask is walked.
  TokenMaskCache none(vocab, 0);
  none.Allowed(states[0], &mask);
  none.Allowed(states[0], &mask);
  EXPECT_EQ(none.stats().hits, 0);
  EXPECT_EQ(none.stats().masks, 0u);
}

TEST(KeptGrammarsTest, AGrammarIsCompiledOnceAndKeptByItsFieldTextAndWhitespace) {
  SamplingParams schema;
  schema.json_schema = R"({"type": "string", "title": "kept once"})";
  const auto first = CompileGrammarKept(schema);
  ASSERT_TRUE(first.ok());
  const KeptGrammarStats before = KeptGrammars();
  const auto again = CompileGrammarKept(schema);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), first->get());  // one Schema: one id for the masks
  EXPECT_EQ(KeptGrammars().hits, before.hits + 1);
  // Refusals are kept too, with their message.
  SamplingParams refused;
  refused.regex = "(a)\\1";
  EXPECT_FALSE(CompileGrammarKept(refused).ok());
  const auto kept_refusal = CompileGrammarKept(refused);
  ASSERT_FALSE(kept_refusal.ok());
  EXPECT_NE(kept_refusal.status().message().find("back-reference"), std::string::npos);
  // Choice lists that join to one text are two grammars; so are a regex and
  // a schema of one text.
  SamplingParams ab_c, a_bc, json_true, regex_true;
  ab_c.choice = {"ab", "c"};
  a_bc.choice = {"a", "bc"};
  json_true.json_schema = "true";
  regex_true.regex = "true";
  EXPECT_NE(CompileGrammarKept(ab_c)->get(), CompileGrammarKept(a_bc)->get());
  const auto as_schema = CompileGrammarKept(json_true);
  const auto as_regex = CompileGrammarKept(regex_true);
  ASSERT_TRUE(as_schema.ok() && as_regex.ok());
  EXPECT_NE(as_regex->get(), as_schema->get());
  // A schema without any whitespace is its own grammar.
  SamplingParams compact = schema;
  compact.disable_any_whitespace = true;
  const auto as_compact = CompileGrammarKept(compact);
  ASSERT_TRUE(as_compact.ok());
  EXPECT_NE(as_compact->get(), first->get());
  EXPECT_FALSE((*as_compact)->any_whitespace());
  EXPECT_TRUE((*first)->any_whitespace());
  // Past kKeptGrammars others, the first is compiled again.
  for (size_t i = 0; i < kKeptGrammars; ++i) {
    SamplingParams other;
    other.regex = "x{" + std::to_string(i + 1) + "}";
    ASSERT_TRUE(CompileGrammarKept(other).ok());
  }
  const KeptGrammarStats full = KeptGrammars();
  EXPECT_NE(CompileGrammarKept(schema)->get(), first->get());
  EXPECT_EQ(KeptGrammars().misses, full.misses + 1);
}

}  // namespace
}  // namespace tandem::grammar
