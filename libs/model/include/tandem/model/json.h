// How the model loaders read JSON (config.json, generation_config.json,
// safetensors headers and index files): with nlohmann::json, the library the
// tokenizer and the frontend read JSON with, behind two helpers that give
// the loaders' errors their shape. The loaders' own reader (libs/model/json.cc)
// is gone (issue 34): one JSON library in the tree.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::model {

// Nesting deeper than this is refused: no file the loaders read nests more
// than 4 deep, and a hostile header should not build a deep tree.
inline constexpr int kMaxJsonDepth = 64;

// The document `text`, or INVALID_ARGUMENT "JSON parse error at byte N:
// <what nlohmann says>" (or "... nested deeper than 64"; a number past a
// double's range: "JSON parse error: <what nlohmann says>"). Never throws.
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text);

// Member `key` of `object`, or nullptr when `object` is not an object or has
// no such member.
const nlohmann::json* JsonMember(const nlohmann::json& object, std::string_view key);

}  // namespace tandem::model
