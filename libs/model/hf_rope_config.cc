// RoPE in config.json, as transformers 5 reads it: the frequencies'
// types, their keys, partial RoPE and the context they are exact over.
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

namespace {

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

}  // namespace

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
  // rope_type, or the older "type" (transformers reads rope_type first);
  // both, disagreeing, are refused.
  std::string type = "default";
  std::optional<std::string> named;
  for (const char* key : {"rope_type", "type"}) {
    if (const nlohmann::json* t = JsonMember(*rope, key); IsSet(t)) {
      if (!t->is_string()) return Bad(where, absl::StrCat("\"", key, "\" is not a string"));
      if (named && *named != t->get<std::string>()) {
        return Bad(where, absl::StrCat("rope_type \"", *named, "\" disagrees with type \"",
                                       t->get<std::string>(), "\""));
      }
      named = t->get<std::string>();
    }
  }
  if (named) type = *named;
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
    TANDEM_ASSIGN_OR_RETURN(rs.high_freq_factor, GetFloat(*rope, where, "high_freq_factor", 0.0f));
    if (!top_original && !IsSet(JsonMember(*rope, "original_max_position_embeddings"))) {
      return Bad(where, "missing \"original_max_position_embeddings\"");
    }
    TANDEM_ASSIGN_OR_RETURN(rs.original_max_position_embeddings, original_max());
    allowed.insert(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
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
      return Refuse(path, absl::StrCat(rope_key, " key \"", key,
                                       "\" is not supported for rope_type \"", type, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::model::internal
