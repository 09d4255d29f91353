#include "hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "file_util.h"
#include "hf_config_read.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/model/json.h"

namespace tandem::model::internal {
namespace {

struct FamilyInfo {
  ModelFamily family;
  const char* architecture;
  const char* model_type;
  // The config class's defaults (transformers 5) for keys a config.json may
  // leave out. 0 head_dim = hidden_size / num_attention_heads; 0 kv heads =
  // num_attention_heads.
  int32_t default_head_dim;
  int32_t default_kv_heads;
  float default_eps;
  bool default_tied;
  // sliding_window when the key is absent (null is none): MistralConfig's,
  // Qwen2Config's, Qwen3Config's and Gemma 2's and 3's 4096.
  int32_t default_window;
  // The config class's defaults for the sizes and token ids, as JSON, where
  // checkpoints rely on them: the text_config of Gemma 3's multimodal
  // checkpoints names only what differs from Gemma3TextConfig. Null where
  // config.json must name them.
  const char* size_defaults;
};

constexpr FamilyInfo kFamilies[] = {
    {ModelFamily::kLlama, "LlamaForCausalLM", "llama", 0, 0, 1e-6f, false, 0, nullptr},
    {ModelFamily::kMistral, "MistralForCausalLM", "mistral", 0, 8, 1e-6f, false, 4096, nullptr},
    {ModelFamily::kQwen2, "Qwen2ForCausalLM", "qwen2", 0, 32, 1e-6f, false, 4096, nullptr},
    {ModelFamily::kQwen3, "Qwen3ForCausalLM", "qwen3", 128, 32, 1e-6f, false, 4096, nullptr},
    {ModelFamily::kPhi3, "Phi3ForCausalLM", "phi3", 0, 0, 1e-5f, false, 0, nullptr},
    {ModelFamily::kGemma, "GemmaForCausalLM", "gemma", 256, 16, 1e-6f, true, 0, nullptr},
    {ModelFamily::kGemma2, "Gemma2ForCausalLM", "gemma2", 256, 4, 1e-6f, true, 4096, nullptr},
    {ModelFamily::kGemma3, "Gemma3ForCausalLM", "gemma3_text", 256, 4, 1e-6f, true, 4096,
     R"({"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
         "num_hidden_layers": 26, "num_attention_heads": 8, "max_position_embeddings": 131072,
         "bos_token_id": 2, "eos_token_id": 1})"},
};

// A multimodal checkpoint whose language model is one of the families
// above, served as text: its config.json nests that model's config under
// text_config (missing keys take the text config class's defaults, as
// transformers builds it), and its language model's tensors sit under
// another prefix. Vision tower and projector are not loaded.
struct WrapperInfo {
  const char* architecture;
  const char* model_type;
  ModelFamily text_family;
  // Top-level keys besides text_config and the token ids: the vision side's,
  // which change nothing for a prompt without images.
  std::initializer_list<const char*> vision_keys;
};

const WrapperInfo kWrappers[] = {
    // Gemma 3 4B, 12B, 27B. transformers 4.52 and later compute no final
    // logit softcapping in this class (4.50 did, through Gemma3ForCausalLM),
    // so a text_config that sets it is refused as for the causal LM.
    {"Gemma3ForConditionalGeneration",
     "gemma3",
     ModelFamily::kGemma3,
     {"vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index",
      "image_token_index", "boi_token_id", "eoi_token_id", "image_token_id"}},
    // Mistral Small 3.1 and 3.2 (24B): a MistralForCausalLM under a Pixtral
    // vision tower.
    {"Mistral3ForConditionalGeneration",
     "mistral3",
     ModelFamily::kMistral,
     {"vision_config", "image_token_index", "image_token_id", "projector_hidden_act",
      "vision_feature_layer", "multimodal_projector_bias", "spatial_merge_size"}},
};

std::string SupportedArchitectures() {
  std::vector<std::string> names;
  for (const FamilyInfo& f : kFamilies) names.push_back(f.architecture);
  for (const WrapperInfo& w : kWrappers) names.push_back(std::string(w.architecture) + " (text)");
  return absl::StrJoin(names, ", ");
}

// Keys that do not change the forward pass (training-only settings,
// bookkeeping, generation settings that generation_config.json supersedes).
const std::set<std::string>& HarmlessKeys() {
  static const std::set<std::string> keys = {
      "_name_or_path", "transformers_version", "use_cache", "initializer_range", "pad_token_id",
      "attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop", "dropout",
      "output_attentions", "output_hidden_states", "return_dict", "torchscript",
      "use_return_dict", "tokenizer_class", "id2label", "label2id", "problem_type",
      "finetuning_task", "task_specific_params", "chunk_size_feed_forward", "prefix",
      "sep_token_id", "decoder_start_token_id", "is_decoder", "is_encoder_decoder",
      "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size",
      "pruned_heads", "auto_map", "torch_dtype", "dtype", "architectures", "model_type",
      // pretraining_tp > 1 slices the projections in training; the sum is the same.
      "pretraining_tp",
      // Generation settings of older configs (generation_config.json wins).
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
      "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
      "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
      "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
      "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
      "cache_implementation"};
  return keys;
}

// Keys a family reads below (and IsGemma3Key's); anything else not harmless
// is refused.
const std::set<std::string>& ReadKeys() {
  static const std::set<std::string> keys = {"hidden_size",
                                             "intermediate_size",
                                             "num_hidden_layers",
                                             "num_attention_heads",
                                             "num_key_value_heads",
                                             "vocab_size",
                                             "max_position_embeddings",
                                             "rms_norm_eps",
                                             "rope_theta",
                                             "rope_scaling",
                                             "rope_parameters",
                                             "head_dim",
                                             "hidden_act",
                                             "hidden_activation",
                                             "bos_token_id",
                                             "eos_token_id",
                                             "tie_word_embeddings",
                                             "attention_bias",
                                             "mlp_bias",
                                             "sliding_window",
                                             "use_sliding_window",
                                             "max_window_layers",
                                             "layer_types",
                                             "partial_rotary_factor",
                                             "original_max_position_embeddings",
                                             "quantization_config",
                                             "full_attn_mod",
                                             "interpolate_factor",
                                             "lm_head_bias"};
  return keys;
}

// Keys only Gemma3ForCausalLM reads (Gemma2ForCausalLM the first and the
// softcaps); another family with one set is refused.
constexpr const char* kGemma3Keys[] = {"query_pre_attn_scalar",      "sliding_window_pattern",
                                       "_sliding_window_pattern",    "rope_local_base_freq",
                                       "final_logit_softcapping",    "attn_logit_softcapping",
                                       "use_bidirectional_attention"};

bool IsGemma3Key(const std::string& key) {
  return std::find(std::begin(kGemma3Keys), std::end(kGemma3Keys), key) != std::end(kGemma3Keys);
}
bool IsGemma2Key(const std::string& key) {
  return key == "query_pre_attn_scalar" || key == "final_logit_softcapping" ||
         key == "attn_logit_softcapping";
}

}  // namespace

