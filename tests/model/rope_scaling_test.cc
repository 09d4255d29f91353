// RoPE scaling (ModelConfig::RopeScaling) as transformers 5 computes it:
// the frequencies against transformers' own numerical snapshots (its
// tests/utils/test_modeling_rope_utils.py), the config keys of each type,
// longrope's context cap, and the attention factor through every backend.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "hf_fixture.h"
#include "tandem/model/checkpoint.h"

namespace tandem::model {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

// transformers' snapshots are printed to 5 significant digits: ours must
// round to them (half a unit of the fifth digit, and a hair for the print).
void ExpectSnapshot(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < want.size(); ++p) {
    const double unit = std::pow(10.0, std::floor(std::log10(want[p])) - 4);
    EXPECT_NEAR(got[p], want[p], 0.5 * unit * 1.001) << "pair " << p;
  }
}

// LlamaConfig()'s defaults, which both snapshots use: head_dim 4096 / 32,
// theta 1e4, max_position_embeddings 2048.
ModelConfig SnapshotConfig(RopeScaling scaling) {
  ModelConfig c;
  c.head_size = 128;
  c.rope_theta = 10000.0f;
  c.rope_scaling = std::move(scaling);
  return c;
}

// test_yarn_rope_numerically's "numerical snapshot": factor 10, beta_fast 32,
// beta_slow 1 (the pretraining context defaults to 2048).
TEST(RopeScalingTest, YarnMatchesTransformersSnapshot) {
  const std::vector<double> want = {
      1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01, 4.2170e-01,
      3.6517e-01, 3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01, 1.7783e-01, 1.5399e-01,
      1.3335e-01, 1.1548e-01, 1.0000e-01, 8.3479e-02, 6.9590e-02, 5.7925e-02, 4.8136e-02,
      3.9931e-02, 3.3061e-02, 2.7315e-02, 2.2515e-02, 1.8512e-02, 1.5177e-02, 1.2403e-02,
      1.0101e-02, 8.1924e-03, 6.6143e-03, 5.3120e-03, 4.2400e-03, 3.3599e-03, 2.6396e-03,
      2.0520e-03, 1.5746e-03, 1.1882e-03, 8.7713e-04, 6.2810e-04, 4.3007e-04, 2.7384e-04,
      2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04, 1.0000e-04,
      8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05, 4.2170e-05, 3.6517e-05,
      3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05, 1.7783e-05, 1.5399e-05, 1.3335e-05,
      1.1548e-05};
  ExpectSnapshot(SnapshotConfig({.type = RopeScaling::Type::kYarn,
                                 .factor = 10.0f,
                                 .original_max_position_embeddings = 2048})
                     .RopeInverseFrequencies(),
                 want);
}

// test_llama3_rope_numerically's snapshot: factor 10, original 2048, low 1,
// high 4.
TEST(RopeScalingTest, Llama3MatchesTransformersSnapshot) {
  const std::vector<double> want = {
      1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01, 4.2170e-01,
      3.6517e-01, 3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01, 1.7783e-01, 1.5399e-01,
      1.3335e-01, 1.1548e-01, 1.0000e-01, 8.6596e-02, 7.4989e-02, 6.4938e-02, 5.6234e-02,
      4.8697e-02, 4.2170e-02, 3.6517e-02, 3.1623e-02, 2.7384e-02, 2.3714e-02, 2.0535e-02,
      1.7783e-02, 1.5399e-02, 1.3335e-02, 1.0730e-02, 7.7785e-03, 5.6009e-03, 3.9991e-03,
      2.8248e-03, 1.9675e-03, 1.3449e-03, 8.9549e-04, 5.7363e-04, 3.4539e-04, 2.7384e-04,
      2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04, 1.0000e-04,
      8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05, 4.2170e-05, 3.6517e-05,
      3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05, 1.7783e-05, 1.5399e-05, 1.3335e-05,
      1.1548e-05};
  ExpectSnapshot(SnapshotConfig({.type = RopeScaling::Type::kLlama3,
                                 .factor = 10.0f,
                                 .low_freq_factor = 1.0f,
                                 .high_freq_factor = 4.0f,
                                 .original_max_position_embeddings = 2048})
                     .RopeInverseFrequencies(),
                 want);
}

