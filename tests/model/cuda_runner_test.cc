// The CUDA backend against the CPU backend (skipped without a device);
// cuda_runner_same_bits_test.cc has the runner options that must not change
// a bit.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <thread>

#include "gtest/gtest.h"
#include "tandem/common/pinned_memory.h"
#include "tandem/model/sampler.h"
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
  TANDEM_REQUIRE_CUDA(model->get());
  // Reference case 0 (prompt [1]) has a decisive prefix of all 128 tokens.
  const std::vector<int32_t> prompt = {1};
  EXPECT_EQ(testing::GenerateGreedy(**model, prompt, 128, Backend::kCuda),
            testing::GenerateGreedy(**model, prompt, 128, Backend::kCpu));
}

// fp32 mode follows the CPU backend's order of operations: every reference
// case of llama2.c matches token for token, near-ties included.
TEST(CudaRunnerTest, Fp32ModeMatchesEveryReferenceCase) {
  TANDEM_REQUIRE_STORIES();
  auto model = Model::Load(testing::StoriesPath());
  ASSERT_TRUE(model.ok());
  TANDEM_REQUIRE_CUDA(model->get());
  const std::vector<testing::ReferenceCase> cases = testing::LoadCases();
  ASSERT_EQ(cases.size(), 5u);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(testing::GenerateGreedy(**model, cases[i].prompt, cases[i].max_tokens,
                                      Backend::kCuda, DType::kFloat32),
              cases[i].expected)
        << "case " << i;
  }
}

std::unique_ptr<Model> RoundedToBf16(const Model& model) {
  ModelWeights w = model.weights();
  auto round = [](std::vector<float>& v) {
    for (float& x : v) x = BFloat16ToFloat(FloatToBFloat16(x));
  };
  round(w.token_embedding);
  round(w.wcls);
  for (LayerWeights& l : w.layers) {
    for (auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) round(*m);
  }
  auto rounded = Model::FromWeights(model.config(), std::move(w), model.name() + "-bf16");
  EXPECT_TRUE(rounded.ok()) << rounded.status();
  return rounded.ok() ? std::move(*rounded) : nullptr;
}

// bf16 mode on stories260K's reference prompts. Rounding the weights to bf16
// changes the model itself: measured on an H100, the fp32 CPU backend on
// bf16-rounded weights leaves llama2.c's tokens after 54, 53 and 52 tokens
// on cases 0, 1 and 3, inside their decisive prefixes (128, 64, 65), whose
// margin is only 1e-3 logits, far below bf16's resolution. So "every decisive
// prefix matches" cannot hold for real bf16 weights; the reference of the
// bf16 path is the CPU backend (bitwise equal to llama2.c) on the rounded
// weights. Free-running, one flipped near-tie sends the two down different
// stories, so the check is teacher-forced: both see the CPU's tokens, and
// at every step whose CPU top-2 margin is at least kBf16DecisiveMargin logits
// (twice bf16 activations' measured logit error of about 0.34, see the next
// test) the GPU must pick the same token.
TEST(CudaRunnerTest, Bf16ModeAgreesWithTheCpuOnBf16WeightsWhereMarginsAreClear) {
  TANDEM_REQUIRE_STORIES();
  constexpr float kBf16DecisiveMargin = 0.7f;
  auto model = Model::Load(testing::StoriesPath());
  ASSERT_TRUE(model.ok());
  TANDEM_REQUIRE_CUDA(model->get());
  const std::unique_ptr<Model> rounded = RoundedToBf16(**model);
  ASSERT_NE(rounded, nullptr);
  const std::vector<testing::ReferenceCase> cases = testing::LoadCases();
  ASSERT_EQ(cases.size(), 5u);
  int32_t compared = 0, steps = 0, agree_all = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const testing::ReferenceCase& c = cases[i];
    const testing::GreedyRun want =
        testing::Greedy(*rounded, c.prompt, c.max_tokens, Backend::kCpu, DType::kFloat32);
    const testing::GreedyRun got =
        testing::Greedy(**model, c.prompt, 0, Backend::kCuda, DType::kBFloat16, &want.tokens);
    ASSERT_EQ(got.tokens.size(), want.tokens.size());
    size_t vs_llama2c = 0;
    while (vs_llama2c < want.tokens.size() && vs_llama2c < c.expected.size() &&
           want.tokens[vs_llama2c] == c.expected[vs_llama2c]) {
      ++vs_llama2c;
    }
    int32_t clear = 0, agree = 0;
    for (size_t t = 0; t < want.tokens.size(); ++t) {
      agree += got.tokens[t] == want.tokens[t];
      if (want.margins[t] < kBf16DecisiveMargin) continue;
      ++clear;
      EXPECT_EQ(got.tokens[t], want.tokens[t])
          << "case " << i << " step " << t << " (CPU margin " << want.margins[t] << ")";
    }
    std::cout << "case " << i << ": bf16-rounded weights follow llama2.c for " << vs_llama2c
                << " tokens (decisive prefix " << c.decisive_prefix_len << "); GPU bf16 agrees at "
                << agree << " of " << want.tokens.size() << " steps, " << clear
                << " with margin >= " << kBf16DecisiveMargin << "\n";
    compared += clear;
    steps += static_cast<int32_t>(want.tokens.size());
    agree_all += agree;
  }
  EXPECT_GE(compared, 30) << "too few clear-margin steps to say anything";
  EXPECT_GE(agree_all, steps * 9 / 10) << "bf16 disagrees at more than 10% of all steps";
}