absl::Status Refuse(const std::string& path, const std::string& what) {
  return absl::UnimplementedError(absl::StrCat(path, ": ", what));
}
absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

bool IsSet(const nlohmann::json* v) { return v != nullptr && !v->is_null(); }

absl::StatusOr<std::optional<double>> GetNumber(const nlohmann::json& obj, const std::string& path,
                                                const std::string& key) {
  const nlohmann::json* v = JsonMember(obj, key);
  if (!IsSet(v)) return std::optional<double>();
  if (!v->is_number()) return Bad(path, absl::StrCat("\"", key, "\" is not a number"));
  return std::optional<double>(v->get<double>());
}

absl::StatusOr<int32_t> GetInt(const nlohmann::json& obj, const std::string& path,
                               const std::string& key, std::optional<int32_t> fallback) {
  const nlohmann::json* v = JsonMember(obj, key);
  if (!IsSet(v)) {
    if (fallback) return *fallback;
    return Bad(path, absl::StrCat("missing \"", key, "\""));
  }
  const double n = v->is_number() ? v->get<double>() : 0.5;
  if (n != std::floor(n) || n > INT32_MAX || n < INT32_MIN) {
    return Bad(path, absl::StrCat("\"", key, "\" is not an integer"));
  }
  return static_cast<int32_t>(n);
}

absl::StatusOr<float> GetFloat(const nlohmann::json& obj, const std::string& path,
                               const std::string& key, float fallback) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> v, GetNumber(obj, path, key));
  return v ? static_cast<float>(*v) : fallback;
}

