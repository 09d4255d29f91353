#include "tandem/frontend/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "openai_parse.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::frontend {
namespace {

using internal::Json;
using internal::ParseChatTurn;
using internal::ParseForcedToolChoice;
using internal::ParseMessages;
using internal::ParseStructuredOutput;
using internal::ParseTools;
using internal::ParseUnsupported;
using internal::Reader;

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

// OpenAI's logit_bias: {"token id": bias}. As vLLM's to_sampling_params:
// keys are integers written as strings (int() of the key, the last of equal
// ids wins), biases clamped to [-100, 100]. Ids outside the vocabulary are
// the scheduler's to refuse (SamplingParams::Validate), as vLLM's processor
// refuses them.
std::optional<ApiError> ParseLogitBias(const Json* bias, CompletionRequest* out) {
  if (bias == nullptr) return std::nullopt;
  if (!bias->is_object()) {
    return BadRequest("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
  }
  std::map<int32_t, float> by_id;
  for (const auto& [key, value] : bias->items()) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(key, &id) || id < 0 || id > INT32_MAX) {
      return BadRequest(absl::StrCat("logit_bias key \"", key, "\" is not a token id"),
                        "logit_bias");
    }
    if (!value.is_number()) {
      return BadRequest(absl::StrCat("logit_bias of token ", key, " must be a number"),
                        "logit_bias");
    }
    by_id[static_cast<int32_t>(id)] =
        static_cast<float>(std::clamp(value.get<double>(), -100.0, 100.0));
  }
  out->logit_bias.assign(by_id.begin(), by_id.end());
  return std::nullopt;
}

// A list of token ids (stop_token_ids, allowed_token_ids); ids outside
// the vocabulary are the scheduler's to refuse (SamplingParams::Validate).
std::optional<ApiError> ParseTokenIds(const Json* ids, const char* field,
                                      std::vector<int32_t>* out) {
  if (ids == nullptr) return std::nullopt;
  const std::string message = absl::StrCat("'", field, "' must be a list of token ids");
  if (!ids->is_array()) return BadRequest(message, field);
  for (const Json& id : *ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return BadRequest(message, field);
    }
    out->push_back(id.get<int32_t>());
  }
  return std::nullopt;
}

// tools and tool_choice, as vLLM's check_tool_usage reads them: with tools,
// tool_choice defaults to "auto"; "none" renders them into the prompt only;
// "auto" also parses the answer's calls, which the server allows only under
// --enable-auto-tool-choice (CompletionRequest::tool_parser).
// "required" and a named tool constrain the output to the calls' JSON
// (ParseForcedToolChoice), with or without a tool parser.
std::optional<ApiError> ParseToolChoice(const Reader& r, Endpoint endpoint,
                                        CompletionRequest* out) {
  const Json* tools = r.Find("tools");
  const Json* choice = r.Find("tool_choice");
  const bool has_tools = tools != nullptr && !(tools->is_array() && tools->empty());
  if (!has_tools) {
    if (choice != nullptr && *choice != "none") {
      return BadRequest("When using `tool_choice`, `tools` must be set.", "tool_choice");
    }
    return std::nullopt;
  }
  if (endpoint != Endpoint::kChat) {
    return BadRequest("'tools' is a /v1/chat/completions field", "tools");
  }
  if (choice == nullptr || *choice == "auto") {
    out->tool_choice = "auto";
  } else if (*choice == "none") {
    out->tool_choice = "none";
  } else if (*choice == "required") {
    out->tool_choice = "required";
  } else if (choice->is_object()) {
    out->tool_choice = "named";
  } else {
    return BadRequest("'tool_choice' must be \"none\", \"auto\", \"required\" or a named tool",
                      "tool_choice");
  }
  if (auto e = r.Bool("parallel_tool_calls", &out->parallel_tool_calls)) return e;
  if (auto e = ParseTools(*tools, out)) return e;
  if (out->tool_choice == "required" || out->tool_choice == "named") {
    return ParseForcedToolChoice(*choice, out);
  }
  return std::nullopt;
}

