// Gemma3ForCausalLM's and Gemma2ForCausalLM's configs and weights as
// transformers 5 reads them, on tests/model/hf_generated/gemma3 and gemma2
// (small random checkpoints made by make_fixtures.py; transformers' tokens
// for them are HfDerivedTest's): the per-layer windows and RoPE bases, the
// folded query_pre_attn_scalar, Gemma 2's softcaps, both config layouts,
// and the keys refused by name.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hf_fixture.h"
#include "tandem/kernels/math.h"

namespace tandem::model {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

std::string GeneratedDir(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/model/hf_generated/" + name;
}
std::string Gemma3Dir() { return GeneratedDir("gemma3"); }
std::string Gemma2Dir() { return GeneratedDir("gemma2"); }

// Greedy tokens of `dir`'s model against its float64.reference.json (see
// TokensMatchAnIndependentFloat64Forward).
void ExpectFloat64Tokens(const std::string& dir) {
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<HfCase> cases = LoadHfCasesFrom(dir + "/float64.reference.json");
  ASSERT_EQ(cases.size(), 5u);
  const auto got = GreedyBatched(**m, cases, Backend::kCpu, DType::kFloat32);
  for (size_t i = 0; i < cases.size(); ++i) {
    ExpectDecisivePrefix(got[i], cases[i], dir + " case " + std::to_string(i));
  }
  if (CudaAvailable(**m)) ExpectCudaMatchesTransformers(**m, cases, dir + " (float64 reference)");
}

TEST(Gemma3Test, ConfigReadsAsTransformersDoes) {
  auto m = Model::Load(Gemma3Dir());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.family, ModelFamily::kGemma3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_EQ(c.embedding_scale, 8.0f);  // sqrt(hidden_size 64)
  // sliding_window_pattern 2: layers 0 and 2 local, 1 and 3 global.
  EXPECT_EQ(c.local_rope_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c.layer_window, (std::vector<int32_t>{6, 0, 6, 0}));
  EXPECT_EQ(c.local_rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c.query_pre_attn_scalar, 24.0f);
  // The local layers' frequencies are the default ones of their own base,
  // unscaled; the global ones are rope_theta's divided by the factor.
  const std::vector<float> local = c.RopeInverseFrequencies(/*local=*/true);
  const std::vector<float> global = c.RopeInverseFrequencies();
  ASSERT_EQ(local.size(), 16u);
  for (int32_t p = 0; p < 16; ++p) {
    const float e = static_cast<float>(2 * p) / 32.0f;
    EXPECT_EQ(local[p], 1.0f / powf(10000.0f, e)) << p;
    EXPECT_EQ(global[p], 1.0f / powf(1e6f, e) / 4.0f) << p;
  }
  EXPECT_EQ(c.RopeTheta(0), 10000.0f);
  EXPECT_EQ(c.RopeTheta(1), 1e6f);
}

// Beside transformers' tokens (HfDerivedTest's gemma3 and gemma2 entries,
// made on the 2026-11-30 H200 run), an independent float64 forward of ours
// (gemma3_float64.py, written from transformers' code) holds the CPU
// backend's greedy tokens, batched, and both CUDA modes' where a GPU is at
// hand. Dropping a sandwich norm or giving the local layers the global RoPE
// fails it.
// A bfloat16 run scales the embeddings by sqrt(hidden_size) rounded to
// bfloat16, as transformers and vLLM do in bfloat16; float32 keeps it.
TEST(GemmaTest, TheEmbeddingScaleIsRoundedToBfloat16InBfloat16) {
  TANDEM_REQUIRE_HF();
  auto gemma = Model::Load(FixtureDir("gemma"));  // hidden_size 128
  ASSERT_TRUE(gemma.ok()) << gemma.status();
  const ModelConfig& c = (*gemma)->config();
  EXPECT_EQ(c.EmbeddingScale(/*bf16=*/false), std::sqrt(128.0f));
  EXPECT_EQ(c.EmbeddingScale(/*bf16=*/true), 11.3125f);  // bf16's nearest to 11.3137
  ModelConfig big = c;
  big.embedding_scale = std::sqrt(1152.0f);  // gemma-3-1b
  EXPECT_EQ(big.EmbeddingScale(/*bf16=*/true), 34.0f);
  auto llama = Model::Load(FixtureDir("llama3.2"));
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ((*llama)->config().EmbeddingScale(/*bf16=*/true), 1.0f);
}

TEST(Gemma3Test, TokensMatchAnIndependentFloat64Forward) { ExpectFloat64Tokens(Gemma3Dir()); }

// The same for Gemma 2, whose softcaps (2 on the attention scores, 5 on the
// logits: small enough to change tokens) must be applied where transformers
// applies them.
TEST(Gemma2Test, TokensMatchAnIndependentFloat64Forward) { ExpectFloat64Tokens(Gemma2Dir()); }

TEST(Gemma2Test, ConfigReadsAsTransformersDoes) {
  auto m = Model::Load(Gemma2Dir());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.family, ModelFamily::kGemma2);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_TRUE(c.local_rope_layers.empty());                       // one RoPE for every layer
  EXPECT_EQ(c.layer_window, (std::vector<int32_t>{6, 0, 6, 0}));  // even layers slide
  EXPECT_EQ(c.attn_logit_softcap, 2.0f);
  EXPECT_EQ(c.final_logit_softcap, 5.0f);
  EXPECT_EQ(c.embedding_scale, 8.0f);
  // Absent softcaps take Gemma2Config's 50 and 30; null ones are none.
  EditedFixture absent(Gemma2Dir(), nlohmann::json::object());
  EditConfig(absent,
             {{"\"attn_logit_softcapping\": 2.0,", ""}, {"\"final_logit_softcapping\": 5.0,", ""}});
  auto d = Model::Load(absent.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->config().attn_logit_softcap, 50.0f);
  EXPECT_EQ((*d)->config().final_logit_softcap, 30.0f);
  EditedFixture none(Gemma2Dir(), nlohmann::json{{"attn_logit_softcapping", nullptr},
                                                 {"final_logit_softcapping", nullptr}});
  auto n = Model::Load(none.path());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ((*n)->config().attn_logit_softcap, 0.0f);
  EXPECT_EQ((*n)->config().final_logit_softcap, 0.0f);
  EXPECT_NE((*n)->fingerprint(), (*m)->fingerprint());
}

