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
};

constexpr FamilyInfo kFamilies[] = {
    {ModelFamily::kLlama, "LlamaForCausalLM", "llama", 0, 0, 1e-6f, false},
    {ModelFamily::kMistral, "MistralForCausalLM", "mistral", 0, 8, 1e-6f, false},
    {ModelFamily::kQwen2, "Qwen2ForCausalLM", "qwen2", 0, 32, 1e-6f, false},
    {ModelFamily::kQwen3, "Qwen3ForCausalLM", "qwen3", 128, 32, 1e-6f, false},
    {ModelFamily::kPhi3, "Phi3ForCausalLM", "phi3", 0, 0, 1e-5f, false},
    {ModelFamily::kGemma, "GemmaForCausalLM", "gemma", 256, 16, 1e-6f, true},
    {ModelFamily::kGemma2, "Gemma2ForCausalLM", "gemma2", 256, 4, 1e-6f, true},
    {ModelFamily::kGemma3, "Gemma3ForCausalLM", "gemma3_text", 256, 4, 1e-6f, true},
};

std::string SupportedArchitectures() {
  std::vector<std::string> names;
  for (const FamilyInfo& f : kFamilies) names.push_back(f.architecture);
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

// A list of positive numbers, one per rotated pair (longrope's factors).
absl::StatusOr<std::vector<float>> GetFactors(const nlohmann::json& obj, const std::string& path,
                                              const std::string& key, int32_t pairs) {
  const nlohmann::json* v = JsonMember(obj, key);
  if (!IsSet(v)) return Bad(path, absl::StrCat("missing \"", key, "\""));
  if (!v->is_array() || static_cast<int32_t>(v->size()) != pairs) {
    return Bad(path,
               absl::StrCat("\"", key, "\" must list ", pairs, " numbers (rotated elements / 2)"));
  }
  std::vector<float> out;
  for (const nlohmann::json& x : *v) {
    if (!x.is_number() || !(x.get<double>() > 0)) {
      return Bad(path, absl::StrCat("\"", key, "\" holds a value that is not a positive number"));
    }
    out.push_back(static_cast<float>(x.get<double>()));
  }
  return out;
}

// yarn's attention factor (transformers' get_mscale): explicit, else from
// mscale / mscale_all_dim when both are set, else 0.1 ln(factor) + 1.
absl::StatusOr<float> YarnAttentionFactor(const nlohmann::json& rope, const std::string& where,
                                          double factor) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> explicit_factor,
                          GetNumber(rope, where, "attention_factor"));
  if (explicit_factor) return static_cast<float>(*explicit_factor);
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> mscale, GetNumber(rope, where, "mscale"));
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> mscale_all_dim,
                          GetNumber(rope, where, "mscale_all_dim"));
  auto get_mscale = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  if (mscale.value_or(0) != 0 && mscale_all_dim.value_or(0) != 0) {
    return static_cast<float>(get_mscale(*mscale) / get_mscale(*mscale_all_dim));
  }
  return static_cast<float>(get_mscale(1.0));
}

// partial_rotary_factor, top-level or in the rope dict (transformers 5 moves
// it there): RoPE over the first int(head_dim * factor) elements of a head.
// Only Phi3's transformers code slices the head (the others would fail).
absl::Status ReadPartialRotary(const nlohmann::json& cfg, const nlohmann::json* rope,
                               const std::string& path, ModelConfig* c) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> top, GetNumber(cfg, path, "partial_rotary_factor"));
  std::optional<double> inner;
  if (rope != nullptr && rope->is_object()) {
    TANDEM_ASSIGN_OR_RETURN(inner, GetNumber(*rope, path, "partial_rotary_factor"));
  }
  if (top && inner && *top != *inner) {
    return Bad(path, absl::StrCat("partial_rotary_factor ", *top,
                                  " disagrees with the rope parameters' ", *inner));
  }
  const double factor = top ? *top : inner.value_or(1.0);
  if (factor == 1.0) return absl::OkStatus();
  if (c->family != ModelFamily::kPhi3) {
    return Refuse(path, absl::StrCat("partial_rotary_factor ", factor,
                                     " is not supported for this family (only Phi3ForCausalLM "
                                     "rotates part of a head)"));
  }
  // Python's int(): toward zero.
  const double dim = std::trunc(static_cast<double>(c->head_size) * factor);
  if (!(factor > 0 && factor < 1) || dim < 2 || std::fmod(dim, 2.0) != 0) {
    return Bad(path, absl::StrCat(
                         "partial_rotary_factor ", factor, " of head_dim ", c->head_size, " gives ",
                         dim, " rotated elements; an even number from 2 to head_dim is needed"));
  }
  c->rotary_dim = static_cast<int32_t>(dim);
  return absl::OkStatus();
}

