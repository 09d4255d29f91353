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
// (vLLM's ResponsesRequest extras among them, and chat_template_kwargs, so
// that Qwen3's enable_thinking reaches the template here too); chat's
// parser checks them.
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
                                       "vllm_xargs",
                                       "structured_outputs",
                                       "mm_processor_kwargs",
                                       "chat_template_kwargs"};

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

// A message item ({"role", "content"}, "type": "message" optional) as a
// chat message.
std::optional<ApiError> MessageItem(const Json& item, const std::string& where, Json* out) {
  auto role = item.find("role");
  if (role == item.end() || !role->is_string() ||
      (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer")) {
    return BadRequest(absl::StrCat("'", where,
                                   ".role' must be \"user\", \"assistant\", \"system\" or "
                                   "\"developer\""),
                      "input");
  }
  auto content = item.find("content");
  *out = Json{{"role", *role}};
  if (content != item.end() && content->is_string()) {
    (*out)["content"] = *content;
  } else if (content != item.end() && content->is_array()) {
    Json parts = Json::array();
    for (size_t j = 0; j < content->size(); ++j) {
      Json part;
      if (auto e = TextPart((*content)[j], absl::StrCat(where, ".content[", j, "]"), &part)) {
        return e;
      }
      parts.push_back(std::move(part));
    }
    (*out)["content"] = std::move(parts);
  } else {
    return BadRequest(
        absl::StrCat("'", where, ".content' must be a string or a list of content parts"), "input");
  }
  return std::nullopt;
}

std::optional<ApiError> StringField(const Json& item, const char* key, const std::string& where) {
  auto it = item.find(key);
  if (it == item.end() || !it->is_string()) {
    return BadRequest(absl::StrCat("'", where, ".", key, "' must be a string"), "input");
  }
  return std::nullopt;
}

// A function_call item (a call the model made, sent back) as a tool call
// of chat's assistant turn: the turn before it when that is the
// assistant's (its text, or calls made beside this one), else a new one.
std::optional<ApiError> FunctionCallItem(const Json& item, const std::string& where,
                                         Json* messages) {
  for (const char* key : {"call_id", "name", "arguments"}) {
    if (auto e = StringField(item, key, where)) return e;
  }
  Json call{{"id", item["call_id"]},
            {"type", "function"},
            {"function", Json{{"name", item["name"]}, {"arguments", item["arguments"]}}}};
  if (messages->empty() || messages->back().value("role", "") != "assistant") {
    messages->push_back(Json{{"role", "assistant"}, {"content", nullptr}});
  }
  Json& turn = messages->back();
  if (!turn.contains("tool_calls")) turn["tool_calls"] = Json::array();
  turn["tool_calls"].push_back(std::move(call));
  return std::nullopt;
}

// A function_call_output item (a call's result) as chat's tool message.
std::optional<ApiError> FunctionOutputItem(const Json& item, const std::string& where,
                                           Json* messages) {
  if (auto e = StringField(item, "call_id", where)) return e;
  auto output = item.find("output");
  Json content;
  if (output != item.end() && output->is_string()) {
    content = *output;
  } else if (output != item.end() && output->is_array()) {
    content = Json::array();
    for (size_t j = 0; j < output->size(); ++j) {
      Json part;
      if (auto e = TextPart((*output)[j], absl::StrCat(where, ".output[", j, "]"), &part)) {
        return e;
      }
      content.push_back(std::move(part));
    }
  } else {
    return BadRequest(absl::StrCat("'", where, ".output' must be a string or a list of text parts"),
                      "input");
  }
  messages->push_back(
      Json{{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", std::move(content)}});
  return std::nullopt;
}

// A reasoning item sent back (an answer's thinking, as this server gives it
// under --reasoning-parser): its reasoning_text content, joined. A summary
// or encrypted_content (another server's) is not the thinking and is
// dropped.
std::optional<ApiError> ReasoningItem(const Json& item, const std::string& where,
                                      std::optional<std::string>* out) {
  auto content = item.find("content");
  if (content == item.end() || content->is_null()) return std::nullopt;
  if (!content->is_array()) {
    return BadRequest(absl::StrCat("'", where, ".content' must be a list of reasoning_text parts"),
                      "input");
  }
  std::string text;
  for (size_t j = 0; j < content->size(); ++j) {
    const Json& part = (*content)[j];
    if (!part.is_object() || part.value("type", Json()) != "reasoning_text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return BadRequest(absl::StrCat("'", where, ".content[", j,
                                     "]' must be {\"type\": \"reasoning_text\", \"text\": ...}"),
                        "input");
    }
    text += part["text"].get<std::string>();
  }
  *out = std::move(text);
  return std::nullopt;
}

// `input` (and `instructions` before it) as chat messages.
std::optional<ApiError> InputMessages(const Reader& r, Json* messages) {
  *messages = Json::array();
  std::optional<std::string> reasoning;  // a reasoning item's, for the next turn
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
    return BadRequest("'input' must be a string or a non-empty list of items", "input");
  }
  for (size_t i = 0; i < input->size(); ++i) {
    const Json& item = (*input)[i];
    const std::string where = absl::StrCat("input[", i, "]");
    if (!item.is_object()) {
      return BadRequest(absl::StrCat("'", where, "' must be an object"), "input");
    }
    const Json type = item.value("type", Json("message"));
    if (type == "reasoning") {
      if (auto e = ReasoningItem(item, where, &reasoning)) return e;
      continue;
    }
    if (type == "message") {
      Json message;
      if (auto e = MessageItem(item, where, &message)) return e;
      messages->push_back(std::move(message));
    } else if (type == "function_call") {
      if (auto e = FunctionCallItem(item, where, messages)) return e;
    } else if (type == "function_call_output") {
      if (auto e = FunctionOutputItem(item, where, messages)) return e;
    } else {
      return BadRequest(absl::StrCat("'", where, "' of type ", type.dump(),
                                     " is not supported: input items are messages, reasoning, "
                                     "function_call and function_call_output"),
                        "input");
    }
    // The thinking before an assistant turn goes with it, as the chat
    // templates that show it read it (reasoning_content); before anything
    // else it has no turn and is dropped.
    Json& last = messages->back();
    if (reasoning && last.value("role", "") == "assistant" && !last.contains("reasoning_content")) {
      last["reasoning_content"] = *reasoning;
    }
    reasoning.reset();
  }
  return std::nullopt;
}

// Responses' function tools ({"type": "function", "name", "description",
// "parameters", "strict"}) as chat's ({"type": "function", "function":
// {...}}); any other kind (OpenAI's hosted tools) is refused.
std::optional<ApiError> ChatTools(const Json& tools, Json* out) {
  if (!tools.is_array()) return BadRequest("'tools' must be a list of tools", "tools");
  *out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string param = absl::StrCat("tools[", i, "]");
    if (!t.is_object() || t.value("type", Json()) != "function") {
      return BadRequest(absl::StrCat("'", param, "' of type ",
                                     t.is_object() ? t.value("type", Json()).dump() : t.dump(),
                                     " is not supported: only function tools"),
                        "tools");
    }
    Json function = Json::object();
    for (const auto& [key, value] : t.items()) {
      if (key != "type") function[key] = value;
    }
    out->push_back(Json{{"type", "function"}, {"function", std::move(function)}});
  }
  return std::nullopt;
}