// The final softcap is monotonic, so greedy tokens cannot see it: every
// backend's logits are TanhSoftcap of the uncapped model's, to the bit on
// the CPU and within 2 ulps under CUDA, whose tanhf is not glibc's (the
// CUDA C++ Programming Guide bounds its error at 2 ulps; the H200 run of
// 2026-11-30 differed from the host's there).
TEST(Gemma2Test, FinalLogitsAreSoftcapped) {
  auto capped = Model::Load(Gemma2Dir());
  ASSERT_TRUE(capped.ok()) << capped.status();
  EditedFixture uncapped_dir(Gemma2Dir(), nlohmann::json{{"final_logit_softcapping", nullptr}});
  auto uncapped = Model::Load(uncapped_dir.path());
  ASSERT_TRUE(uncapped.ok()) << uncapped.status();
  const std::vector<int32_t> tokens = MakePrompt(20, 7, (*capped)->config().vocab_size);
  for (const auto& [backend, dtype] : RunnerModes(**capped)) {
    SCOPED_TRACE(ModeName(backend, dtype));
    const std::vector<float> got = LastLogits(**capped, tokens, 20, backend, dtype);
    std::vector<float> want = LastLogits(**uncapped, tokens, 20, backend, dtype);
    ASSERT_EQ(got.size(), want.size());
    float widest = 0;
    for (float& x : want) {
      widest = std::max(widest, std::abs(x));
      x = kernels::TanhSoftcap(x, 5.0f);
    }
    EXPECT_GT(widest, 5.0f) << "the cap changes nothing on these logits";
    if (backend == Backend::kCpu) {
      EXPECT_TRUE(SameBits(got, want));
      continue;
    }
    float worst = 0;  // in ulps of the host's value
    for (size_t i = 0; i < got.size(); ++i) {
      const float ulp = std::nextafter(std::abs(want[i]), INFINITY) - std::abs(want[i]);
      worst = std::max(worst, std::abs(got[i] - want[i]) / ulp);
    }
    EXPECT_LE(worst, 2.0f) << "ulps";
  }
}

