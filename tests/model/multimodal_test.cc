// Multimodal checkpoints served as text (Gemma3ForConditionalGeneration,
// Mistral3ForConditionalGeneration): a causal LM's weights rewrapped as the
// Hub stores such a checkpoint (text_config, language_model.model.*, the
// vision tower's and projector's tensors beside them) and as transformers 5
// saves it (model.language_model.*), must be read as the same model, to the
// bit; the config's nesting and defaults as transformers builds them; and
// what does not fit, refused by name.
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hf_fixture.h"

namespace tandem::model {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

std::string Gemma3CheckpointDir() {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/model/hf_generated/gemma3";
}

using Rename = std::function<std::string(const std::string&)>;

// "model.X" -> prefix + "X", and lm_head.weight -> head.
Rename Layout(const std::string& prefix, const std::string& head) {
  return [=](const std::string& name) {
    if (name == "lm_head.weight") return head;
    if (absl::StartsWith(name, "model.")) return prefix + name.substr(6);
    return name;
  };
}
const Rename kHubLayout = Layout("language_model.model.", "language_model.lm_head.weight");
const Rename kTransformers5Layout = Layout("model.language_model.", "lm_head.weight");

// `src` (a causal LM's config.json and model.safetensors) as a multimodal
// checkpoint: config.json is `config`, each tensor is renamed by `rename`,
// and `extra` tensors (4 float32 zeros each: a vision tower's, say) join them.
class WrappedFixture {
 public:
  WrappedFixture(const std::string& src, const nlohmann::json& config, const Rename& rename,
                 const std::vector<std::string>& extra) {
    const std::string bytes = Slurp(src + "/model.safetensors");
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    auto header = ParseJson(bytes.substr(8, n));
    EXPECT_TRUE(header.ok()) << header.status();
    if (!header.ok()) return;
    std::string data = bytes.substr(8 + n);
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [name, info] : header->items()) {
      out[name == "__metadata__" ? name : rename(name)] = info;
    }
    for (const std::string& name : extra) {
      const size_t at = data.size();
      data.append(16, '\0');
      out[name] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {at, at + 16}}};
    }
    std::string text = out.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t len = text.size();
    std::string file(reinterpret_cast<const char*>(&len), 8);
    Spit(dir_.File("model.safetensors"), file + text + data);
    Spit(dir_.File("config.json"), config.dump(1));
  }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
};

// `causal`'s config.json nested as `architecture`'s text_config (its
// architectures key dropped), with `top` merged in at the top level.
nlohmann::json Nest(const std::string& causal, const std::string& architecture,
                    const std::string& model_type, const nlohmann::json& top) {
  auto text = ParseJson(Slurp(causal + "/config.json"));
  EXPECT_TRUE(text.ok()) << text.status();
  text->erase("architectures");
  nlohmann::json cfg = {{"architectures", {architecture}},
                        {"model_type", model_type},
                        {"text_config", *text},
                        {"torch_dtype", text->value("torch_dtype", "float32")}};
  cfg.update(top);
  return cfg;
}

// Gemma 3's top level as the Hub's gemma-3-4b-it has it (a vision tower
// too small to matter: its config is read by nobody here).
nlohmann::json Gemma3Top() {
  return {{"boi_token_index", 255999},
          {"eoi_token_index", 256000},
          {"image_token_index", 262144},
          {"mm_tokens_per_image", 4},
          {"initializer_range", 0.02},
          {"vision_config",
           {{"model_type", "siglip_vision_model"},
            {"hidden_size", 16},
            {"intermediate_size", 32},
            {"num_attention_heads", 2},
            {"num_hidden_layers", 1},
            {"image_size", 28},
            {"patch_size", 14},
            {"vision_use_head", false}}}};
}
const std::vector<std::string> kHubVision = {"vision_tower.vision_model.post_layernorm.weight",
                                             "multi_modal_projector.mm_soft_emb_norm.weight"};
const std::vector<std::string> kTransformers5Vision = {
    "model.vision_tower.vision_model.post_layernorm.weight",
    "model.multi_modal_projector.mm_soft_emb_norm.weight"};

