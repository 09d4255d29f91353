// Hugging Face checkpoints: stories260K converted by WriteHfCheckpoint (wq/wk
// permuted for rotate-half RoPE) generates the same tokens as the .bin; F16
// and BF16 tensors load as the nearest values; sharded directories load.
#include <cmath>
#include <cstring>
#if !defined(__FLT16_MAX__)
#include <immintrin.h>
#endif

#include "gtest/gtest.h"
#include "test_util.h"

namespace tandem::model {
namespace {

// The compiler's own _Float16 conversion is the independent reference; clang
// 14 has no _Float16 on x86 (the sanitizer builds), so there the CPU's F16C
// conversion, round to nearest even too.
#if defined(__FLT16_MAX__)
float RoundTripF16(float f) { return static_cast<float>(static_cast<_Float16>(f)); }
#else
__attribute__((target("f16c"))) float RoundTripF16(float f) {
  return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
#endif

using testing::GenerateGreedy;
using testing::LoadTestModel;
using testing::MakePrompt;
using testing::TempDir;

TEST(HfTest, ConvertedStoriesGeneratesSameTokensAsBin) {
  TANDEM_REQUIRE_STORIES();
  auto bin = Model::Load(testing::StoriesPath());
  ASSERT_TRUE(bin.ok()) << bin.status();
  TempDir dir;
  ASSERT_TRUE(WriteHfCheckpoint((*bin)->config(), (*bin)->weights(), dir.path()).ok());
  auto hf = Model::Load(dir.path());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->config().rope_style, RopeStyle::kRotateHalf);
  EXPECT_EQ((*hf)->config().vocab_size, 512);
  EXPECT_TRUE((*hf)->weights().wcls.empty()) << "tied embeddings";
  EXPECT_NE((*hf)->fingerprint(), (*bin)->fingerprint());
  for (uint32_t salt = 0; salt < 4; ++salt) {
    const std::vector<int32_t> prompt = MakePrompt(1 + 10 * salt, salt, 512);
    EXPECT_EQ(GenerateGreedy(**hf, prompt, 60), GenerateGreedy(**bin, prompt, 60))
        << "prompt " << salt;
  }
}

TEST(HfTest, ShardedDirectoryWithUntiedClassifierLoadsTheSameWeights) {
  auto ckpt = MakeRandomCheckpoint(
      RandomModelOptions{.num_layers = 2, .shared_classifier = false, .seed = 3});
  ASSERT_TRUE(ckpt.ok());
  TempDir dir;
  ASSERT_TRUE(
      WriteHfCheckpoint(ckpt->config, ckpt->weights, dir.path(), HfWriteOptions{.num_shards = 3})
          .ok());
  auto hf = Model::Load(dir.path());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->weights().wcls, ckpt->weights.wcls);
  EXPECT_EQ((*hf)->weights().layers[1].w2, ckpt->weights.layers[1].w2);
  EXPECT_EQ((*hf)->weights().layers[1].wv, ckpt->weights.layers[1].wv);
  // wq is stored permuted: row 1 of head 0 (pair 0, second element) moves to
  // row head_size / 2.
  const int32_t hs = ckpt->config.head_size, dim = ckpt->config.dim;
  EXPECT_TRUE(std::equal(ckpt->weights.layers[0].wq.begin() + dim,
                         ckpt->weights.layers[0].wq.begin() + 2 * dim,
                         (*hf)->weights().layers[0].wq.begin() + (hs / 2) * dim));
  // And the rotate-half model computes the same greedy tokens.
  auto bin = Model::FromWeights(ckpt->config, ckpt->weights, "random");
  ASSERT_TRUE(bin.ok());
  const std::vector<int32_t> prompt = MakePrompt(9, 1, ckpt->config.vocab_size);
  EXPECT_EQ(GenerateGreedy(**hf, prompt, 20), GenerateGreedy(**bin, prompt, 20));
}

// The nearest bf16 to f: one of the two bf16 values around it (truncation or
// the next one up in magnitude), whichever is closer.
bool IsNearestBf16(float f, float got) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t lo_bits = bits & 0xFFFF0000u, hi_bits = lo_bits + 0x10000u;
  float lo, hi;
  std::memcpy(&lo, &lo_bits, 4);
  std::memcpy(&hi, &hi_bits, 4);
  const double dl = std::fabs(double{f} - lo), dh = std::fabs(double{f} - hi);
  return got == (dl <= dh ? lo : hi) || (dl == dh && (got == lo || got == hi));
}

TEST(HfTest, Fp16AndBf16TensorsLoadAsTheNearestValues) {
  auto ckpt = MakeRandomCheckpoint(RandomModelOptions{.num_layers = 1, .seed = 9});
  ASSERT_TRUE(ckpt.ok());
  for (TensorDtype dtype : {TensorDtype::kF16, TensorDtype::kBF16}) {
    TempDir dir;
    ASSERT_TRUE(WriteHfCheckpoint(ckpt->config, ckpt->weights, dir.path(), {.dtype = dtype}).ok());
    auto hf = Model::Load(dir.path());
    ASSERT_TRUE(hf.ok()) << hf.status();
    const std::vector<float>& want = ckpt->weights.layers[0].w1;
    const std::vector<float>& got = (*hf)->weights().layers[0].w1;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (dtype == TensorDtype::kF16) {
        ASSERT_EQ(got[i], RoundTripF16(want[i])) << i;
      } else {
        ASSERT_TRUE(IsNearestBf16(want[i], got[i])) << i << " " << want[i] << " " << got[i];
      }
    }
    // A reduced-precision model still runs and produces finite logits.
    auto runner = ModelRunner::Create(hf->get(), {.block_size = 16, .num_blocks = 4});
    ASSERT_TRUE(runner.ok());
    std::vector<int32_t> tokens = {1, 5, 9}, table = {0};
    SequenceInput in{.token_ids = tokens, .start_pos = 0, .block_table = table};
    std::vector<float> logits;
    ASSERT_TRUE((*runner)->Forward({&in, 1}, &logits).ok());
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(HfTest, HalfConversionsRoundTripSpecialValues) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(5.9604645e-08f)), 5.9604645e-08f);  // smallest subnormal
  EXPECT_EQ(HalfToFloat(FloatToHalf(-0.0f)), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(FloatToHalf(-0.0f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f)), 1.0f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
}

}  // namespace
}  // namespace tandem::model