absl::StatusOr<bool> GetBool(const nlohmann::json& obj, const std::string& path,
                             const std::string& key, bool fallback) {
  const nlohmann::json* v = JsonMember(obj, key);
  if (!IsSet(v)) return fallback;
  if (!v->is_boolean()) return Bad(path, absl::StrCat("\"", key, "\" is not true or false"));
  return v->get<bool>();
}

// layer_types, when the config lists them: true for "sliding_attention".
absl::StatusOr<std::optional<std::vector<bool>>> LayerTypes(const nlohmann::json& cfg,
                                                            const std::string& path,
                                                            int32_t num_layers) {
  const nlohmann::json* types = JsonMember(cfg, "layer_types");
  if (!IsSet(types)) return std::optional<std::vector<bool>>();
  if (!types->is_array() || static_cast<int32_t>(types->size()) != num_layers) {
    return Bad(path, "\"layer_types\" must list one type per layer");
  }
  std::vector<bool> slides;
  for (const nlohmann::json& t : *types) {
    const std::string name = t.is_string() ? t.get<std::string>() : "";
    if (name != "full_attention" && name != "sliding_attention") {
      return Refuse(path, "layer_types: only full_attention and sliding_attention are supported");
    }
    slides.push_back(name == "sliding_attention");
  }
  return std::optional<std::vector<bool>>(std::move(slides));
}

namespace {

// An int or a list of ints (eos_token_id).
absl::StatusOr<std::vector<int32_t>> GetIds(const nlohmann::json& obj, const std::string& path,
                                            const std::string& key) {
  const nlohmann::json* v = JsonMember(obj, key);
  std::vector<int32_t> ids;
  if (!IsSet(v)) return ids;
  if (v->is_array()) {
    for (const nlohmann::json& x : *v) {
      const double n = x.is_number() ? x.get<double>() : -1;
      if (n != std::floor(n) || n < 0 || n > INT32_MAX) {
        return Bad(path, absl::StrCat("\"", key, "\" holds a value that is not a token id"));
      }
      ids.push_back(static_cast<int32_t>(n));
    }
    return ids;
  }
  TANDEM_ASSIGN_OR_RETURN(int32_t id, GetInt(obj, path, key, std::nullopt));
  ids.push_back(id);
  return ids;
}

absl::StatusOr<const FamilyInfo*> PickFamily(const nlohmann::json& cfg, const std::string& path,
                                             std::string* architecture) {
  const nlohmann::json* archs = JsonMember(cfg, "architectures");
  const nlohmann::json* type = JsonMember(cfg, "model_type");
  const FamilyInfo* by_arch = nullptr;
  const FamilyInfo* by_type = nullptr;
  if (IsSet(archs)) {
    if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
      return Bad(path, "\"architectures\" must be a list of one class name");
    }
    *architecture = (*archs)[0].get<std::string>();
    for (const FamilyInfo& f : kFamilies) {
      if (*architecture == f.architecture) by_arch = &f;
    }
    if (by_arch == nullptr) {
      return Refuse(path, absl::StrCat("architecture \"", *architecture,
                                       "\" is not supported (supported: ",
                                       SupportedArchitectures(), ")"));
    }
  }
  if (IsSet(type)) {
    if (!type->is_string()) return Bad(path, "\"model_type\" is not a string");
    for (const FamilyInfo& f : kFamilies) {
      if (type->get<std::string>() == f.model_type) by_type = &f;
    }
    if (by_type == nullptr) {
      return Refuse(path, absl::StrCat("model_type \"", type->get<std::string>(),
                                       "\" is not supported (supported architectures: ",
                                       SupportedArchitectures(), ")"));
    }
  }
  if (by_arch == nullptr && by_type == nullptr) {
    return Bad(path, "neither \"architectures\" nor \"model_type\" says which model this is");
  }
  if (by_arch != nullptr && by_type != nullptr && by_arch != by_type) {
    return Bad(path,
               absl::StrCat("architecture \"", *architecture, "\" disagrees with model_type \"",
                            type->get<std::string>(), "\""));
  }
  const FamilyInfo* f = by_arch != nullptr ? by_arch : by_type;
  *architecture = f->architecture;
  return f;
}

// Which layers slide, as transformers 5 decides it, and by how much.
struct SlidingLayers {
  std::vector<int32_t> windows;  // ModelConfig::layer_window
  int32_t cap = 0;               // a family whose transformers code reads no window
};