// bf16 logits against the CPU backend run on the same bf16-rounded weights:
// what differs is the bf16 activations and KV cache, and the sums' order.
TEST(CudaRunnerTest, Bf16LogitsTrackTheCpuBackendOnRoundedWeights) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  const std::unique_ptr<Model> rounded = RoundedToBf16(*model);
  ASSERT_NE(rounded, nullptr);
  auto gpu = ModelRunner::Create(rounded.get(),
                                 {.block_size = 16, .num_blocks = 64, .dtype = DType::kBFloat16},
                                 Backend::kCuda);
  if (absl::IsUnavailable(gpu.status())) GTEST_SKIP() << gpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->block_bytes() * 2, KvBlockBytes(model->config(), 16));
  auto cpu = ModelRunner::Create(rounded.get(), {.block_size = 16, .num_blocks = 64});
  ASSERT_TRUE(cpu.ok());
  const int32_t vocab = model->config().vocab_size;
  const std::vector<int32_t> a = MakePrompt(300, 1, vocab), b = MakePrompt(40, 2, vocab);
  std::vector<int32_t> ta(20), tb = {40, 41, 42};
  for (int32_t i = 0; i < 20; ++i) ta[i] = i;
  const std::vector<SequenceInput> prefill = {{.token_ids = a, .start_pos = 0, .block_table = ta},
                                              {.token_ids = b, .start_pos = 0, .block_table = tb}};
  const std::vector<int32_t> da = {7}, db = {9};
  const std::vector<SequenceInput> decode = {
      {.token_ids = da, .start_pos = 300, .block_table = ta},
      {.token_ids = db, .start_pos = 40, .block_table = tb}};
  for (const auto* step : {&prefill, &decode}) {
    std::vector<float> want, got;
    ASSERT_TRUE((*cpu)->Forward(*step, &want).ok());
    ASSERT_TRUE((*gpu)->Forward(*step, &got).ok());
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < step->size(); ++s) {
      double max_abs = 0, max_err = 0;
      for (int32_t i = 0; i < vocab; ++i) {
        max_abs = std::max<double>(max_abs, std::fabs(want[s * vocab + i]));
        max_err = std::max<double>(max_err, std::fabs(got[s * vocab + i] - want[s * vocab + i]));
      }
      std::cout << "sequence " << s << ": max |logit| " << max_abs << ", max error " << max_err
                << "\n";
      EXPECT_LE(max_err, 0.05 * max_abs) << "sequence " << s;
    }
  }
}

