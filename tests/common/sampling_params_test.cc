#include "tandem/common/sampling_params.h"

#include <limits>

#include "gtest/gtest.h"

namespace tandem {
namespace {

void ExpectInvalid(const SamplingParams& p, absl::string_view needle) {
  absl::Status s = p.Validate(512);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
  EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s.message();
}

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams{}.Validate(512).ok()); }

TEST(SamplingParamsTest, EachBadFieldIsNamed) {
  ExpectInvalid({.temperature = -1.0f}, "temperature");
  ExpectInvalid({.top_k = 513}, "top_k");
  ExpectInvalid({.top_p = 0.0f}, "top_p");
  ExpectInvalid({.top_p = 1.5f}, "top_p");
  ExpectInvalid({.min_p = -0.1f}, "min_p");
  ExpectInvalid({.min_p = 1.5f}, "min_p");
  ExpectInvalid({.presence_penalty = 2.5f}, "presence_penalty");
  ExpectInvalid({.frequency_penalty = -2.5f}, "frequency_penalty");
  ExpectInvalid({.frequency_penalty = std::numeric_limits<float>::quiet_NaN()},
                "frequency_penalty");
  ExpectInvalid({.repetition_penalty = 0.0f}, "repetition_penalty");
  ExpectInvalid({.repetition_penalty = std::numeric_limits<float>::infinity()},
                "repetition_penalty");
  EXPECT_TRUE(
      (SamplingParams{
           .presence_penalty = -2.0f, .frequency_penalty = 2.0f, .repetition_penalty = 0.5f})
          .Validate(512)
          .ok());
  ExpectInvalid({.logit_bias = {{512, 1.0f}}}, "logit_bias token id 512");
  ExpectInvalid({.logit_bias = {{-1, 1.0f}}}, "logit_bias token id -1");
  ExpectInvalid({.logit_bias = {{3, std::numeric_limits<float>::infinity()}}}, "logit_bias");
  ExpectInvalid({.logit_bias = {{5, 1.0f}, {5, 2.0f}}}, "each token id once");
  ExpectInvalid({.logit_bias = {{7, 1.0f}, {5, 2.0f}}}, "each token id once");
  EXPECT_TRUE((SamplingParams{.logit_bias = {{0, -100.0f}, {511, 100.0f}}}).Validate(512).ok());
  ExpectInvalid({.bad_words = {{3}, {}}}, "bad_words sequence 1 is empty");
  ExpectInvalid({.bad_words = {{3, 512}}}, "bad_words token id 512");
  EXPECT_TRUE((SamplingParams{.bad_words = {{0}, {511, 3}}}).Validate(512).ok());
  ExpectInvalid({.allowed_token_ids = {3, 512}}, "allowed_token_ids token id 512");
  ExpectInvalid({.allowed_token_ids = {-1}}, "allowed_token_ids token id -1");
  EXPECT_TRUE((SamplingParams{.allowed_token_ids = {0, 511, 0}}).Validate(512).ok());
  ExpectInvalid({.json_schema_after_token = 3},
                "json_schema_after_token needs a json_schema, a choice, a regex or a grammar");
  ExpectInvalid({.json_schema = "{}", .choice = {"a"}}, "more than one of json_schema, choice");
  ExpectInvalid({.choice = {"a"}, .regex = "a"}, "more than one of json_schema, choice");
  ExpectInvalid({.json_schema = "{}", .regex = "a"}, "more than one of json_schema, choice");
  ExpectInvalid({.regex = "a", .disable_any_whitespace = true},
                "disable_any_whitespace needs a json_schema");
  ExpectInvalid({.choice = {"a"}, .disable_any_whitespace = true},
                "disable_any_whitespace needs a json_schema");
  EXPECT_TRUE(
      (SamplingParams{.json_schema = "{}", .disable_any_whitespace = true}).Validate(512).ok());
  ExpectInvalid({.regex = "a+", .ignore_eos = true},
                "ignore_eos is not supported with structured outputs (regex)");
  EXPECT_TRUE((SamplingParams{.regex = "a+", .json_schema_after_token = 511}).Validate(512).ok());
  ExpectInvalid({.choice = {"a"}, .min_tokens = 1},
                "min_tokens is not supported with structured outputs (choice)");
  EXPECT_TRUE((SamplingParams{.choice = {"a"}, .json_schema_after_token = 511}).Validate(512).ok());
  ExpectInvalid({.json_schema = "{}", .json_schema_after_token = 512},
                "json_schema_after_token token id 512");
  EXPECT_TRUE(
      (SamplingParams{.json_schema = "{}", .json_schema_after_token = 511}).Validate(512).ok());
  ExpectInvalid({.max_tokens = 0}, "max_tokens");
  ExpectInvalid({.max_tokens = 4, .min_tokens = 5}, "min_tokens");
  ExpectInvalid({.stop_token_ids = {512}}, "stop token id 512");
  ExpectInvalid({.stop_token_ids = {-1}}, "stop token id -1");
}