TEST(RopeScalingTest, Llama3ScalingMatchesTransformersFrequencies) {
  // transformers' _compute_llama3_parameters for head_dim 32, theta 5e5,
  // factor 32, low 1, high 4, original 8192: pairs whose wavelength exceeds
  // 8192 are divided by 32, those under 2048 are kept, the rest blend.
  ModelConfig c;
  c.head_size = 32;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {.type = RopeScaling::Type::kLlama3,
                    .factor = 32.0f,
                    .low_freq_factor = 1.0f,
                    .high_freq_factor = 4.0f,
                    .original_max_position_embeddings = 8192};
  const std::vector<float> inv = c.RopeInverseFrequencies();
  ASSERT_EQ(inv.size(), 16u);
  for (int32_t p = 0; p < 16; ++p) {
    const double base = 1.0 / std::pow(500000.0, 2.0 * p / 32.0);
    const double wavelen = 2 * M_PI / base;
    double want = base;
    if (wavelen > 8192) {
      want = base / 32;
    } else if (wavelen >= 2048) {
      const double smooth = (8192 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * base / 32 + smooth * base;
    }
    EXPECT_NEAR(inv[p], want, 1e-6 * want) << "pair " << p;
  }
  c.rope_scaling = {.type = RopeScaling::Type::kLinear, .factor = 4.0f};
  c.rope_theta = 10000.0f;
  EXPECT_FLOAT_EQ(c.RopeInverseFrequencies()[1], 1.0f / std::pow(10000.0f, 2.0f / 32) / 4);
}

// A JSON list of n copies of x.
std::string Repeat(double x, int32_t n) {
  return absl::StrCat("[", absl::StrJoin(std::vector<double>(static_cast<size_t>(n), x), ", "),
                      "]");
}

absl::StatusOr<ModelConfig> LoadConfig(const EditedFixture& f) {
  auto m = Model::Load(f.path());
  if (!m.ok()) return m.status();
  return (*m)->config();
}

// Qwen's documented way to reach 128k: rope_scaling yarn, factor 4, over the
// 32,768 positions it was trained on.
TEST(RopeScalingTest, YarnReadsTransformersKeysAndVllmsContext) {
  TANDEM_REQUIRE_HF();
  const std::string yarn =
      R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})";
  EditedFixture f("qwen2.5", "\"use_cache\": true", absl::StrCat("\"use_cache\": true, ", yarn));
  auto c = LoadConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  const RopeScaling& rs = c->rope_scaling;
  EXPECT_EQ(rs.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(rs.factor, 4.0f);
  EXPECT_EQ(rs.original_max_position_embeddings, 32768);
  EXPECT_EQ(rs.beta_fast, 32.0);
  EXPECT_EQ(rs.beta_slow, 1.0);
  EXPECT_TRUE(rs.truncate);
  // get_mscale(4) = 0.1 ln 4 + 1, in double, then rounded once.
  EXPECT_EQ(rs.attention_factor, static_cast<float>(0.1 * std::log(4.0) + 1.0));
  // vLLM's context for yarn: the pretraining context times the factor.
  EXPECT_EQ(c->max_seq_len, 131072);

  // mscale / mscale_all_dim (DeepSeek's keys) divide two get_mscales; an
  // explicit attention_factor wins over both; beta 0 means the default.
  EditedFixture m("qwen2.5", "\"use_cache\": true",
                  R"("use_cache": true, "rope_scaling": {"rope_type": "yarn", "factor": 40, )"
                  R"("mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 0, "beta_slow": 2, )"
                  R"("truncate": false})");
  c = LoadConfig(m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.attention_factor,
            static_cast<float>((0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1)));
  EXPECT_EQ(c->rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c->rope_scaling.beta_slow, 2.0);
  EXPECT_FALSE(c->rope_scaling.truncate);
  EditedFixture e("qwen2.5", "\"use_cache\": true",
                  R"("use_cache": true, "rope_scaling": {"rope_type": "yarn", "factor": 2, )"
                  R"("attention_factor": 0.75, "mscale": 1.0, "mscale_all_dim": 1.0})");
  c = LoadConfig(e);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.attention_factor, 0.75f);

  // Keys of other types are refused by name; so is "dynamic".
  ExpectEditRefused("qwen2.5", "\"use_cache\": true",
                    R"("use_cache": true, "rope_scaling": {"rope_type": "yarn", "factor": 2, )"
                    R"("low_freq_factor": 1})",
                    absl::StatusCode::kUnimplemented, "low_freq_factor");
  ExpectEditRefused("llama-linear-sharded", "\"rope_type\": \"linear\"",
                    "\"rope_type\": \"dynamic\"", absl::StatusCode::kUnimplemented, "dynamic");
  ExpectEditRefused("llama3.2", "\"rope_type\": \"llama3\"",
                    "\"rope_type\": \"llama3\", \"beta_fast\": 32",
                    absl::StatusCode::kUnimplemented, "beta_fast");
  ExpectEditRefused("phi3", "\"rope_scaling\": null",
                    R"("rope_scaling": {"type": "yarn", "factor": 2})",
                    absl::StatusCode::kUnimplemented, "yarn");
}

