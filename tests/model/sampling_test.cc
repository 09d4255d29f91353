// Seeded sampling (DESIGN §6): tokens depend only on (seed, output position),
// never on the batch; different seeds give different tokens.
#include "tandem/kernels/sampling.h"

#include <map>

#include "gtest/gtest.h"
#include "tandem/model/sampler.h"
#include "test_util.h"

namespace tandem::model {
namespace {

using testing::LoadTestModel;
using testing::MakePrompt;

constexpr int32_t kTokens = 24;

// Generates for every prompt at once (one batch per step) and returns the
// output tokens of each.
std::vector<std::vector<int32_t>> GenerateBatch(const Model& model,
                                                const std::vector<std::vector<int32_t>>& prompts,
                                                const std::vector<SamplingParams>& params) {
  const int32_t n = static_cast<int32_t>(prompts.size());
  auto runner = ModelRunner::Create(&model, {.block_size = 16, .num_blocks = 8 * n});
  EXPECT_TRUE(runner.ok());
  std::vector<std::vector<int32_t>> tables(prompts.size()), out(prompts.size()), chunk = prompts;
  std::vector<int32_t> pos(prompts.size(), 0);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t b = 0; b < 8; ++b) tables[static_cast<size_t>(i)].push_back(8 * i + b);
  }
  std::vector<float> logits;
  const int32_t vocab = model.config().vocab_size;
  for (int32_t step = 0; step < kTokens; ++step) {
    std::vector<SequenceInput> batch;
    for (int32_t i = 0; i < n; ++i) {
      batch.push_back({.token_ids = chunk[i], .start_pos = pos[i], .block_table = tables[i]});
    }
    EXPECT_TRUE((*runner)->Forward(batch, &logits).ok());
    for (int32_t i = 0; i < n; ++i) {
      pos[i] += static_cast<int32_t>(chunk[i].size());
      const int32_t t = SampleToken(std::span(logits).subspan(i * vocab, vocab), params[i], step);
      out[i].push_back(t);
      chunk[i] = {t};
    }
  }
  return out;
}

TEST(SamplingTest, SameSeedSameTokensInAnyBatchDifferentSeedDifferentTokens) {
  auto model = LoadTestModel();
  ASSERT_NE(model, nullptr);
  const int32_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = MakePrompt(12, 3, vocab);
  for (const SamplingParams& base :
       {SamplingParams{.temperature = 1.0f}, SamplingParams{.temperature = 0.8f, .top_k = 40},
        SamplingParams{.temperature = 1.2f, .top_p = 0.9f},
        SamplingParams{.temperature = 1.0f, .top_k = 100, .top_p = 0.95f}}) {
    SamplingParams seeded = base;
    seeded.seed = 1234;
    const auto alone = GenerateBatch(*model, {prompt}, {seeded});
    // In a batch of 6 with other prompts and seeds, at index 4.
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    for (int32_t i = 0; i < 6; ++i) {
      prompts.push_back(i == 4 ? prompt : MakePrompt(5 + i, 50 + i, vocab));
      SamplingParams p = base;
      p.seed = i == 4 ? 1234 : 77 + i;
      params.push_back(p);
    }
    const auto batched = GenerateBatch(*model, prompts, params);
    EXPECT_EQ(batched[4], alone[0]) << "temperature " << base.temperature;
    SamplingParams other = seeded;
    other.seed = 1235;
    const auto different = GenerateBatch(*model, {prompt}, {other});
    EXPECT_NE(different[0], alone[0]) << "temperature " << base.temperature;
  }
}

TEST(SamplingTest, GreedyPicksArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(SampleToken(logits, SamplingParams{}, 0), 1);
}

// vLLM raises a temperature in (0, 0.01) to 0.01: a "nearly greedy" 0.001
// samples exactly as 0.01 does (two top logits 0.02 apart are both drawn),
// and 1e-40, whose scaled logits overflowed to inf, draws the argmax, not id 0.
TEST(SamplingTest, ATemperatureBelowOneHundredthSamplesAtOneHundredth) {
  const std::vector<float> close = {1.0f, 3.00f, 2.98f, 0.0f};
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const int32_t at_floor = SampleToken(close, {.temperature = 0.01f, .seed = seed}, 0);
    EXPECT_EQ(SampleToken(close, {.temperature = 0.001f, .seed = seed}, 0), at_floor) << seed;
    EXPECT_EQ(SampleToken(close, {.temperature = 1e-30f, .seed = seed}, 0), at_floor) << seed;
    seen[at_floor]++;
  }
  EXPECT_EQ(seen.size(), 2u) << "at 0.01 both close tokens are drawn";
  const std::vector<float> far = {1.0f, 5.0f, 10.0f, 4.0f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    EXPECT_EQ(SampleToken(far, {.temperature = 1e-40f, .seed = seed}, 0), 2) << seed;
  }
  EXPECT_EQ(ToSampleArgs({.temperature = 0.005f}, 0).temperature, kMinSamplingTemperature);
  EXPECT_EQ(ToSampleArgs({.temperature = 0.0f}, 0).temperature, 0.0f) << "0 stays greedy";
  EXPECT_EQ(ToSampleArgs({.temperature = 0.5f}, 0).temperature, 0.5f);
}