// Sliding-window attention per family (transformers 5):
//  - Qwen2 / Qwen3: layer_types when listed, else layers i >= max_window_layers
//    when use_sliding_window; the window is sliding_window, and none unless
//    use_sliding_window (the config class sets it to None).
//  - Mistral / Phi-3: every layer when sliding_window is set (the model builds
//    one sliding mask for all); layer_types saying otherwise is refused.
//  - Gemma 3: the layers of layer_types (or of sliding_window_pattern) slide
//    by sliding_window (4096 when absent), the others attend to everything.
//    Gemma 2 the same, its layers alternating (even ones slide) by default.
//  - Llama / Gemma: their transformers code reads no window, vLLM's may: the
//    context is capped at the window, where both readings agree.
// `disable` (--disable-sliding-window) takes the cap for every family.
absl::StatusOr<SlidingLayers> SlidingWindow(const nlohmann::json& cfg, const std::string& path,
                                            const FamilyInfo& f, int32_t num_layers,
                                            int32_t max_seq_len, bool disable) {
  // Gemma 2 and 3 interleave sliding and full layers (Gemma 2: every other one).
  const bool interleaved = f.family == ModelFamily::kGemma3 || f.family == ModelFamily::kGemma2;
  // Absent: the config class's default; null: none.
  const nlohmann::json* window_key = JsonMember(cfg, "sliding_window");
  TANDEM_ASSIGN_OR_RETURN(int32_t window, GetInt(cfg, path, "sliding_window",
                                                 window_key == nullptr ? f.default_window : 0));
  if (window < 0) return Bad(path, "\"sliding_window\" is negative");
  std::optional<std::vector<bool>> types;
  if (interleaved) {
    TANDEM_ASSIGN_OR_RETURN(
        types, GemmaLayerTypes(cfg, path, num_layers, f.family == ModelFamily::kGemma2 ? 2 : 6));
  } else {
    TANDEM_ASSIGN_OR_RETURN(types, LayerTypes(cfg, path, num_layers));
  }
  const bool qwen = f.family == ModelFamily::kQwen2 || f.family == ModelFamily::kQwen3;
  if (!qwen && (IsSet(JsonMember(cfg, "use_sliding_window")) ||
                IsSet(JsonMember(cfg, "max_window_layers")))) {
    return Refuse(path, "use_sliding_window / max_window_layers are Qwen keys, not this family's");
  }
  std::vector<bool> slides(static_cast<size_t>(num_layers), window > 0);
  if (qwen) {
    TANDEM_ASSIGN_OR_RETURN(bool use, GetBool(cfg, path, "use_sliding_window", false));
    // Qwen2Config's and Qwen3Config's default.
    TANDEM_ASSIGN_OR_RETURN(int32_t max_window_layers, GetInt(cfg, path, "max_window_layers", 28));
    if (!use) window = 0;
    for (int32_t i = 0; i < num_layers; ++i) {
      slides[static_cast<size_t>(i)] =
          types ? (*types)[static_cast<size_t>(i)] : window > 0 && i >= max_window_layers;
    }
  } else if (interleaved) {
    slides = *types;
  } else if (types && *types != slides) {
    if (f.family == ModelFamily::kMistral || f.family == ModelFamily::kPhi3) {
      return Refuse(path, absl::StrCat("layer_types disagrees with sliding_window: ",
                                       f.architecture, " slides every layer when it is set"));
    }
    slides = *types;
  }
  const bool any = std::find(slides.begin(), slides.end(), true) != slides.end();
  if (!any) return SlidingLayers{};
  if (window <= 0) return Bad(path, "sliding_attention layers without a window");
  // A window at least the context slides nothing.
  if (window >= max_seq_len) return SlidingLayers{};
  if (disable || (f.family != ModelFamily::kMistral && f.family != ModelFamily::kPhi3 && !qwen &&
                  !interleaved)) {
    return SlidingLayers{.cap = window};
  }
  SlidingLayers out;
  for (bool s : slides) out.windows.push_back(s ? window : 0);
  return out;
}