// ForwardSample on the GPU (the argmax kernel for greedy rows, sampling.h's
// program for temperature rows and rows with banned ids, both on the device)
// picks exactly the tokens SampleToken picks from Forward's logits.
TEST(CudaRunnerTest, ForwardSampleEqualsForwardThenSampleToken) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    auto gpu = ModelRunner::Create(model.get(), {.block_size = 16, .num_blocks = 64, .dtype = dtype},
                                   Backend::kCuda);
    if (absl::IsUnavailable(gpu.status())) GTEST_SKIP() << gpu.status();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const int32_t vocab = model->config().vocab_size;
    std::vector<std::vector<int32_t>> prompts, tables;
    std::vector<SequenceInput> batch;
    std::vector<SamplingParams> params(6);
    std::vector<SampleRequest> sample;
    for (int32_t i = 0; i < 6; ++i) {
      prompts.push_back(MakePrompt(5 + 7 * i, 10 + i, vocab));
      tables.push_back({i * 4, i * 4 + 1, i * 4 + 2, i * 4 + 3});
      params[i].temperature = i % 2 == 0 ? 0.0f : 0.8f;
      params[i].top_k = i == 3 ? 5 : 0;
      params[i].seed = 100 + i;
    }
    // Penalized rows, greedy (0) and sampled (5), read their history.
    const std::vector<int32_t> output = {3, 9, 3};
    for (int32_t i : {0, 5}) {
      params[i].repetition_penalty = 1.3f;
      params[i].frequency_penalty = 0.5f;
    }
    for (int32_t i = 0; i < 6; ++i) {
      batch.push_back({.token_ids = prompts[i], .start_pos = 0, .block_table = tables[i]});
      sample.push_back({.params = i == 4 ? nullptr : &params[i], .output_position = i});
      if (params[i].HasPenalties()) {
        sample[i].prompt_token_ids = prompts[i];
        sample[i].output_token_ids = output;
      }
    }
    std::vector<float> logits;
    ASSERT_TRUE((*gpu)->Forward(batch, &logits).ok());
    // A greedy row that may not draw its argmax (min_tokens' banned EOS).
    const std::vector<int32_t> ban = {
        SampleToken(std::span<const float>(logits).subspan(2 * vocab, vocab), params[2], 2)};
    sample[2].banned_token_ids = ban;
    std::vector<int32_t> tokens;
    ASSERT_TRUE((*gpu)->ForwardSample(batch, sample, &tokens).ok());
    EXPECT_NE(tokens[2], ban[0]);
    ASSERT_EQ(tokens.size(), 6u);
    for (int32_t i = 0; i < 6; ++i) {
      if (sample[i].params == nullptr) {
        EXPECT_EQ(tokens[i], -1);
        continue;
      }
      std::vector<kernels::SamplePenalty> history;
      if (params[i].HasPenalties()) PenaltyHistory(prompts[i], output, &history);
      EXPECT_EQ(tokens[i], SampleToken(std::span<const float>(logits).subspan(i * vocab, vocab),
                                       params[i], i, sample[i].banned_token_ids, history))
          << DTypeName(dtype) << " sequence " << i;
    }
  }
}

// ModelRunnerOptions::async_launch: LaunchSample returns once the step is
// enqueued, on_done runs once it is done, and FinishSample gives exactly
// ForwardSample's tokens (greedy, drawn, penalized and not sampled rows; a
// prefill and then decodes, replayed from graphs in bf16). A second launch
// comes only after the first is finished, as the worker does it.
TEST(CudaRunnerTest, AsyncLaunchGivesForwardSamplesTokens) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const KvCacheOptions cache = {.block_size = 16, .num_blocks = 64, .dtype = dtype};
    auto eager = ModelRunner::Create(model.get(), cache, Backend::kCuda);
    if (absl::IsUnavailable(eager.status())) GTEST_SKIP() << eager.status();
    ASSERT_TRUE(eager.ok()) << eager.status();
    auto async = ModelRunner::Create(model.get(), cache, Backend::kCuda,
                                     ModelRunnerOptions{.async_launch = true});
    ASSERT_TRUE(async.ok()) << async.status();
    const int32_t vocab = model->config().vocab_size;
    std::vector<std::vector<int32_t>> seqs, tables;
    std::vector<SamplingParams> params(5);
    for (int32_t i = 0; i < 5; ++i) {
      seqs.push_back(MakePrompt(3 + 5 * i, 8 + i, vocab));
      tables.push_back({i * 4, i * 4 + 1, i * 4 + 2, i * 4 + 3});
      params[i].temperature = i % 2 == 0 ? 0.0f : 0.8f;
      params[i].seed = 7 + i;
    }
    params[1].repetition_penalty = 1.3f;
    for (int step = 0; step < 4; ++step) {
      std::vector<SequenceInput> batch;
      std::vector<SampleRequest> sample;
      const std::vector<int32_t> no_output;
      for (int32_t i = 0; i < 5; ++i) {
        const int32_t start = step == 0 ? 0 : static_cast<int32_t>(seqs[i].size()) - 1;
        batch.push_back({.token_ids = std::span<const int32_t>(seqs[i]).subspan(start),
                         .start_pos = start,
                         .block_table = tables[i]});
        sample.push_back(
            {.params = i == 3 && step == 0 ? nullptr : &params[i], .output_position = step});
        if (params[i].HasPenalties()) {
          sample[i].prompt_token_ids = seqs[i];
          sample[i].output_token_ids = no_output;
        }
      }
      std::vector<int32_t> want, got;
      std::vector<SampleLogprobs> logprobs;
      ASSERT_TRUE((*eager)->ForwardSample(batch, sample, &want).ok());
      std::atomic<int> done{0};
      ASSERT_TRUE((*async)->LaunchSample(batch, sample, false, [&] { done.fetch_add(1); }).ok());
      for (int i = 0; i < 10'000 && done.load() == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_EQ(done.load(), 1) << DTypeName(dtype) << " step " << step;
      ASSERT_TRUE((*async)->FinishSample(&got, &logprobs).ok());
      EXPECT_EQ(got, want) << DTypeName(dtype) << " step " << step;
      for (int32_t i = 0; i < 5; ++i) {
        if (want[i] >= 0) seqs[i].push_back(want[i]);
      }
    }
    EXPECT_EQ((*async)->graph_replays(), (*eager)->graph_replays()) << DTypeName(dtype);
    EXPECT_EQ((*async)->device_time().steps, 4) << DTypeName(dtype);
  }
}

