// Gemma 2's and Gemma 3's own config.json keys (DESIGN-NOTES "Gemma 2",
// "Gemma 3").
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hf_config_read.h"
#include "tandem/common/status.h"
#include "tandem/model/json.h"

namespace tandem::model::internal {

// Gemma 2's and 3's layer types (Gemma2Config, Gemma3TextConfig):
// layer_types when listed, else every sliding_window_pattern-th layer full
// (default: Gemma 3's 6, Gemma 2's 2) and the rest sliding. Newer configs
// save the pattern as "_sliding_window_pattern" beside layer_types.
absl::StatusOr<std::vector<bool>> GemmaLayerTypes(const nlohmann::json& cfg,
                                                  const std::string& path, int32_t num_layers,
                                                  int32_t default_pattern) {
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
  TANDEM_ASSIGN_OR_RETURN(c->local_rope_layers, GemmaLayerTypes(cfg, path, c->num_layers, 6));
  return absl::OkStatus();
}

// Gemma2ForCausalLM's own keys (Gemma2Config, transformers 5): tanh
// softcapping of the attention scores and of the final logits (50 and 30
// when the key is absent, none when it is null), and query_pre_attn_scalar
// (Gemma 2 27B's 144 against head_dim 128), folded into q_proj's weights at
// load (HfWeights::Resolve), as Gemma 3's is into its q norm.
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
  if (!(scalar > 0)) return Bad(path, "\"query_pre_attn_scalar\" must be positive");
  c->query_pre_attn_scalar = scalar == static_cast<float>(c->head_size) ? 0.0f : scalar;
  return absl::OkStatus();
}

}  // namespace tandem::model::internal