// Phi-3.5-mini's layout: longrope with 131,072 positions over a pretraining
// context of 4,096 (top-level original_max_position_embeddings).
TEST(RopeScalingTest, LongRopeServesItsShortFactorsWithinTheOriginalContext) {
  TANDEM_REQUIRE_HF();
  const int32_t pairs = 16;  // head_dim 32
  std::vector<double> short_factor;
  for (int32_t p = 0; p < pairs; ++p) short_factor.push_back(1.0 + 0.25 * p);
  const std::string scaling = absl::StrCat(
      R"("rope_scaling": {"type": "longrope", "short_factor": [)", absl::StrJoin(short_factor, ", "),
      R"(], "long_factor": )", Repeat(8.0, pairs), "}");
  EditedFixture f("phi3", "\"rope_scaling\": null", scaling);
  EditConfig(f, {{"\"max_position_embeddings\": 4096", "\"max_position_embeddings\": 131072"}});
  auto m = Model::Load(f.path());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLongRope);
  EXPECT_EQ(c.max_seq_len, 4096) << "capped where the short factors hold";
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  // transformers: factor = 131072 / 4096, attention sqrt(1 + ln 32 / ln 4096).
  EXPECT_EQ(c.rope_scaling.attention_factor,
            static_cast<float>(std::sqrt(1 + std::log(32.0) / std::log(4096.0))));
  // The short factors divide the default frequencies (transformers' test's
  // "factor == 1.0 -> short factor is applied to the default frequencies").
  ModelConfig plain = c;
  plain.rope_scaling = {};
  const std::vector<float> base = plain.RopeInverseFrequencies();
  const std::vector<float> inv = c.RopeInverseFrequencies();
  ASSERT_EQ(inv.size(), static_cast<size_t>(pairs));
  for (int32_t p = 0; p < pairs; ++p) {
    EXPECT_NEAR(inv[p], base[p] / short_factor[p], 2e-7 * base[p]) << "pair " << p;
  }
  auto unscaled = Model::Load(FixtureDir("phi3"));
  ASSERT_TRUE(unscaled.ok());
  EXPECT_NE((*m)->fingerprint(), (*unscaled)->fingerprint());

  // The older "su" name of Phi-3-mini-128k's first configs is longrope.
  EditedFixture su("phi3", "\"rope_scaling\": null", scaling);
  EditConfig(su, {{"\"longrope\"", "\"su\""}});
  auto su_config = LoadConfig(su);
  ASSERT_TRUE(su_config.ok()) << su_config.status();
  EXPECT_EQ(su_config->rope_scaling.type, RopeScaling::Type::kLongRope);
  // Phi-3.5-MoE's short_mscale is not implemented; factors of the wrong
  // length are bad input.
  EditedFixture mscale("phi3", "\"rope_scaling\": null", scaling);
  EditConfig(mscale, {{"\"type\": \"longrope\"", "\"type\": \"longrope\", \"short_mscale\": 1.1"}});
  ExpectRefused(mscale, absl::StatusCode::kUnimplemented, "short_mscale");
  ExpectEditRefused(
      "phi3", "\"rope_scaling\": null",
      absl::StrCat(R"("rope_scaling": {"type": "longrope", "short_factor": )",
                   Repeat(1.0, pairs - 1), R"(, "long_factor": )", Repeat(1.0, pairs), "}"),
      absl::StatusCode::kInvalidArgument, "short_factor");
}

