#include "tandem/frontend/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::frontend {
namespace {

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

bool IsTokenList(const Json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const Json& x : v) {
    if (!x.is_number_integer()) return false;
  }
  return true;
}

std::optional<ApiError> ParseTokenList(const Json& v, std::vector<int32_t>* out) {
  for (const Json& x : v) {
    if (x.is_number_unsigned() ? x.get<uint64_t>() > uint64_t{INT32_MAX}
                               : (x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)) {
      return BadRequest(absl::StrCat("prompt token id ", x.dump(), " is out of range"), "prompt");
    }
    out->push_back(x.get<int32_t>());
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const Json* prompt, CompletionRequest* out) {
  const char* kShapes = "a string, a list of strings, a list of token ids or a list of lists";
  if (prompt == nullptr) return BadRequest("'prompt' is required", "prompt");
  if (prompt->is_string()) {
    out->prompts.push_back({.text = prompt->get<std::string>()});
    return std::nullopt;
  }
  if (!prompt->is_array() || prompt->empty()) {
    return BadRequest(absl::StrCat("'prompt' must be ", kShapes, ", non-empty"), "prompt");
  }
  if (IsTokenList(*prompt)) {
    PromptInput& p = out->prompts.emplace_back();
    return ParseTokenList(*prompt, &p.token_ids);
  }
  if (prompt->size() > static_cast<size_t>(kMaxPrompts)) {
    return BadRequest(absl::StrCat("at most ", kMaxPrompts, " prompts per request"), "prompt");
  }
  for (const Json& item : *prompt) {
    if (item.is_string()) {
      out->prompts.push_back({.text = item.get<std::string>()});
    } else if (IsTokenList(item)) {
      PromptInput& p = out->prompts.emplace_back();
      if (auto e = ParseTokenList(item, &p.token_ids)) return e;
    } else {
      return BadRequest(absl::StrCat("'prompt' must be ", kShapes,
                                     "; an element is neither a string nor a non-empty list of "
                                     "integers"),
                        "prompt");
    }
  }
  return std::nullopt;
}

// Chat content: a string, or a list of {"type": "text", "text": ...} parts
// (joined with "\n" as vLLM joins them); null for an assistant turn that
// only called tools.
std::optional<ApiError> NormalizeContent(Json* content, size_t index) {
  const std::string param = absl::StrCat("messages[", index, "].content");
  if (content->is_null() || content->is_string()) return std::nullopt;
  if (!content->is_array()) {
    return BadRequest(param + " must be a string or a list of content parts", param);
  }
  std::string text;
  for (const Json& part : *content) {
    auto type = part.find("type");
    auto t = part.find("text");
    if (!part.is_object() || type == part.end() || *type != "text" || t == part.end() ||
        !t->is_string()) {
      return BadRequest(param + ": only parts of type \"text\" are supported", param);
    }
    if (!text.empty()) text += "\n";
    text += t->get<std::string>();
  }
  *content = text;
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

std::optional<ApiError> ParseMessages(const Json* messages, CompletionRequest* out) {
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return BadRequest("'messages' must be a non-empty list of messages", "messages");
  }
  Json copy = *messages;
  for (size_t i = 0; i < copy.size(); ++i) {
    Json& m = copy[i];
    auto role = m.is_object() ? m.find("role") : m.end();
    if (!m.is_object() || role == m.end() || !role->is_string()) {
      return BadRequest(absl::StrCat("messages[", i, "] must be an object with a string 'role'"),
                        "messages");
    }
    if (auto content = m.find("content"); content != m.end()) {
      // As OpenAI and vLLM: null content only on an assistant turn that
      // called tools; anywhere else it is a 400 here, not a template error.
      auto tool_calls = m.find("tool_calls");
      const bool called_tools = *role == "assistant" && tool_calls != m.end() &&
                                tool_calls->is_array() && !tool_calls->empty();
      if (content->is_null() && !called_tools) {
        const std::string param = absl::StrCat("messages[", i, "].content");
        return BadRequest(param + " is null; only an assistant message with tool_calls may have "
                                  "null content (send a string or a list of content parts)",
                          param);
      }
      if (auto e = NormalizeContent(&*content, i)) return e;
    }
    if (auto tool_calls = m.find("tool_calls");
        *role == "assistant" && tool_calls != m.end() && tool_calls->is_array()) {
      if (auto e = ParseToolCallArguments(&*tool_calls, i)) return e;
    }
  }
  out->messages = std::move(copy);
  return std::nullopt;
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

std::optional<ApiError> ParseStop(const Json* stop, CompletionRequest* out) {
  if (stop == nullptr) return std::nullopt;
  std::vector<std::string> list;
  if (stop->is_string()) {
    list.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    for (const Json& s : *stop) {
      if (!s.is_string()) return BadRequest("'stop' must be a string or a list of strings", "stop");
      list.push_back(s.get<std::string>());
    }
  } else {
    return BadRequest("'stop' must be a string or a list of strings", "stop");
  }
  if (list.size() > static_cast<size_t>(kMaxStopStrings)) {
    return BadRequest(absl::StrCat("at most ", kMaxStopStrings, " stop strings"), "stop");
  }
  for (std::string& s : list) {
    if (s.empty()) return BadRequest("stop strings must not be empty", "stop");
    out->stop.push_back(std::move(s));
  }
  return std::nullopt;
}

// vLLM's request fields Tandem does not build, each accepted only at its
// neutral value (absent and null always are). vllm_fields_test walks
// vLLM's CompletionRequest and ChatCompletionRequest field lists against
// this table and the fields the parser reads.
struct Unbuilt {
  const char* name;
  Json neutral;
  const char* why;
};
const std::vector<Unbuilt>& UnbuiltFields(Endpoint endpoint) {
  static const char* kNoLogprobs = "the worker does not return log-probabilities";
  static const char* kNoGuided = "structured outputs (guided decoding) are not implemented";
  static const char* kNoPenalties = "penalties are not implemented";
  static const auto* common = new std::vector<Unbuilt>{
      {"logprobs", Json(false), kNoLogprobs},
      {"prompt_logprobs", Json(nullptr), kNoLogprobs},
      {"return_tokens_as_token_ids", Json(false), kNoLogprobs},
      {"best_of", Json(1), "use n"},
      {"use_beam_search", Json(false), "beam search is not implemented"},
      {"length_penalty", Json(1), "beam search is not implemented"},
      {"presence_penalty", Json(0), kNoPenalties},
      {"frequency_penalty", Json(0), kNoPenalties},
      {"repetition_penalty", Json(1), kNoPenalties},
      {"logit_bias", Json::object(), "not implemented"},
      {"allowed_token_ids", Json(nullptr), "not implemented"},
      {"bad_words", Json::array(), "not implemented"},
      {"logits_processors", Json::array(), "not implemented"},
      {"spaces_between_special_tokens", Json(true),
       "special tokens decode as the tokenizer's decoder writes them"},
      {"guided_json", Json(nullptr), kNoGuided},
      {"guided_regex", Json(nullptr), kNoGuided},
      {"guided_choice", Json(nullptr), kNoGuided},
      {"guided_grammar", Json(nullptr), kNoGuided},
      {"guided_decoding_backend", Json(nullptr), kNoGuided},
      {"guided_whitespace_pattern", Json(nullptr), kNoGuided},
      {"structural_tag", Json(nullptr), kNoGuided},
      {"structured_outputs", Json(nullptr), kNoGuided},
      {"request_id", Json(nullptr), "the server names each request (the response's id)"},
      {"cache_salt", Json(nullptr),
       "the server salts the prefix cache per API key (--api-keys-file)"},
      {"kv_transfer_params", Json(nullptr), "disaggregated serving is not implemented"},
      {"vllm_xargs", Json(nullptr), "no extensions read it"},
      {"mm_processor_kwargs", Json(nullptr), "no multimodal models are served"},
      {"media_io_kwargs", Json(nullptr), "no multimodal models are served"},
  };
  static const auto* completions = [] {
    auto* v = new std::vector<Unbuilt>(*common);
    v->push_back({"suffix", Json(""), "no insertion models are served"});
    v->push_back({"prompt_embeds", Json(nullptr), "prompts are text or token ids"});
    return v;
  }();
  static const auto* chat = [] {
    auto* v = new std::vector<Unbuilt>(*common);
    v->push_back({"top_logprobs", Json(0), kNoLogprobs});
    v->push_back({"echo", Json(false), "chat echo (prepending the last message) is not implemented"});
    v->push_back({"continue_final_message", Json(false), "not implemented"});
    v->push_back({"documents", Json(nullptr), "not implemented"});
    v->push_back({"chat_template", Json(nullptr),
                  "the server's template is used (tandem-frontend --chat-template)"});
    v->push_back({"reasoning_effort", Json(nullptr), "reasoning is not implemented"});
    v->push_back({"include_reasoning", Json(true), "reasoning is not implemented"});
    v->push_back({"parallel_tool_calls", Json(false), "tool calling is not implemented"});
    return v;
  }();
  return endpoint == Endpoint::kCompletions ? *completions : *chat;
}

std::optional<ApiError> ParseUnsupported(const Reader& r, Endpoint endpoint) {
  for (const Unbuilt& f : UnbuiltFields(endpoint)) {
    if (auto e = r.OnlyNeutral(f.name, f.neutral, f.why)) return e;
  }
  if (const Json* tools = r.Find("tools");
      tools != nullptr && !(tools->is_array() && tools->empty())) {
    const Json* choice = r.Find("tool_choice");
    if (choice == nullptr || *choice != "none") {
      return BadRequest(
          "'tools' is not supported (tool calling is not implemented); send "
          "tool_choice \"none\" to render the tools into the prompt only",
          "tools");
    }
  }
  if (const Json* format = r.Find("response_format"); format != nullptr) {
    auto type = format->is_object() ? format->find("type") : format->end();
    if (!format->is_object() || type == format->end() || *type != "text") {
      return BadRequest("'response_format' other than {\"type\": \"text\"} is not supported",
                        "response_format");
    }
  }
  return std::nullopt;
}

const char* ChunkObject(Endpoint e) {
  return e == Endpoint::kChat ? "chat.completion.chunk" : "text_completion";
}

void AddFinish(Json* choice, FinishReason reason, const std::string& stop_reason,
               std::optional<int32_t> stop_token) {
  (*choice)["finish_reason"] =
      reason == FinishReason::kNone ? Json() : Json(FinishReasonName(reason));
  // vLLM's stop_reason: the stop string or stop token that ended the
  // choice; null for EOS and length.
  if (!stop_reason.empty()) {
    (*choice)["stop_reason"] = stop_reason;
  } else if (stop_token) {
    (*choice)["stop_reason"] = *stop_token;
  } else {
    (*choice)["stop_reason"] = nullptr;
  }
}

// Appends `s` as a JSON string value, escaped exactly as a tree's dump()
// escapes it (ensure_ascii off, invalid UTF-8 replaced by U+FFFD): printable
// ASCII is copied, anything else goes through nlohmann's serializer.
void AppendJsonString(std::string* out, std::string_view s) {
  const bool plain = std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x80 && c != '"' && c != '\\';
  });
  if (plain) {
    out->push_back('"');
    out->append(s);
    out->push_back('"');
    return;
  }
  *out += Json(std::string(s)).dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Event(const Json& j) {
  return absl::StrCat("data: ", j.dump(-1, ' ', false, Json::error_handler_t::replace),
                      "\n\n");
}

}  // namespace

