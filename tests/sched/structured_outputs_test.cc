// Structured outputs at admission: a json_schema, choice, regex or grammar the grammar cannot
// hold, or one sent to a scheduler whose worker has no vocabulary, is refused
// with a precise error and changes nothing.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sched_test_util.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched {
namespace {

// Adds a request whose output is held to `schema`, to `choice` or to `regex`.
absl::Status Add(Scheduler& s, const std::string& schema, bool ignore_eos = false,
                 std::vector<std::string> choice = {}, const std::string& regex = "") {
  SamplingParams sampling = testing::Greedy(2);
  sampling.json_schema = schema;
  sampling.choice = std::move(choice);
  sampling.regex = regex;
  sampling.ignore_eos = ignore_eos;
  return s.AddRequest({.request_id = "r", .prompt_token_ids = {1, 2}, .sampling = sampling}, 0);
}

absl::Status AddChoice(Scheduler& s, std::vector<std::string> choice) {
  return Add(s, "", /*ignore_eos=*/false, std::move(choice));
}

TEST(StructuredOutputsAdmissionTest, SchemasAreCompiledAndRefusedByName) {
  SchedulerConfig config = testing::TestConfig(64, /*async=*/false);
  config.structured_outputs = true;
  Scheduler s(config, nullptr);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"type":"integer","multipleOf":2})", "keyword 'multipleOf' is not supported"},
      {R"({"type":"string","pattern":"(a)\\1"})", "'pattern': regex: a back-reference"},
      {R"({"type":)", "json_schema is not valid JSON"},
      {R"({"$ref":"#/$defs/X"})", "'$ref' \"#/$defs/X\""},
  };
  for (const auto& [schema, message] : refused) {
    const absl::Status st = Add(s, schema);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << schema;
    EXPECT_NE(st.message().find(message), std::string::npos) << st;
  }
  const absl::Status eos = Add(s, R"({"type":"integer"})", /*ignore_eos=*/true);
  EXPECT_NE(eos.message().find("ignore_eos is not supported with structured outputs"),
            std::string::npos)
      << eos;
  EXPECT_FALSE(s.HasUnfinishedRequests());
  EXPECT_TRUE(Add(s, R"({"type":"object","properties":{"a":{"type":"integer"}}})").ok());
}

// A grammar compiled before the request reaches the engine loop (as the
// scheduler's gRPC handler compiles it) is found kept at admission, refusals
// too: the loop compiles nothing.
TEST(StructuredOutputsAdmissionTest, AdmissionTakesTheGrammarTheHandlerCompiled) {
  SchedulerConfig config = testing::TestConfig(64, /*async=*/false);
  config.structured_outputs = true;
  Scheduler s(config, nullptr);
  const std::string schema = R"({"type":"object","properties":{"kept":{"type":"string"}}})";
  const std::string refused = R"({"type":"object","properties":{"x":{"oneOf":[]}}})";
  for (const std::string& text : {schema, refused}) {
    SamplingParams sampling;
    sampling.json_schema = text;
    (void)grammar::CompileGrammarKept(sampling);  // what Engine::Submit does
  }
  const grammar::KeptGrammarStats before = grammar::KeptGrammars();
  EXPECT_TRUE(Add(s, schema).ok());
  EXPECT_EQ(Add(s, refused).code(), absl::StatusCode::kInvalidArgument);
  const grammar::KeptGrammarStats after = grammar::KeptGrammars();
  EXPECT_EQ(after.hits - before.hits, 2);
  EXPECT_EQ(after.misses, before.misses);
}

TEST(StructuredOutputsAdmissionTest, ChoicesAreCompiledAndRefusedByName) {
  SchedulerConfig config = testing::TestConfig(64, /*async=*/false);
  config.structured_outputs = true;
  Scheduler s(config, nullptr);
  const absl::Status empty = AddChoice(s, {"a", ""});
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.message().find("sampling: choice 1 is empty"), std::string::npos) << empty;
  EXPECT_FALSE(s.HasUnfinishedRequests());
  EXPECT_TRUE(AddChoice(s, {"yes", "no"}).ok());
}

TEST(StructuredOutputsAdmissionTest, RegexesAreCompiledAndRefusedByName) {
  SchedulerConfig config = testing::TestConfig(64, /*async=*/false);
  config.structured_outputs = true;
  Scheduler s(config, nullptr);
  const absl::Status lookahead = Add(s, "", false, {}, "a(?=b)");
  EXPECT_EQ(lookahead.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lookahead.message().find("sampling: regex: lookaround"), std::string::npos)
      << lookahead;
  const absl::Status both = Add(s, "", false, {"a"}, "a");
  EXPECT_NE(both.message().find("more than one of json_schema, choice, regex and grammar"),
            std::string::npos)
      << both;
  EXPECT_FALSE(s.HasUnfinishedRequests());
  EXPECT_TRUE(Add(s, "", false, {}, R"(\d{3}-\d{4})").ok());
}

TEST(StructuredOutputsAdmissionTest, GrammarsAreCompiledAndRefusedByName) {
  SchedulerConfig config = testing::TestConfig(64, /*async=*/false);
  config.structured_outputs = true;
  Scheduler s(config, nullptr);
  SamplingParams sampling = testing::Greedy(2);
  sampling.ignore_eos = false;
  sampling.grammar = "root ::= root \"a\" | \"b\"";
  const absl::Status left =
      s.AddRequest({.request_id = "r", .prompt_token_ids = {1, 2}, .sampling = sampling}, 0);
  EXPECT_EQ(left.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(left.message().find("sampling: grammar: rule 'root' reaches itself"), std::string::npos)
      << left;
  EXPECT_FALSE(s.HasUnfinishedRequests());
  sampling.grammar = "root ::= \"a\" root | \"b\"";
  EXPECT_TRUE(
      s.AddRequest({.request_id = "r", .prompt_token_ids = {1, 2}, .sampling = sampling}, 0).ok());
}

TEST(StructuredOutputsAdmissionTest, AWorkerWithoutAVocabularyTakesNoSchema) {
  Scheduler s(testing::TestConfig(64, /*async=*/false), nullptr);
  const absl::Status st = Add(s, R"({"type":"integer"})");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tandem-worker --tokenizer"), std::string::npos) << st;
  const absl::Status choice = AddChoice(s, {"yes"});
  EXPECT_NE(choice.message().find("sampling: choice (structured outputs) needs"), std::string::npos)
      << choice;
  EXPECT_FALSE(s.HasUnfinishedRequests());
}

}  // namespace
}  // namespace tandem::sched
