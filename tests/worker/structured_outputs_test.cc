// Structured outputs in StepExecutor: a backend that draws a random token
// among those neither banned nor masked (as the sampling program does) writes, step by
// step, a document of the request's json_schema, and ends it with EOS only
// once it is complete. The grammar itself is tests/grammar's.
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "re2/re2.h"
#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/token_mask.h"
#include "tandem/worker/step_executor.h"

namespace tandem::worker {
namespace {

using sched::CachedRequestData;
using sched::NewRequestData;
using sched::SchedulerOutput;

constexpr int32_t kEos = 1;
constexpr int32_t kThinkEnd = 47;  // "</think>", Vocabulary()'s last

// Draws uniformly among the ids a row neither bans nor masks (ids of empty
// bytes included, as a model may favour them), and records which rows had either.
class RandomBackend final : public StepBackend {
 public:
  explicit RandomBackend(int32_t vocab, uint32_t seed) : vocab_(vocab), rng_(seed) {}
  absl::Status ForwardSample(std::span<const model::SequenceInput> batch,
                             std::span<const model::SampleRequest> sample,
                             std::vector<int32_t>* tokens,
                             std::vector<model::SampleLogprobs>* logprobs) override {
    if (logprobs != nullptr) logprobs->assign(batch.size(), {});
    tokens->assign(batch.size(), -1);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (sample[i].params == nullptr) continue;
      std::vector<int32_t> free;
      const auto& b = sample[i].banned_token_ids;
      const std::span<const uint32_t> mask = sample[i].allowed_mask;
      for (int32_t t = 0; t < vocab_; ++t) {
        // A mask bans what it does not allow, ids past its words too.
        const bool masked = !mask.empty() && (static_cast<size_t>(t) / 32 >= mask.size() ||
                                              !grammar::MaskAllows(mask, t));
        if (!masked && std::find(b.begin(), b.end(), t) == b.end()) free.push_back(t);
      }
      if (free.empty()) return absl::InternalError("every token banned");
      (*tokens)[i] = free[rng_() % free.size()];
      if (drawn_ < script.size()) {
        (*tokens)[i] = script[drawn_];
        if (std::find(free.begin(), free.end(), script[drawn_]) == free.end()) {
          return absl::InternalError(absl::StrCat("scripted token ", script[drawn_], " banned"));
        }
      }
      ++drawn_;
      eos_allowed.push_back(std::find(free.begin(), free.end(), kEos) != free.end());
      restricted.push_back(!b.empty() || !mask.empty());
    }
    return absl::OkStatus();
  }
  std::vector<int32_t> script;    // the first draws (each must be free)
  std::vector<bool> eos_allowed;  // per draw
  std::vector<bool> restricted;   // per draw: it had banned ids or a mask