// Prompt logprobs' extra rows (all_logits) match the CPU backend within each
// mode's tolerance, and ForwardSample's logprobs, computed on the device,
// are ComputeLogprobs over the GPU's own logits, to the bit (the device and
// the host run kernels/logprobs.h's program). In bf16 both backends run the
// bf16-rounded weights (as Bf16LogitsTrackTheCpuBackendOnRoundedWeights) and
// the bound is 5% of the largest logit of the step: a row's error is
// absolute noise from the bf16 activations, and a row whose own logits are
// all small (0.52 at most in one row here) says nothing about it. A row
// taken from the wrong position is off by the logits' whole range.
TEST(CudaRunnerTest, AllLogitsRowsAndLogprobsMatchTheCpuBackend) {
  auto loaded = testing::LoadTestModel();
  ASSERT_NE(loaded, nullptr);
  const std::unique_ptr<Model> rounded = RoundedToBf16(*loaded);
  ASSERT_NE(rounded, nullptr);
  const int32_t vocab = loaded->config().vocab_size;
  const std::vector<int32_t> a = MakePrompt(30, 21, vocab), b = MakePrompt(12, 22, vocab);
  const std::vector<int32_t> ta = {0, 1}, tb = {2};
  const std::vector<SequenceInput> batch = {{.token_ids = a, .block_table = ta, .all_logits = true},
                                            {.token_ids = b, .block_table = tb}};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Model* model = dtype == DType::kFloat32 ? loaded.get() : rounded.get();
    auto gpu = ModelRunner::Create(model, {.block_size = 16, .num_blocks = 8, .dtype = dtype},
                                   Backend::kCuda);
    if (absl::IsUnavailable(gpu.status())) GTEST_SKIP() << gpu.status();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    auto cpu = ModelRunner::Create(model, {.block_size = 16, .num_blocks = 8});
    ASSERT_TRUE(cpu.ok());
    std::vector<float> want, got;
    ASSERT_TRUE((*cpu)->Forward(batch, &want).ok());
    ASSERT_TRUE((*gpu)->Forward(batch, &got).ok());
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(got.size(), static_cast<size_t>((2 + 29) * vocab));
    float step_max_abs = 0;
    for (float w : want) step_max_abs = std::max(step_max_abs, std::fabs(w));
    for (size_t row = 0; row < got.size() / vocab; ++row) {
      float max_err = 0, max_abs = 0;
      for (int32_t k = 0; k < vocab; ++k) {
        max_err = std::max(max_err, std::fabs(got[row * vocab + k] - want[row * vocab + k]));
        max_abs = std::max(max_abs, std::fabs(want[row * vocab + k]));
      }
      if (dtype == DType::kFloat32) {
        EXPECT_LE(max_err, 1e-3f + 1e-3f * max_abs) << "row " << row;
      } else {
        EXPECT_LE(max_err, 0.05f * step_max_abs) << "row " << row;
      }
    }
    const SamplingParams greedy{};
    const std::vector<SampleRequest> sample = {{.params = &greedy,
                                                .num_logprobs = 4,
                                                .prompt_targets = std::span(a).subspan(1),
                                                .num_prompt_logprobs = 3},
                                               {.params = &greedy, .num_logprobs = 0}};
    std::vector<int32_t> tokens;
    std::vector<SampleLogprobs> lp;
    ASSERT_TRUE((*gpu)->ForwardSample(batch, sample, &tokens, &lp).ok());
    ASSERT_EQ(lp.size(), 2u);
    auto row = [&](size_t i, int32_t j) {
      return std::span<const float>(got).subspan(
          static_cast<size_t>(LogitsRowOf(batch, i, j)) * vocab, vocab);
    };
    ASSERT_EQ(lp[0].sampled.size(), 1u);
    EXPECT_EQ(lp[0].sampled[0], ComputeLogprobs(row(0, 29), tokens[0], 4));
    EXPECT_EQ(lp[0].sampled[0].rank, 1);
    EXPECT_EQ(lp[1].sampled[0], ComputeLogprobs(row(1, 11), tokens[1], 0));
    ASSERT_EQ(lp[0].prompt.size(), 29u);
    for (int32_t j = 0; j < 29; ++j) {
      EXPECT_EQ(lp[0].prompt[j], ComputeLogprobs(row(0, j), a[j + 1], 3)) << "position " << j + 1;
    }
  }
}