// RoPE: rope_parameters (transformers 5) or rope_theta + rope_scaling (4.x).
// Sets *context_cap when the scaling is only exact up to a shorter context
// (longrope), or *long_factors when max_model_len asks past it.
absl::Status ReadRope(const nlohmann::json& cfg, const std::string& path, int32_t max_model_len,
                      ModelConfig* c, int32_t* context_cap, bool* long_factors) {
  const nlohmann::json* params = JsonMember(cfg, "rope_parameters");
  const nlohmann::json* scaling = JsonMember(cfg, "rope_scaling");
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> top_theta, GetNumber(cfg, path, "rope_theta"));
  const nlohmann::json* rope = nullptr;
  const char* rope_key = "";
  if (IsSet(params)) {
    if (IsSet(scaling)) {
      return Bad(path, "both \"rope_parameters\" and \"rope_scaling\" are set: which one holds?");
    }
    rope = params;
    rope_key = "rope_parameters";
  } else if (IsSet(scaling)) {
    rope = scaling;
    rope_key = "rope_scaling";
  }
  if (top_theta) c->rope_theta = static_cast<float>(*top_theta);
  TANDEM_RETURN_IF_ERROR(ReadPartialRotary(cfg, rope, path, c));
  if (rope == nullptr) return absl::OkStatus();
  if (!rope->is_object()) return Bad(path, absl::StrCat("\"", rope_key, "\" is not an object"));
  const std::string where = absl::StrCat(path, " ", rope_key);
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> theta, GetNumber(*rope, where, "rope_theta"));
  if (theta) {
    if (top_theta && static_cast<float>(*top_theta) != static_cast<float>(*theta)) {
      return Bad(path, absl::StrCat("rope_theta ", *top_theta, " disagrees with ", rope_key,
                                    ".rope_theta ", *theta));
    }
    c->rope_theta = static_cast<float>(*theta);
  }
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (const nlohmann::json* t = JsonMember(*rope, key); IsSet(t)) {
      if (!t->is_string()) return Bad(where, absl::StrCat("\"", key, "\" is not a string"));
      type = t->get<std::string>();
    }
  }
  // Phi3Config renames the older "su" to "longrope".
  if (type == "su" && c->family == ModelFamily::kPhi3) type = "longrope";

  // The pretraining context of llama3, yarn and longrope (transformers 5's
  // standardize_rope_params): a top-level original_max_position_embeddings
  // wins (Phi3Config always has one, 4096 by default), then the rope dict's,
  // then max_position_embeddings.
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> top_original,
                          GetNumber(cfg, path, "original_max_position_embeddings"));
  auto original_max = [&]() -> absl::StatusOr<int32_t> {
    if (top_original || c->family == ModelFamily::kPhi3) {
      return GetInt(cfg, path, "original_max_position_embeddings", 4096);
    }
    return GetInt(*rope, where, "original_max_position_embeddings", c->max_seq_len);
  };

  std::set<std::string> allowed = {"rope_type", "type", "rope_theta"};
  RopeScaling& rs = c->rope_scaling;
  if (type == "default") {
    rs.type = RopeScaling::Type::kNone;
  } else if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
    TANDEM_ASSIGN_OR_RETURN(rs.factor, GetFloat(*rope, where, "factor", 0.0f));
    allowed.insert("factor");
  } else if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    TANDEM_ASSIGN_OR_RETURN(rs.factor, GetFloat(*rope, where, "factor", 0.0f));
    TANDEM_ASSIGN_OR_RETURN(rs.low_freq_factor, GetFloat(*rope, where, "low_freq_factor", 0.0f));
    TANDEM_ASSIGN_OR_RETURN(rs.high_freq_factor,
                            GetFloat(*rope, where, "high_freq_factor", 0.0f));
    if (!top_original && !IsSet(JsonMember(*rope, "original_max_position_embeddings"))) {
      return Bad(where, "missing \"original_max_position_embeddings\"");
    }
    TANDEM_ASSIGN_OR_RETURN(rs.original_max_position_embeddings, original_max());
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings"});
  } else if (type == "yarn") {
    // transformers' _compute_yarn_parameters; exact at every length.
    if (c->family == ModelFamily::kPhi3) {
      return Refuse(where,
                    "rope_type \"yarn\" in a Phi3 config (transformers 4 reads it as "
                    "longrope, transformers 5 as yarn)");
    }
    rs.type = RopeScaling::Type::kYarn;
    TANDEM_ASSIGN_OR_RETURN(rs.original_max_position_embeddings, original_max());
    TANDEM_ASSIGN_OR_RETURN(std::optional<double> factor, GetNumber(*rope, where, "factor"));
    const double f = factor ? *factor
                            : static_cast<double>(c->max_seq_len) /
                                  std::max(rs.original_max_position_embeddings, 1);
    if (!(f >= 1)) return Bad(where, absl::StrCat("yarn factor ", f, " is below 1"));
    rs.factor = static_cast<float>(f);
    TANDEM_ASSIGN_OR_RETURN(rs.attention_factor, YarnAttentionFactor(*rope, where, f));
    // `beta_fast or 32`, `beta_slow or 1`: 0 takes the default too.
    TANDEM_ASSIGN_OR_RETURN(std::optional<double> fast, GetNumber(*rope, where, "beta_fast"));
    TANDEM_ASSIGN_OR_RETURN(std::optional<double> slow, GetNumber(*rope, where, "beta_slow"));
    rs.beta_fast = fast.value_or(0) != 0 ? *fast : 32.0;
    rs.beta_slow = slow.value_or(0) != 0 ? *slow : 1.0;
    if (!(rs.beta_fast > 0) || !(rs.beta_slow > 0)) {
      return Bad(where, "yarn beta_fast and beta_slow must be positive");
    }
    TANDEM_ASSIGN_OR_RETURN(rs.truncate, GetBool(*rope, where, "truncate", true));
    // The context vLLM derives: the pretraining context times the factor.
    const double scaled =
        static_cast<double>(IsSet(JsonMember(*rope, "original_max_position_embeddings"))
                                ? rs.original_max_position_embeddings
                                : c->max_seq_len) *
        f;
    if (scaled > INT32_MAX)
      return Bad(where, absl::StrCat("yarn context ", scaled, " is too long"));
    c->max_seq_len = static_cast<int32_t>(scaled);
    allowed.insert({"factor", "attention_factor", "beta_fast", "beta_slow", "mscale",
                    "mscale_all_dim", "truncate", "original_max_position_embeddings"});
  } else if (type == "longrope") {
    // transformers' _compute_longrope_parameters. Its short factors serve
    // sequences of up to original_max_position_embeddings; past that it
    // switches every later forward to the long factors while the cache keeps
    // keys rotated by the short ones, so a token's K/V would depend on how
    // long its sequence grew. The context is capped where the short factors
    // hold (what vLLM does when max_model_len <= the original context).
    // A max_model_len past it takes vLLM's other choice: the long factors
    // for every position, which is what transformers computes for a prompt
    // longer than the original context, not for a shorter one.
    rs.type = RopeScaling::Type::kLongRope;
    TANDEM_ASSIGN_OR_RETURN(rs.original_max_position_embeddings, original_max());
    if (rs.original_max_position_embeddings <= 0) {
      return Bad(where, "original_max_position_embeddings must be positive");
    }
    const int32_t pairs = c->RotaryDim() / 2;
    TANDEM_ASSIGN_OR_RETURN(std::vector<float> short_factor,
                            GetFactors(*rope, where, "short_factor", pairs));
    TANDEM_ASSIGN_OR_RETURN(std::vector<float> long_factor,
                            GetFactors(*rope, where, "long_factor", pairs));
    *long_factors = max_model_len > rs.original_max_position_embeddings;
    rs.ext_factors = *long_factors ? std::move(long_factor) : std::move(short_factor);
    TANDEM_ASSIGN_OR_RETURN(std::optional<double> factor, GetNumber(*rope, where, "factor"));
    const double f =
        factor ? *factor
               : static_cast<double>(c->max_seq_len) / rs.original_max_position_embeddings;
    rs.factor = static_cast<float>(f);
    TANDEM_ASSIGN_OR_RETURN(std::optional<double> attention,
                            GetNumber(*rope, where, "attention_factor"));
    rs.attention_factor = static_cast<float>(
        attention ? *attention
        : f <= 1  ? 1.0
                  : std::sqrt(1 + std::log(f) / std::log(static_cast<double>(
                                                   rs.original_max_position_embeddings))));
    if (!*long_factors && c->max_seq_len > rs.original_max_position_embeddings) {
      *context_cap = rs.original_max_position_embeddings;
    }
    allowed.insert({"short_factor", "long_factor", "factor", "attention_factor",
                    "original_max_position_embeddings"});
  } else {
    // dynamic (NTK): its frequencies change with each forward's length.
    return Refuse(path, absl::StrCat(rope_key, " rope_type \"", type,
                                     "\" is not supported (supported: default, linear, llama3, "
                                     "yarn, longrope)"));
  }
  for (const auto& [key, value] : rope->items()) {
    if (key == "partial_rotary_factor") continue;  // ReadPartialRotary's
    if (allowed.count(key) == 0 && !value.is_null()) {
      return Refuse(path, absl::StrCat(rope_key, " key \"", key, "\" is not supported for rope_type \"",
                                       type, "\""));
    }
  }
  return absl::OkStatus();
}