// When `file_cfg` is a multimodal checkpoint of kWrappers: its text_config,
// completed as transformers builds it (the family's model_type when it has
// none; the top-level tie_word_embeddings and token ids, which transformers 5
// reads there), in *text, and *out's tensor names for its layouts. Refuses a
// top-level key that is neither the vision side's nor harmless.
absl::StatusOr<bool> Unwrap(const nlohmann::json& file_cfg, const std::string& path, HfConfig* out,
                            nlohmann::json* text) {
  const nlohmann::json* archs = JsonMember(file_cfg, "architectures");
  const nlohmann::json* type = JsonMember(file_cfg, "model_type");
  auto names = [&](const char* architecture) {
    return IsSet(archs) && archs->is_array() && archs->size() == 1 && (*archs)[0] == architecture;
  };
  const WrapperInfo* w = nullptr;
  for (const WrapperInfo& x : kWrappers) {
    if (names(x.architecture) || (IsSet(type) && *type == x.model_type)) w = &x;
  }
  if (w == nullptr) return false;
  if (IsSet(archs) && !names(w->architecture)) {
    return Bad(path, absl::StrCat("\"architectures\" ", archs->dump(),
                                  " disagrees with model_type \"", w->model_type, "\""));
  }
  if (IsSet(type) && *type != w->model_type) {
    return Bad(path, absl::StrCat("architecture \"", w->architecture,
                                  "\" disagrees with model_type ", type->dump()));
  }
  for (const auto& item : file_cfg.items()) {
    const std::string& key = item.key();
    const bool vision =
        std::find_if(w->vision_keys.begin(), w->vision_keys.end(),
                     [&](const char* k) { return key == k; }) != w->vision_keys.end();
    if (!vision && HarmlessKeys().count(key) == 0 && key != "text_config" &&
        key != "tie_word_embeddings" && key != "bos_token_id" && key != "eos_token_id") {
      return Refuse(path, absl::StrCat("config key \"", key, "\" of ", w->architecture,
                                       " is not supported (it may change the model's math; "
                                       "Tandem refuses what it cannot honour exactly)"));
    }
  }
  const nlohmann::json* nested = JsonMember(file_cfg, "text_config");
  if (!IsSet(nested) || !nested->is_object()) {
    return Bad(path, absl::StrCat(w->architecture, " without a \"text_config\" object"));
  }
  *text = *nested;
  const FamilyInfo* family = nullptr;
  for (const FamilyInfo& f : kFamilies) {
    if (f.family == w->text_family) family = &f;
  }
  if (!text->contains("model_type")) (*text)["model_type"] = family->model_type;
  if ((*text)["model_type"] != family->model_type) {
    return Refuse(path, absl::StrCat("text_config model_type ", (*text)["model_type"].dump(),
                                     " is not supported (", w->architecture, " is served with a ",
                                     family->model_type, " language model)"));
  }
  if (const nlohmann::json* inner = JsonMember(*text, "architectures");
      IsSet(inner) && *inner != nlohmann::json::array({family->architecture})) {
    return Bad(path, absl::StrCat("text_config's \"architectures\" ", inner->dump(), " is not ",
                                  family->architecture));
  }
  (*text)["architectures"] = nlohmann::json::array({family->architecture});
  for (const char* key : {"tie_word_embeddings", "bos_token_id", "eos_token_id"}) {
    const nlohmann::json* top = JsonMember(file_cfg, key);
    if (!IsSet(top)) continue;
    const nlohmann::json* inner = JsonMember(*text, key);
    if (IsSet(inner) && *inner != *top) {
      return Bad(path,
                 absl::StrCat("\"", key, "\" is ", top->dump(), " but text_config's is ",
                              inner->dump(), " (transformers' versions read one or the other)"));
    }
    (*text)[key] = *top;
  }
  out->architecture = w->architecture;
  out->text_architecture = family->architecture;
  out->text_prefixes = {"language_model.model.", "model.language_model."};
  out->head_names = {"language_model.lm_head.weight", "lm_head.weight"};
  out->unserved_prefixes = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                            "model.multi_modal_projector."};
  return true;
}