// What `include` may ask of items this server never produces (reasoning,
// hosted tools' calls, images): there is nothing to add, so asking changes
// nothing. Agent frameworks send reasoning.encrypted_content with store
// false.
bool IncludesNothingHere(const std::string& what) {
  static const char* const kNothing[] = {
      "reasoning.encrypted_content",   "file_search_call.results",
      "web_search_call.results",       "web_search_call.action.sources",
      "code_interpreter_call.outputs", "computer_call_output.output.image_url",
      "message.input_image.image_url"};
  for (const char* n : kNothing) {
    if (what == n) return true;
  }
  return false;
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
  if (const Json* choice = r.Find("tool_choice")) out->tool_choice = *choice;
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
  if (const Json* include = r.Find("include")) {
    if (!include->is_array()) return BadRequest("'include' must be a list", "include");
    for (const Json& what : *include) {
      if (what == "message.output_text.logprobs") {
        out->include_logprobs = true;
      } else if (!what.is_string() || !IncludesNothingHere(what.get<std::string>())) {
        return BadRequest(absl::StrCat("'include' ", what.dump(), " is not supported"), "include");
      }
    }
  }
  if (auto e = r.OnlyNeutral("truncation", "disabled",
                             "a prompt longer than the context is refused, not truncated")) {
    return e;
  }
  if (auto e = r.OnlyNeutral("request_id", Json(),
                             "a response's id is the server's here (chat and completions take "
                             "it)")) {
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

Json TextPartOut(const std::string& text, const Json& logprobs = Json::array()) {
  return Json{{"type", "output_text"},
              {"annotations", Json::array()},
              {"logprobs", logprobs.is_array() ? logprobs : Json::array()},
              {"text", text}};
}

// The answer's message item; `text` null: just added, still empty.
Json OutputMessage(const std::string& id, const std::string* text, FinishReason finish,
                   const Json& logprobs = Json::array()) {
  Json item;
  item["id"] = id;
  item["type"] = "message";
  item["status"] = text == nullptr      ? "in_progress"
                   : Incomplete(finish) ? "incomplete"
                                        : "completed";
  item["role"] = "assistant";
  item["content"] = text == nullptr ? Json::array() : Json::array({TextPartOut(*text, logprobs)});
  return item;
}

// The item id of the answer's call: "fc_" and the call id's hex digits, so
// that a stream's events and its final object name it alike.
std::string FunctionCallId(const ToolCall& call) {
  const size_t dash = call.id.rfind('-');
  return "fc_" + (dash == std::string::npos ? call.id : call.id.substr(dash + 1));
}

// A call the answer made; `done` false: just added, no arguments yet.
Json OutputFunctionCall(const ToolCall& call, bool done) {
  Json item;
  item["id"] = FunctionCallId(call);
  item["type"] = "function_call";
  item["status"] = done ? "completed" : "in_progress";
  item["arguments"] = done ? call.arguments : "";
  item["call_id"] = call.id;
  item["name"] = call.name;
  return item;
}

// The answer's message: there when it has text, or when it neither called
// a tool nor thought (an empty answer).
bool HasMessage(const std::string& text, const std::vector<ToolCall>& calls,
                const std::optional<std::string>& reasoning) {
  return !text.empty() || (calls.empty() && !reasoning);
}

Json ReasoningPart(const std::string& text) {
  return Json{{"type", "reasoning_text"}, {"text", text}};
}

// The answer's thinking (under --reasoning-parser), as OpenAI's reasoning
// item with the text as reasoning_text content (gpt-oss's shape) and no
// summary; `text` null: just added.
Json OutputReasoning(const std::string& id, const std::string* text) {
  Json item;
  item["id"] = id;
  item["type"] = "reasoning";
  item["summary"] = Json::array();
  item["content"] = text == nullptr ? Json::array() : Json::array({ReasoningPart(*text)});
  item["encrypted_content"] = nullptr;
  item["status"] = text == nullptr ? "in_progress" : "completed";
  return item;
}

}  // namespace

std::optional<ApiError> ParseResponsesRequest(std::string_view body, CompletionRequest* out) {
  *out = CompletionRequest{};
  if (JsonNestedDeeperThan(body)) return TooDeeplyNested("the request body");
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
  // Chat checks tool_choice and parallel_tool_calls against the tools; with
  // none, Responses' own default ("auto") and "none" change nothing.
  const Json* tools = r.Find("tools");
  if (tools != nullptr && !(tools->is_array() && tools->empty())) {
    if (auto e = ChatTools(*tools, &chat["tools"])) return e;
    for (const char* name : {"tool_choice", "parallel_tool_calls"}) {
      if (const Json* v = r.Find(name)) chat[name] = *v;
    }
    // Responses names a tool {"type": "function", "name": ...}; chat nests it
    // under "function".
    if (auto it = chat.find("tool_choice"); it != chat.end() && it->is_object() &&
                                            it->value("type", Json()) == "function" &&
                                            it->contains("name") && !it->contains("function")) {
      *it = {{"type", "function"}, {"function", {{"name", (*it)["name"]}}}};
    }
    fields.tools = *tools;
  } else if (const Json* choice = r.Find("tool_choice");
             choice != nullptr && *choice != "auto" && *choice != "none") {
    return BadRequest(absl::StrCat("'tool_choice' ", choice->dump(), " needs 'tools'"),
                      "tool_choice");
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
  // Logprobs only where include asks for them, as OpenAI and vLLM: then
  // top_logprobs alternatives beside each token.
  if (fields.include_logprobs) out->logprobs = fields.top_logprobs;
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
  r["output"] = Json::array();
  if (output != nullptr) {
    if (output->reasoning) {
      r["output"].push_back(OutputReasoning(run.reasoning_id, &*output->reasoning));
    }
    if (HasMessage(output->text, output->calls, output->reasoning)) {
      r["output"].push_back(
          OutputMessage(run.message_id, &output->text, output->finish, output->logprobs));
    }
    for (const ToolCall& call : output->calls) {
      r["output"].push_back(OutputFunctionCall(call, /*done=*/true));
    }
  }
  r["parallel_tool_calls"] = f.parallel_tool_calls;
  r["previous_response_id"] = nullptr;
  r["reasoning"] = Json{{"effort", nullptr}, {"summary", nullptr}};
  r["service_tier"] = f.service_tier;
  r["store"] = false;
  r["temperature"] = run.temperature;
  r["text"] = Json{{"format", Json{{"type", "text"}}}};
  r["tool_choice"] = f.tool_choice;
  r["tools"] = f.tools;
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
  return out;
}

std::string ResponsesEvents::ReasoningDelta(std::string_view text) {
  if (text.empty() || message_index_ >= 0) return "";
  std::string out;
  if (reasoning_index_ < 0) {
    reasoning_index_ = next_index_++;
    reasoning_.emplace();
    out += Event("response.output_item.added",
                 Json{{"output_index", reasoning_index_},
                      {"item", OutputReasoning(run_.reasoning_id, nullptr)}});
    out += Event("response.content_part.added", Json{{"item_id", run_.reasoning_id},
                                                     {"output_index", reasoning_index_},
                                                     {"content_index", 0},
                                                     {"part", ReasoningPart("")}});
  }
  *reasoning_ += text;
  out += Event("response.reasoning_text.delta", Json{{"item_id", run_.reasoning_id},
                                                     {"output_index", reasoning_index_},
                                                     {"content_index", 0},
                                                     {"delta", text}});
  return out;
}

std::string ResponsesEvents::EndReasoning() {
  if (reasoning_index_ < 0 || reasoning_done_) return "";
  reasoning_done_ = true;
  const Json at{
      {"item_id", run_.reasoning_id}, {"output_index", reasoning_index_}, {"content_index", 0}};
  Json done = at;
  done["text"] = *reasoning_;
  std::string out = Event("response.reasoning_text.done", done);
  Json part = at;
  part["part"] = ReasoningPart(*reasoning_);
  out += Event("response.content_part.done", part);
  out += Event("response.output_item.done",
               Json{{"output_index", reasoning_index_},
                    {"item", OutputReasoning(run_.reasoning_id, &*reasoning_)}});
  return out;
}

std::string ResponsesEvents::StartMessage() {
  std::string out = EndReasoning();
  message_index_ = next_index_++;
  out += Event("response.output_item.added",
               Json{{"output_index", message_index_},
                    {"item", OutputMessage(run_.message_id, nullptr, {})}});
  out += Event("response.content_part.added", Json{{"item_id", run_.message_id},
                                                   {"output_index", message_index_},
                                                   {"content_index", 0},
                                                   {"part", TextPartOut("")}});
  return out;
}

std::string ResponsesEvents::Delta(std::string_view text, const nlohmann::ordered_json& logprobs) {
  const Json pieces = logprobs.is_array() ? logprobs : Json::array();
  logprobs_.insert(logprobs_.end(), pieces.begin(), pieces.end());
  if (text.empty()) return "";
  std::string out = message_index_ >= 0 ? "" : StartMessage();
  text_ += text;
  out += Event("response.output_text.delta", Json{{"item_id", run_.message_id},
                                                  {"output_index", message_index_},
                                                  {"content_index", 0},
                                                  {"delta", text},
                                                  {"logprobs", pieces}});
  return out;
}

std::string ResponsesEvents::Finish(FinishReason finish, const Usage& usage,
                                    const std::vector<ToolCall>& calls) {
  std::string out = EndReasoning();
  if (message_index_ < 0 && HasMessage(text_, calls, reasoning_)) out += StartMessage();
  if (message_index_ >= 0) {
    const Json at{
        {"item_id", run_.message_id}, {"output_index", message_index_}, {"content_index", 0}};
    Json done = at;
    done["text"] = text_;
    done["logprobs"] = logprobs_;
    out += Event("response.output_text.done", done);
    Json part = at;
    part["part"] = TextPartOut(text_, logprobs_);
    out += Event("response.content_part.done", part);
    out += Event("response.output_item.done",
                 Json{{"output_index", message_index_},
                      {"item", OutputMessage(run_.message_id, &text_, finish, logprobs_)}});
  }
  for (const ToolCall& call : calls) {
    const int32_t index = next_index_++;
    const Json at{{"item_id", FunctionCallId(call)}, {"output_index", index}};
    out += Event("response.output_item.added",
                 Json{{"output_index", index}, {"item", OutputFunctionCall(call, false)}});
    Json delta = at;
    delta["delta"] = call.arguments;
    out += Event("response.function_call_arguments.delta", delta);
    Json done = at;
    done["name"] = call.name;
    done["arguments"] = call.arguments;
    out += Event("response.function_call_arguments.done", done);
    out += Event("response.output_item.done",
                 Json{{"output_index", index}, {"item", OutputFunctionCall(call, true)}});
  }
  const ResponsesOutput output{.text = text_,
                               .calls = calls,
                               .finish = finish,
                               .usage = usage,
                               .logprobs = logprobs_,
                               .reasoning = reasoning_};
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
