// stream_options of a completion request (openai_parse.h).
#include "absl/strings/str_cat.h"
#include "openai_parse.h"

namespace tandem::frontend::internal {

// stream_options: OpenAI's include_usage and include_obfuscation (false
// only: no obfuscation field is written), vLLM's continuous_usage_stats.
// Errors name the field as stream_options.<key>.
std::optional<ApiError> ParseStreamOptions(const Json& options, CompletionRequest* out) {
  auto flag = [&](const char* key, std::optional<bool>* value) -> std::optional<ApiError> {
    auto it = options.find(key);
    if (it == options.end() || it->is_null()) return std::nullopt;
    const std::string name = absl::StrCat("stream_options.", key);
    if (!it->is_boolean()) return BadRequest(absl::StrCat("'", name, "' must be a boolean"), name);
    *value = it->get<bool>();
    return std::nullopt;
  };
  std::optional<bool> include_usage, continuous, obfuscation;
  if (auto e = flag("include_usage", &include_usage)) return e;
  if (auto e = flag("continuous_usage_stats", &continuous)) return e;
  if (auto e = flag("include_obfuscation", &obfuscation)) return e;
  if (obfuscation.value_or(false)) {
    return BadRequest(
        "'stream_options.include_obfuscation' is not supported: chunks carry no obfuscation "
        "field (send false)",
        "stream_options.include_obfuscation");
  }
  out->include_usage = include_usage.value_or(continuous.value_or(false));
  out->continuous_usage = out->include_usage && continuous.value_or(false);
  return std::nullopt;
}

}  // namespace tandem::frontend::internal