// Which layers slide, as transformers 5 decides it, and by how much.
struct SlidingLayers {
  std::vector<int32_t> windows;  // ModelConfig::layer_window
  int32_t cap = 0;               // a family whose transformers code reads no window
};

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

// Gemma 3's layer types (Gemma3TextConfig): layer_types when listed, else
// every sliding_window_pattern-th layer (default 6) full and the rest
// sliding. Newer configs save the pattern as "_sliding_window_pattern"
// beside layer_types.
absl::StatusOr<std::vector<bool>> Gemma3LayerTypes(const nlohmann::json& cfg,
                                                   const std::string& path, int32_t num_layers,
                                                   int32_t default_pattern = 6) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::vector<bool>> types,
                          LayerTypes(cfg, path, num_layers));
  if (types) return std::move(*types);
  TANDEM_ASSIGN_OR_RETURN(int32_t saved, GetInt(cfg, path, "_sliding_window_pattern", 0));
  TANDEM_ASSIGN_OR_RETURN(int32_t pattern, GetInt(cfg, path, "sliding_window_pattern", 0));
  if (pattern != 0 && saved != 0 && pattern != saved) {
    return Bad(path, "\"sliding_window_pattern\" and \"_sliding_window_pattern\" disagree");
  }
  if (!IsSet(JsonMember(cfg, "sliding_window_pattern"))) {
    pattern = IsSet(JsonMember(cfg, "_sliding_window_pattern")) ? saved : default_pattern;
  }
  if (pattern <= 0) return Bad(path, "\"sliding_window_pattern\" must be positive");
  std::vector<bool> slides;
  for (int32_t i = 0; i < num_layers; ++i) slides.push_back((i + 1) % pattern != 0);
  return slides;
}