// The two models compute the same: every greedy token and every margin on
// the CPU in float32, and on a GPU (when there is one) in bfloat16.
void ExpectSameModel(const Model& wrapped, const Model& causal, const std::vector<HfCase>& cases) {
  std::vector<std::pair<Backend, DType>> runs = {{Backend::kCpu, DType::kFloat32}};
  if (CudaAvailable(causal)) runs.emplace_back(Backend::kCuda, DType::kBFloat16);
  for (const auto& [backend, dtype] : runs) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const HfCase& c = cases[i];
      const GreedyRun a = Greedy(wrapped, c.prompt, c.max_tokens, backend, dtype, nullptr, false);
      const GreedyRun b = Greedy(causal, c.prompt, c.max_tokens, backend, dtype, nullptr, false);
      EXPECT_EQ(a.tokens, b.tokens) << "case " << i;
      EXPECT_EQ(a.margins, b.margins) << "case " << i;
    }
  }
}

TEST(MultimodalTest, Gemma3ForConditionalGenerationServesItsGemma3ForCausalLM) {
  auto causal = Model::Load(Gemma3CheckpointDir());
  ASSERT_TRUE(causal.ok()) << causal.status();
  const std::vector<HfCase> cases =
      LoadHfCasesFrom(Gemma3CheckpointDir() + "/float64.reference.json");
  ASSERT_FALSE(cases.empty());
  const nlohmann::json cfg =
      Nest(Gemma3CheckpointDir(), "Gemma3ForConditionalGeneration", "gemma3", Gemma3Top());
  for (const auto& [rename, vision, layout] :
       {std::tuple{kHubLayout, kHubVision, "the Hub's layout"},
        std::tuple{kTransformers5Layout, kTransformers5Vision, "transformers 5's layout"}}) {
    SCOPED_TRACE(layout);
    WrappedFixture wrapped(Gemma3CheckpointDir(), cfg, rename, vision);
    auto m = Model::Load(wrapped.path());
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = (*m)->config();
    const ModelConfig& want = (*causal)->config();
    EXPECT_EQ(c.family, ModelFamily::kGemma3);
    EXPECT_EQ(c.dim, want.dim);
    EXPECT_EQ(c.num_layers, want.num_layers);
    EXPECT_EQ(c.layer_window, want.layer_window);
    EXPECT_EQ(c.local_rope_layers, want.local_rope_layers);
    EXPECT_EQ(c.query_pre_attn_scalar, want.query_pre_attn_scalar);
    EXPECT_EQ(c.embedding_scale, want.embedding_scale);
    EXPECT_EQ(c.rope_scaling.type, want.rope_scaling.type);
    EXPECT_EQ(c.max_seq_len, want.max_seq_len);
    ExpectSameModel(**m, **causal, cases);
  }
}

TEST(MultimodalTest, Mistral3ForConditionalGenerationMatchesTransformersMistral) {
  TANDEM_REQUIRE_HF();
  auto causal = Model::Load(FixtureDir("mistral"));
  ASSERT_TRUE(causal.ok()) << causal.status();
  const nlohmann::json top = {{"image_token_index", 10},
                              {"projector_hidden_act", "gelu"},
                              {"spatial_merge_size", 2},
                              {"vision_feature_layer", -1},
                              {"multimodal_projector_bias", false},
                              {"vision_config", {{"model_type", "pixtral"}, {"hidden_size", 16}}}};
  WrappedFixture wrapped(
      FixtureDir("mistral"),
      Nest(FixtureDir("mistral"), "Mistral3ForConditionalGeneration", "mistral3", top), kHubLayout,
      kHubVision);
  auto m = Model::Load(wrapped.path());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().family, ModelFamily::kMistral);
  // Text only, Mistral3ForConditionalGeneration is MistralForCausalLM:
  // transformers' tokens for the latter hold.
  const std::vector<HfCase> cases = LoadHfCases("mistral");
  for (size_t i = 0; i < cases.size(); ++i) {
    const GreedyRun got = Greedy(**m, cases[i].prompt, cases[i].max_tokens, Backend::kCpu,
                                 DType::kFloat32, nullptr, false);
    ExpectDecisivePrefix(got.tokens, cases[i], absl::StrCat("mistral3 case ", i));
  }
  ExpectSameModel(**m, **causal, cases);
}