std::string ApiError::ToJson() const {
  Json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? Json() : Json(param);
  e["code"] = code.empty() ? Json() : Json(code);
  Json j;
  j["error"] = std::move(e);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

ApiError BadRequest(std::string message, std::string param) {
  return ApiError{.http_status = 400, .message = std::move(message), .param = std::move(param)};
}

std::optional<ApiError> ParseCompletionRequest(std::string_view body, Endpoint endpoint,
                                               CompletionRequest* out) {
  *out = CompletionRequest{};
  out->endpoint = endpoint;
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return BadRequest("the request body is not valid JSON");
  if (!j.is_object()) return BadRequest("the request body must be a JSON object");
  const Reader r(j);
  if (const Json* model = r.Find("model")) {
    if (!model->is_string()) return BadRequest("'model' must be a string", "model");
    out->model = model->get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto e = ParsePrompt(r.Find("prompt"), out)) return e;
    if (auto e = r.Bool("echo", &out->echo)) return e;
  } else {
    if (auto e = ParseMessages(r.Find("messages"), out)) return e;
    if (auto e = r.Bool("add_generation_prompt", &out->add_generation_prompt)) return e;
  }
  if (auto e = ParseUnsupported(r, endpoint)) return e;
  if (const Json* tools = r.Find("tools"); tools != nullptr && !(tools->is_array() && tools->empty())) {
    if (endpoint != Endpoint::kChat) {
      return BadRequest("'tools' is a /v1/chat/completions field", "tools");
    }
    // tool_choice "none" (ParseUnsupported): rendered into the prompt only.
    if (auto e = ParseTools(*tools, out)) return e;
  }

  std::optional<int64_t> v;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    v.reset();
    if (auto e = r.Int(name, 1, INT32_MAX, &v)) return e;
    if (v) out->max_tokens = static_cast<int32_t>(*v);
  }
  if (auto e = r.Number("temperature", 0, 1e6, false, &out->temperature)) return e;
  if (auto e = r.Number("top_p", 0, 1, true, &out->top_p)) return e;
  if (auto e = r.Number("min_p", 0, 1, false, &out->min_p)) return e;
  v.reset();
  if (auto e = r.Int("top_k", -1, INT32_MAX, &v)) return e;
  if (v) out->top_k = *v > 0 ? static_cast<int32_t>(*v) : 0;
  v.reset();
  if (auto e = r.Int("min_tokens", 0, INT32_MAX, &v)) return e;
  out->min_tokens = static_cast<int32_t>(v.value_or(0));
  // Against the default max_tokens too on completions, as vLLM checks it.
  const std::optional<int32_t> max_tokens =
      out->max_tokens ? out->max_tokens
      : endpoint == Endpoint::kCompletions ? std::optional<int32_t>(kDefaultCompletionsMaxTokens)
                                           : std::nullopt;
  if (max_tokens && out->min_tokens > *max_tokens) {
    return BadRequest(absl::StrCat("'min_tokens' (", out->min_tokens,
                                   ") must not exceed 'max_tokens' (", *max_tokens,
                                   out->max_tokens ? "" : ", the default", ")"),
                      "min_tokens");
  }
  if (auto e = r.Int("seed", INT64_MIN, INT64_MAX, &out->seed)) return e;
  v.reset();
  if (auto e = r.Int("n", 1, kMaxN, &v)) return e;
  out->n = static_cast<int32_t>(v.value_or(1));
  if (auto e = ParseStop(r.Find("stop"), out)) return e;
  if (const Json* ids = r.Find("stop_token_ids")) {
    if (!ids->is_array()) {
      return BadRequest("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    }
    for (const Json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return BadRequest("'stop_token_ids' must be a list of token ids", "stop_token_ids");
      }
      out->stop_token_ids.push_back(id.get<int32_t>());
    }
  }
  if (auto e = r.Bool("ignore_eos", &out->ignore_eos)) return e;
  if (auto e = r.Bool("stream", &out->stream)) return e;
  if (const Json* options = r.Find("stream_options")) {
    if (!out->stream) {
      return BadRequest("'stream_options' is allowed only with stream: true", "stream_options");
    }
    if (!options->is_object()) {
      return BadRequest("'stream_options' must be an object", "stream_options");
    }
    if (const Reader o(*options); auto e = o.Bool("include_usage", &out->include_usage)) return e;
  }
  if (const Json* user = r.Find("user")) {
    if (!user->is_string()) return BadRequest("'user' must be a string", "user");
    out->user = user->get<std::string>();
  }
  bool add_special = false;
  if (r.Find("add_special_tokens") != nullptr) {
    if (auto e = r.Bool("add_special_tokens", &add_special)) return e;
    out->add_special_tokens = add_special;
  }
  if (auto e = r.Bool("skip_special_tokens", &out->skip_special_tokens)) return e;
  if (auto e = r.Bool("return_token_ids", &out->return_token_ids)) return e;
  if (auto e = r.Bool("include_stop_str_in_output", &out->include_stop_str_in_output)) return e;
  v.reset();
  if (auto e = r.Int("truncate_prompt_tokens", -1, INT32_MAX, &v)) return e;
  if (v) {
    // vLLM: -1 keeps max_model_len tokens; 0 would keep nothing.
    if (*v == 0) {
      return BadRequest("'truncate_prompt_tokens' must be >= 1, or -1 for the model's context",
                        "truncate_prompt_tokens");
    }
    out->truncate_prompt_tokens = static_cast<int32_t>(*v);
  }
  v.reset();
  if (auto e = r.Int("priority", INT32_MIN, INT32_MAX, &v)) return e;
  out->priority = static_cast<int32_t>(v.value_or(0));
  if (endpoint == Endpoint::kChat) {
    if (const Json* kwargs = r.Find("chat_template_kwargs")) {
      if (!kwargs->is_object()) {
        return BadRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs");
      }
      for (const char* reserved : {"messages", "add_generation_prompt", "bos_token", "eos_token"}) {
        if (kwargs->contains(reserved)) {
          return BadRequest(absl::StrCat("'chat_template_kwargs' must not set '", reserved,
                                         "' (the server sets it; add_generation_prompt is a "
                                         "request field)"),
                            "chat_template_kwargs");
        }
      }
      out->chat_template_kwargs = *kwargs;
    }
  }
  return std::nullopt;
}