absl::Status ReadGenerationConfig(const std::string& dir, ModelConfig* c) {
  const std::string path = JoinPath(dir, "generation_config.json");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  absl::StatusOr<nlohmann::json> gen = ParseJson(text);
  if (!gen.ok()) return Annotate(gen.status(), path);
  if (!gen->is_object()) return Bad(path, "not a JSON object");
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> eos, GetIds(*gen, path, "eos_token_id"));
  for (int32_t id : eos) c->extra_eos_token_ids.push_back(id);
  GenerationDefaults& g = c->generation;
  auto opt_float = [&](const char* key, std::optional<float>* out) -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(std::optional<double> v, GetNumber(*gen, path, key));
    if (v) *out = static_cast<float>(*v);
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(opt_float("temperature", &g.temperature));
  TANDEM_RETURN_IF_ERROR(opt_float("top_p", &g.top_p));
  TANDEM_RETURN_IF_ERROR(opt_float("min_p", &g.min_p));
  TANDEM_RETURN_IF_ERROR(opt_float("repetition_penalty", &g.repetition_penalty));
  if (IsSet(JsonMember(*gen, "top_k"))) {
    TANDEM_ASSIGN_OR_RETURN(int32_t k, GetInt(*gen, path, "top_k", std::nullopt));
    g.top_k = k;
  }
  // vLLM's default max_tokens (get_diff_sampling_param renames it).
  if (IsSet(JsonMember(*gen, "max_new_tokens"))) {
    TANDEM_ASSIGN_OR_RETURN(int32_t n, GetInt(*gen, path, "max_new_tokens", std::nullopt));
    g.max_new_tokens = n;
  }
  if (absl::Status s = g.Validate(c->vocab_size); !s.ok()) return Annotate(s, path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfConfig> ReadHfConfig(const std::string& dir, const LoadOptions& options) {
  const std::string file = JoinPath(dir, "config.json");
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(file));
  absl::StatusOr<nlohmann::json> parsed = ParseJson(text);
  if (!parsed.ok()) return Annotate(parsed.status(), file);
  if (!parsed->is_object()) return Bad(file, "not a JSON object");

  HfConfig out;
  nlohmann::json unwrapped;
  TANDEM_ASSIGN_OR_RETURN(const bool wrapped, Unwrap(*parsed, file, &out, &unwrapped));
  nlohmann::json& cfg = wrapped ? unwrapped : *parsed;
  const std::string path = wrapped ? file + " text_config" : file;
  std::string picked;
  TANDEM_ASSIGN_OR_RETURN(const FamilyInfo* f, PickFamily(cfg, path, &picked));
  if (!wrapped) out.architecture = picked;
  if (f->size_defaults != nullptr) {
    const nlohmann::json defaults = nlohmann::json::parse(f->size_defaults);
    for (const auto& [key, value] : defaults.items()) {
      if (!cfg.contains(key)) cfg[key] = value;
    }
  }
  for (const auto& [key, value] : cfg.items()) {
    if (ReadKeys().count(key) == 0 && HarmlessKeys().count(key) == 0 && !IsGemma3Key(key)) {
      return Refuse(path, absl::StrCat("config key \"", key,
                                       "\" is not supported (it may change the model's math; "
                                       "Tandem refuses what it cannot honour exactly)"));
    }
  }
  // Phi-4-mini's config carries keys of its remote code that transformers'
  // Phi3 (and vLLM) read nowhere; taken at the values that mean nothing.
  for (const auto& [key, neutral] : {std::pair<const char*, nlohmann::json>{"full_attn_mod", 1},
                                     {"interpolate_factor", 1},
                                     {"lm_head_bias", false}}) {
    const nlohmann::json* v = JsonMember(cfg, key);
    if (IsSet(v) && !(f->family == ModelFamily::kPhi3 && *v == neutral)) {
      return Refuse(path, absl::StrCat("config key \"", key, "\" = ", v->dump(),
                                       " is not supported (Phi3ForCausalLM's ", neutral.dump(),
                                       " changes nothing)"));
    }
  }
  if (f->family != ModelFamily::kGemma3) {
    for (const char* key : kGemma3Keys) {
      if (f->family == ModelFamily::kGemma2 && IsGemma2Key(key)) continue;
      if (IsSet(JsonMember(cfg, key))) {
        return Refuse(path, absl::StrCat("config key \"", key, "\" is Gemma3ForCausalLM's, not ",
                                         f->architecture, "'s"));
      }
    }
  }
  if (const nlohmann::json* q = JsonMember(cfg, "quantization_config"); IsSet(q)) {
    const nlohmann::json* method = q->is_object() ? JsonMember(*q, "quant_method") : nullptr;
    return Refuse(path, absl::StrCat("quantization_config",
                                     method != nullptr && method->is_string()
                                         ? " (quant_method \"" + method->get<std::string>() + "\")"
                                         : "",
                                     " is not supported: Tandem serves unquantized checkpoints"));
  }
  if (const nlohmann::json* d = JsonMember(cfg, "torch_dtype"); d != nullptr && d->is_string()) {
    out.torch_dtype = d->get<std::string>();
  } else if (const nlohmann::json* d2 = JsonMember(cfg, "dtype");
             d2 != nullptr && d2->is_string()) {
    out.torch_dtype = d2->get<std::string>();
  }

  ModelConfig& c = out.config;
  c.family = f->family;
  c.torch_dtype = out.torch_dtype;
  c.rope_style = RopeStyle::kRotateHalf;
  TANDEM_ASSIGN_OR_RETURN(c.dim, GetInt(cfg, path, "hidden_size", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.hidden_dim, GetInt(cfg, path, "intermediate_size", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.num_layers, GetInt(cfg, path, "num_hidden_layers", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.num_heads, GetInt(cfg, path, "num_attention_heads", std::nullopt));
  // A missing key takes the config class's default; an explicit null means
  // multi-head attention, as transformers' configs turn None into
  // num_attention_heads ("for backward compatibility").
  const nlohmann::json* kv_heads = JsonMember(cfg, "num_key_value_heads");
  TANDEM_ASSIGN_OR_RETURN(
      c.num_kv_heads,
      GetInt(cfg, path, "num_key_value_heads",
             f->default_kv_heads > 0 && kv_heads == nullptr ? f->default_kv_heads : c.num_heads));
  TANDEM_ASSIGN_OR_RETURN(c.vocab_size, GetInt(cfg, path, "vocab_size", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.max_seq_len,
                          GetInt(cfg, path, "max_position_embeddings", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.bos_token_id, GetInt(cfg, path, "bos_token_id", 1));
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> eos, GetIds(cfg, path, "eos_token_id"));
  c.eos_token_id = eos.empty() ? 2 : eos.front();
  if (eos.size() > 1) c.extra_eos_token_ids.assign(eos.begin() + 1, eos.end());
  if (c.num_heads <= 0) return Bad(path, "\"num_attention_heads\" must be positive");
  const int32_t default_head =
      f->default_head_dim > 0 ? f->default_head_dim : c.dim / c.num_heads;
  if (f->default_head_dim == 0 && !IsSet(JsonMember(cfg, "head_dim")) && c.dim % c.num_heads != 0) {
    return Bad(path, absl::StrCat("hidden_size ", c.dim, " is not a multiple of ",
                                  "num_attention_heads ", c.num_heads, " and head_dim is not set"));
  }
  TANDEM_ASSIGN_OR_RETURN(c.head_size, GetInt(cfg, path, "head_dim", default_head));
  TANDEM_ASSIGN_OR_RETURN(c.norm_eps, GetFloat(cfg, path, "rms_norm_eps", f->default_eps));
  TANDEM_ASSIGN_OR_RETURN(out.tied_embeddings,
                          GetBool(cfg, path, "tie_word_embeddings", f->default_tied));
  int32_t rope_cap = 0;
  if (f->family == ModelFamily::kGemma3) {
    TANDEM_RETURN_IF_ERROR(
        ReadGemma3(cfg, path, options.max_model_len, &c, &rope_cap, &out.rope_long_factors));
  } else {
    if (f->family == ModelFamily::kGemma2) TANDEM_RETURN_IF_ERROR(ReadGemma2(cfg, path, &c));
    TANDEM_RETURN_IF_ERROR(
        ReadRope(cfg, path, options.max_model_len, &c, &rope_cap, &out.rope_long_factors));
  }
  if (rope_cap > 0) {
    c.max_seq_len = rope_cap;
    out.rope_context_cap = rope_cap;
  }

  // The activation. Gemma 2 and 3 read hidden_activation. Gemma 1: its
  // transformers 5 MLP reads hidden_act, 4.39+ read hidden_activation, and
  // google/gemma-2b and -7b say hidden_act "gelu" (exact GeLU in
  // transformers 5) though Google trained them with the tanh form, which
  // vLLM and transformers 4.39+ serve: "gelu" in Gemma 1's hidden_act is
  // read as that legacy name for tanh (logged), and a hidden_act that
  // disagrees with hidden_activation otherwise is refused. The others read
  // hidden_act.
  const ModelFamily family = f->family;
  const bool gemma = family == ModelFamily::kGemma || family == ModelFamily::kGemma2 ||
                     family == ModelFamily::kGemma3;
  auto read_act = [&](const char* key) -> absl::StatusOr<std::optional<std::string>> {
    const nlohmann::json* a = JsonMember(cfg, key);
    if (!IsSet(a)) return std::nullopt;
    if (!a->is_string()) return Bad(path, absl::StrCat("\"", key, "\" is not a string"));
    return a->get<std::string>();
  };
  auto to_activation = [&](const char* key, const std::string& act) -> absl::StatusOr<Activation> {
    if (act == "silu" || act == "swish") return Activation::kSilu;
    // gelu_new and gelu_fast are the same tanh formula (fast in another order).
    if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast") {
      return Activation::kGeluTanh;
    }
    return Refuse(path, absl::StrCat(key, " \"", act,
                                     "\" is not supported (supported: silu, gelu_pytorch_tanh)"));
  };
  TANDEM_ASSIGN_OR_RETURN(const std::optional<std::string> hidden_act, read_act("hidden_act"));
  TANDEM_ASSIGN_OR_RETURN(const std::optional<std::string> hidden_activation,
                          read_act("hidden_activation"));
  if (!gemma) {
    TANDEM_ASSIGN_OR_RETURN(c.activation, to_activation("hidden_act", hidden_act.value_or("silu")));
  } else if (family != ModelFamily::kGemma) {
    TANDEM_ASSIGN_OR_RETURN(
        c.activation,
        to_activation("hidden_activation", hidden_activation.value_or("gelu_pytorch_tanh")));
  } else {
    std::optional<Activation> from_act;
    if (hidden_act == "gelu") {
      TANDEM_LOG(WARNING) << path << ": Gemma's hidden_act \"gelu\" is served as "
                          << "gelu_pytorch_tanh, the form the model was trained with (as vLLM "
                          << "serves it; transformers 5 computes exact GeLU)";
      from_act = Activation::kGeluTanh;
    } else if (hidden_act) {
      TANDEM_ASSIGN_OR_RETURN(from_act, to_activation("hidden_act", *hidden_act));
    }
    std::optional<Activation> from_activation;
    if (hidden_activation) {
      TANDEM_ASSIGN_OR_RETURN(from_activation,
                              to_activation("hidden_activation", *hidden_activation));
    }
    if (from_act && from_activation && *from_act != *from_activation) {
      return Refuse(path, absl::StrCat("hidden_act \"", *hidden_act,
                                       "\" disagrees with hidden_activation \"", *hidden_activation,
                                       "\" (transformers 5 reads hidden_act, 4.x "
                                       "hidden_activation)"));
    }
    c.activation = from_act.value_or(from_activation.value_or(Activation::kGeluTanh));
  }

  // Biases, per family as transformers builds the modules.
  TANDEM_ASSIGN_OR_RETURN(bool attention_bias, GetBool(cfg, path, "attention_bias", false));
  TANDEM_ASSIGN_OR_RETURN(bool mlp_bias, GetBool(cfg, path, "mlp_bias", false));
  if (mlp_bias) return Refuse(path, "mlp_bias = true is not supported");
  switch (f->family) {
    case ModelFamily::kQwen2:
      c.qkv_bias = true;  // always, whatever attention_bias says
      break;
    case ModelFamily::kMistral:
    case ModelFamily::kPhi3:
      if (attention_bias) {
        return Refuse(path, absl::StrCat("attention_bias = true is not part of ",
                                         f->architecture));
      }
      break;
    default:
      c.qkv_bias = c.o_bias = attention_bias;
      break;
  }
  c.qk_norm = c.qk_norm || f->family == ModelFamily::kQwen3;
  if (gemma) {
    // transformers: inputs_embeds * tensor(hidden_size ** 0.5, dtype) (fp32 here).
    c.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.dim)));
  }

  TANDEM_ASSIGN_OR_RETURN(
      SlidingLayers sliding,
      SlidingWindow(cfg, path, *f, c.num_layers, c.max_seq_len, options.disable_sliding_window));
  c.layer_window = std::move(sliding.windows);
  if (sliding.cap > 0) {
    c.max_seq_len = sliding.cap;
    out.sliding_window_cap = sliding.cap;
  }
  TANDEM_RETURN_IF_ERROR(ReadGenerationConfig(dir, &c));
  if (absl::Status s = c.Validate(); !s.ok()) return Annotate(s, path);
  return out;
}

}  // namespace tandem::model::internal