// A text_config naming only what differs from Gemma3TextConfig (as
// gemma-3-4b-it's does) takes the class's defaults for the rest.
TEST(MultimodalTest, TextConfigKeysLeftOutTakeGemma3TextConfigsDefaults) {
  auto causal = Model::Load(Gemma3CheckpointDir());
  ASSERT_TRUE(causal.ok()) << causal.status();
  nlohmann::json cfg =
      Nest(Gemma3CheckpointDir(), "Gemma3ForConditionalGeneration", "gemma3", Gemma3Top());
  // The fixture's values of these are the defaults but for the context.
  for (const char* key : {"max_position_embeddings", "rope_theta", "rms_norm_eps", "bos_token_id",
                          "eos_token_id", "hidden_activation", "model_type", "rope_local_base_freq",
                          "attention_bias", "final_logit_softcapping", "attn_logit_softcapping"}) {
    ASSERT_TRUE(cfg["text_config"].contains(key)) << key;
    cfg["text_config"].erase(key);
  }
  cfg["eos_token_id"] = {1, 106};  // the top level's, as the Hub's has them
  WrappedFixture sparse(Gemma3CheckpointDir(), cfg, kHubLayout, kHubVision);
  auto m = Model::Load(sparse.path());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.max_seq_len, 131072);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.extra_eos_token_ids, (std::vector<int32_t>{106}));
  EXPECT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.local_rope_theta, 1e4f);
  const std::vector<HfCase> cases =
      LoadHfCasesFrom(Gemma3CheckpointDir() + "/float64.reference.json");
  ExpectSameModel(**m, **causal, cases);

  // vocab_size left out is 262208, which these weights are not.
  cfg["text_config"].erase("vocab_size");
  WrappedFixture no_vocab(Gemma3CheckpointDir(), cfg, kHubLayout, kHubVision);
  auto refused = Model::Load(no_vocab.path());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("262208"), std::string::npos) << refused.status();
}

// What the wrapper cannot honour, or where its config disagrees with itself
// or its weights, is refused by name.
TEST(MultimodalTest, WhatDoesNotFitIsRefusedByName) {
  const nlohmann::json good =
      Nest(Gemma3CheckpointDir(), "Gemma3ForConditionalGeneration", "gemma3", Gemma3Top());
  auto refused = [&](const nlohmann::json& cfg, const std::vector<std::string>& extra,
                     absl::StatusCode code, const std::string& needle) {
    WrappedFixture f(Gemma3CheckpointDir(), cfg, kHubLayout, extra);
    auto m = Model::Load(f.path());
    ASSERT_FALSE(m.ok()) << "loaded; wanted a refusal naming " << needle;
    EXPECT_EQ(m.status().code(), code) << m.status();
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status();
  };
  nlohmann::json cfg = good;
  cfg["audio_config"] = {{"hidden_size", 8}};  // a part Tandem knows nothing of
  refused(cfg, kHubVision, absl::StatusCode::kUnimplemented, "audio_config");
  cfg = good;
  cfg["text_config"]["model_type"] = "gemma2";
  refused(cfg, kHubVision, absl::StatusCode::kUnimplemented, "gemma2");
  cfg = good;
  cfg.erase("text_config");
  refused(cfg, kHubVision, absl::StatusCode::kInvalidArgument, "text_config");
  cfg = good;
  cfg["tie_word_embeddings"] = true;  // text_config says false
  refused(cfg, kHubVision, absl::StatusCode::kInvalidArgument, "tie_word_embeddings");
  cfg = good;
  cfg["text_config"]["final_logit_softcapping"] = 30.0;  // 4.50 capped, 4.52 and later do not
  refused(cfg, kHubVision, absl::StatusCode::kUnimplemented, "final_logit_softcapping");
  cfg = good;
  cfg["model_type"] = "gemma3_text";
  refused(cfg, kHubVision, absl::StatusCode::kInvalidArgument, "disagrees");
  // A tensor of neither the language model nor the vision side.
  refused(good, {"language_model.model.layers.0.extra.weight"}, absl::StatusCode::kInvalidArgument,
          "language_model.model.layers.0.extra.weight");
}

// MistralConfig's sliding_window is 4096 when config.json leaves it out (null
// is none): every layer slides.
TEST(MultimodalTest, MistralWithoutASlidingWindowKeyTakesMistralConfigs4096) {
  TANDEM_REQUIRE_HF();
  EditedFixture absent(FixtureDir("mistral"), "\"sliding_window\": null,", "");
  auto m = Model::Load(absent.path());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().layer_window, std::vector<int32_t>(3, 4096));
  auto plain = Model::Load(FixtureDir("mistral"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE((*plain)->config().layer_window.empty());
}

}  // namespace
}  // namespace tandem::model
