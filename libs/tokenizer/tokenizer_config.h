// What tokenizer_config.json contributes (private).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer::internal {

struct TokenizerConfig {
  // Token texts; a {"content": ...} object counts by its content.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> unk_token;
  std::optional<std::string> pad_token;
  std::vector<std::string> additional_special_tokens;
  // A string, or from a list of named templates the one named "default".
  std::optional<std::string> chat_template;
  // From such a list, the one named "tool_use" (transformers renders it for
  // a request with tools).
  std::optional<std::string> tool_use_chat_template;
  std::optional<bool> clean_up_tokenization_spaces;
  // transformers 5 (TokenizersBackend): when the file names either, the
  // post-processor becomes [bos_token if add_bos_token] $A [eos_token if
  // add_eos_token], the one not named false.
  bool names_add_bos_or_eos = false;
  bool add_bos_token = false;
  bool add_eos_token = false;
};

// Parses the file's text; `name` names it in errors.
absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(const std::string& name,
                                                     const std::string& text);

// A processor's chat_template.json ({"chat_template": "..."}): its template,
// nullopt when it has none.
absl::StatusOr<std::optional<std::string>> ParseProcessorChatTemplate(const std::string& name,
                                                                      const std::string& text);

// Whether a model's config.json describes a multimodal model (a
// vision_config beside its text model's): its processor's template is the
// one vLLM renders. False for text that is not such a JSON object.
bool IsMultimodalModelConfig(const std::string& text);

}  // namespace tandem::tokenizer::internal
