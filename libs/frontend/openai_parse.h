// Internal to libs/frontend: the request parser's pieces, split along their
// seams (openai.cc: prompts, sampling and the responses; openai_chat.cc:
// messages and tools; openai_unbuilt.cc: the fields Tandem refuses).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tandem/frontend/openai.h"
#include "tandem/tokenizer/chat_template.h"

namespace tandem::frontend::internal {

// Ordered: chat's conversation, tools and template variables keep the
// client's key order (a tool's JSON schema is rendered with tojson, as vLLM
// renders the dict it parsed), and one parse serves every field.
using Json = nlohmann::ordered_json;

// Field readers: absent and null mean "keep the default"; a value of the
// wrong type or range is a 400 naming the field.
class Reader {
 public:
  explicit Reader(const Json& body) : body_(body) {}

  const Json* Find(const char* name) const {
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<ApiError> Bool(const char* name, bool* out) const {
    const Json* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return BadRequest(absl::StrCat("'", name, "' must be a boolean"), name);
    *out = v->get<bool>();
    return std::nullopt;
  }

  // The same, where absent and null stay nullopt (the request did not say).
  std::optional<ApiError> Bool(const char* name, std::optional<bool>* out) const {
    if (Find(name) == nullptr) return std::nullopt;
    bool value = false;
    if (auto e = Bool(name, &value)) return e;
    *out = value;
    return std::nullopt;
  }

  std::optional<ApiError> Int(const char* name, int64_t min, int64_t max,
                              std::optional<int64_t>* out) const {
    const Json* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) {
      return BadRequest(absl::StrCat("'", name, "' must be an integer"), name);
    }
    // Unsigned values above int64 are out of every range here.
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
      return OutOfRange(name, min, max);
    }
    const int64_t x = v->get<int64_t>();
    if (x < min || x > max) return OutOfRange(name, min, max);
    *out = x;
    return std::nullopt;
  }

  std::optional<ApiError> Number(const char* name, double min, double max, bool min_open,
                                 std::optional<float>* out) const {
    const Json* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return BadRequest(absl::StrCat("'", name, "' must be a number"), name);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < min || (min_open && x == min) || x > max) {
      return BadRequest(absl::StrFormat("'%s' must be in %c%g, %g], got %g", name,
                                        min_open ? '(' : '[', min, max, x),
                        name);
    }
    *out = static_cast<float>(x);
    return std::nullopt;
  }

  // A field we do not implement: accepted only at its neutral value.
  std::optional<ApiError> OnlyNeutral(const char* name, const Json& neutral,
                                      std::string_view why) const {
    const Json* v = Find(name);
    if (v == nullptr || *v == neutral) return std::nullopt;
    return BadRequest(absl::StrCat("'", name, "' is not supported: ", std::string(why)), name);
  }

 private:
  static ApiError OutOfRange(const char* name, int64_t min, int64_t max) {
    return BadRequest(max == INT64_MAX
                          ? absl::StrCat("'", name, "' must be >= ", min)
                          : absl::StrCat("'", name, "' must be in [", min, ", ", max, "]"),
                      name);
  }

  const Json& body_;
};

// Chat: `messages` (a non-empty list) as vLLM parses them: every content a
// list of text parts (a string one part, null or missing none; null only on
// an assistant turn that called tools), tool_calls arguments parsed from
// their JSON strings.
[[nodiscard]] std::optional<ApiError> ParseMessages(const Json* messages, CompletionRequest* out);
// After ParseMessages: add_generation_prompt, continue_final_message, echo,
// and the answer's role they give (vLLM's rules).
[[nodiscard]] std::optional<ApiError> ParseChatTurn(const Reader& r, CompletionRequest* out);
// Those messages shaped for a template that reads content in `format`
// (ChatTemplate::content_format, vLLM's detection): "string" joins each
// message's non-empty texts with "\n"; "openai" keeps the parts, except a
// tool message's, joined (vLLM's normalization of tool results).
[[nodiscard]] Json MessagesForTemplate(const Json& messages, tokenizer::ContentFormat format);
// Chat with tool_choice "none": `tools` as vLLM hands them to the template.
[[nodiscard]] std::optional<ApiError> ParseTools(const Json& tools, CompletionRequest* out);
// Every field Tandem does not build: a 400 naming the first one that is not
// at its neutral value.
[[nodiscard]] std::optional<ApiError> ParseUnsupported(const Reader& r, Endpoint endpoint);
// Structured outputs: OpenAI's response_format (text, json_object,
// json_schema) and vLLM's structured_outputs (json, json_object) into
// out->json_schema, the schema compiled (libs/grammar) so that what it
// cannot hold is a 400 naming the keyword and where it is; and
// structured_outputs' choice, regex and grammar into out->choice,
// out->regex and out->grammar.
[[nodiscard]] std::optional<ApiError> ParseStructuredOutput(const Reader& r,
                                                            CompletionRequest* out);
// Chat's tool_choice "required" or a named tool ({"type": "function",
// "function": {"name": ...}}), after ParseTools: out->forced_tool, and the
// calls' schema (vLLM's) in out->json_schema; a named tool that is not in
// the tools, or parameters the grammar cannot hold, is a 400 naming them.
[[nodiscard]] std::optional<ApiError> ParseForcedToolChoice(const Json& choice,
                                                            CompletionRequest* out);
// stream_options (an object): include_usage, vLLM's continuous_usage_stats
// and OpenAI's include_obfuscation (false only) into *out.
[[nodiscard]] std::optional<ApiError> ParseStreamOptions(const Json& options,
                                                         CompletionRequest* out);

}  // namespace tandem::frontend::internal