// --gpu-memory-utilization (issue 33): with num_blocks 0 the runner sizes
// the cache from what the device has left after the weights, and every block
// it reports is usable: a sequence placed in the last one computes the same
// logits as in the first.
TEST(CudaRunnerTest, GpuMemoryUtilizationSizesTheCache) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto gpu = ModelRunner::Create(model.get(), {.block_size = 16, .num_blocks = 0, .dtype = dtype},
                                   Backend::kCuda, {.gpu_memory_utilization = 0.05});
    if (absl::IsUnavailable(gpu.status())) GTEST_SKIP() << gpu.status();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const int32_t n = (*gpu)->num_blocks();
    // 5% of any GPU this runs on is far more than the step reserve.
    EXPECT_GT(n, 1000);
    const std::vector<int32_t> prompt = MakePrompt(20, 5, model->config().vocab_size);
    std::vector<float> first, last;
    const std::vector<int32_t> t_first = {0, 1}, t_last = {n - 2, n - 1};
    const SequenceInput a{.token_ids = prompt, .block_table = t_first};
    const SequenceInput b{.token_ids = prompt, .block_table = t_last};
    ASSERT_TRUE((*gpu)->Forward({&a, 1}, &first).ok());
    ASSERT_TRUE((*gpu)->Forward({&b, 1}, &last).ok());
    EXPECT_EQ(first, last);
  }
  // A share the device cannot give is refused with vLLM's wording.
  auto none = ModelRunner::Create(model.get(), {.block_size = 16, .num_blocks = 0}, Backend::kCuda,
                                  {.gpu_memory_utilization = 1.0});
  if (!absl::IsUnavailable(none.status())) {
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.status().message().find("on startup is less than desired GPU memory"),
              std::string::npos)
        << none.status();
  }
}

TEST(CudaRunnerTest, Bf16BlocksRoundTripThroughHostMemory) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  auto gpu = ModelRunner::Create(model.get(),
                                 {.block_size = 16, .num_blocks = 8, .dtype = DType::kBFloat16},
                                 Backend::kCuda);
  if (absl::IsUnavailable(gpu.status())) GTEST_SKIP() << gpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<int32_t> prompt = MakePrompt(20, 3, model->config().vocab_size);
  const std::vector<int32_t> table = {3, 5};
  const SequenceInput in{.token_ids = prompt, .start_pos = 0, .block_table = table};
  std::vector<float> logits;
  ASSERT_TRUE((*gpu)->Forward({&in, 1}, &logits).ok());
  std::vector<std::byte> host(static_cast<size_t>((*gpu)->block_bytes())), back(host.size());
  ASSERT_TRUE((*gpu)->CopyBlockToHost(3, host).ok());
  EXPECT_NE(host, std::vector<std::byte>(host.size()));  // the prefill wrote it
  ASSERT_TRUE((*gpu)->CopyBlockFromHost(6, host).ok());
  ASSERT_TRUE((*gpu)->CopyBlockToHost(6, back).ok());
  EXPECT_EQ(back, host);
  std::vector<std::byte> wrong_size(host.size() * 2);
  EXPECT_FALSE((*gpu)->CopyBlockToHost(3, wrong_size).ok());
}