// ModelConfig::Validate's rules for the scaling a config may carry, whoever
// built it (the loader, or FromWeights' callers).
TEST(RopeScalingTest, ValidateRefusesScalingTheKernelsCannotApply) {
  if (!HaveStories()) GTEST_SKIP() << "no " << StoriesPath();
  auto ckpt = ReadLlama2cCheckpoint(StoriesPath());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelConfig base = ckpt->config;  // head_size 8
  ASSERT_TRUE(base.Validate().ok());
  auto expect_invalid = [&](const ModelConfig& c, const std::string& needle) {
    const absl::Status s = c.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  };
  ModelConfig c = base;
  c.rotary_dim = 3;
  expect_invalid(c, "rotary_dim 3 must be even");
  c.rotary_dim = base.head_size + 2;
  expect_invalid(c, "at most head_size");
  const RopeScaling yarn{.type = RopeScaling::Type::kYarn,
                         .factor = 2.0f,
                         .original_max_position_embeddings = 16,
                         .attention_factor = 1.1f};
  c = base;
  c.rope_scaling = yarn;
  EXPECT_TRUE(c.Validate().ok());
  c.rope_scaling.original_max_position_embeddings = 0;
  expect_invalid(c, "yarn and longrope need original_max_position_embeddings > 0");
  c.rope_scaling = yarn;
  c.rope_scaling.attention_factor = 0.0f;
  expect_invalid(c, "positive attention factor");
  c.rope_scaling = {.type = RopeScaling::Type::kLongRope,
                    .original_max_position_embeddings = 16,
                    .ext_factors = {1.0f, 2.0f, 3.0f}};  // head_size 8: 4 pairs
  expect_invalid(c, "longrope needs rotary_dim / 2 = 4 factors, got 3");
  c.rope_scaling.ext_factors = {1.0f, 2.0f, 0.0f, 3.0f};
  expect_invalid(c, "longrope factors must be positive");
  c.rope_scaling.ext_factors = {1.0f, 2.0f, 2.5f, 3.0f};
  EXPECT_TRUE(c.Validate().ok());
  c.rope_scaling = {.type = RopeScaling::Type::kLinear, .factor = 2.0f, .attention_factor = 1.5f};
  expect_invalid(c, "only yarn and longrope scale attention");
}