 private:
  size_t drawn_ = 0;
  int32_t vocab_;
  std::mt19937 rng_;
};

std::shared_ptr<const grammar::TokenVocabulary> Vocabulary() {
  // Id 0 has no text (a special token), 1 is EOS.
  std::vector<std::string> tokens = {"",  "",   "{",      "}",    "\"",    "\":", ",",
                                     " ", "ok", "n",      "true", "false", "1",   "23",
                                     "-", "ab", "\"ok\"", "[",    "]",     "\n",  ":"};
  for (char c = 'a'; c <= 'z'; ++c) tokens.emplace_back(1, c);
  tokens.emplace_back("</think>");  // kThinkEnd
  return std::make_shared<const grammar::TokenVocabulary>(std::move(tokens));
}

constexpr const char* kSchema =
    R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"},)"
    R"("s":{"type":"string","maxLength":3}},"required":["ok","n"]})";

SchedulerOutput NewStep(uint64_t id, const std::string& req, SamplingParams sampling) {
  SchedulerOutput s{.step_id = id, .last_processed_step_id = id - 1};
  s.scheduled_new_reqs.push_back(NewRequestData{.request_id = req,
                                                .prompt_token_ids = {5, 6},
                                                .sampling = std::move(sampling),
                                                .block_ids = {0, 1}});
  s.num_scheduled_tokens = {2};
  s.total_num_scheduled_tokens = 2;
  return s;
}

SchedulerOutput DecodeStep(uint64_t id, const std::string& req, int32_t num_computed) {
  SchedulerOutput s{.step_id = id, .last_processed_step_id = id - 1};
  s.scheduled_cached_reqs.push_back(
      CachedRequestData{.request_id = req, .num_computed_tokens = num_computed});
  s.num_scheduled_tokens = {1};
  s.total_num_scheduled_tokens = 1;
  return s;
}

// Runs one request (sync steps) until it draws EOS or 300 tokens.
std::vector<int32_t> Generate(StepExecutor& executor, const SamplingParams& sampling) {
  std::vector<int32_t> out;
  sched::ModelRunnerOutput o = executor.Execute(NewStep(1, "r", sampling));
  for (uint64_t step = 2; o.error.empty() && out.size() < 300; ++step) {
    const int32_t t = o.sampled.at(0).token_ids.at(0);
    out.push_back(t);
    if (t == kEos) break;
    o = executor.Execute(DecodeStep(step, "r", 2 + static_cast<int32_t>(out.size()) - 1));
  }
  EXPECT_TRUE(o.error.empty()) << o.error;
  return out;
}

TEST(StructuredOutputsTest, EveryDrawKeepsTheDocumentAndEosComesOnlyOnceItIsComplete) {
  const auto vocab = Vocabulary();
  const auto schema = grammar::CompileJsonSchema(nlohmann::ordered_json::parse(kSchema)).value();
  int complete = 0;
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    RandomBackend backend(vocab->size(), seed);
    StepExecutor executor(&backend, nullptr, {.eos_token_ids = {kEos}, .vocabulary = vocab});
    const std::vector<int32_t> out =
        Generate(executor, {.json_schema = kSchema, .max_tokens = 400});
    ASSERT_EQ(backend.eos_allowed.size(), out.size());
    grammar::JsonMatcher m(schema);
    std::string doc;
    for (size_t k = 0; k < out.size(); ++k) {
      // EOS may be drawn exactly where the document is complete.
      EXPECT_EQ(backend.eos_allowed[k], m.Complete()) << "at " << doc;
      if (out[k] == kEos) {
        EXPECT_EQ(k + 1, out.size());
        EXPECT_TRUE(nlohmann::json::accept(doc)) << doc;
        ++complete;
        break;
      }
      ASSERT_FALSE(vocab->bytes(out[k]).empty()) << "a token without text drawn after " << doc;
      ASSERT_TRUE(m.Accept(vocab->bytes(out[k])))
          << "'" << vocab->bytes(out[k]) << "' after " << doc;
      doc += vocab->bytes(out[k]);
    }
  }
  EXPECT_GT(complete, 20);
}

// A new request's grammar is compiled and its first mask made as its step
// is prepared (while the step before runs), so the launch finds it kept.
TEST(StructuredOutputsTest, ANewRequestsFirstMaskIsMadeAsItsStepIsPrepared) {
  const auto vocab = Vocabulary();
  RandomBackend backend(vocab->size(), 1);
  StepExecutor executor(&backend, nullptr, {.eos_token_ids = {kEos}, .vocabulary = vocab});
  std::unique_ptr<StepExecutor::Step> st =
      executor.Prepare(NewStep(1, "r", {.json_schema = kSchema, .max_tokens = 10}));
  EXPECT_EQ(executor.structured_stats().masks_walked, 1);
  EXPECT_EQ(executor.structured_stats().masks_kept, 0);
  executor.Launch(*st, [] {});
  const sched::ModelRunnerOutput out = executor.Finish(std::move(st));
  ASSERT_TRUE(out.error.empty()) << out.error;
  EXPECT_EQ(executor.structured_stats().masks_walked, 1);
  EXPECT_EQ(executor.structured_stats().masks_kept, 1);
  // The draw was from that mask: the document's first byte.
  EXPECT_EQ(vocab->bytes(out.sampled.at(0).token_ids.at(0)).substr(0, 1), "{");
}