// Block copies to host beside the steps (CopyBlocksToHostAsync, the
// KV-store's stores, issue 32), in both modes: they give the bytes a
// synchronous copy gives, and a step that rewrites the blocks right after
// the copies began (the scheduler freed and reused them) leaves the copies
// with the bytes from before it, because its kernels wait for the copies on
// the device. Pinned memory, as the connector's store staging: a copy into
// pageable memory would end before the call returns and test nothing.
TEST(CudaRunnerTest, AsyncBlockCopiesReadTheBlocksBeforeALaterStepRewritesThem) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  TANDEM_REQUIRE_CUDA(model.get());
  const int32_t vocab = model->config().vocab_size;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(dtype == DType::kFloat32 ? "float32" : "bfloat16");
    auto gpu = ModelRunner::Create(
        model.get(), {.block_size = 16, .num_blocks = 32, .dtype = dtype}, Backend::kCuda);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const std::vector<int32_t> table = {10, 11, 12, 13};
    const std::vector<int32_t> a = MakePrompt(64, 1, vocab), b = MakePrompt(64, 2, vocab);
    std::vector<float> logits;
    const SequenceInput in_a{.token_ids = a, .start_pos = 0, .block_table = table};
    ASSERT_TRUE((*gpu)->Forward({&in_a, 1}, &logits).ok());
    const size_t bb = static_cast<size_t>((*gpu)->block_bytes());
    std::vector<std::byte> want(bb * table.size());
    for (size_t i = 0; i < table.size(); ++i) {
      ASSERT_TRUE((*gpu)->CopyBlockToHost(table[i], std::span(want).subspan(i * bb, bb)).ok());
    }
    auto pinned = PinnedBuffer::Allocate(want.size(), {.what = "test"});
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    std::vector<std::span<std::byte>> out;
    for (size_t i = 0; i < table.size(); ++i) out.emplace_back(pinned->data() + i * bb, bb);
    auto wait = (*gpu)->CopyBlocksToHostAsync(table, out);
    ASSERT_TRUE(wait.ok()) << wait.status();
    const SequenceInput in_b{.token_ids = b, .start_pos = 0, .block_table = table};
    ASSERT_TRUE((*gpu)->Forward({&in_b, 1}, &logits).ok());
    ASSERT_TRUE((*wait)().ok());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), pinned->data()));
    // The second step did rewrite them.
    std::vector<std::byte> now(bb);
    ASSERT_TRUE((*gpu)->CopyBlockToHost(table[0], now).ok());
    EXPECT_FALSE(std::equal(now.begin(), now.end(), want.begin()));
    // A load into a block whose copy out may still run waits for it too.
    auto again = (*gpu)->CopyBlocksToHostAsync(table, out);
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_TRUE((*gpu)->CopyBlockFromHost(table[0], std::span(want).first(bb)).ok());
    ASSERT_TRUE((*again)().ok());
    EXPECT_TRUE(std::equal(now.begin(), now.end(), pinned->data()));
    // So does a batch of loads (queued on the step stream, one wait), and
    // it writes every block: from pinned memory, as the connector's staging.
    auto third = (*gpu)->CopyBlocksToHostAsync(table, out);
    ASSERT_TRUE(third.ok()) << third.status();
    auto from = PinnedBuffer::Allocate(want.size(), {.what = "test"});
    ASSERT_TRUE(from.ok()) << from.status();
    std::memcpy(from->data(), want.data(), want.size());
    const std::vector<int32_t> reversed(table.rbegin(), table.rend());
    std::vector<std::span<const std::byte>> in;
    for (size_t i = 0; i < table.size(); ++i) in.emplace_back(from->data() + i * bb, bb);
    ASSERT_TRUE((*gpu)->CopyBlocksFromHost(reversed, in).ok());
    ASSERT_TRUE((*third)().ok());
    EXPECT_TRUE(std::equal(want.begin(), want.begin() + bb, pinned->data()));
    for (size_t i = 0; i < table.size(); ++i) {
      ASSERT_TRUE((*gpu)->CopyBlockToHost(reversed[i], now).ok());
      EXPECT_TRUE(std::equal(now.begin(), now.end(), want.begin() + i * bb)) << i;
    }
  }
}

