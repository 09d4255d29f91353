#include "tandem/frontend/openai_responses.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "openai_parse.h"

namespace tandem::frontend {
namespace {

using internal::Json;
using internal::Reader;

// Chat's fields that a Responses request takes under the same name
// (vLLM's ResponsesRequest extras among them); chat's parser checks them.
constexpr const char* kChatFields[] = {"model",
                                       "temperature",
                                       "top_p",
                                       "top_k",
                                       "min_p",
                                       "seed",
                                       "stop",
                                       "ignore_eos",
                                       "min_tokens",
                                       "logit_bias",
                                       "priority",
                                       "repetition_penalty",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "skip_special_tokens",
                                       "include_stop_str_in_output",
                                       "stream",
                                       "cache_salt",
                                       "request_id",
                                       "vllm_xargs",
                                       "structured_outputs",
                                       "mm_processor_kwargs"};

// A content part of an input message as chat's {"type": "text"} part.
std::optional<ApiError> TextPart(const Json& part, const std::string& where, Json* out) {
  const Json* type = part.is_object() && part.contains("type") ? &part["type"] : nullptr;
  if (type == nullptr || !type->is_string()) {
    return BadRequest(absl::StrCat("'", where, "' must be an object with a string 'type'"),
                      "input");
  }
  const std::string t = type->get<std::string>();
  if (t != "input_text" && t != "output_text") {
    return BadRequest(absl::StrCat("'", where, "' of type ", t,
                                   " is not supported: this server takes text "
                                   "(input_text and output_text parts) only"),
                      "input");
  }
  auto text = part.find("text");
  if (text == part.end() || !text->is_string()) {
    return BadRequest(absl::StrCat("'", where, ".text' must be a string"), "input");
  }
  *out = Json{{"type", "text"}, {"text", *text}};
  return std::nullopt;
}

// `input` (and `instructions` before it) as chat messages.
std::optional<ApiError> InputMessages(const Reader& r, Json* messages) {
  *messages = Json::array();
  if (const Json* instructions = r.Find("instructions")) {
    if (!instructions->is_string()) {
      return BadRequest("'instructions' must be a string", "instructions");
    }
    messages->push_back(Json{{"role", "system"}, {"content", *instructions}});
  }
  const Json* input = r.Find("input");
  if (input == nullptr) return BadRequest("'input' is required", "input");
  if (input->is_string()) {
    messages->push_back(Json{{"role", "user"}, {"content", *input}});
    return std::nullopt;
  }
  if (!input->is_array() || input->empty()) {
    return BadRequest("'input' must be a string or a non-empty list of messages", "input");
  }
  for (size_t i = 0; i < input->size(); ++i) {
    const Json& item = (*input)[i];
    const std::string where = absl::StrCat("input[", i, "]");
    if (!item.is_object())
      return BadRequest(absl::StrCat("'", where, "' must be an object"), "input");
    auto type = item.find("type");
    if (type != item.end() && *type != "message") {
      return BadRequest(absl::StrCat("'", where, "' of type ", type->dump(),
                                     " is not supported: input items are messages only (no "
                                     "tool calls, tool outputs, reasoning or item references)"),
                        "input");
    }
    auto role = item.find("role");
    if (role == item.end() || !role->is_string() ||
        (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer")) {
      return BadRequest(absl::StrCat("'", where,
                                     ".role' must be \"user\", \"assistant\", \"system\" or "
                                     "\"developer\""),
                        "input");
    }
    auto content = item.find("content");
    Json message{{"role", *role}};
    if (content != item.end() && content->is_string()) {
      message["content"] = *content;
    } else if (content != item.end() && content->is_array()) {
      Json parts = Json::array();
      for (size_t j = 0; j < content->size(); ++j) {
        Json part;
        if (auto e = TextPart((*content)[j], absl::StrCat(where, ".content[", j, "]"), &part)) {
          return e;
        }
        parts.push_back(std::move(part));
      }
      message["content"] = std::move(parts);
    } else {
      return BadRequest(
          absl::StrCat("'", where, ".content' must be a string or a list of content parts"),
          "input");
    }
    messages->push_back(std::move(message));
  }
  return std::nullopt;
}

// The Responses fields Tandem does not build, each refused by name unless
// it has its neutral value; and those its response repeats.
std::optional<ApiError> ParseSettings(const Reader& r, ResponsesFields* out) {
  if (const Json* id = r.Find("previous_response_id")) {
    // vLLM's answer without its store: no response is ever found.
    return ApiError{.http_status = 404,
                    .message = absl::StrCat("Response with id ", id->dump(),
                                            " not found: this server stores no responses"),
                    .param = "previous_response_id"};
  }
  bool flag = false;
  if (auto e = r.Bool("background", &flag)) return e;
  if (flag) {
    return BadRequest("'background' is not supported: this server stores no responses",
                      "background");
  }
  if (auto e = r.Bool("store", &flag)) return e;
  if (const Json* tools = r.Find("tools");
      tools != nullptr && !(tools->is_array() && tools->empty())) {
    return BadRequest("'tools' is not supported on /v1/responses; /v1/chat/completions takes them",
                      "tools");
  }
  if (const Json* choice = r.Find("tool_choice")) {
    if (*choice != "auto" && *choice != "none") {
      return BadRequest("'tool_choice' must be \"auto\" or \"none\": /v1/responses takes no tools",
                        "tool_choice");
    }
    out->tool_choice = choice->get<std::string>();
  }
  if (auto e = r.Bool("parallel_tool_calls", &out->parallel_tool_calls)) return e;
  if (const Json* text = r.Find("text")) {
    if (!text->is_object()) return BadRequest("'text' must be an object", "text");
    for (const auto& [key, value] : text->items()) {
      if (value.is_null()) continue;
      if (key == "format" && value.is_object() && value.value("type", "") == "text") continue;
      return BadRequest(absl::StrCat("'text.", key, "' ", value.dump(),
                                     " is not supported: only {\"format\": {\"type\": \"text\"}} "
                                     "(structured outputs are not implemented)"),
                        absl::StrCat("text.", key));
    }
  }
  if (const Json* reasoning = r.Find("reasoning")) {
    if (!reasoning->is_object()) return BadRequest("'reasoning' must be an object", "reasoning");
    for (const auto& [key, value] : reasoning->items()) {
      if (!value.is_null()) {
        return BadRequest(absl::StrCat("'reasoning.", key,
                                       "' is not supported: this server has no reasoning settings"),
                          "reasoning");
      }
    }
  }
  if (const Json* include = r.Find("include");
      include != nullptr && !(include->is_array() && include->empty())) {
    return BadRequest(absl::StrCat("'include' ", include->dump(), " is not supported"), "include");
  }
  if (auto e = r.OnlyNeutral("truncation", "disabled",
                             "a prompt longer than the context is refused, not truncated")) {
    return e;
  }
  if (auto e = r.OnlyNeutral("prompt", Json(), "prompt templates are not implemented")) return e;
  if (auto e = r.OnlyNeutral("conversation", Json(), "this server stores no conversations")) {
    return e;
  }
  std::optional<int64_t> v;
  if (auto e = r.Int("top_logprobs", 0, 20, &v)) return e;
  out->top_logprobs = static_cast<int32_t>(v.value_or(0));
  if (const Json* metadata = r.Find("metadata")) {
    if (!metadata->is_object()) return BadRequest("'metadata' must be an object", "metadata");
    out->metadata = *metadata;
  }
  if (const Json* instructions = r.Find("instructions")) out->instructions = *instructions;
  if (const Json* user = r.Find("user")) out->user = *user;
  if (const Json* calls = r.Find("max_tool_calls")) out->max_tool_calls = *calls;
  if (const Json* tier = r.Find("service_tier"); tier != nullptr && tier->is_string()) {
    out->service_tier = tier->get<std::string>();
  }
  return std::nullopt;
}

// An error chat's parser gave, named as the Responses request names it.
ApiError AsResponsesError(ApiError e) {
  for (const auto& [chat, responses] :
       {std::pair<std::string, std::string>{"max_tokens", "max_output_tokens"},
        {"messages", "input"}}) {
    if (e.param == chat) e.param = responses;
    e.message = absl::StrReplaceAll(e.message, {{"'" + chat + "'", "'" + responses + "'"}});
  }
  return e;
}

Json UsageJson(const Usage& u) {
  Json out;
  out["input_tokens"] = u.prompt_tokens;
  out["input_tokens_details"] = Json{{"cached_tokens", u.cached_tokens}};
  out["output_tokens"] = u.completion_tokens;
  out["output_tokens_details"] = Json{{"reasoning_tokens", 0}};
  out["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  return out;
}

bool Incomplete(FinishReason finish) { return finish == FinishReason::kLength; }

Json TextPartOut(const std::string& text) {
  return Json{{"type", "output_text"},
              {"annotations", Json::array()},
              {"logprobs", Json::array()},
              {"text", text}};
}

// The answer's message item; `done` false: added, still empty.
Json MessageItem(const std::string& id, const std::string* text, FinishReason finish) {
  Json item;
  item["id"] = id;
  item["type"] = "message";
  item["status"] = text == nullptr      ? "in_progress"
                   : Incomplete(finish) ? "incomplete"
                                        : "completed";
  item["role"] = "assistant";
  item["content"] = text == nullptr ? Json::array() : Json::array({TextPartOut(*text)});
  return item;
}

}  // namespace

std::optional<ApiError> ParseResponsesRequest(std::string_view body, CompletionRequest* out) {
  *out = CompletionRequest{};
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return BadRequest("the request body is not valid JSON");
  if (!j.is_object()) return BadRequest("the request body must be a JSON object");
  const Reader r(j);
  ResponsesFields fields;
  if (auto e = ParseSettings(r, &fields)) return e;
  Json chat = Json::object();
  if (auto e = InputMessages(r, &chat["messages"])) return e;
  for (const char* name : kChatFields) {
    if (const Json* v = r.Find(name)) chat[name] = *v;
  }
  if (const Json* v = r.Find("max_output_tokens")) chat["max_tokens"] = *v;
  if (const Json* options = r.Find("stream_options")) {
    if (!options->is_object()) {
      return BadRequest("'stream_options' must be an object", "stream_options");
    }
    if (options->contains("include_obfuscation")) {
      chat["stream_options"] = Json{{"include_obfuscation", (*options)["include_obfuscation"]}};
    }
  }
  if (auto e = ParseCompletionRequest(chat.dump(), Endpoint::kChat, out)) {
    return AsResponsesError(*e);
  }
  out->endpoint = Endpoint::kResponses;
  out->responses = std::move(fields);
  return std::nullopt;
}

nlohmann::ordered_json ResponsesObject(const CompletionRequest& request, const ResponseHead& head,
                                       const ResponsesRun& run, const ResponsesOutput* output) {
  const ResponsesFields& f = *request.responses;
  const bool incomplete = output != nullptr && Incomplete(output->finish);
  Json r;
  r["id"] = head.id;
  r["object"] = "response";
  r["created_at"] = head.created;
  r["status"] = output == nullptr ? "in_progress" : incomplete ? "incomplete" : "completed";
  r["background"] = false;
  r["error"] = nullptr;
  r["incomplete_details"] = incomplete ? Json{{"reason", "max_output_tokens"}} : Json();
  r["instructions"] = f.instructions;
  r["max_output_tokens"] = run.max_output_tokens;
  r["max_tool_calls"] = f.max_tool_calls;
  r["metadata"] = f.metadata.is_null() ? Json::object() : f.metadata;
  r["model"] = head.model;
  r["output"] = output == nullptr
                    ? Json::array()
                    : Json::array({MessageItem(run.message_id, &output->text, output->finish)});
  r["parallel_tool_calls"] = f.parallel_tool_calls;
  r["previous_response_id"] = nullptr;
  r["reasoning"] = Json{{"effort", nullptr}, {"summary", nullptr}};
  r["service_tier"] = f.service_tier;
  r["store"] = false;
  r["temperature"] = run.temperature;
  r["text"] = Json{{"format", Json{{"type", "text"}}}};
  r["tool_choice"] = f.tool_choice;
  r["tools"] = Json::array();
  r["top_logprobs"] = f.top_logprobs;
  r["top_p"] = run.top_p;
  r["truncation"] = "disabled";
  r["usage"] = output == nullptr ? Json() : UsageJson(output->usage);
  r["user"] = f.user;
  return r;
}

ResponsesEvents::ResponsesEvents(const CompletionRequest& request, const ResponseHead& head,
                                 ResponsesRun run)
    : request_(request), head_(head), run_(std::move(run)) {}

std::string ResponsesEvents::Event(std::string_view type, nlohmann::ordered_json data) {
  Json event;
  event["type"] = type;
  event["sequence_number"] = sequence_++;
  event.update(data);
  return absl::StrCat("event: ", std::string(type), "\ndata: ",
                      event.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
                      "\n\n");
}

std::string ResponsesEvents::Start() {
  const Json response = ResponsesObject(request_, head_, run_, nullptr);
  std::string out = Event("response.created", Json{{"response", response}});
  out += Event("response.in_progress", Json{{"response", response}});
  out += Event("response.output_item.added",
               Json{{"output_index", 0}, {"item", MessageItem(run_.message_id, nullptr, {})}});
  Json part = TextPartOut("");
  out += Event(
      "response.content_part.added",
      Json{
          {"item_id", run_.message_id}, {"output_index", 0}, {"content_index", 0}, {"part", part}});
  return out;
}

std::string ResponsesEvents::Delta(std::string_view text) {
  if (text.empty()) return "";
  text_ += text;
  return Event("response.output_text.delta", Json{{"item_id", run_.message_id},
                                                  {"output_index", 0},
                                                  {"content_index", 0},
                                                  {"delta", text},
                                                  {"logprobs", Json::array()}});
}

std::string ResponsesEvents::Finish(FinishReason finish, const Usage& usage) {
  const Json at{{"item_id", run_.message_id}, {"output_index", 0}, {"content_index", 0}};
  Json done = at;
  done["text"] = text_;
  done["logprobs"] = Json::array();
  std::string out = Event("response.output_text.done", done);
  Json part = at;
  part["part"] = TextPartOut(text_);
  out += Event("response.content_part.done", part);
  out += Event("response.output_item.done",
               Json{{"output_index", 0}, {"item", MessageItem(run_.message_id, &text_, finish)}});
  const ResponsesOutput output{.text = text_, .finish = finish, .usage = usage};
  out += Event(Incomplete(finish) ? "response.incomplete" : "response.completed",
               Json{{"response", ResponsesObject(request_, head_, run_, &output)}});
  return out;
}

std::string ResponsesEvents::Error(const ApiError& error) {
  return Event("error", Json{{"code", error.code.empty() ? Json() : Json(error.code)},
                             {"message", error.message},
                             {"param", error.param.empty() ? Json() : Json(error.param)}});
}

}  // namespace tandem::frontend
