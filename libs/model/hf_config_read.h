// Private: what hf_config.cc, hf_rope_config.cc and hf_gemma_config.cc share
// to read config.json: typed getters whose errors name the file and key
// (INVALID_ARGUMENT for a malformed value, Refuse's UNIMPLEMENTED for one
// Tandem cannot honour), and the readers each file defines for the others.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tandem/model/model.h"

namespace tandem::model::internal {

absl::Status Refuse(const std::string& path, const std::string& what);
absl::Status Bad(const std::string& path, const std::string& what);
// Present and not null.
bool IsSet(const nlohmann::json* v);
// Absent or null: nullopt (GetInt: `fallback`, or an error without one).
absl::StatusOr<std::optional<double>> GetNumber(const nlohmann::json& obj, const std::string& path,
                                                const std::string& key);
absl::StatusOr<int32_t> GetInt(const nlohmann::json& obj, const std::string& path,
                               const std::string& key, std::optional<int32_t> fallback);
absl::StatusOr<float> GetFloat(const nlohmann::json& obj, const std::string& path,
                               const std::string& key, float fallback);
absl::StatusOr<bool> GetBool(const nlohmann::json& obj, const std::string& path,
                             const std::string& key, bool fallback);
// layer_types, when the config lists them: true for "sliding_attention".
absl::StatusOr<std::optional<std::vector<bool>>> LayerTypes(const nlohmann::json& cfg,
                                                            const std::string& path,
                                                            int32_t num_layers);

// hf_rope_config.cc: RoPE, rope_parameters (transformers 5) or rope_theta +
// rope_scaling (4.x), into c's rope fields. Sets *context_cap when the
// scaling is only exact up to a shorter context (longrope), or
// *long_factors when max_model_len asks past it.
absl::Status ReadRope(const nlohmann::json& cfg, const std::string& path, int32_t max_model_len,
                      ModelConfig* c, int32_t* context_cap, bool* long_factors);

// hf_gemma_config.cc: Gemma 2's and 3's own keys (see there).
absl::StatusOr<std::vector<bool>> GemmaLayerTypes(const nlohmann::json& cfg,
                                                  const std::string& path, int32_t num_layers,
                                                  int32_t default_pattern);
absl::Status ReadGemma3(const nlohmann::json& cfg, const std::string& path, int32_t max_model_len,
                        ModelConfig* c, int32_t* context_cap, bool* long_factors);
absl::Status ReadGemma2(const nlohmann::json& cfg, const std::string& path, ModelConfig* c);

}  // namespace tandem::model::internal