// vLLM's structured_outputs.choice: every output is one of the strings, and
// "ok" (which begins "okay") may end or go on.
TEST(StructuredOutputsTest, EachOutputIsOneOfTheChoices) {
  const auto vocab = Vocabulary();
  const std::vector<std::string> choices = {"ok", "okay", "nab", "true"};
  std::set<std::string> seen;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    RandomBackend backend(vocab->size(), seed);
    StepExecutor executor(&backend, nullptr, {.eos_token_ids = {kEos}, .vocabulary = vocab});
    const std::vector<int32_t> out = Generate(executor, {.choice = choices, .max_tokens = 50});
    ASSERT_FALSE(out.empty());
    ASSERT_EQ(out.back(), kEos) << "seed " << seed;
    std::string text;
    for (size_t k = 0; k + 1 < out.size(); ++k) {
      EXPECT_FALSE(backend.eos_allowed[k] && text != "ok") << "EOS allowed after '" << text << "'";
      text += vocab->bytes(out[k]);
    }
    EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << text;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 3u);  // the draws are the backend's, among every choice
}

// vLLM's structured_outputs.regex: every output matches the pattern whole, as
// RE2 reads it, and EOS may be drawn exactly where the text so far does.
TEST(StructuredOutputsTest, EachOutputMatchesTheRegex) {
  const auto vocab = Vocabulary();
  const std::string pattern = R"([a-e]{1,4}(-(1|23)|ok)\n?)";
  const RE2 re(pattern);
  ASSERT_TRUE(re.ok());
  std::set<std::string> seen;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    RandomBackend backend(vocab->size(), seed);
    StepExecutor executor(&backend, nullptr, {.eos_token_ids = {kEos}, .vocabulary = vocab});
    const std::vector<int32_t> out = Generate(executor, {.regex = pattern, .max_tokens = 50});
    ASSERT_FALSE(out.empty());
    ASSERT_EQ(out.back(), kEos) << "seed " << seed;
    std::string text;
    for (size_t k = 0; k + 1 < out.size(); ++k) {
      EXPECT_EQ(backend.eos_allowed[k], RE2::FullMatch(text, re)) << "at '" << text << "'";
      text += vocab->bytes(out[k]);
    }
    EXPECT_TRUE(RE2::FullMatch(text, re)) << text;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 10u);
}

// vLLM's structured_outputs.grammar (xgrammar's EBNF): every output is text
// of the grammar, checked by RE2 against the same language written as one
// pattern, and EOS may be drawn exactly where the text so far is whole.
TEST(StructuredOutputsTest, EachOutputIsTextOfTheGrammar) {
  const auto vocab = Vocabulary();
  const std::string grammar =
      "root ::= item (sep item){0,3} end\n"
      "item ::= word | \"[\" word \"]\"\n"
      "word ::= [a-e]{1,4}\n"
      "sep ::= \"-\" | \", \"\n"
      "end ::= \"ok\" | \"\\n\"\n";
  const RE2 re(R"(([a-e]{1,4}|\[[a-e]{1,4}\])((-|, )([a-e]{1,4}|\[[a-e]{1,4}\])){0,3}(ok|\n))");
  ASSERT_TRUE(re.ok());
  std::set<std::string> seen;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    RandomBackend backend(vocab->size(), seed);
    StepExecutor executor(&backend, nullptr, {.eos_token_ids = {kEos}, .vocabulary = vocab});
    const std::vector<int32_t> out = Generate(executor, {.grammar = grammar, .max_tokens = 80});
    ASSERT_FALSE(out.empty());
    ASSERT_EQ(out.back(), kEos) << "seed " << seed;
    std::string text;
    for (size_t k = 0; k + 1 < out.size(); ++k) {
      EXPECT_EQ(backend.eos_allowed[k], RE2::FullMatch(text, re)) << "at '" << text << "'";
      text += vocab->bytes(out[k]);
    }
    EXPECT_TRUE(RE2::FullMatch(text, re)) << text;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 10u);
}

