// The Hugging Face families against transformers' own greedy tokens
// (shared/models/hf/*/reference.json: transformers 5.17, fp32, eager
// attention), single and batched, on the CPU backend and, when a GPU is at
// hand, on both CUDA modes; and the loader's refusals, one test each.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "hf_config.h"
#include "hf_fixture.h"

namespace tandem::model {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

const char* const kFixtures[] = {"llama2-bf16", "llama3.2",  "llama3.2-tf5",
                                 "llama-linear-sharded", "mistral", "qwen2.5",
                                 "qwen3",       "phi3",      "gemma"};

class HfFixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(HfFixtureTest, CpuMatchesTransformersSingleAndBatched) {
  TANDEM_REQUIRE_HF();
  auto model = Model::Load(FixtureDir(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<HfCase> cases = LoadHfCases(GetParam());
  ASSERT_FALSE(cases.empty());
  int32_t full_matches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const HfCase& c = cases[i];
    const std::vector<int32_t> got =
        testing::Greedy(**model, c.prompt, c.max_tokens, Backend::kCpu, DType::kFloat32, nullptr,
                        /*stop_on_eos=*/false)
            .tokens;
    ExpectDecisivePrefix(got, c, absl::StrCat(GetParam(), " case ", i));
    full_matches += got == c.expected;
  }
  // Near-ties past the decisive prefix may go either way, but most cases
  // have none: a model that is subtly off diverges inside the prefix anyway.
  EXPECT_GT(full_matches, 0) << GetParam();
  const auto batched = GreedyBatched(**model, cases, Backend::kCpu, DType::kFloat32);
  for (size_t i = 0; i < cases.size(); ++i) {
    ExpectDecisivePrefix(batched[i], cases[i], absl::StrCat(GetParam(), " batched case ", i));
  }
}

TEST_P(HfFixtureTest, CudaMatchesTransformersInBothModes) {
  TANDEM_REQUIRE_HF();
  auto model = Model::Load(FixtureDir(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status();
  if (!CudaAvailable(**model)) GTEST_SKIP() << "no CUDA device";
  ExpectCudaMatchesTransformers(**model, LoadHfCases(GetParam()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFixtureTest, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// The worker's load: no fp32 host weights; the runner reads each tensor
// from the mapped checkpoint and keeps what it needs.
TEST_P(HfFixtureTest, MappedLoadComputesTheSameLogits) {
  TANDEM_REQUIRE_HF();
  auto host = Model::Load(FixtureDir(GetParam()));
  auto mapped = Model::Load(FixtureDir(GetParam()), {.host_weights = false});
  ASSERT_TRUE(host.ok() && mapped.ok()) << mapped.status();
  EXPECT_TRUE((*host)->has_host_weights());
  EXPECT_FALSE((*mapped)->has_host_weights());
  EXPECT_TRUE((*mapped)->weights().layers.empty());
  EXPECT_EQ((*mapped)->fingerprint(), (*host)->fingerprint());
  const ModelConfig& c = (*host)->config();
  // Every weight agrees, in fp32 and as bf16 (a BF16-stored tensor's bits
  // are the checkpoint's own).
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    for (WeightKind kind : {WeightKind::kWq, WeightKind::kWv, WeightKind::kW3, WeightKind::kRmsAtt,
                            WeightKind::kBq, WeightKind::kQNorm, WeightKind::kClassifier}) {
      auto a = (*host)->Fp32({kind, layer});
      auto b = (*mapped)->Fp32({kind, layer});
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_TRUE(std::equal(a->span().begin(), a->span().end(), b->span().begin(),
                             b->span().end()))
          << "weight " << static_cast<int>(kind) << " layer " << layer;
      auto ha = (*host)->Bf16({kind, layer});
      auto hb = (*mapped)->Bf16({kind, layer});
      ASSERT_TRUE(ha.ok() && hb.ok());
      ASSERT_TRUE(std::equal(ha->span().begin(), ha->span().end(), hb->span().begin(),
                             hb->span().end()));
    }
  }
  std::vector<int32_t> prompt = LoadHfCases(GetParam())[1].prompt, table = {0, 1, 2, 3};
  const SequenceInput in{.token_ids = prompt, .start_pos = 0, .block_table = table};
  auto r1 = ModelRunner::Create(host->get(), {.block_size = 16, .num_blocks = 4});
  auto r2 = ModelRunner::Create(mapped->get(), {.block_size = 16, .num_blocks = 4});
  ASSERT_TRUE(r1.ok() && r2.ok()) << r2.status();
  // The runner holds its own copy: the mapping can go.
  (*mapped)->ReleaseCheckpoint();
  EXPECT_EQ((*mapped)->Fp32({WeightKind::kWq, 0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<float> l1, l2;
  ASSERT_TRUE((*r1)->Forward({&in, 1}, &l1).ok());
  ASSERT_TRUE((*r2)->Forward({&in, 1}, &l2).ok());
  EXPECT_EQ(l1, l2);
}

TEST(HfFamiliesTest, ConfigsReadAsTheirFamilies) {
  TANDEM_REQUIRE_HF();
  struct Want {
    const char* fixture;
    ModelFamily family;
    int32_t head_size;
    bool qkv_bias, qk_norm;
    Activation act;
  };
  for (const Want& w : {Want{"qwen2.5", ModelFamily::kQwen2, 32, true, false, Activation::kSilu},
                        Want{"qwen3", ModelFamily::kQwen3, 64, false, true, Activation::kSilu},
                        Want{"phi3", ModelFamily::kPhi3, 32, false, false, Activation::kSilu},
                        Want{"gemma", ModelFamily::kGemma, 64, false, false,
                             Activation::kGeluTanh}}) {
    auto m = Model::Load(FixtureDir(w.fixture));
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = (*m)->config();
    EXPECT_EQ(c.family, w.family) << w.fixture;
    EXPECT_EQ(c.head_size, w.head_size) << w.fixture;
    EXPECT_EQ(c.qkv_bias, w.qkv_bias) << w.fixture;
    EXPECT_EQ(c.qk_norm, w.qk_norm) << w.fixture;
    EXPECT_EQ(c.activation, w.act) << w.fixture;
  }
  // Both llama3.2 layouts give one config: theta 5e5 and llama3 scaling.
  auto v4 = Model::Load(FixtureDir("llama3.2"));
  auto v5 = Model::Load(FixtureDir("llama3.2-tf5"));
  ASSERT_TRUE(v4.ok() && v5.ok());
  for (const Model* m : {v4->get(), v5->get()}) {
    EXPECT_EQ(m->config().rope_theta, 500000.0f);
    EXPECT_EQ(m->config().rope_scaling.type, RopeScaling::Type::kLlama3);
    EXPECT_EQ(m->config().rope_scaling.factor, 32.0f);
    EXPECT_EQ(m->config().rope_scaling.original_max_position_embeddings, 8192);
    EXPECT_EQ(m->config().EosTokenIds(), (std::vector<int32_t>{2, 5, 7}));
  }
  EXPECT_EQ((*v4)->fingerprint(), (*v5)->fingerprint());
}

TEST(HfFamiliesTest, RefusesAnUnknownArchitectureByName) {
  TANDEM_REQUIRE_HF();
  ExpectEditRefused("mistral", "\"MistralForCausalLM\"", "\"FooBarForCausalLM\"",
                    absl::StatusCode::kUnimplemented, "FooBarForCausalLM");
  ExpectEditRefused("mistral", "\"model_type\": \"mistral\"", "\"model_type\": \"llama\"",
                    absl::StatusCode::kInvalidArgument, "disagrees with model_type");
}

TEST(HfFamiliesTest, RefusesAnUnknownActivation) {
  TANDEM_REQUIRE_HF();
  ExpectEditRefused("mistral", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"relu2\"",
                    absl::StatusCode::kUnimplemented, "relu2");
  ExpectEditRefused("gemma", "\"hidden_activation\": \"gelu_pytorch_tanh\"",
                    "\"hidden_activation\": \"gelu\"", absl::StatusCode::kUnimplemented,
                    "hidden_activation \"gelu\"");
}

// Gemma 1's MLP reads hidden_act in transformers 5 (hidden_activation in
// 4.39+): a hidden_act that disagrees with hidden_activation is refused,
// one alone is read; "gelu" there is google/gemma-2b's and -7b's legacy
// name for the tanh form they were trained with (served as vLLM serves it).
TEST(HfFamiliesTest, GemmaOneReadsHiddenActWithItsLegacyGelu) {
  TANDEM_REQUIRE_HF();
  ExpectEditRefused("gemma", "\"hidden_act\": \"gelu_pytorch_tanh\"", "\"hidden_act\": \"silu\"",
                    absl::StatusCode::kUnimplemented,
                    "hidden_act \"silu\" disagrees with hidden_activation \"gelu_pytorch_tanh\"");
  auto activation = [](const std::string& act, bool with_hidden_activation) {
    EditedFixture f("gemma", "\"hidden_act\": \"gelu_pytorch_tanh\"",
                    "\"hidden_act\": \"" + act + "\"");
    if (!with_hidden_activation) {
      EditConfig(f, {{"\"hidden_activation\": \"gelu_pytorch_tanh\",", ""}});
    }
    auto m = Model::Load(f.path());
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? (*m)->config().activation : Activation::kSilu;
  };
  EXPECT_EQ(activation("silu", false), Activation::kSilu) << "hidden_act alone is read";
  EXPECT_EQ(activation("gelu", false), Activation::kGeluTanh);
  EXPECT_EQ(activation("gelu", true), Activation::kGeluTanh);
  EXPECT_EQ(activation("gelu_pytorch_tanh", false), Activation::kGeluTanh);
  // An unknown one is refused by name.
  ExpectEditRefused("gemma", "\"hidden_act\": \"gelu_pytorch_tanh\"", "\"hidden_act\": \"relu2\"",
                    absl::StatusCode::kUnimplemented, "hidden_act \"relu2\"");
}

// rope_type and the older "type" both set must agree (transformers reads
// rope_type first; the loop here read type last).
TEST(HfFamiliesTest, RopeTypeAndTypeMustAgree) {
  TANDEM_REQUIRE_HF();
  ExpectEditRefused(
      "llama3.2", "\"rope_type\": \"llama3\"", "\"rope_type\": \"llama3\", \"type\": \"linear\"",
      absl::StatusCode::kInvalidArgument, "rope_type \"llama3\" disagrees with type \"linear\"");
  EditedFixture same("llama3.2", "\"rope_type\": \"llama3\"",
                     "\"rope_type\": \"llama3\", \"type\": \"llama3\"");
  auto m = Model::Load(same.path());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().rope_scaling.type, RopeScaling::Type::kLlama3);
}

// Qwen2Config's and Qwen3Config's max_window_layers is 28 when config.json
// leaves it out: with use_sliding_window, layers 28 and up slide.
TEST(HfFamiliesTest, QwenMaxWindowLayersDefaultsTo28) {
  TANDEM_REQUIRE_HF();
  for (const char* fixture : {"qwen2.5", "qwen3"}) {
    SCOPED_TRACE(fixture);
    EditedFixture f(fixture, nlohmann::json{{"num_hidden_layers", 30},
                                            {"use_sliding_window", true},
                                            {"sliding_window", 1024}});
    auto cfg = ParseJson(Slurp(f.File("config.json")));
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    cfg->erase("max_window_layers");
    cfg->erase("layer_types");
    Spit(f.File("config.json"), cfg->dump(1));
    auto hf = internal::ReadHfConfig(f.path());
    ASSERT_TRUE(hf.ok()) << hf.status();
    std::vector<int32_t> expected(30, 0);
    expected[28] = expected[29] = 1024;
    EXPECT_EQ(hf->config.layer_window, expected);
  }
}

// An explicit "num_key_value_heads": null is multi-head attention, as
// transformers' configs read it; a missing key is the class's default
// (MistralConfig 8, Qwen2Config and Qwen3Config 32). null used to take the
// default too, which refused the checkpoint's weights.
TEST(HfFamiliesTest, NullKeyValueHeadsMeansOneKvHeadPerQueryHead) {
  TANDEM_REQUIRE_HF();
  for (const auto& [fixture, class_default] :
       {std::pair{"mistral", 8}, std::pair{"qwen2.5", 32}, std::pair{"qwen3", 32}}) {
    SCOPED_TRACE(fixture);
    EditedFixture f(fixture, nlohmann::json::object());
    auto cfg = ParseJson(Slurp(f.File("config.json")));
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    (*cfg)["num_key_value_heads"] = nullptr;
    Spit(f.File("config.json"), cfg->dump(1));
    auto hf = internal::ReadHfConfig(f.path());
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_EQ(hf->config.num_kv_heads, hf->config.num_heads);
    // The class default (the fixtures' 4 heads are not a multiple of 8 or
    // 32: the check that follows names it).
    cfg->erase("num_key_value_heads");
    Spit(f.File("config.json"), cfg->dump(1));
    hf = internal::ReadHfConfig(f.path());
    ASSERT_FALSE(hf.ok());
    EXPECT_NE(hf.status().message().find("num_kv_heads " + std::to_string(class_default)),
              std::string::npos)
        << hf.status();
  }
}

TEST(HfFamiliesTest, RefusesConfigKeysThatMayChangeTheMath) {
  TANDEM_REQUIRE_HF();
  ExpectEditRefused("mistral", "\"use_cache\": true", "\"use_cache\": true, \"logit_softcap\": 30",
                    absl::StatusCode::kUnimplemented, "logit_softcap");
  ExpectEditRefused("mistral", "\"use_cache\": true",
                    "\"use_cache\": true, \"quantization_config\": {\"quant_method\": \"awq\"}",
                    absl::StatusCode::kUnimplemented, "awq");
  // Only Phi3's transformers code rotates part of a head.
  ExpectEditRefused("mistral", "\"use_cache\": true",
                    "\"use_cache\": true, \"partial_rotary_factor\": 0.5",
                    absl::StatusCode::kUnimplemented, "partial_rotary_factor");
  ExpectEditRefused("llama2-bf16", "\"mlp_bias\": false", "\"mlp_bias\": true",
                    absl::StatusCode::kUnimplemented, "mlp_bias");
}

TEST(HfFamiliesTest, RefusesATensorItWouldLeaveUnread) {
  TANDEM_REQUIRE_HF();
  // Qwen2's q/k/v biases under a Llama config without attention_bias: the
  // biases would be dropped, the model silently another.
  EditedFixture f("qwen2.5", "\"Qwen2ForCausalLM\"", "\"LlamaForCausalLM\"");
  std::string cfg = Slurp(f.File("config.json"));
  cfg.replace(cfg.find("\"qwen2\""), 7, "\"llama\"");
  for (const char* key : {"\"use_sliding_window\": false,", "\"max_window_layers\": 3,"}) {
    cfg.replace(cfg.find(key), std::string(key).size(), "");
  }
  Spit(f.File("config.json"), cfg);
  ExpectRefused(f, absl::StatusCode::kInvalidArgument, "self_attn.k_proj.bias");
}

std::vector<int32_t> LayerWindows(const EditedFixture& f) {
  auto m = Model::Load(f.path());
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? (*m)->config().layer_window : std::vector<int32_t>{-1};
}

// Which layers slide, as transformers 5 decides it per family.
TEST(HfFamiliesTest, SlidingWindowsFollowEachFamilysRule) {
  TANDEM_REQUIRE_HF();
  {  // Mistral and Phi-3: every layer, the context not capped.
    EditedFixture f("mistral", "\"sliding_window\": null", "\"sliding_window\": 4096");
    auto m = Model::Load(f.path());
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->config().layer_window, (std::vector<int32_t>{4096, 4096, 4096}));
    EXPECT_EQ((*m)->config().max_seq_len, 32768);
    auto full = Model::Load(FixtureDir("mistral"));
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_NE((*m)->fingerprint(), (*full)->fingerprint()) << "other K/V past the window";
    EditedFixture phi("phi3", "\"sliding_window\": null", "\"sliding_window\": 2047");
    EXPECT_EQ(LayerWindows(phi), (std::vector<int32_t>{2047, 2047, 2047}));
    // A window at least the context slides nothing.
    EditedFixture wide("mistral", "\"sliding_window\": null", "\"sliding_window\": 32768");
    EXPECT_TRUE(LayerWindows(wide).empty());
    // layer_types cannot make Mistral's layers full: transformers ignores it.
    ExpectEditRefused("mistral", "\"sliding_window\": null",
                      "\"sliding_window\": 64, \"layer_types\": [\"sliding_attention\", "
                      "\"full_attention\", \"sliding_attention\"]",
                      absl::StatusCode::kUnimplemented, "layer_types");
  }
  {  // Qwen: only with use_sliding_window, layers past max_window_layers.
    EditedFixture q("qwen2.5", "\"sliding_window\": null", "\"sliding_window\": 1024");
    EXPECT_TRUE(LayerWindows(q).empty()) << "use_sliding_window is false";
    EditConfig(q, {{"\"use_sliding_window\": false", "\"use_sliding_window\": true"},
                   {"\"max_window_layers\": 3", "\"max_window_layers\": 1"}});
    EXPECT_EQ(LayerWindows(q), (std::vector<int32_t>{0, 1024, 1024}));
    // layer_types, when listed, names the layers.
    EditConfig(q, {{"\"sliding_window\": 1024",
                    "\"sliding_window\": 1024, \"layer_types\": [\"sliding_attention\", "
                    "\"full_attention\", \"sliding_attention\"]"}});
    EXPECT_EQ(LayerWindows(q), (std::vector<int32_t>{1024, 0, 1024}));
    EditedFixture q3("qwen3", "\"sliding_window\": null", "\"sliding_window\": 512");
    EditConfig(q3, {{"\"use_sliding_window\": false", "\"use_sliding_window\": true"}});
    EXPECT_TRUE(LayerWindows(q3).empty()) << "max_window_layers = num_layers: none slides";
  }
  {  // Llama: its transformers code reads no window; capped where both agree.
    EditedFixture l("llama2-bf16", "\"max_position_embeddings\": 4096",
                    "\"max_position_embeddings\": 4096, \"sliding_window\": 1024");
    auto m = Model::Load(l.path());
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->config().max_seq_len, 1024);
    EXPECT_TRUE((*m)->config().layer_window.empty());
  }
}

// vLLM's --disable-sliding-window: no window, the context capped at the
// smallest one (Qwen's full layers do not lower it).
TEST(HfFamiliesTest, DisableSlidingWindowCapsTheContextInstead) {
  TANDEM_REQUIRE_HF();
  EditedFixture q("qwen2.5", "\"sliding_window\": null", "\"sliding_window\": 1024");
  EditConfig(q, {{"\"use_sliding_window\": false", "\"use_sliding_window\": true"},
                 {"\"max_window_layers\": 3", "\"max_window_layers\": 1"}});
  auto m = Model::Load(q.path(), {.disable_sliding_window = true});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->config().layer_window.empty());
  EXPECT_EQ((*m)->config().max_seq_len, 1024);
  // A model without a window is untouched.
  auto plain = Model::Load(FixtureDir("mistral"), {.disable_sliding_window = true});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->config().max_seq_len, 32768);
}

// A sliding window of W keeps key kv for the query at q when kv > q - W, so
// through 3 layers the last position p reads tokens p - 3 (W - 1) .. p and
// nothing earlier. Checked at both edges: a token changed one place before
// the receptive field leaves the logits' bits as they were, one changed at
// its first place moves them. Prefills in one chunk, in chunks that cut the
// window, and token by token agree bit for bit (the windows of later chunks
// read K/V that earlier steps wrote). Where a GPU is at hand, both CUDA
// modes keep the same edges.
TEST(HfFamiliesTest, ASlidingWindowSeesExactlyItsWindow) {
  TANDEM_REQUIRE_HF();
  constexpr int32_t kWindow = 5, kLayers = 3, kLength = 40;
  EditedFixture f("mistral", "\"sliding_window\": null", "\"sliding_window\": 5");
  auto m = Model::Load(f.path());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->config().num_layers, kLayers);
  const std::vector<int32_t> tokens = testing::MakePrompt(kLength, 3, (*m)->config().vocab_size);
  const int32_t first_read = kLength - 1 - kLayers * (kWindow - 1);
  auto changed_at = [&](int32_t at) {
    std::vector<int32_t> t = tokens;
    t[static_cast<size_t>(at)] = (t[static_cast<size_t>(at)] + 1) % (*m)->config().vocab_size;
    return t;
  };
  for (const auto& [backend, dtype] : RunnerModes(**m)) {
    SCOPED_TRACE(ModeName(backend, dtype));
    const std::vector<float> base = LastLogits(**m, tokens, kLength, backend, dtype);
    ASSERT_FALSE(base.empty());
    EXPECT_TRUE(
        SameBits(LastLogits(**m, changed_at(first_read - 1), kLength, backend, dtype), base))
        << "a token before the receptive field changed the logits";
    EXPECT_TRUE(SameBits(LastLogits(**m, changed_at(0), kLength, backend, dtype), base));
    EXPECT_FALSE(SameBits(LastLogits(**m, changed_at(first_read), kLength, backend, dtype), base))
        << "the receptive field's first token did not reach the logits";
    if (backend == Backend::kCpu) {
      EXPECT_TRUE(SameBits(LastLogits(**m, tokens, 7, backend, dtype), base)) << "chunks of 7";
      EXPECT_TRUE(SameBits(LastLogits(**m, tokens, 1, backend, dtype), base)) << "token by token";
    }
  }
  // Without the window the first token reaches the last position.
  auto full = Model::Load(FixtureDir("mistral"));
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_FALSE(
      SameBits(LastLogits(**full, changed_at(0), kLength), LastLogits(**full, tokens, kLength)));
}

// A window wider than the reference runs (prompts of up to 250 tokens, then
// 32) changes no
// token: the window's code path gives transformers' tokens where its mask
// and the full one agree.
TEST(HfFamiliesTest, AWindowWiderThanTheSequenceKeepsTransformersTokens) {
  TANDEM_REQUIRE_HF();
  EditedFixture f("mistral", "\"sliding_window\": null", "\"sliding_window\": 512");
  auto m = Model::Load(f.path());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_FALSE((*m)->config().layer_window.empty());
  const std::vector<HfCase> cases = LoadHfCases("mistral");
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_LE(cases[i].prompt.size() + cases[i].max_tokens, 512u);
    const std::vector<int32_t> got =
        testing::Greedy(**m, cases[i].prompt, cases[i].max_tokens, Backend::kCpu, DType::kFloat32,
                        nullptr, /*stop_on_eos=*/false)
            .tokens;
    ExpectDecisivePrefix(got, cases[i], absl::StrCat("mistral, window 512, case ", i));
  }
}

TEST(HfFamiliesTest, GenerationConfigAddsEosIdsAndSamplingDefaults) {
  TANDEM_REQUIRE_HF();
  EditedFixture f("llama3.2", "\"use_cache\": true", "\"use_cache\": true");
  Spit(f.File("generation_config.json"),
       R"({"bos_token_id": 1, "eos_token_id": [2, 9], "do_sample": true,
           "temperature": 0.6, "top_p": 0.9, "top_k": 40, "max_new_tokens": 300,
           "transformers_version": "5.17.0"})");
  auto m = Model::Load(f.path());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.EosTokenIds(), (std::vector<int32_t>{2, 5, 7, 9}));
  EXPECT_EQ(c.generation.temperature, 0.6f);
  EXPECT_EQ(c.generation.top_p, 0.9f);
  EXPECT_EQ(c.generation.top_k, 40);
  EXPECT_FALSE(c.generation.min_p.has_value());
  EXPECT_EQ(c.generation.max_new_tokens, 300);
  Spit(f.File("generation_config.json"), R"({"max_new_tokens": 0})");
  auto zero = Model::Load(f.path());
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("max_new_tokens must be >= 1"), std::string::npos)
      << zero.status();
  Spit(f.File("generation_config.json"), R"({"temperature": -1})");
  auto negative = Model::Load(f.path());
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("generation_config.json"), std::string::npos)
      << negative.status();
  Spit(f.File("generation_config.json"), R"({"eos_token_id": 4096})");
  auto bad = Model::Load(f.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("4096"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace tandem::model
