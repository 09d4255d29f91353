// Log-probabilities (TokenLogprobs): ComputeLogprobs against a log-softmax
// computed here in long double, and the CPU runner's all_logits rows and
// ForwardSample's logprobs against its own logits (the CPU backend is the
// reference: it follows llama2.c's run.c).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "tandem/model/sampler.h"
#include "test_util.h"

namespace tandem::model {
namespace {

using testing::LoadTestModel;
using testing::MakePrompt;

// log-softmax of logits[id], independently of the sampler.
double ReferenceLogprob(std::span<const float> logits, int32_t id) {
  long double max = logits[0];
  for (float l : logits) max = std::max<long double>(max, l);
  long double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<long double>(l) - max);
  return static_cast<double>(static_cast<long double>(logits[static_cast<size_t>(id)]) - max -
                             std::log(sum));
}

TEST(LogprobsTest, MatchTheLogSoftmaxWithRankAndSortedTopList) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> logits(1000);
  for (float& l : logits) l = dist(rng);
  for (int32_t token : {0, 17, 999}) {
    const TokenLogprobs lp = ComputeLogprobs(logits, token, 20);
    EXPECT_EQ(lp.token_id, token);
    EXPECT_NEAR(lp.logprob, ReferenceLogprob(logits, token), 1e-5);
    // Rank: 1 + the tokens strictly more likely.
    const int32_t above = static_cast<int32_t>(
        std::count_if(logits.begin(), logits.end(), [&](float l) { return l > logits[token]; }));
    EXPECT_EQ(lp.rank, above + 1);
    ASSERT_EQ(lp.top_token_ids.size(), 20u);
    ASSERT_EQ(lp.top_logprobs.size(), 20u);
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (size_t k = 0; k < 20; ++k) {
      EXPECT_EQ(lp.top_token_ids[k], order[k]) << k;
      EXPECT_NEAR(lp.top_logprobs[k], ReferenceLogprob(logits, order[k]), 1e-5);
      if (k > 0) {
        EXPECT_GE(lp.top_logprobs[k - 1], lp.top_logprobs[k]);
      }
    }
  }
  // The probabilities sum to one.
  double total = 0;
  for (int32_t id = 0; id < 1000; ++id) total += std::exp(ComputeLogprobs(logits, id, 0).logprob);
  EXPECT_NEAR(total, 1.0, 1e-4);
}

TEST(LogprobsTest, TiesRankTheLowerIdFirstAndZeroAlternativesGiveNoList) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.5f, 3.0f};
  const TokenLogprobs lp = ComputeLogprobs(logits, 2, 3);
  EXPECT_EQ(lp.rank, 2);  // after id 1
  EXPECT_EQ(lp.top_token_ids, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_TRUE(ComputeLogprobs(logits, 3, 0).top_token_ids.empty());
  EXPECT_EQ(ComputeLogprobs(logits, 3, 0).rank, 5);
  // More alternatives than the vocabulary: all of it.
  EXPECT_EQ(ComputeLogprobs(logits, 0, 50).top_token_ids.size(), 5u);
  // A -inf logit (a masked token) has probability 0.
  const std::vector<float> masked = {0.0f, -INFINITY};
  EXPECT_EQ(ComputeLogprobs(masked, 1, 0).logprob, -INFINITY);
  EXPECT_EQ(ComputeLogprobs(masked, 0, 0).logprob, 0.0f);
}

