// The answers' JSON: completions and chat responses, their stream chunks
// (written straight into the SSE text on the hot path) and usage, and the
// response ids (openai.h declares them; openai.cc parses the requests).
#include "tandem/frontend/openai.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "openai_parse.h"

namespace tandem::frontend {
namespace {

using internal::Json;

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

// Whether a choice's finish_reason is "tool_calls" (vLLM's, after OpenAI's):
// calls parsed from an "auto" answer; calls of "required" that stopped; never
// for a named tool (its finish stays "stop" or "length").
bool FinishesWithToolCalls(const CompletionRequest& request, FinishReason finish, bool has_calls) {
  if (!has_calls) return false;
  if (!request.forced_tool) return true;
  return !request.forced_tool->name && finish == FinishReason::kStop;
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
      choice["message"] = {{"role", request.response_role},
                           {"content", c.content_null ? Json() : Json(c.text)}};
      if (c.reasoning) {
        choice["message"]["reasoning"] = *c.reasoning;
        choice["message"]["reasoning_content"] = *c.reasoning;
      }
      if (!c.tool_calls.empty()) {
        choice["message"]["tool_calls"] = RenderToolCalls(c.tool_calls, /*with_index=*/false);
      }
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = c.logprobs;
    AddFinish(&choice, c.finish_reason, c.stop_reason, c.stop_token);
    if (FinishesWithToolCalls(request, c.finish_reason, !c.tool_calls.empty())) {
      choice["finish_reason"] = "tool_calls";
    }
    if (request.return_token_ids) choice["token_ids"] = c.token_ids;
    if (!chat && request.prompt_logprobs) choice["prompt_logprobs"] = c.prompt_logprobs;
    // vLLM: completions carry the prompt's ids in each choice, chat once.
    const size_t prompt = static_cast<size_t>(c.index / std::max(request.n, 1));
    if (!chat && request.return_token_ids && prompt < prompt_token_ids.size()) {
      choice["prompt_token_ids"] = prompt_token_ids[prompt];
    }
    list.push_back(std::move(choice));
  }
  j["choices"] = std::move(list);
  if (chat && request.prompt_logprobs) {
    j["prompt_logprobs"] = choices.empty() ? Json() : choices.front().prompt_logprobs;
  }
  j["usage"] = usage.ToJson();
  if (chat && request.return_token_ids && !prompt_token_ids.empty()) {
    j["prompt_token_ids"] = prompt_token_ids[0];
  }
  return j;
}

// A chunk is written directly rather than built as a JSON tree and dumped:
// one goes out per token per stream, and the tree (an ordered map of a dozen
// nodes) was the frontend's largest cost of its own per token (perf, 256
// streams: nlohmann's tree, its dump and their allocations ~8% of the
// frontend's CPU). The bytes are what the tree's dump() wrote
// (openai_test's ChunksAreTheBytesATreeWouldDump checks it).
namespace {
void AppendIds(std::string* out, const std::vector<int32_t>& ids) {
  *out += '[';
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) *out += ',';
    absl::StrAppend(out, ids[i]);
  }
  *out += ']';
}
}  // namespace

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
    bool fields = false;
    auto field = [&](std::string_view name) {
      absl::StrAppend(&out, fields ? "," : "", "\"", absl::string_view(name.data(), name.size()),
                      "\":");
      fields = true;
    };
    if (delta.first) {
      field("role");
      AppendJsonString(&out, request.response_role);
    }
    if (delta.first || !delta.text.empty()) {
      field("content");
      AppendJsonString(&out, delta.text);
    }
    if (!delta.reasoning.empty()) {
      // vLLM's field, and the name DeepSeek's API and older vLLM use.
      for (const char* name : {"reasoning", "reasoning_content"}) {
        field(name);
        AppendJsonString(&out, delta.reasoning);
      }
    }
    if (!delta.tool_calls.is_null()) {
      field("tool_calls");
      out += delta.tool_calls.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    out += '}';
  } else {
    out += ",\"text\":";
    AppendJsonString(&out, delta.text);
  }
  out += ",\"logprobs\":";
  out += delta.logprobs.dump(-1, ' ', false, Json::error_handler_t::replace);
  out += ",\"finish_reason\":";
  if (delta.finish_reason == FinishReason::kNone) {
    out += "null";
  } else if (FinishesWithToolCalls(request, delta.finish_reason, !delta.tool_calls.is_null())) {
    out += "\"tool_calls\"";
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
  const bool chat = request.endpoint == Endpoint::kChat;
  // vLLM: a choice's first chunk carries the prompt's ids, in the choice
  // (completions) or beside the choices (chat).
  if (!chat && delta.prompt_token_ids != nullptr) {
    out += ",\"prompt_token_ids\":";
    AppendIds(&out, *delta.prompt_token_ids);
  }
  if (request.return_token_ids) {
    out += ",\"token_ids\":";
    AppendIds(&out, delta.token_ids);
  }
  out += "}]";
  if (delta.usage) {
    absl::StrAppend(&out, ",\"usage\":", delta.usage->ToJson().dump());
  } else if (request.include_usage) {
    out += ",\"usage\":null";
  }
  if (chat && delta.prompt_token_ids != nullptr) {
    out += ",\"prompt_token_ids\":";
    AppendIds(&out, *delta.prompt_token_ids);
  }
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
