#include "tandem/frontend/tool_calls.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kStart = "<tool_call>";
constexpr std::string_view kEnd = "</tool_call>";

std::string ToolCallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("chatcmpl-tool-%016x%016x", rng(), rng());
}

void Dumps(const Json& v, std::string* out) {
  if (v.is_object()) {
    *out += '{';
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) *out += ", ";
      first = false;
      *out += Json(key).dump(-1, ' ', false, Json::error_handler_t::replace);
      *out += ": ";
      Dumps(value, out);
    }
    *out += '}';
  } else if (v.is_array()) {
    *out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) *out += ", ";
      Dumps(v[i], out);
    }
    *out += ']';
  } else {
    *out += v.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

}  // namespace

std::string PythonJsonDumps(const Json& value) {
  std::string out;
  Dumps(value, &out);
  return out;
}

ExtractedToolCalls ExtractHermesToolCalls(std::string_view text) {
  const size_t first = text.find(kStart);
  if (first == std::string_view::npos) return {.content = std::string(text)};
  // vLLM's regex <tool_call>(.*?)</tool_call>|<tool_call>(.*), DOTALL.
  ExtractedToolCalls out;
  for (size_t at = first; at != std::string_view::npos; at = text.find(kStart, at)) {
    const size_t body = at + kStart.size();
    const size_t end = text.find(kEnd, body);
    const std::string_view json =
        text.substr(body, end == std::string_view::npos ? std::string_view::npos : end - body);
    const Json call = Json::parse(json, nullptr, /*allow_exceptions=*/false);
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string() ||
        !call.contains("arguments")) {
      return {.content = std::string(text)};
    }
    out.calls.push_back({.id = ToolCallId(),
                         .name = call["name"].get<std::string>(),
                         .arguments = PythonJsonDumps(call["arguments"])});
    at = end == std::string_view::npos ? end : end + kEnd.size();
  }
  if (first > 0) out.content = std::string(text.substr(0, first));
  return out;
}

Json RenderToolCalls(const std::vector<ToolCall>& calls, bool with_index) {
  Json list = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json call;
    if (with_index) call["index"] = i;
    call["id"] = calls[i].id;
    call["type"] = "function";
    call["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    list.push_back(std::move(call));
  }
  return list;
}

std::string HermesToolStream::Push(std::string_view delta) {
  text_ += delta;
  if (in_call_) return "";
  // Held tails are prefixes of the tag, so a tag starts at released_ or later.
  size_t until = text_.find(kStart, released_);
  if (until != std::string::npos) {
    in_call_ = true;
  } else {
    // Hold a tail that may be the start of the tag.
    until = text_.size();
    for (size_t k = std::min(kStart.size() - 1, text_.size()); k > 0; --k) {
      if (std::string_view(text_).substr(text_.size() - k) == kStart.substr(0, k)) {
        until = text_.size() - k;
        break;
      }
    }
  }
  std::string out = text_.substr(released_, until - released_);
  released_ = until;
  return out;
}

ExtractedToolCalls HermesToolStream::Finish() {
  ExtractedToolCalls all = ExtractHermesToolCalls(text_);
  if (all.calls.empty()) {
    all.content = text_.substr(released_);  // what was held: a tag that did not parse
  } else {
    all.content.reset();  // the text before the tag is out already
  }
  released_ = text_.size();
  return all;
}

}  // namespace tandem::frontend
