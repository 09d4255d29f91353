// The CUDA backend against the CPU backend (skipped without a device).
#include <cmath>

#include "gtest/gtest.h"
#include "test_util.h"

namespace tandem::model {
namespace {

using testing::LoadTestModel;
using testing::MakePrompt;

TEST(CudaRunnerTest, LogitsMatchTheCpuBackendWithinTolerance) {
  auto model = LoadTestModel();
  ASSERT_NE(model, nullptr);
  auto gpu = ModelRunner::Create(model.get(), {.block_size = 16, .num_blocks = 64}, Backend::kCuda);
  if (absl::IsUnavailable(gpu.status())) GTEST_SKIP() << gpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = ModelRunner::Create(model.get(), {.block_size = 16, .num_blocks = 64});
  ASSERT_TRUE(cpu.ok());
  const int32_t vocab = model->config().vocab_size;
  // Step 1: two prefills (one sharing the other's first block in the same
  // step); step 2: decodes.
  const std::vector<int32_t> a = MakePrompt(40, 1, vocab);
  std::vector<int32_t> b(a.begin(), a.begin() + 16);
  const std::vector<int32_t> tail = MakePrompt(10, 2, vocab);
  b.insert(b.end(), tail.begin(), tail.end());
  const std::vector<int32_t> ta = {0, 1, 2}, tb = {0, 5};
  std::vector<SequenceInput> step1 = {
      {.token_ids = a, .start_pos = 0, .block_table = ta},
      {.token_ids = std::span(b).subspan(16), .start_pos = 16, .block_table = tb}};
  const std::vector<int32_t> da = {7}, db = {9};
  std::vector<SequenceInput> step2 = {{.token_ids = da, .start_pos = 40, .block_table = ta},
                                      {.token_ids = db, .start_pos = 26, .block_table = tb}};
  for (auto* step : {&step1, &step2}) {
    std::vector<float> want, got;
    ASSERT_TRUE((*cpu)->Forward(*step, &want).ok());
    ASSERT_TRUE((*gpu)->Forward(*step, &got).ok());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_LE(std::fabs(got[i] - want[i]), 1e-3 + 1e-3 * std::fabs(want[i])) << i;
    }
  }
  // Blocks round-trip through host memory.
  std::vector<std::byte> host(static_cast<size_t>((*gpu)->block_bytes()));
  ASSERT_TRUE((*gpu)->CopyBlockToHost(1, host).ok());
  ASSERT_TRUE((*gpu)->CopyBlockFromHost(9, host).ok());
  std::vector<std::byte> back(host.size());
  ASSERT_TRUE((*gpu)->CopyBlockToHost(9, back).ok());
  EXPECT_EQ(back, host);
}

TEST(CudaRunnerTest, GreedyTokensMatchTheCpuBackendOnClearMargins) {
  TANDEM_REQUIRE_STORIES();
  auto model = Model::Load(testing::StoriesPath());
  ASSERT_TRUE(model.ok());
  auto probe =
      ModelRunner::Create(model->get(), {.block_size = 16, .num_blocks = 4}, Backend::kCuda);
  if (absl::IsUnavailable(probe.status())) GTEST_SKIP() << probe.status();
  // Reference case 0 (prompt [1]) has a decisive prefix of all 128 tokens.
  const std::vector<int32_t> prompt = {1};
  EXPECT_EQ(testing::GenerateGreedy(**model, prompt, 128, Backend::kCuda),
            testing::GenerateGreedy(**model, prompt, 128, Backend::kCpu));
}

}  // namespace
}  // namespace tandem::model