// The config reader's own rules: the pretraining context's precedence (a
// top-level original_max_position_embeddings wins), llama3 needing one,
// factors and partial factors in range.
TEST(RopeScalingTest, TheReaderTakesThePretrainingContextAndFactorsAsTransformers) {
  TANDEM_REQUIRE_HF();
  EditedFixture both("qwen2.5", "\"use_cache\": true",
                     R"("use_cache": true, "original_max_position_embeddings": 64, )"
                     R"("rope_scaling": {"rope_type": "yarn", "factor": 2.0, )"
                     R"("original_max_position_embeddings": 128})");
  auto c = LoadConfig(both);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 64);
  ExpectEditRefused("llama3.2", "    \"original_max_position_embeddings\": 8192,\n", "",
                    absl::StatusCode::kInvalidArgument, "original_max_position_embeddings");
  ExpectEditRefused("phi3", "\"rope_scaling\": null",
                    absl::StrCat(R"("rope_scaling": {"type": "longrope", "short_factor": )",
                                 Repeat(0.0, 16), R"(, "long_factor": )", Repeat(1.0, 16), "}"),
                    absl::StatusCode::kInvalidArgument, "not a positive number");
  ExpectEditRefused("phi3", "\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 1.5",
                    absl::StatusCode::kInvalidArgument, "partial_rotary_factor 1.5");
}

// A --max-model-len past the original context takes vLLM's other choice: the
// long factors at every position and the whole context. Within it, the cap;
// past the model's context, a refusal naming both.
TEST(RopeScalingTest, MaxModelLenPastTheOriginalContextTakesTheLongFactors) {
  TANDEM_REQUIRE_HF();
  const std::string scaling =
      absl::StrCat(R"("rope_scaling": {"type": "longrope", "short_factor": )", Repeat(1.5, 16),
                   R"(, "long_factor": )", Repeat(6.0, 16), "}");
  EditedFixture f("phi3", "\"rope_scaling\": null", scaling);
  EditConfig(f, {{"\"max_position_embeddings\": 4096", "\"max_position_embeddings\": 131072"}});
  auto long_mode = Model::Load(f.path(), {.max_model_len = 8192});
  ASSERT_TRUE(long_mode.ok()) << long_mode.status();
  EXPECT_EQ((*long_mode)->config().rope_scaling.ext_factors, std::vector<float>(16, 6.0f));
  EXPECT_EQ((*long_mode)->config().max_seq_len, 131072);
  auto short_mode = Model::Load(f.path(), {.max_model_len = 4096});
  ASSERT_TRUE(short_mode.ok()) << short_mode.status();
  EXPECT_EQ((*short_mode)->config().rope_scaling.ext_factors, std::vector<float>(16, 1.5f));
  EXPECT_EQ((*short_mode)->config().max_seq_len, 4096);
  // The two rotate keys differently: stored blocks of one are not the other's.
  EXPECT_NE((*long_mode)->fingerprint(), (*short_mode)->fingerprint());
  EXPECT_EQ((*long_mode)->config().rope_scaling.attention_factor,
            (*short_mode)->config().rope_scaling.attention_factor);

  auto too_long = Model::Load(f.path(), {.max_model_len = 131073});
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find(
                "--max-model-len 131073 is outside the model's context [0, 131072]"),
            std::string::npos)
      << too_long.status();
  if (HaveStories()) {
    EXPECT_FALSE(Model::Load(StoriesPath(), {.max_model_len = 513}).ok());
    EXPECT_TRUE(Model::Load(StoriesPath(), {.max_model_len = 512}).ok());
  }
}

// Longrope with every short factor 4 rotates by linear scaling's angles to
// the bit (1 / (4 x) and (1 / x) / 4 round alike), so with an attention
// factor of 1 the linear fixture's transformers tokens must come out.
TEST(RopeScalingTest, UniformLongRopeFactorsGiveLinearScalingsTransformersTokens) {
  TANDEM_REQUIRE_HF();
  EditedFixture f("llama-linear-sharded", R"("rope_type": "linear",
    "factor": 4.0)",
                  absl::StrCat(R"("rope_type": "longrope", "attention_factor": 1.0, "short_factor": )",
                               Repeat(4.0, 16), R"(, "long_factor": )", Repeat(1.0, 16)));
  auto longrope = Model::Load(f.path());
  ASSERT_TRUE(longrope.ok()) << longrope.status();
  auto linear = Model::Load(FixtureDir("llama-linear-sharded"));
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ((*longrope)->config().RopeInverseFrequencies(),
            (*linear)->config().RopeInverseFrequencies());
  EXPECT_EQ((*longrope)->config().max_seq_len, 16384) << "no cap without a longer context";
  const std::vector<HfCase> cases = LoadHfCases("llama-linear-sharded");
  ASSERT_FALSE(cases.empty());
  const auto got = GreedyBatched(**longrope, cases, Backend::kCpu, DType::kFloat32);
  for (size_t i = 0; i < cases.size(); ++i) {
    ExpectDecisivePrefix(got[i], cases[i], absl::StrCat("case ", i));
  }
}