// json_schema_after_token (a reasoning model's "</think>"): the output up to
// it is free, EOS included; after it, a document.
TEST(StructuredOutputsTest, TheDocumentStartsAfterTheThinkingsEnd) {
  const auto vocab = Vocabulary();
  ASSERT_EQ(vocab->bytes(kThinkEnd), "</think>");
  const auto schema = grammar::CompileJsonSchema(nlohmann::ordered_json::parse(kSchema)).value();
  // "}a" is no document's start and "</think>" is in none: drawn freely.
  const std::vector<int32_t> thinking = {3, 21, kThinkEnd};
  int complete = 0;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    RandomBackend backend(vocab->size(), seed);
    backend.script = thinking;
    StepExecutor executor(&backend, nullptr, {.eos_token_ids = {kEos}, .vocabulary = vocab});
    const std::vector<int32_t> out =
        Generate(executor,
                 {.json_schema = kSchema, .json_schema_after_token = kThinkEnd, .max_tokens = 400});
    ASSERT_GT(out.size(), thinking.size());
    for (size_t k = 0; k < thinking.size(); ++k) {
      EXPECT_FALSE(backend.restricted[k]) << "draw " << k << " is before the document";
    }
    grammar::JsonMatcher m(schema);
    std::string doc;
    for (size_t k = thinking.size(); k < out.size(); ++k) {
      EXPECT_EQ(backend.eos_allowed[k], m.Complete()) << "at " << doc;
      if (out[k] == kEos) {
        EXPECT_TRUE(nlohmann::json::accept(doc)) << doc;
        ++complete;
        break;
      }
      ASSERT_TRUE(m.Accept(vocab->bytes(out[k])))
          << "'" << vocab->bytes(out[k]) << "' after " << doc;
      doc += vocab->bytes(out[k]);
    }
  }
  EXPECT_GT(complete, 10);
}

TEST(StructuredOutputsTest, AResumedRequestsGrammarFollowsTheTokensTheSchedulerGives) {
  const auto vocab = Vocabulary();
  const SamplingParams sampling{.json_schema = kSchema, .max_tokens = 400};
  // Two tokens drawn, preempted, then back with an output of its own: `{"ok"` (what this worker
  // drew is forgotten), recomputed from the start.
  SchedulerOutput resume{.step_id = 4, .last_processed_step_id = 3};
  resume.scheduled_cached_reqs.push_back(CachedRequestData{.request_id = "r",
                                                           .resumed_from_preemption = true,
                                                           .new_block_ids = {0, 1},
                                                           .all_token_ids = {5, 6, 2, 16},
                                                           .num_computed_tokens = 0});
  resume.num_scheduled_tokens = {4};
  resume.total_num_scheduled_tokens = 4;
  for (int i = 0; i < 20; ++i) {
    RandomBackend again(vocab->size(), 100 + i);
    StepExecutor e(&again, nullptr, {.eos_token_ids = {kEos}, .vocabulary = vocab});
    ASSERT_TRUE(e.Execute(NewStep(1, "r", sampling)).error.empty());
    ASSERT_TRUE(e.Execute(DecodeStep(2, "r", 2)).error.empty());
    SchedulerOutput p{.step_id = 3, .last_processed_step_id = 2};
    p.preempted_req_ids = {"r"};
    ASSERT_TRUE(e.Execute(std::move(p)).error.empty());
    const sched::ModelRunnerOutput o = e.Execute(resume);
    ASSERT_TRUE(o.error.empty()) << o.error;
    const std::string next(vocab->bytes(o.sampled.at(0).token_ids.at(0)));
    // After a key, only whitespace or the colon.
    EXPECT_TRUE(next == " " || next == "\n" || next == ":") << "'" << next << "'";
  }
}