// completions' logprobs N; chat's logprobs (bool) and top_logprobs N;
// prompt_logprobs N. The limit (the scheduler's) is CheckLogprobsLimit's.
// Needs out->stream.
std::optional<ApiError> ParseLogprobs(const Reader& r, Endpoint endpoint, CompletionRequest* out) {
  std::optional<int64_t> v;
  if (endpoint == Endpoint::kCompletions) {
    if (auto e = r.Int("logprobs", 0, INT32_MAX, &v)) return e;
    if (v) out->logprobs = static_cast<int32_t>(*v);
  } else {
    bool logprobs = false;
    if (auto e = r.Bool("logprobs", &logprobs)) return e;
    if (auto e = r.Int("top_logprobs", 0, INT32_MAX, &v)) return e;
    // As vLLM: top_logprobs 0 alone is harmless, more needs logprobs.
    if (v && *v > 0 && !logprobs) {
      return BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    }
    if (logprobs) out->logprobs = static_cast<int32_t>(v.value_or(0));
  }
  v.reset();
  if (auto e = r.Int("prompt_logprobs", 0, INT32_MAX, &v)) return e;
  if (v && out->stream) {
    // vLLM's rule; 0 is accepted and, like vLLM, renders nothing.
    if (*v > 0) {
      return BadRequest("'prompt_logprobs' is not available with stream: true", "prompt_logprobs");
    }
    v.reset();
  }
  if (v) out->prompt_logprobs = static_cast<int32_t>(*v);
  return std::nullopt;
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

bool JsonNestedDeeperThan(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

ApiError TooDeeplyNested(std::string_view what, std::string param) {
  return BadRequest(absl::StrCat(std::string(what), " nests JSON arrays and objects more than ",
                                 kMaxJsonNesting, " deep"),
                    std::move(param));
}

std::optional<ApiError> ParseCompletionRequest(std::string_view body, Endpoint endpoint,
                                               CompletionRequest* out) {
  *out = CompletionRequest{};
  out->endpoint = endpoint;
  if (JsonNestedDeeperThan(body)) return TooDeeplyNested("the request body");
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
    if (auto e = ParseChatTurn(r, out)) return e;
  }
  if (auto e = ParseUnsupported(r, endpoint)) return e;
  if (auto e = ParseToolChoice(r, endpoint, out)) return e;

  std::optional<int64_t> v;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    v.reset();
    // 0 with echo: the prompt alone, scored (vLLM's echo without
    // generation; lm-eval's legacy OpenAI loglikelihood asks it).
    if (auto e = r.Int(name, out->echo ? 0 : 1, INT32_MAX, &v)) return e;
    if (v) out->max_tokens = static_cast<int32_t>(*v);
  }
  if (auto e = r.Number("temperature", 0, 1e6, false, &out->temperature)) return e;
  if (auto e = r.Number("top_p", 0, 1, true, &out->top_p)) return e;
  if (auto e = r.Number("min_p", 0, 1, false, &out->min_p)) return e;
  if (auto e = r.Number("presence_penalty", -2, 2, false, &out->presence_penalty)) return e;
  if (auto e = r.Number("frequency_penalty", -2, 2, false, &out->frequency_penalty)) return e;
  if (auto e = r.Number("repetition_penalty", 0, 1e6, true, &out->repetition_penalty)) return e;
  if (auto e = ParseLogitBias(r.Find("logit_bias"), out)) return e;
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
  if (out->seed == -1) out->seed.reset();  // vLLM's "no seed" (SamplingParams)
  v.reset();
  if (auto e = r.Int("n", 1, kMaxN, &v)) return e;
  out->n = static_cast<int32_t>(v.value_or(1));
  if (auto e = ParseStop(r.Find("stop"), out)) return e;
  if (auto e = ParseTokenIds(r.Find("stop_token_ids"), "stop_token_ids", &out->stop_token_ids)) {
    return e;
  }
  // vLLM refuses an empty list ("allowed_token_ids is not None and
  // empty!"): it would allow nothing.
  if (const Json* allowed = r.Find("allowed_token_ids")) {
    if (auto e = ParseTokenIds(allowed, "allowed_token_ids", &out->allowed_token_ids)) return e;
    if (out->allowed_token_ids.empty()) {
      return BadRequest("'allowed_token_ids' must list at least one token id", "allowed_token_ids");
    }
  }
  if (const Json* words = r.Find("bad_words")) {
    if (!words->is_array()) return BadRequest("'bad_words' must be a list of strings", "bad_words");
    for (const Json& w : *words) {
      if (!w.is_string()) return BadRequest("'bad_words' must be a list of strings", "bad_words");
      out->bad_words.push_back(w.get<std::string>());
    }
  }
  if (auto e = r.Bool("return_tokens_as_token_ids", &out->return_tokens_as_token_ids)) return e;
  if (auto e = r.Bool("ignore_eos", &out->ignore_eos)) return e;
  // After the fields it cannot go with.
  if (auto e = ParseStructuredOutput(r, out)) return e;
  if (auto e = r.Bool("stream", &out->stream)) return e;
  if (const Json* options = r.Find("stream_options")) {
    if (!out->stream) {
      return BadRequest("'stream_options' is allowed only with stream: true", "stream_options");
    }
    if (!options->is_object()) {
      return BadRequest("'stream_options' must be an object", "stream_options");
    }
    if (auto e = internal::ParseStreamOptions(*options, out)) return e;
  }
  if (auto e = ParseLogprobs(r, endpoint, out)) return e;
  if (const Json* user = r.Find("user")) {
    if (!user->is_string()) return BadRequest("'user' must be a string", "user");
    out->user = user->get<std::string>();
  }
  if (const Json* salt = r.Find("cache_salt"); salt != nullptr && !salt->is_null()) {
    if (!salt->is_string() || salt->get_ref<const std::string&>().empty()) {
      return BadRequest("'cache_salt' must be a non-empty string if provided", "cache_salt");
    }
    out->client_cache_salt = salt->get<std::string>();
  }
  if (const Json* id = r.Find("request_id"); id != nullptr && !id->is_null()) {
    if (!id->is_string()) return BadRequest("'request_id' must be a string", "request_id");
    out->request_id = id->get<std::string>();
  }
  if (auto e = r.Bool("add_special_tokens", &out->add_special_tokens)) return e;
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
    // vLLM's per-request template: the body's, and chat_template_kwargs'
    // over it (a template is no variable of its own).
    if (const Json* source = r.Find("chat_template"); source != nullptr && !source->is_null()) {
      if (!source->is_string()) {
        return BadRequest("'chat_template' must be a string (a Jinja template)", "chat_template");
      }
      out->chat_template = source->get<std::string>();
    }
    if (auto it = out->chat_template_kwargs.find("chat_template");
        out->chat_template_kwargs.is_object() && it != out->chat_template_kwargs.end()) {
      if (!it->is_null() && !it->is_string()) {
        return BadRequest(
            "'chat_template_kwargs.chat_template' must be a string (a Jinja template)",
            "chat_template_kwargs");
      }
      if (it->is_string()) out->chat_template = it->get<std::string>();
      out->chat_template_kwargs.erase(it);
    }
    // vLLM's list[dict[str, str]], for the template's `documents`.
    if (const Json* documents = r.Find("documents"); documents != nullptr && !documents->is_null()) {
      auto strings = [](const Json& d) {
        return d.is_object() && std::all_of(d.begin(), d.end(),
                                            [](const Json& v) { return v.is_string(); });
      };
      if (!documents->is_array() || !std::all_of(documents->begin(), documents->end(), strings)) {
        return BadRequest("'documents' must be a list of objects whose values are strings",
                          "documents");
      }
      out->documents = *documents;
    }
    // vLLM's: false leaves the thinking out (the server refuses it without
    // --reasoning-parser, which splits it out).
    if (auto e = r.Bool("include_reasoning", &out->include_reasoning)) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> CheckLogprobsLimit(const CompletionRequest& request, int32_t max_logprobs) {
  const char* logprobs = request.endpoint == Endpoint::kCompletions ? "logprobs" : "top_logprobs";
  for (const auto& [name, value] : {std::pair{logprobs, request.logprobs},
                                    std::pair{"prompt_logprobs", request.prompt_logprobs}}) {
    if (value && *value > max_logprobs) {
      return BadRequest(absl::StrCat("'", name, "' (", *value, ") must be at most ", max_logprobs,
                                     ", this server's max_logprobs"),
                        name);
    }
  }
  return std::nullopt;
}

std::optional<int32_t> PromptLogprobsToAsk(const CompletionRequest& request) {
  std::optional<int32_t> n = request.prompt_logprobs;
  if (request.echo && request.logprobs) n = std::max(n.value_or(0), *request.logprobs);
  return n;
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
  if (auto p = request.repetition_penalty ? request.repetition_penalty
                                          : model_defaults.repetition_penalty) {
    out.repetition_penalty = *p;
  }
  out.presence_penalty = request.presence_penalty.value_or(0.0f);
  out.frequency_penalty = request.frequency_penalty.value_or(0.0f);
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

}  // namespace tandem::frontend