// Gemma 2 27B's query_pre_attn_scalar (144 against head_dim 128; the
// fixture's 24 against 32) rides on q_proj's weights, as Gemma 3's on its q
// norm: the fixture's tokens above hold it to the float64 forward, which
// scales the logits instead.
TEST(Gemma2Test, QueryPreAttnScalarIsFoldedIntoQProj) {
  auto m = Model::Load(Gemma2Dir());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().query_pre_attn_scalar, 24.0f);
  EditedFixture plain(Gemma2Dir(), nlohmann::json{{"query_pre_attn_scalar", 32}});
  auto same = Model::Load(plain.path());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->config().query_pre_attn_scalar, 0.0f);  // head_dim: nothing to fold
  const std::vector<float>& scaled = (*m)->weights().layers[1].wq;
  const std::vector<float>& unscaled = (*same)->weights().layers[1].wq;
  ASSERT_EQ(scaled.size(), 128u * 64u);
  const float factor = static_cast<float>(std::sqrt(32.0 / 24.0));
  for (size_t i = 0; i < scaled.size(); ++i) ASSERT_EQ(scaled[i], unscaled[i] * factor) << i;
  EXPECT_EQ((*m)->weights().layers[1].wk, (*same)->weights().layers[1].wk);
  EditedFixture zero(Gemma2Dir(), nlohmann::json{{"query_pre_attn_scalar", 0}});
  ExpectRefused(zero, absl::StatusCode::kInvalidArgument, "query_pre_attn_scalar");
}

TEST(Gemma2Test, WhatItCannotHonourIsRefusedByName) {
  for (const char* key :
       {"rope_local_base_freq", "sliding_window_pattern", "use_bidirectional_attention"}) {
    EditedFixture f(Gemma2Dir(), nlohmann::json{{key, 2}});
    ExpectRefused(f, absl::StatusCode::kUnimplemented, key);
  }
  EditedFixture negative(Gemma2Dir(), nlohmann::json{{"attn_logit_softcapping", -1.0}});
  ExpectRefused(negative, absl::StatusCode::kInvalidArgument, "attn_logit_softcapping");
}

// Logits scaled by query_pre_attn_scalar^-1/2 are the kernels' head_size^-1/2
// with q scaled by sqrt(head_size / scalar), which rides on the q norm's
// (1 + w); k's norm is (1 + w) alone.
TEST(Gemma3Test, QueryPreAttnScalarIsFoldedIntoTheQNorm) {
  auto m = Model::Load(Gemma3Dir());
  ASSERT_TRUE(m.ok()) << m.status();
  EditedFixture plain(Gemma3Dir(), "\"query_pre_attn_scalar\": 24",
                      "\"query_pre_attn_scalar\": 32");
  auto same = Model::Load(plain.path());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->config().query_pre_attn_scalar, 0.0f);  // head_dim: nothing to fold
  EXPECT_NE((*m)->fingerprint(), (*same)->fingerprint());
  const std::vector<float>& scaled = (*m)->weights().layers[1].q_norm;
  const std::vector<float>& unscaled = (*same)->weights().layers[1].q_norm;
  ASSERT_EQ(scaled.size(), 32u);
  const float factor = static_cast<float>(std::sqrt(32.0 / 24.0));
  for (size_t i = 0; i < scaled.size(); ++i) EXPECT_EQ(scaled[i], unscaled[i] * factor) << i;
  EXPECT_EQ((*m)->weights().layers[1].k_norm, (*same)->weights().layers[1].k_norm);
  // The norms are (1 + w): Gemma3RMSNorm's weights start at zero.
  const std::vector<float>& post = (*same)->weights().layers[0].post_att_norm;
  ASSERT_EQ(post.size(), 64u);
  float mean = 0;
  for (float x : post) mean += x / 64.0f;
  EXPECT_NEAR(mean, 1.0f, 0.1f);
}