TEST(SamplingTest, TopKOneIsGreedyAndTopKRestrictsTheSupport) {
  std::vector<float> logits(64);
  for (int32_t i = 0; i < 64; ++i) logits[i] = static_cast<float>((i * 37) % 64) * 0.1f;
  const int32_t best = kernels::ArgMax(logits.data(), 64);
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    EXPECT_EQ(SampleToken(logits, {.temperature = 1.0f, .top_k = 1, .seed = seed}, 0), best);
    seen[SampleToken(logits, {.temperature = 5.0f, .top_k = 3, .seed = seed}, 2)]++;
  }
  // Only the 3 largest logits (6.3, 6.2, 6.1) can be chosen, and all are.
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& [tok, count] : seen) EXPECT_GE(logits[tok], 6.05f) << tok;
}

TEST(SamplingTest, TopPKeepsTheSmallestSetReachingTheMass) {
  // Probabilities ~ [0.5, 0.3, 0.15, 0.05] at temperature 1.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    seen[SampleToken(logits, {.temperature = 1.0f, .top_p = 0.75f, .seed = seed}, 0)]++;
  }
  EXPECT_EQ(seen.size(), 2u);  // 0.5 + 0.3 >= 0.75: tokens 0 and 1 only
  EXPECT_GT(seen[0], seen[1]);
}

// The tokens 400 seeds can reach.
std::map<int32_t, int> Reached(const std::vector<float>& logits, SamplingParams p) {
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    p.seed = seed;
    seen[SampleToken(logits, p, 0)]++;
  }
  return seen;
}

std::vector<int32_t> Keys(const std::map<int32_t, int>& m) {
  std::vector<int32_t> k;
  for (const auto& [key, count] : m) k.push_back(key);
  return k;
}

// vLLM's MinP logits processor: after temperature, a token stays when its
// probability is at least min_p times the top token's.
TEST(SamplingTest, MinPDropsTokensBelowItsShareOfTheTopProbability) {
  // Probabilities [0.5, 0.3, 0.15, 0.05] at temperature 1: shares of the top
  // 1, 0.6, 0.3, 0.1.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 1.0f, .min_p = 0.25f})),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 1.0f, .min_p = 0.5f})),
            (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 1.0f, .min_p = 1.0f})), (std::vector<int32_t>{0}));
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 1.0f, .min_p = 0.0f})),
            (std::vector<int32_t>{0, 1, 2, 3}));
  // Temperature 2 flattens the shares to sqrt: 1, 0.77, 0.55, 0.32.
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 2.0f, .min_p = 0.5f})),
            (std::vector<int32_t>{0, 1, 2}));
}

// vLLM's apply_top_k_top_p: top-p's mass is over the tokens min-p and top-k
// kept, renormalized (not over the whole vocabulary).
TEST(SamplingTest, TopPCountsTheMassOfWhatMinPAndTopKKept) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  // top_k 2 keeps 0.5 and 0.3: renormalized 0.625 and 0.375, so top_p 0.6
  // keeps token 0 alone (over the whole vocabulary it would need two).
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 1.0f, .top_k = 2, .top_p = 0.6f})),
            (std::vector<int32_t>{0}));
  // min_p 0.25 keeps 0.5, 0.3, 0.15 (mass 0.95): renormalized 0.526, 0.842,
  // so top_p 0.83 keeps two (over the whole vocabulary: three).
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 1.0f, .top_p = 0.83f, .min_p = 0.25f})),
            (std::vector<int32_t>{0, 1}));
  // min_p and top_k together: the smaller set wins.
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 1.0f, .top_k = 3, .min_p = 0.5f})),
            (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Keys(Reached(logits, {.temperature = 1.0f, .top_k = 1, .min_p = 0.25f})),
            (std::vector<int32_t>{0}));
}

TEST(SamplingTest, BannedTokensAreNeverDrawnGreedyOrSampled) {
  const std::vector<float> logits = {0.0f, 9.0f, 1.0f, 8.5f, 0.5f};
  const std::vector<int32_t> banned = {1, 4};
  EXPECT_EQ(SampleToken(logits, SamplingParams{}, 0), 1);
  EXPECT_EQ(SampleToken(logits, SamplingParams{}, 0, banned), 3);
  for (int32_t pos = 0; pos < 200; ++pos) {
    const SamplingParams hot{.temperature = 2.0f, .seed = 9};
    const int32_t t = SampleToken(logits, hot, pos, banned);
    EXPECT_NE(t, 1);
    EXPECT_NE(t, 4);
  }
}

TEST(SamplingTest, CounterUniformDependsOnSeedAndPositionOnly) {
  EXPECT_EQ(kernels::CounterUniform(5, 9), kernels::CounterUniform(5, 9));
  EXPECT_NE(kernels::CounterUniform(5, 9), kernels::CounterUniform(5, 10));
  EXPECT_NE(kernels::CounterUniform(5, 9), kernels::CounterUniform(6, 9));
  double sum = 0;
  for (int32_t i = 0; i < 10000; ++i) {
    const float u = kernels::CounterUniform(42, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace tandem::model