RequestSampling EffectiveSampling(const CompletionRequest& request,
                                  const GenerationDefaults& model_defaults) {
  RequestSampling out;
  if (auto t = request.temperature ? request.temperature : model_defaults.temperature) {
    out.temperature = *t;
  }
  if (auto p = request.top_p ? request.top_p : model_defaults.top_p) out.top_p = *p;
  if (auto p = request.min_p ? request.min_p : model_defaults.min_p) out.min_p = *p;
  if (auto k = request.top_k ? request.top_k : model_defaults.top_k) out.top_k = std::max(*k, 0);
  return out;
}

ApiError FromStatus(int code, std::string_view message) {
  ApiError e{.message = std::string(message)};
  switch (code) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE
      e.http_status = 400;
      break;
    case 8:  // RESOURCE_EXHAUSTED
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case 14:  // UNAVAILABLE
      e.http_status = 503;
      e.type = "server_error";
      e.code = "service_unavailable";
      break;
    case 4:  // DEADLINE_EXCEEDED
      e.http_status = 504;
      e.type = "server_error";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

Json Usage::ToJson() const {
  Json u;
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", cached_tokens}};
  return u;
}

Json CompletionResponse(const CompletionRequest& request, const ResponseHead& head,
                               const std::vector<Choice>& choices, const Usage& usage,
                               const std::vector<std::vector<int32_t>>& prompt_token_ids) {
  const bool chat = request.endpoint == Endpoint::kChat;
  Json j;
  j["id"] = head.id;
  j["object"] = chat ? "chat.completion" : "text_completion";
  j["created"] = head.created;
  j["model"] = head.model;
  Json list = Json::array();
  for (const Choice& c : choices) {
    Json choice;
    choice["index"] = c.index;
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = nullptr;
    AddFinish(&choice, c.finish_reason, c.stop_reason, c.stop_token);
    if (request.return_token_ids) choice["token_ids"] = c.token_ids;
    list.push_back(std::move(choice));
  }
  j["choices"] = std::move(list);
  j["usage"] = usage.ToJson();
  if (request.return_token_ids) {
    // One prompt (chat, or a single completions prompt): a flat list, as
    // vLLM returns it; several: one list per prompt.
    j["prompt_token_ids"] = prompt_token_ids.size() == 1 ? Json(prompt_token_ids[0])
                                                         : Json(prompt_token_ids);
  }
  return j;
}

// A chunk is written directly rather than built as a JSON tree and dumped:
// one goes out per token per stream, and the tree (an ordered map of a dozen
// nodes) was the frontend's largest cost of its own per token (perf, 256
// streams: nlohmann's tree, its dump and their allocations ~8% of the
// frontend's CPU). The bytes are what the tree's dump() wrote
// (openai_test's ChunksAreTheBytesATreeWouldDump checks it).
std::string StreamChunk(const CompletionRequest& request, const ResponseHead& head,
                        const ChunkDelta& delta) {
  std::string out;
  out.reserve(160 + head.id.size() + head.model.size() + delta.text.size() +
              8 * delta.token_ids.size());
  out += "data: {\"id\":";
  AppendJsonString(&out, head.id);
  absl::StrAppend(&out, ",\"object\":\"", ChunkObject(request.endpoint),
                  "\",\"created\":", head.created, ",\"model\":");
  AppendJsonString(&out, head.model);
  absl::StrAppend(&out, ",\"choices\":[{\"index\":", delta.index);
  if (request.endpoint == Endpoint::kChat) {
    out += ",\"delta\":{";
    if (delta.first) out += "\"role\":\"assistant\"";
    if (delta.first || !delta.text.empty()) {
      if (delta.first) out += ',';
      out += "\"content\":";
      AppendJsonString(&out, delta.text);
    }
    out += '}';
  } else {
    out += ",\"text\":";
    AppendJsonString(&out, delta.text);
  }
  out += ",\"logprobs\":null,\"finish_reason\":";
  if (delta.finish_reason == FinishReason::kNone) {
    out += "null";
  } else {
    absl::StrAppend(&out, "\"", FinishReasonName(delta.finish_reason), "\"");
  }
  out += ",\"stop_reason\":";
  if (!delta.stop_reason.empty()) {
    AppendJsonString(&out, delta.stop_reason);
  } else if (delta.stop_token) {
    absl::StrAppend(&out, *delta.stop_token);
  } else {
    out += "null";
  }
  if (request.return_token_ids) {
    out += ",\"token_ids\":[";
    for (size_t i = 0; i < delta.token_ids.size(); ++i) {
      if (i > 0) out += ',';
      absl::StrAppend(&out, delta.token_ids[i]);
    }
    out += ']';
  }
  out += "}]";
  if (request.include_usage) out += ",\"usage\":null";
  out += "}\n\n";
  return out;
}

std::string StreamUsageChunk(const CompletionRequest& request, const ResponseHead& head,
                             const Usage& usage) {
  Json j;
  j["id"] = head.id;
  j["object"] = ChunkObject(request.endpoint);
  j["created"] = head.created;
  j["model"] = head.model;
  j["choices"] = Json::array();
  j["usage"] = usage.ToJson();
  return Event(j);
}

std::string StreamErrorEvent(const ApiError& error) {
  return absl::StrCat("data: ", error.ToJson(), "\n\n");
}

std::string NewResponseId(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%s%016x%016x", prefix, rng(), rng());
}

}  // namespace tandem::frontend