// transformers multiplies cos and sin by the attention factor, so q and k
// come out scaled by it. With a factor of 2 that is to the bit what weights
// wq and wk scaled by 2 give (powers of two commute with rounding), on every
// backend and mode; the factor ignored would give the unscaled logits.
TEST(RopeScalingTest, AnAttentionFactorScalesQueriesAndKeysLikeTheirWeights) {
  if (!HaveStories()) GTEST_SKIP() << "no " << StoriesPath();
  auto ckpt = ReadLlama2cCheckpoint(StoriesPath());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto make = [&](float attention_factor, float weight_scale) {
    ModelConfig c = ckpt->config;
    c.rope_scaling = {.type = RopeScaling::Type::kYarn,
                      .factor = 1.0f,
                      .original_max_position_embeddings = c.max_seq_len,
                      .attention_factor = attention_factor};
    ModelWeights w = ckpt->weights;
    for (LayerWeights& l : w.layers) {
      for (float& x : l.wq) x *= weight_scale;
      for (float& x : l.wk) x *= weight_scale;
    }
    auto m = Model::FromWeights(c, std::move(w), "stories260K");
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(*m);
  };
  const std::unique_ptr<Model> factor = make(2.0f, 1.0f);
  const std::unique_ptr<Model> weights = make(1.0f, 2.0f);
  const std::unique_ptr<Model> neither = make(1.0f, 1.0f);
  const std::vector<int32_t> tokens = MakePrompt(40, 5, factor->config().vocab_size);
  for (const auto& [backend, dtype] : RunnerModes(*factor)) {
    SCOPED_TRACE(ModeName(backend, dtype));
    const std::vector<float> got = LastLogits(*factor, tokens, 40, backend, dtype);
    ASSERT_FALSE(got.empty());
    EXPECT_TRUE(SameBits(got, LastLogits(*weights, tokens, 40, backend, dtype)));
    EXPECT_TRUE(SameBits(LastLogits(*factor, tokens, 7, backend, dtype),
                         LastLogits(*weights, tokens, 7, backend, dtype)))
        << "prefill chunks and their decode-like tails";
    EXPECT_FALSE(SameBits(got, LastLogits(*neither, tokens, 40, backend, dtype)));
  }
}