// A schema whose readings pass grammar::kMaxAlternatives where it begins (300
// alike string branches) leaves no token to draw: the step reports that
// request's error, and the other request in the step goes on as before.
TEST(StructuredOutputsTest, ADocumentNoTokenCanContinueFailsItsRequestAlone) {
  nlohmann::ordered_json branches = nlohmann::ordered_json::array();
  for (int i = 0; i < 300; ++i) branches.push_back({{"type", "string"}});
  const std::string stuck = nlohmann::ordered_json{{"anyOf", branches}}.dump();
  const auto vocab = Vocabulary();
  RandomBackend backend(vocab->size(), 3);
  StepExecutor executor(&backend, nullptr, {.eos_token_ids = {kEos}, .vocabulary = vocab});
  SchedulerOutput step = NewStep(1, "stuck", {.json_schema = stuck, .max_tokens = 8});
  step.scheduled_new_reqs.push_back(
      NewRequestData{.request_id = "fine",
                     .prompt_token_ids = {5, 6},
                     .sampling = {.json_schema = kSchema, .max_tokens = 8},
                     .block_ids = {2, 3}});
  step.num_scheduled_tokens = {2, 2};
  step.total_num_scheduled_tokens = 4;
  const sched::ModelRunnerOutput o = executor.Execute(step);
  ASSERT_TRUE(o.error.empty()) << o.error;
  ASSERT_EQ(o.sampled.size(), 2u);
  EXPECT_EQ(o.sampled[0].request_id, "stuck");
  EXPECT_NE(o.sampled[0].error.find("no token can go on with the document after 0 tokens: the "
                                    "json_schema's readings passed 256 at once"),
            std::string::npos)
      << o.sampled[0].error;
  EXPECT_EQ(o.sampled[1].request_id, "fine");
  EXPECT_EQ(o.sampled[1].error, "");
  ASSERT_EQ(o.sampled[1].token_ids.size(), 1u);
  EXPECT_EQ(vocab->bytes(o.sampled[1].token_ids[0]).substr(0, 1), "{");
}

// The ids that end a request join the mask where the document is complete,
// also one past the vocabulary's words (the mask grows to hold it rather
// than being written past its end).
TEST(StructuredOutputsTest, AnEndIdPastTheVocabularyJoinsTheMaskWhereTheDocumentIsComplete) {
  const auto vocab = Vocabulary();  // 48 ids: two words of mask
  constexpr int32_t kFarEos = 100, kFarStop = 70;
  StructuredOutputs structured(vocab, {kEos, kFarEos}, size_t{1} << 20);
  SamplingParams params;
  params.choice = {"ok"};
  params.stop_token_ids = {kFarStop};
  GrammarState state;
  grammar::TokenMask allowed;
  structured.Mask("r", params, {}, &state, &allowed);
  ASSERT_TRUE(state.error.empty()) << state.error;
  EXPECT_EQ(allowed.size(), 2u);  // nothing ends the request yet
  EXPECT_FALSE(grammar::MaskAllows(allowed, kEos));
  const std::vector<int32_t> ok = {8};  // "ok": the document is complete
  structured.Mask("r", params, ok, &state, &allowed);
  ASSERT_EQ(allowed.size(), static_cast<size_t>(kFarEos / 32 + 1));
  for (int32_t end : {kEos, kFarEos, kFarStop}) {
    EXPECT_TRUE(grammar::MaskAllows(allowed, end)) << end;
  }
  EXPECT_FALSE(grammar::MaskAllows(allowed, 2));  // "{" after the choice
}

TEST(StructuredOutputsTest, AWorkerWithoutAVocabularyFailsTheStepNamingTheFlag) {
  RandomBackend backend(8, 1);
  StepExecutor executor(&backend, nullptr, {.eos_token_ids = {kEos}});
  const sched::ModelRunnerOutput o =
      executor.Execute(NewStep(1, "r", {.json_schema = kSchema, .max_tokens = 4}));
  EXPECT_NE(o.error.find("no vocabulary for structured outputs (tandem-worker --tokenizer)"),
            std::string::npos)
      << o.error;
}

}  // namespace
}  // namespace tandem::worker