// Copies into the cache beside the steps (CopyBlocksFromHostAsync, the
// KV-store's loads), in both modes: once done() the blocks hold the bytes; a
// step run right after the copies began (before done(), which the worker
// never does) reads the loaded blocks, not what was there, because the
// runner orders it after them; a copy out of a block still being loaded
// gives the loaded bytes; and a bad id copies nothing. Pinned memory, as the
// connector's load staging.
TEST(CudaRunnerTest, AsyncCopiesIntoTheCacheEndWithTheBlocksWritten) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  TANDEM_REQUIRE_CUDA(model.get());
  const int32_t vocab = model->config().vocab_size;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(dtype == DType::kFloat32 ? "float32" : "bfloat16");
    // Two runners: `src` computes a prompt's KV into blocks 10..13, `gpu`
    // gets those blocks by copies in and must give src's logits for the
    // next token.
    auto src = ModelRunner::Create(
        model.get(), {.block_size = 16, .num_blocks = 32, .dtype = dtype}, Backend::kCuda);
    auto gpu = ModelRunner::Create(
        model.get(), {.block_size = 16, .num_blocks = 32, .dtype = dtype}, Backend::kCuda);
    ASSERT_TRUE(src.ok() && gpu.ok());
    const std::vector<int32_t> table = {10, 11, 12, 13};
    const std::vector<int32_t> prompt = MakePrompt(64, 5, vocab), next = {7};
    std::vector<float> logits, want;
    const SequenceInput in_prompt{.token_ids = prompt, .start_pos = 0, .block_table = table};
    ASSERT_TRUE((*src)->Forward({&in_prompt, 1}, &logits).ok());
    const size_t bb = static_cast<size_t>((*src)->block_bytes());
    auto pinned = PinnedBuffer::Allocate(bb * table.size(), {.what = "test"});
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    std::vector<std::span<const std::byte>> in;
    for (size_t i = 0; i < table.size(); ++i) {
      ASSERT_TRUE((*src)->CopyBlockToHost(table[i], {pinned->data() + i * bb, bb}).ok());
      in.emplace_back(pinned->data() + i * bb, bb);
    }
    // Position 64 reads the 4 loaded blocks and writes block 14.
    const std::vector<int32_t> table5 = {10, 11, 12, 13, 14};
    const SequenceInput in_next{.token_ids = next, .start_pos = 64, .block_table = table5};
    ASSERT_TRUE((*src)->Forward({&in_next, 1}, &want).ok());

    auto copy = (*gpu)->CopyBlocksFromHostAsync(table, in);
    ASSERT_TRUE(copy.ok()) << copy.status();
    ASSERT_TRUE((*gpu)->Forward({&in_next, 1}, &logits).ok());  // before done(): ordered after
    EXPECT_EQ(logits, want) << "the step read the blocks before their copy";
    ASSERT_TRUE(copy->wait().ok());
    EXPECT_TRUE(copy->done());
    std::vector<std::byte> back(bb);
    for (size_t i = 0; i < table.size(); ++i) {
      ASSERT_TRUE((*gpu)->CopyBlockToHost(table[i], back).ok());
      EXPECT_TRUE(std::equal(back.begin(), back.end(), in[i].begin())) << i;
    }
    // A copy out right behind a copy in of the same blocks: the loaded bytes.
    std::vector<std::byte> other(bb * table.size(), std::byte{0x5a});
    std::memcpy(pinned->data(), other.data(), other.size());
    auto again = (*gpu)->CopyBlocksFromHostAsync(table, in);
    ASSERT_TRUE(again.ok()) << again.status();
    auto out_buf = PinnedBuffer::Allocate(bb * table.size(), {.what = "test"});
    ASSERT_TRUE(out_buf.ok());
    std::vector<std::span<std::byte>> out;
    for (size_t i = 0; i < table.size(); ++i) out.emplace_back(out_buf->data() + i * bb, bb);
    auto out_wait = (*gpu)->CopyBlocksToHostAsync(table, out);
    ASSERT_TRUE(out_wait.ok()) << out_wait.status();
    ASSERT_TRUE((*out_wait)().ok());
    EXPECT_TRUE(std::equal(other.begin(), other.end(), out_buf->data()));
    ASSERT_TRUE(again->wait().ok());
    // A bad id: nothing begins.
    const std::vector<int32_t> bad = {10, 99};
    EXPECT_EQ((*gpu)->CopyBlocksFromHostAsync(bad, std::span(in).first(2)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Decode steps through CUDA graphs (decode_graphs.h) against the same steps
// run eagerly, teacher-forced with the eager runner's tokens. Contexts from
// 3 to about 460 tokens cross attention-split buckets as they grow (1, 2, 4
// splits: a recapture each), and every batch size below is a bucket or pads
// to one. At a bucket's own size the graph's tokens are the eager tokens,
// every step; padded, only cuBLAS may pick another GEMM for the bigger batch,
// so there the tokens must agree wherever the eager top-2 margin is above
// bf16's noise.
void ExpectGraphsReplayEagerSteps(const Model* model, std::initializer_list<int32_t> batches) {
  const int32_t vocab = model->config().vocab_size, bs = 16;
  for (int32_t batch : batches) {
    SCOPED_TRACE(model->name() + " batch " + std::to_string(batch));
    const bool bucket = batch == 1 || batch == 2 || batch == 8 || batch == 24;
    const int32_t steps = 40, per_seq = (470 + steps) / bs + 1;
    const KvCacheOptions kv{.block_size = bs, .num_blocks = batch * per_seq,
                            .dtype = DType::kBFloat16};
    auto eager = ModelRunner::Create(model, kv, Backend::kCuda,
                                     ModelRunnerOptions{.cuda_graphs = false});
    auto graph = ModelRunner::Create(model, kv, Backend::kCuda, ModelRunnerOptions{});
    ASSERT_TRUE(eager.ok()) << eager.status();
    ASSERT_TRUE(graph.ok()) << graph.status();
    std::vector<std::vector<int32_t>> prompts, tables(batch);
    std::vector<SequenceInput> prefill;
    for (int32_t i = 0; i < batch; ++i) {
      prompts.push_back(MakePrompt(3 + (i * 97) % 420, 31 + i, vocab));
      for (int32_t j = 0; j < per_seq; ++j) tables[i].push_back(i * per_seq + j);
      prefill.push_back({.token_ids = prompts[i], .start_pos = 0, .block_table = tables[i]});
    }
    SamplingParams greedy;
    const std::vector<SampleRequest> sample(batch, SampleRequest{.params = &greedy});
    std::vector<int32_t> want, got;
    ASSERT_TRUE((*eager)->ForwardSample(prefill, sample, &want).ok());
    ASSERT_TRUE((*graph)->ForwardSample(prefill, sample, &got).ok());
    EXPECT_EQ(got, want) << "prefill (eager in both)";
    std::vector<std::vector<int32_t>> fed(batch);
    int32_t compared = 0;
    for (int32_t step = 0; step < steps; ++step) {
      std::vector<SequenceInput> decode;
      for (int32_t i = 0; i < batch; ++i) {
        fed[i] = {want[i]};
        decode.push_back({.token_ids = fed[i],
                          .start_pos = static_cast<int32_t>(prompts[i].size()) + step,
                          .block_table = tables[i]});
      }
      std::vector<float> logits;
      ASSERT_TRUE((*eager)->Forward(decode, &logits).ok());  // rewrites the same KV
      ASSERT_TRUE((*eager)->ForwardSample(decode, sample, &want).ok());
      ASSERT_TRUE((*graph)->ForwardSample(decode, sample, &got).ok());
      for (int32_t i = 0; i < batch; ++i) {
        std::vector<float> row(logits.begin() + int64_t{i} * vocab,
                               logits.begin() + int64_t{i + 1} * vocab);
        std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
        if (!bucket && row[0] - row[1] < 0.05f) continue;
        ++compared;
        EXPECT_EQ(got[i], want[i]) << "step " << step << " sequence " << i;
      }
    }
    EXPECT_GT(compared, steps * batch / 2);
    EXPECT_EQ((*graph)->graph_replays(), steps);
    EXPECT_EQ((*eager)->graph_replays(), 0);
  }
}

TEST(CudaRunnerTest, DecodeGraphsReplayTheEagerSteps) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  TANDEM_REQUIRE_CUDA(model.get());
  ExpectGraphsReplayEagerSteps(model.get(), {1, 2, 8, 24, 5, 13});
}

// The ops only some families run inside a captured step: Qwen2's q/k/v
// biases, Qwen3's q/k norms, Gemma's embedding scale (a step that touched
// the legacy stream would fail its capture and count no replay).
TEST(CudaRunnerTest, DecodeGraphsCaptureEveryFamilysOps) {
  for (const char* name : {"qwen2.5", "qwen3", "gemma"}) {
    const std::string dir = testing::SharedDir() + "/models/hf/" + name;
    if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is missing";
    auto model = Model::Load(dir);
    ASSERT_TRUE(model.ok()) << model.status();
    TANDEM_REQUIRE_CUDA(model->get());
    ExpectGraphsReplayEagerSteps(model->get(), {3, 8});
  }
}

}  // namespace
}  // namespace tandem::model