// Phi3's partial_rotary_factor (Phi-4-mini: 0.75): RoPE over the first
// int(head_dim * factor) elements, frequencies over that many. Prefills whole,
// in chunks and token by token read the same cache, so on the CPU they agree
// to the bit only if the elements RoPE leaves reach the cache too. On CUDA
// a chunk's attention and GEMMs take other kernels than a whole prefill's
// (tensor-core tiles against split-K rows), so the bits differ there by
// design (an H200 showed it); HfDerivedTest holds both CUDA modes to
// transformers' tokens on phi3-partial-longrope instead.
TEST(RopeScalingTest, PartialRotaryTurnsTheFirstElementsOfPhi3Heads) {
  TANDEM_REQUIRE_HF();
  EditedFixture f("phi3", "\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 0.75");
  auto m = Model::Load(f.path());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.rotary_dim, 24);  // head_dim 32
  const std::vector<float> inv = c.RopeInverseFrequencies();
  ASSERT_EQ(inv.size(), 12u);
  for (int32_t p = 0; p < 12; ++p) {
    EXPECT_EQ(inv[p], 1.0f / powf(10000.0f, static_cast<float>(2 * p) / 24.0f)) << p;
  }
  auto whole = Model::Load(FixtureDir("phi3"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*whole)->config().rotary_dim, 0);
  EXPECT_NE((*m)->fingerprint(), (*whole)->fingerprint());
  const std::vector<int32_t> tokens = MakePrompt(37, 11, c.vocab_size);
  for (const auto& [backend, dtype] : RunnerModes(**m)) {
    SCOPED_TRACE(ModeName(backend, dtype));
    const std::vector<float> base = LastLogits(**m, tokens, 37, backend, dtype);
    ASSERT_FALSE(base.empty());
    if (backend == Backend::kCpu) {
      EXPECT_TRUE(SameBits(LastLogits(**m, tokens, 7, backend, dtype), base)) << "chunks of 7";
      EXPECT_TRUE(SameBits(LastLogits(**m, tokens, 1, backend, dtype), base)) << "token by token";
    }
    EXPECT_FALSE(SameBits(LastLogits(**whole, tokens, 37, backend, dtype), base));
  }
}

// Phi-4-mini-instruct's layout: partial 0.75, longrope with one factor per
// rotated pair, 131,072 positions over 4,096, and keys of its remote code
// that transformers' Phi3 never reads.
TEST(RopeScalingTest, Phi4MinisLayoutLoadsAndItsUnreadKeysAreHeldToTheirValues) {
  TANDEM_REQUIRE_HF();
  const std::string scaling =
      absl::StrCat(R"("rope_scaling": {"type": "longrope", "short_factor": )", Repeat(1.5, 12),
                   R"(, "long_factor": )", Repeat(9.0, 12), "}");
  const std::string phi4_keys =
      R"("use_cache": true, "full_attn_mod": 1, "interpolate_factor": 1, "lm_head_bias": false)";
  EditedFixture f("phi3", "\"rope_scaling\": null", scaling);
  EditConfig(f, {{"\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 0.75"},
                 {"\"max_position_embeddings\": 4096", "\"max_position_embeddings\": 131072"},
                 {"\"use_cache\": true", phi4_keys}});
  auto c = LoadConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rotary_dim, 24);
  EXPECT_EQ(c->rope_scaling.ext_factors.size(), 12u);
  EXPECT_EQ(c->max_seq_len, 4096);
  EXPECT_EQ(c->RopeInverseFrequencies().size(), 12u);

  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"\"full_attn_mod\": 1", "\"full_attn_mod\": 2"},
                                                        {"\"lm_head_bias\": false", "\"lm_head_bias\": true"}}) {
    EditedFixture g("phi3", "\"use_cache\": true", phi4_keys);
    EditConfig(g, {{from, to}});
    ExpectRefused(g, absl::StatusCode::kUnimplemented, from.substr(1, from.find('"', 1) - 1));
  }
  ExpectEditRefused("mistral", "\"use_cache\": true", "\"use_cache\": true, \"full_attn_mod\": 1",
                    absl::StatusCode::kUnimplemented, "full_attn_mod");
  // 12 factors are a head's worth of pairs only with the partial factor.
  ExpectEditRefused("phi3", "\"rope_scaling\": null", scaling, absl::StatusCode::kInvalidArgument,
                    "short_factor");
  // int(32 * 0.1) = 3 elements cannot be paired; two places disagreeing is ambiguous.
  ExpectEditRefused("phi3", "\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 0.1",
                    absl::StatusCode::kInvalidArgument, "gives 3 rotated elements");
  EditedFixture both("phi3", "\"rope_scaling\": null",
                     R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})");
  EditConfig(both, {{"\"rope_theta\": 10000.0,", ""}});
  ExpectRefused(both, absl::StatusCode::kInvalidArgument, "disagrees");
}

}  // namespace
}  // namespace tandem::model