// Gemma3ForCausalLM's own keys and its two RoPEs (Gemma3TextConfig,
// transformers 5): the full-attention layers rotate by rope_theta (default
// 1e6) and rope_scaling, the sliding ones by rope_local_base_freq (default
// 1e4) unscaled; transformers 5 writes them as rope_parameters
// {"full_attention": {...}, "sliding_attention": {...}}. Softcapping and
// bidirectional attention are refused.
absl::Status ReadGemma3(const nlohmann::json& cfg, const std::string& path, int32_t max_model_len,
                        ModelConfig* c, int32_t* context_cap, bool* long_factors) {
  c->qk_norm = true;
  c->sandwich_norms = true;
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    if (IsSet(JsonMember(cfg, key))) {
      return Refuse(path, absl::StrCat("\"", key,
                                       "\" (tanh softcapping, Gemma 2's) is not "
                                       "supported"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(bool bidirectional,
                          GetBool(cfg, path, "use_bidirectional_attention", false));
  if (bidirectional) {
    return Refuse(path,
                  "use_bidirectional_attention = true (an encoder, not a causal LM) is not "
                  "supported");
  }
  TANDEM_ASSIGN_OR_RETURN(float scalar, GetFloat(cfg, path, "query_pre_attn_scalar", 256.0f));
  if (!(scalar > 0)) return Bad(path, "\"query_pre_attn_scalar\" must be positive");
  c->query_pre_attn_scalar = scalar == static_cast<float>(c->head_size) ? 0.0f : scalar;

  TANDEM_ASSIGN_OR_RETURN(std::optional<double> local_base,
                          GetNumber(cfg, path, "rope_local_base_freq"));
  nlohmann::json global = cfg;  // what ReadRope reads for the full-attention layers
  const nlohmann::json* params = JsonMember(cfg, "rope_parameters");
  if (IsSet(params) && params->is_object() &&
      (params->contains("full_attention") || params->contains("sliding_attention"))) {
    for (const auto& [key, value] : params->items()) {
      if (key != "full_attention" && key != "sliding_attention") {
        return Refuse(path, absl::StrCat("rope_parameters key \"", key,
                                         "\" (Gemma 3 keys them by layer type)"));
      }
    }
    const nlohmann::json* full = JsonMember(*params, "full_attention");
    if (IsSet(full)) {
      global["rope_parameters"] = *full;
    } else {
      global.erase("rope_parameters");
    }
    if (const nlohmann::json* local = JsonMember(*params, "sliding_attention"); IsSet(local)) {
      const std::string where = path + " rope_parameters.sliding_attention";
      if (!local->is_object()) return Bad(where, "not an object");
      for (const auto& [key, value] : local->items()) {
        const bool default_type =
            (key == "rope_type" || key == "type") && value.is_string() && value == "default";
        if (key != "rope_theta" && !default_type && !value.is_null()) {
          return Refuse(where, absl::StrCat("key \"", key, "\" = ", value.dump(),
                                            " is not supported (the local layers' RoPE is "
                                            "transformers' default)"));
        }
      }
      TANDEM_ASSIGN_OR_RETURN(std::optional<double> theta, GetNumber(*local, where, "rope_theta"));
      if (theta && local_base && static_cast<float>(*theta) != static_cast<float>(*local_base)) {
        return Bad(path, absl::StrCat("rope_local_base_freq ", *local_base,
                                      " disagrees with rope_parameters.sliding_attention's "
                                      "rope_theta ",
                                      *theta));
      }
      if (theta) local_base = theta;
    }
  }
  c->local_rope_theta = static_cast<float>(local_base.value_or(10000.0));
  c->rope_theta = 1e6f;  // Gemma3TextConfig's, unless config.json says otherwise
  TANDEM_RETURN_IF_ERROR(ReadRope(global, path, max_model_len, c, context_cap, long_factors));
  if (c->rope_scaling.ScalesAttention()) {
    return Refuse(path,
                  "yarn and longrope scaling of Gemma 3's full-attention layers are not "
                  "supported (their attention factor would reach its local layers)");
  }
  TANDEM_ASSIGN_OR_RETURN(c->local_rope_layers, Gemma3LayerTypes(cfg, path, c->num_layers));
  return absl::OkStatus();
}

// Gemma2ForCausalLM's own keys (Gemma2Config, transformers 5): tanh
// softcapping of the attention scores and of the final logits (50 and 30
// when the key is absent, none when it is null), and query_pre_attn_scalar,
// which only head_dim can be here (Gemma 2 has no q norm to fold it into).
absl::Status ReadGemma2(const nlohmann::json& cfg, const std::string& path, ModelConfig* c) {
  c->sandwich_norms = true;
  for (auto [key, fallback, out] : {std::tuple<const char*, float, float*>{
                                        "attn_logit_softcapping", 50.0f, &c->attn_logit_softcap},
                                    {"final_logit_softcapping", 30.0f, &c->final_logit_softcap}}) {
    const nlohmann::json* v = JsonMember(cfg, key);
    if (v == nullptr) {
      *out = fallback;
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(*out, GetFloat(cfg, path, key, 0.0f));
    if (v->is_number() && !(*out > 0)) {
      return Bad(path, absl::StrCat("\"", key, "\" must be positive (null: none)"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(float scalar, GetFloat(cfg, path, "query_pre_attn_scalar", 256.0f));
  if (scalar != static_cast<float>(c->head_size)) {
    return Refuse(path,
                  absl::StrCat("query_pre_attn_scalar ", scalar, " != head_dim ", c->head_size,
                               " is not supported for Gemma2ForCausalLM "
                               "(Gemma 2 27B; it has no q norm to fold the scale into)"));
  }
  return absl::OkStatus();
}

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
  const bool gemma3 = f.family == ModelFamily::kGemma3 || f.family == ModelFamily::kGemma2;
  TANDEM_ASSIGN_OR_RETURN(int32_t window, GetInt(cfg, path, "sliding_window", gemma3 ? 4096 : 0));
  if (window < 0) return Bad(path, "\"sliding_window\" is negative");
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::vector<bool>> types,
                          LayerTypes(cfg, path, num_layers));
  if (gemma3) {
    TANDEM_ASSIGN_OR_RETURN(
        types, Gemma3LayerTypes(cfg, path, num_layers, f.family == ModelFamily::kGemma2 ? 2 : 6));
  }
  const bool qwen = f.family == ModelFamily::kQwen2 || f.family == ModelFamily::kQwen3;
  if (!qwen && (IsSet(JsonMember(cfg, "use_sliding_window")) ||
                IsSet(JsonMember(cfg, "max_window_layers")))) {
    return Refuse(path, "use_sliding_window / max_window_layers are Qwen keys, not this family's");
  }
  std::vector<bool> slides(static_cast<size_t>(num_layers), window > 0);
  if (qwen) {
    TANDEM_ASSIGN_OR_RETURN(bool use, GetBool(cfg, path, "use_sliding_window", false));
    TANDEM_ASSIGN_OR_RETURN(int32_t max_window_layers,
                            GetInt(cfg, path, "max_window_layers", num_layers));
    if (!use) window = 0;
    for (int32_t i = 0; i < num_layers; ++i) {
      slides[static_cast<size_t>(i)] =
          types ? (*types)[static_cast<size_t>(i)] : window > 0 && i >= max_window_layers;
    }
  } else if (gemma3) {
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
  if (disable ||
      (f.family != ModelFamily::kMistral && f.family != ModelFamily::kPhi3 && !qwen && !gemma3)) {
    return SlidingLayers{.cap = window};
  }
  SlidingLayers out;
  for (bool s : slides) out.windows.push_back(s ? window : 0);
  return out;
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
  if (absl::Status s = g.Validate(c->vocab_size); !s.ok()) return Annotate(s, path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfConfig> ReadHfConfig(const std::string& dir, const LoadOptions& options) {
  const std::string path = JoinPath(dir, "config.json");
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  absl::StatusOr<nlohmann::json> parsed = ParseJson(text);
  if (!parsed.ok()) return Annotate(parsed.status(), path);
  const nlohmann::json& cfg = *parsed;
  if (!cfg.is_object()) return Bad(path, "not a JSON object");

  HfConfig out;
  TANDEM_ASSIGN_OR_RETURN(const FamilyInfo* f, PickFamily(cfg, path, &out.architecture));
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
  TANDEM_ASSIGN_OR_RETURN(
      c.num_kv_heads,
      GetInt(cfg, path, "num_key_value_heads",
             f->default_kv_heads > 0 ? f->default_kv_heads : c.num_heads));
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

  // The activation: Gemma's MLP reads hidden_activation (its hidden_act is
  // a leftover that transformers ignores); the others read hidden_act.
  const bool gemma = f->family == ModelFamily::kGemma || f->family == ModelFamily::kGemma2 ||
                     f->family == ModelFamily::kGemma3;
  const char* act_key = gemma ? "hidden_activation" : "hidden_act";
  std::string act = gemma ? "gelu_pytorch_tanh" : "silu";
  if (const nlohmann::json* a = JsonMember(cfg, act_key); IsSet(a)) {
    if (!a->is_string()) return Bad(path, absl::StrCat("\"", act_key, "\" is not a string"));
    act = a->get<std::string>();
  }
  if (act == "silu" || act == "swish") {
    c.activation = Activation::kSilu;
  } else if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast") {
    // gelu_new and gelu_fast are the same tanh formula (fast in another order).
    c.activation = Activation::kGeluTanh;
  } else {
    return Refuse(path, absl::StrCat(act_key, " \"", act,
                                     "\" is not supported (supported: silu, gelu_pytorch_tanh)"));
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