// LogprobTargets, the bookkeeping the host and the device share: which
// logits row scores which token, top-n clamped to the vocabulary once (the
// device kernel's rounds trust it), and bad targets refused.
TEST(LogprobsTest, TargetsMapRowsAndClampTopNToTheVocabulary) {
  const std::vector<int32_t> chunk = {5, 6, 7, 8}, nine = {9}, three = {3};
  const std::vector<SequenceInput> batch = {
      {.token_ids = chunk, .all_logits = true}, {.token_ids = nine}, {.token_ids = three}};
  const SamplingParams params;
  const std::vector<int32_t> targets_of_0 = {6, 7, 8, 1};
  const std::vector<SampleRequest> sample = {
      {.params = &params,
       .num_logprobs = 100,
       .prompt_targets = targets_of_0,
       .num_prompt_logprobs = 1000},
      {.params = &params, .num_logprobs = 2},
      {.params = nullptr, .num_logprobs = 5}};  // samples nothing: no target
  const std::vector<int32_t> tokens = {4, 2, -1};
  auto got = LogprobTargets(batch, sample, tokens, /*vocab=*/10);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 6u);
  // Sequence 0: its sampled token on its last row (row 0), top-n 100 -> 10;
  // prompt targets on its extra rows 3, 4, 5 (after the batch's 3 rows),
  // the last one on row 0.
  EXPECT_EQ((*got)[0].logits_row, 0);
  EXPECT_EQ((*got)[0].top_n, 10);
  EXPECT_EQ((*got)[0].prompt_index, -1);
  for (int32_t j = 0; j < 4; ++j) {
    const LogprobTarget& t = (*got)[static_cast<size_t>(1 + j)];
    EXPECT_EQ(t.prompt_index, j);
    EXPECT_EQ(t.token, targets_of_0[static_cast<size_t>(j)]);
    EXPECT_EQ(t.logits_row, j == 3 ? 0 : 3 + j);
    EXPECT_EQ(t.top_n, 10);
  }
  EXPECT_EQ((*got)[5].sequence, 1);
  EXPECT_EQ((*got)[5].logits_row, 1);
  EXPECT_EQ((*got)[5].top_n, 2);
  // A token outside the vocabulary, and prompt targets past a chunk's rows.
  const std::vector<int32_t> outside = {4, 10, -1};
  EXPECT_EQ(LogprobTargets(batch, sample, outside, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  const std::vector<SampleRequest> too_many = {{.params = &params, .prompt_targets = five}};
  EXPECT_EQ(LogprobTargets({batch.data(), 1}, too_many, tokens, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class RunnerLogprobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LoadTestModel();
    ASSERT_NE(model_, nullptr);
    vocab_ = model_->config().vocab_size;
  }
  std::unique_ptr<ModelRunner> NewRunner() {
    auto r = ModelRunner::Create(model_.get(), {.block_size = 16, .num_blocks = 64});
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  }
  // Logits after each token of `tokens`, fed one token per step (the
  // reference for all_logits rows).
  std::vector<std::vector<float>> OneAtATime(const std::vector<int32_t>& tokens,
                                             const std::vector<int32_t>& table) {
    auto runner = NewRunner();
    std::vector<std::vector<float>> rows;
    std::vector<float> logits;
    for (size_t p = 0; p < tokens.size(); ++p) {
      SequenceInput in{.token_ids = std::span(tokens).subspan(p, 1),
                       .start_pos = static_cast<int32_t>(p),
                       .block_table = table};
      EXPECT_TRUE(runner->Forward({&in, 1}, &logits).ok());
      rows.push_back(logits);
    }
    return rows;
  }

  std::unique_ptr<Model> model_;
  int32_t vocab_ = 0;
};

TEST_F(RunnerLogprobsTest, AllLogitsRowsEqualTheLogitsAfterEachToken) {
  const std::vector<int32_t> a = MakePrompt(37, 3, vocab_), b = MakePrompt(21, 5, vocab_),
                             c = MakePrompt(9, 8, vocab_);
  const std::vector<int32_t> ta = {1, 2, 3}, tb = {4, 5}, tc = {6};
  const auto ref_a = OneAtATime(a, ta), ref_c = OneAtATime(c, tc);
  // a and c want every row, b only its last; c's chunk starts mid-prompt.
  auto runner = NewRunner();
  std::vector<float> logits;
  SequenceInput c_head{.token_ids = std::span(c).first(4), .block_table = tc};
  ASSERT_TRUE(runner->Forward({&c_head, 1}, &logits).ok());
  const std::vector<SequenceInput> batch = {{.token_ids = a, .block_table = ta, .all_logits = true},
                                            {.token_ids = b, .block_table = tb},
                                            {.token_ids = std::span(c).subspan(4),
                                             .start_pos = 4,
                                             .block_table = tc,
                                             .all_logits = true}};
  ASSERT_TRUE(runner->Forward(batch, &logits).ok());
  const size_t v = static_cast<size_t>(vocab_);
  ASSERT_EQ(logits.size(), (3 + 36 + 4) * v);
  for (int32_t j = 0; j < 37; ++j) {
    const int32_t row = LogitsRowOf(batch, 0, j);
    EXPECT_EQ(std::memcmp(&logits[row * v], ref_a[j].data(), v * sizeof(float)), 0) << "a " << j;
  }
  for (int32_t j = 0; j < 5; ++j) {
    const int32_t row = LogitsRowOf(batch, 2, j);
    EXPECT_EQ(std::memcmp(&logits[row * v], ref_c[4 + j].data(), v * sizeof(float)), 0)
        << "c " << j;
  }
  EXPECT_EQ(LogitsRowOf(batch, 1, 20), 1);
  EXPECT_EQ(LogitsRowOf(batch, 2, 0), 3 + 36);
}

TEST_F(RunnerLogprobsTest, ForwardSampleScoresTheSampledTokenAndThePromptTargets) {
  const std::vector<int32_t> prompt = MakePrompt(30, 4, vocab_);
  const std::vector<int32_t> table = {1, 2};
  const auto ref = OneAtATime(prompt, table);
  auto runner = NewRunner();
  const SamplingParams greedy{.max_tokens = 4}, hot{.temperature = 0.9f, .seed = 3};
  // Two sequences with the same prompt: greedy and sampled.
  const std::vector<int32_t> table2 = {3, 4};
  const std::vector<SequenceInput> batch = {
      {.token_ids = prompt, .block_table = table, .all_logits = true},
      {.token_ids = prompt, .block_table = table2}};
  const std::vector<SampleRequest> sample = {{.params = &greedy,
                                              .num_logprobs = 5,
                                              .prompt_targets = std::span(prompt).subspan(1),
                                              .num_prompt_logprobs = 2},
                                             {.params = &hot, .num_logprobs = 0}};
  std::vector<int32_t> tokens;
  std::vector<SampleLogprobs> lp;
  ASSERT_TRUE(runner->ForwardSample(batch, sample, &tokens, &lp).ok());
  ASSERT_EQ(lp.size(), 2u);
  ASSERT_EQ(lp[0].sampled.size(), 1u);
  const TokenLogprobs& g = lp[0].sampled[0];
  // Greedy: the sampled token is the most likely; its logprob is the top one.
  EXPECT_EQ(g.token_id, tokens[0]);
  EXPECT_EQ(g.rank, 1);
  EXPECT_EQ(g.top_token_ids.size(), 5u);
  EXPECT_EQ(g.top_token_ids[0], tokens[0]);
  EXPECT_EQ(g.top_logprobs[0], g.logprob);
  EXPECT_NEAR(g.logprob, ReferenceLogprob(ref.back(), tokens[0]), 1e-5);
  // Sampled at a temperature: the raw logprob of whatever it drew.
  ASSERT_EQ(lp[1].sampled.size(), 1u);
  EXPECT_EQ(lp[1].sampled[0].token_id, tokens[1]);
  EXPECT_NEAR(lp[1].sampled[0].logprob, ReferenceLogprob(ref.back(), tokens[1]), 1e-5);
  EXPECT_TRUE(lp[1].sampled[0].top_token_ids.empty());
  EXPECT_TRUE(lp[1].prompt.empty());
  // Prompt token p + 1 scored by the logits after token p.
  ASSERT_EQ(lp[0].prompt.size(), 29u);
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    EXPECT_EQ(lp[0].prompt[p].token_id, prompt[p + 1]);
    EXPECT_NEAR(lp[0].prompt[p].logprob, ReferenceLogprob(ref[p], prompt[p + 1]), 1e-5) << p;
    EXPECT_EQ(lp[0].prompt[p].top_token_ids.size(), 2u);
  }
  // Without a logprobs vector: the same tokens.
  std::vector<int32_t> again;
  auto runner2 = NewRunner();
  ASSERT_TRUE(runner2->ForwardSample(batch, sample, &again).ok());
  EXPECT_EQ(again, tokens);
}

TEST_F(RunnerLogprobsTest, PromptTargetsBeyondTheLastRowNeedAllLogits) {
  const std::vector<int32_t> prompt = MakePrompt(8, 4, vocab_);
  const std::vector<int32_t> table = {1};
  auto runner = NewRunner();
  const SequenceInput in{.token_ids = prompt, .block_table = table};
  const SampleRequest r{.prompt_targets = std::span(prompt).subspan(1), .num_prompt_logprobs = 0};
  std::vector<int32_t> tokens;
  std::vector<SampleLogprobs> lp;
  const absl::Status s = runner->ForwardSample({&in, 1}, {&r, 1}, &tokens, &lp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("all_logits"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem::model