// vLLM's apply_bad_words: a sequence's last token is banned where the
// output ends with the rest of it; a one-token sequence always; a sequence
// longer than the output plus one never.
TEST(SamplingParamsTest, BadWordsBanTheLastTokenAfterTheRest) {
  const std::vector<std::vector<int32_t>> words = {{7}, {1, 2}, {1, 2, 3}, {4, 2, 5}};
  auto bans = [&](std::vector<int32_t> output) {
    std::vector<int32_t> banned = {99};  // appended to, not replaced
    BadWordBans(words, output, &banned);
    return banned;
  };
  EXPECT_EQ(bans({}), (std::vector<int32_t>{99, 7}));
  EXPECT_EQ(bans({1}), (std::vector<int32_t>{99, 7, 2}));
  EXPECT_EQ(bans({5, 1}), (std::vector<int32_t>{99, 7, 2}));
  EXPECT_EQ(bans({1, 2}), (std::vector<int32_t>{99, 7, 3}));
  EXPECT_EQ(bans({4, 2}), (std::vector<int32_t>{99, 7, 5}));
  EXPECT_EQ(bans({2, 1}), (std::vector<int32_t>{99, 7, 2}));
  EXPECT_EQ(bans({1, 3}), (std::vector<int32_t>{99, 7}));
}

TEST(GenerationDefaultsTest, NoneAndLlama3sAreValid) {
  EXPECT_TRUE(GenerationDefaults{}.empty());
  EXPECT_TRUE(GenerationDefaults{}.Validate(512).ok());
  const GenerationDefaults llama3{.temperature = 0.6f, .top_p = 0.9f};
  EXPECT_FALSE(llama3.empty());
  EXPECT_TRUE(llama3.Validate(512).ok());
  // Hugging Face's top_k 0 and vLLM's -1 both mean off.
  for (int32_t off : {0, -1}) {
    const GenerationDefaults d{.top_k = off};
    EXPECT_TRUE(d.Validate(512).ok()) << off;
  }
  const GenerationDefaults gemma{.top_k = 512, .min_p = 0.0f, .repetition_penalty = 1.1f};
  EXPECT_TRUE(gemma.Validate(512).ok());
}

TEST(GenerationDefaultsTest, EachBadFieldIsNamed) {
  auto expect_invalid = [](const GenerationDefaults& d, absl::string_view needle) {
    absl::Status s = d.Validate(512);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s.message();
  };
  expect_invalid({.temperature = -0.5f}, "temperature");
  expect_invalid({.temperature = std::numeric_limits<float>::infinity()}, "temperature");
  expect_invalid({.top_p = 0.0f}, "top_p");
  expect_invalid({.top_p = 1.01f}, "top_p");
  expect_invalid({.top_k = 513}, "top_k");
  expect_invalid({.min_p = 1.5f}, "min_p");
  expect_invalid({.repetition_penalty = 0.0f}, "repetition_penalty");
}

}  // namespace
}  // namespace tandem
