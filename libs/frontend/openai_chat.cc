// Chat bodies: messages and tools as the chat template sees them (vLLM's
// normalizations), for ParseCompletionRequest.
#include "absl/strings/str_cat.h"
#include "openai_parse.h"

namespace tandem::frontend::internal {
namespace {

// Chat content as vLLM parses it (_parse_chat_message_content), before the
// template's format shapes it (MessagesForTemplate): a list of {"type":
// "text", "text": ...} parts. A string is one part, null none (an assistant
// turn that only called tools); "refusal" parts (an OpenAI client replaying
// an assistant turn) are text. Other parts (images, audio) are refused.
std::optional<ApiError> NormalizeContent(Json* content, size_t index) {
  const std::string param = absl::StrCat("messages[", index, "].content");
  auto part = [](const std::string& text) { return Json{{"type", "text"}, {"text", text}}; };
  if (content->is_null()) {
    *content = Json::array();
    return std::nullopt;
  }
  if (content->is_string()) {
    *content = Json::array({part(content->get<std::string>())});
    return std::nullopt;
  }
  if (!content->is_array()) {
    return BadRequest(param + " must be a string or a list of content parts", param);
  }
  Json parts = Json::array();
  for (const Json& p : *content) {
    auto type = p.is_object() ? p.find("type") : p.end();
    const char* key = type != p.end() && *type == "refusal" ? "refusal" : "text";
    auto t = p.is_object() ? p.find(key) : p.end();
    if (!p.is_object() || type == p.end() || (*type != "text" && *type != "refusal") ||
        t == p.end() || !t->is_string()) {
      return BadRequest(param + ": only parts of type \"text\" (or \"refusal\") are supported",
                        param);
    }
    parts.push_back(part(t->get<std::string>()));
  }
  *content = std::move(parts);
  return std::nullopt;
}

// An assistant turn's tool_calls: each function's `arguments` as the template
// sees it. OpenAI clients send a JSON string; vLLM (and transformers' tool
// templates) want the object, so a string is parsed ("" or absent: {}).
std::optional<ApiError> ParseToolCallArguments(Json* tool_calls, size_t index) {
  for (size_t k = 0; k < tool_calls->size(); ++k) {
    Json& call = (*tool_calls)[k];
    const std::string param = absl::StrCat("messages[", index, "].tool_calls[", k, "]");
    auto function = call.is_object() ? call.find("function") : call.end();
    if (!call.is_object() || function == call.end() || !function->is_object()) {
      return BadRequest(param + " must be an object with a 'function' object", param);
    }
    auto arguments = function->find("arguments");
    if (arguments == function->end() || arguments->is_null() ||
        (arguments->is_string() && arguments->get<std::string>().empty())) {
      (*function)["arguments"] = Json::object();
    } else if (arguments->is_string()) {
      if (JsonNestedDeeperThan(arguments->get<std::string>())) {
        return TooDeeplyNested(param + ".function.arguments", param + ".function.arguments");
      }
      Json parsed =
          Json::parse(arguments->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) {
        return BadRequest(param + ".function.arguments is not valid JSON", param + ".function.arguments");
      }
      *arguments = std::move(parsed);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseMessages(const Json* messages, CompletionRequest* out) {
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return BadRequest("'messages' must be a non-empty list of messages", "messages");
  }
  Json copy = *messages;
  for (size_t i = 0; i < copy.size(); ++i) {
    Json& m = copy[i];
    auto role_it = m.is_object() ? m.find("role") : m.end();
    if (!m.is_object() || role_it == m.end() || !role_it->is_string()) {
      return BadRequest(absl::StrCat("messages[", i, "] must be an object with a string 'role'"),
                        "messages");
    }
    // A copy: adding "content" below moves the object's members (an ordered
    // map is a vector), and an iterator into them would dangle.
    const std::string role = role_it->get<std::string>();
    const bool absent = !m.contains("content");
    if (absent) m["content"] = nullptr;  // as vLLM reads it: message.get("content")
    if (auto content = m.find("content"); content != m.end()) {
      // As OpenAI and vLLM: null content only on an assistant turn that
      // called tools; anywhere else it is a 400 here, not a template error.
      auto tool_calls = m.find("tool_calls");
      const bool called_tools = role == "assistant" && tool_calls != m.end() &&
                                tool_calls->is_array() && !tool_calls->empty();
      if (content->is_null() && !called_tools && !absent) {
        const std::string param = absl::StrCat("messages[", i, "].content");
        return BadRequest(param + " is null; only an assistant message with tool_calls may have "
                                  "null content (send a string or a list of content parts)",
                          param);
      }
      if (auto e = NormalizeContent(&*content, i)) return e;
    }
    if (auto tool_calls = m.find("tool_calls");
        role == "assistant" && tool_calls != m.end() && tool_calls->is_array()) {
      if (auto e = ParseToolCallArguments(&*tool_calls, i)) return e;
    }
    // An assistant turn's thinking sent back under vLLM's current name
    // ("reasoning") or the older one templates read ("reasoning_content"):
    // the template sees both, as vLLM hands it both.
    if (role == "assistant") {
      auto reasoning = m.find("reasoning");
      auto reasoning_content = m.find("reasoning_content");
      const bool has = reasoning != m.end() && reasoning->is_string();
      const bool has_content = reasoning_content != m.end() && reasoning_content->is_string();
      if (has != has_content) {
        std::string text = has ? *reasoning : *reasoning_content;
        m[has ? "reasoning_content" : "reasoning"] = std::move(text);
      }
    }
  }
  out->messages = std::move(copy);
  return std::nullopt;
}

std::optional<ApiError> ParseChatTurn(const Reader& r, CompletionRequest* out) {
  if (auto e = r.Bool("add_generation_prompt", &out->add_generation_prompt)) return e;
  if (auto e = r.Bool("continue_final_message", &out->continue_final_message)) return e;
  if (out->continue_final_message) {
    if (r.Find("add_generation_prompt") != nullptr && out->add_generation_prompt) {
      return BadRequest(
          "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
          "continue_final_message");
    }
    out->add_generation_prompt = false;
  }
  const Json& last = out->messages.back();
  if (!out->add_generation_prompt) out->response_role = last["role"].get<std::string>();
  bool echo = false;
  if (auto e = r.Bool("echo", &echo)) return e;
  if (!echo) return std::nullopt;
  out->chat_echo.emplace();
  if (last["role"] != out->response_role) return std::nullopt;
  const Json& content = last["content"];
  if (content.is_string()) {
    *out->chat_echo = content.get<std::string>();
  } else if (content.is_array()) {
    // Joined as the "string" content format joins them (most templates').
    for (const Json& part : content) {
      const std::string& text = part["text"].get_ref<const std::string&>();
      if (text.empty()) continue;
      if (!out->chat_echo->empty()) *out->chat_echo += "\n";
      *out->chat_echo += text;
    }
  }
  return std::nullopt;
}

Json MessagesForTemplate(const Json& messages, tokenizer::ContentFormat format) {
  Json out = messages;
  for (Json& m : out) {
    auto content = m.find("content");
    if (content == m.end() || !content->is_array()) continue;
    // "string": the non-empty texts joined (vLLM drops empty ones there);
    // "openai": the parts, but a tool result's texts joined, since most
    // templates print a tool message's content as a string.
    const bool tool = m.value("role", "") == "tool";
    if (format == tokenizer::ContentFormat::kOpenAi && !tool) continue;
    std::string text;
    bool first = true;
    for (const Json& p : *content) {
      const std::string& t = p["text"].get_ref<const std::string&>();
      if (t.empty() && format == tokenizer::ContentFormat::kString) continue;
      if (!first) text += "\n";
      text += t;
      first = false;
    }
    *content = text;
  }
  return out;
}

// `tools` as vLLM hands them to the template (ChatCompletionToolsParam's
// model_dump): {"type": "function", "function": {"name", "description",
// "parameters", ...}}, description and parameters null when absent.
std::optional<ApiError> ParseTools(const Json& tools, CompletionRequest* out) {
  if (!tools.is_array()) return BadRequest("'tools' must be a list of tools", "tools");
  out->tools = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string param = absl::StrCat("tools[", i, "]");
    auto type = t.is_object() ? t.find("type") : t.end();
    auto function = t.is_object() ? t.find("function") : t.end();
    if (!t.is_object() || (type != t.end() && *type != "function") || function == t.end() ||
        !function->is_object() || !function->contains("name") ||
        !(*function)["name"].is_string()) {
      return BadRequest(param + " must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        param);
    }
    Json f = {{"name", (*function)["name"]},
                     {"description", function->value("description", Json())},
                     {"parameters", function->value("parameters", Json())}};
    for (const auto& [key, value] : function->items()) {
      if (!f.contains(key)) f[key] = value;
    }
    Json tool = {{"type", "function"}, {"function", std::move(f)}};
    for (const auto& [key, value] : t.items()) {
      if (!tool.contains(key)) tool[key] = value;
    }
    out->tools.push_back(std::move(tool));
  }
  return std::nullopt;
}

}  // namespace tandem::frontend::internal