// transformers 5 saves rope_parameters keyed by layer type; both layouts are
// the same model, to the fingerprint.
TEST(Gemma3Test, TransformersFiveRopeParametersReadTheSame) {
  auto legacy = Model::Load(Gemma3Dir());
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EditedFixture f(
      Gemma3Dir(),
      nlohmann::json{
          {"rope_theta", nullptr},
          {"rope_local_base_freq", nullptr},
          {"rope_scaling", nullptr},
          {"rope_parameters",
           {{"full_attention", {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e6}}},
            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}});
  auto v5 = Model::Load(f.path());
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_EQ((*v5)->fingerprint(), (*legacy)->fingerprint());
  // Explicit layer_types win over the pattern.
  EditedFixture typed(Gemma3Dir(), nlohmann::json{{"layer_types",
                                                   {"full_attention", "sliding_attention",
                                                    "sliding_attention", "full_attention"}}});
  auto t = Model::Load(typed.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->config().local_rope_layers, (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ((*t)->config().layer_window, (std::vector<int32_t>{0, 6, 6, 0}));
  // gemma-3-270m's config saves the pattern as "_sliding_window_pattern".
  EditedFixture saved(Gemma3Dir(), nlohmann::json{{"sliding_window_pattern", nullptr},
                                                  {"_sliding_window_pattern", 4}});
  auto s = Model::Load(saved.path());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->config().local_rope_layers, (std::vector<bool>{true, true, true, false}));
  // Both spellings must agree.
  EditedFixture both(Gemma3Dir(), nlohmann::json{{"_sliding_window_pattern", 4}});
  ExpectRefused(both, absl::StatusCode::kInvalidArgument, "disagree");
}

// --disable-sliding-window caps the context at the window and serves every
// layer whole, but the local layers keep their own RoPE.
TEST(Gemma3Test, DisablingTheWindowKeepsTheLocalRope) {
  auto m = Model::Load(Gemma3Dir(), {.disable_sliding_window = true});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->config().layer_window.empty());
  EXPECT_EQ((*m)->config().max_seq_len, 6);
  EXPECT_EQ((*m)->config().local_rope_layers, (std::vector<bool>{true, false, true, false}));
}

TEST(Gemma3Test, WhatItCannotHonourIsRefusedByName) {
  const auto kRefused = absl::StatusCode::kUnimplemented;
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    EditedFixture f(Gemma3Dir(), nlohmann::json{{key, 30.0}});
    ExpectRefused(f, kRefused, key);
  }
  EditedFixture bidirectional(Gemma3Dir(), nlohmann::json{{"use_bidirectional_attention", true}});
  ExpectRefused(bidirectional, kRefused, "use_bidirectional_attention");
  EditedFixture yarn(Gemma3Dir(),
                     nlohmann::json{{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}});
  ExpectRefused(yarn, kRefused, "yarn and longrope scaling of Gemma 3");
  EditedFixture local_scaled(
      Gemma3Dir(),
      nlohmann::json{{"rope_local_base_freq", nullptr},
                     {"rope_parameters",
                      {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}}}});
  ExpectRefused(local_scaled, kRefused, "rope_parameters.sliding_attention");
  EditedFixture disagree(
      Gemma3Dir(),
      nlohmann::json{{"rope_parameters", {{"sliding_attention", {{"rope_theta", 20000.0}}}}}});
  ExpectRefused(disagree, absl::StatusCode::kInvalidArgument, "rope_local_base_freq");
  // The multimodal checkpoints' class nests its text model's config
  // (multimodal_test.cc): a flat one disagrees with it.
  EditedFixture multimodal(Gemma3Dir(),
                           nlohmann::json{{"architectures", {"Gemma3ForConditionalGeneration"}}});
  ExpectRefused(multimodal, absl::StatusCode::kInvalidArgument, "Gemma3ForConditionalGeneration");
}

// Another family carrying a Gemma 3 key would be silently wrong: refused.
TEST(Gemma3Test, GemmaThreeKeysInAnotherFamilyAreRefused) {
  TANDEM_REQUIRE_HF();
  for (const char* key :
       {"query_pre_attn_scalar", "rope_local_base_freq", "sliding_window_pattern"}) {
    EditedFixture f("llama-linear-sharded", nlohmann::json{{key, 4}});
    ExpectRefused(f, absl::StatusCode::kUnimplemented, key);
  }
}

}  // namespace
}  // namespace tandem::model
