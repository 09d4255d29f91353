#include "tokenizer_config.h"

#include "absl/strings/str_cat.h"
#include "hf_components.h"

namespace tandem::tokenizer::internal {
namespace {

// A token given as "text" or {"content": "text", ...}; nullopt for null.
absl::StatusOr<std::optional<std::string>> TokenText(const Json& json, const std::string& where) {
  if (json.is_null()) return std::nullopt;
  if (json.is_string()) return json.get<std::string>();
  if (json.is_object() && json.contains("content") && json["content"].is_string()) {
    return json["content"].get<std::string>();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, " is neither a string nor {\"content\": string}"));
}

// The JSON object in `text`; `name` names the file in errors.
absl::StatusOr<Json> ParseObject(const std::string& name, const std::string& text) {
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not valid JSON at byte ", e.byte, ": ", e.what()));
  } catch (const Json::exception& e) {  // e.g. out_of_range: a number beyond double
    return absl::InvalidArgumentError(absl::StrCat(name, ": not valid JSON: ", e.what()));
  }
  if (!json.is_object()) return absl::InvalidArgumentError(absl::StrCat(name, ": not an object"));
  return json;
}

}  // namespace

absl::StatusOr<std::optional<std::string>> ParseProcessorChatTemplate(const std::string& name,
                                                                      const std::string& text) {
  absl::StatusOr<Json> json = ParseObject(name, text);
  if (!json.ok()) return json.status();
  const auto it = json->find("chat_template");
  if (it == json->end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": \"chat_template\" is not a string"));
  }
  return it->get<std::string>();
}

bool IsMultimodalModelConfig(const std::string& text) {
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return json.is_object() && json.contains("vision_config");
}

absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(const std::string& name,
                                                     const std::string& text) {
  absl::StatusOr<Json> parsed = ParseObject(name, text);
  if (!parsed.ok()) return parsed.status();
  Json& json = *parsed;
  TokenizerConfig config;
  for (const auto& [key, target] :
       {std::pair{"bos_token", &config.bos_token}, std::pair{"eos_token", &config.eos_token},
        std::pair{"unk_token", &config.unk_token}, std::pair{"pad_token", &config.pad_token}}) {
    if (!json.contains(key)) continue;
    absl::StatusOr<std::optional<std::string>> t =
        TokenText(json[key], absl::StrCat(name, ": ", key));
    if (!t.ok()) return t.status();
    *target = *t;
  }
  if (const auto it = json.find("additional_special_tokens"); it != json.end() && it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      absl::StatusOr<std::optional<std::string>> t =
          TokenText((*it)[i], absl::StrCat(name, ": additional_special_tokens[", i, "]"));
      if (!t.ok()) return t.status();
      if (*t) config.additional_special_tokens.push_back(**t);
    }
  }
  if (const auto it = json.find("chat_template"); it != json.end() && !it->is_null()) {
    if (it->is_string()) {
      config.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      for (const Json& entry : *it) {
        if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) {
          continue;
        }
        const std::string named = entry.value("name", "");
        if (named == "default") config.chat_template = entry["template"].get<std::string>();
        if (named == "tool_use") {
          config.tool_use_chat_template = entry["template"].get<std::string>();
        }
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": chat_template is neither a string nor a list of templates"));
    }
  }
  if (const auto it = json.find("clean_up_tokenization_spaces");
      it != json.end() && it->is_boolean()) {
    config.clean_up_tokenization_spaces = it->get<bool>();
  }
  for (const auto& [key, target] : {std::pair{"add_bos_token", &config.add_bos_token},
                                    std::pair{"add_eos_token", &config.add_eos_token}}) {
    const auto it = json.find(key);
    if (it == json.end()) continue;
    config.names_add_bos_or_eos = true;
    if (it->is_null()) continue;  // transformers reads null as false
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": \"", key, "\" is not a boolean"));
    }
    *target = it->get<bool>();
  }
  // transformers' split_special_tokens encodes special tokens' text as
  // ordinary text; not built.
  if (const auto it = json.find("split_special_tokens");
      it != json.end() && !it->is_null() && *it != Json(false)) {
    return absl::UnimplementedError(
        absl::StrCat(name, ": split_special_tokens ", it->dump(), " is not supported"));
  }
  return config;
}

}  // namespace tandem::tokenizer::internal
