#include "tandem/frontend/tool_calls.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "pythonic_tool_calls.h"

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
  } else if (v.is_number_float()) {
    *out += internal::PythonFloatRepr(v.get<double>());  // 1e15 as 1000000000000000.0
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

namespace {

ExtractedToolCalls ExtractHermes(std::string_view text) {
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

constexpr std::string_view kPythonTag = "<|python_tag|>";

// vLLM's {[^{}]*(?:{[^{}]*}[^{}]*)*} at `at`: the end of the match, or npos.
// The classes exclude braces, so the match is unique: no backtracking.
size_t MatchLlamaObject(std::string_view t, size_t at) {
  if (at >= t.size() || t[at] != '{') return std::string_view::npos;
  size_t i = at + 1;
  for (;;) {
    while (i < t.size() && t[i] != '{' && t[i] != '}') ++i;
    if (i >= t.size()) return std::string_view::npos;
    if (t[i] == '}') return i + 1;
    ++i;  // an inner object: no braces until its end
    while (i < t.size() && t[i] != '{' && t[i] != '}') ++i;
    if (i >= t.size() || t[i] == '{') return std::string_view::npos;
    ++i;
  }
}

bool IsPythonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// The first match of the whole pattern, P(?:\s*;\s*P)*, as re.search finds
// it: the leftmost start where P matches, then as many "; P" as follow.
std::optional<std::string_view> SearchLlamaCalls(std::string_view t) {
  for (size_t at = t.find('{'); at != std::string_view::npos; at = t.find('{', at + 1)) {
    size_t end = MatchLlamaObject(t, at);
    if (end == std::string_view::npos) continue;
    for (;;) {
      size_t i = end;
      while (i < t.size() && IsPythonSpace(t[i])) ++i;
      if (i >= t.size() || t[i] != ';') break;
      ++i;
      while (i < t.size() && IsPythonSpace(t[i])) ++i;
      const size_t next = MatchLlamaObject(t, i);
      if (next == std::string_view::npos) break;
      end = next;
    }
    return t.substr(at, end - at);
  }
  return std::nullopt;
}

ExtractedToolCalls ExtractLlama3Json(std::string_view text) {
  const ExtractedToolCalls none{.content = std::string(text)};
  if (text.find(kPythonTag) == std::string_view::npos && text.find('{') == std::string_view::npos) {
    return none;
  }
  const std::optional<std::string_view> found = SearchLlamaCalls(text);
  if (!found) return none;
  ExtractedToolCalls out;  // content null, as vLLM's
  for (absl::string_view piece :
       absl::StrSplit(absl::string_view(found->data(), found->size()), ';')) {
    piece = absl::StripAsciiWhitespace(piece);
    if (piece.empty()) continue;
    const Json call = Json::parse(std::string_view(piece.data(), piece.size()), nullptr,
                                  /*allow_exceptions=*/false);
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return none;
    const auto args = call.contains("arguments") ? call.find("arguments") : call.find("parameters");
    if (args == call.end()) return none;
    out.calls.push_back({.id = ToolCallId(),
                         .name = call["name"].get<std::string>(),
                         .arguments = PythonJsonDumps(*args)});
  }
  return out;
}

}  // namespace

std::optional<ToolParser> ToolParserNamed(std::string_view name) {
  if (name == "hermes") return ToolParser::kHermes;
  if (name == "llama3_json" || name == "llama4_json") return ToolParser::kLlama3Json;
  if (name == "pythonic") return ToolParser::kPythonic;
  if (name == "llama4_pythonic") return ToolParser::kLlama4Pythonic;
  return std::nullopt;
}

ExtractedToolCalls ExtractToolCalls(ToolParser parser, std::string_view text) {
  switch (parser) {
    case ToolParser::kHermes:
      return ExtractHermes(text);
    case ToolParser::kLlama3Json:
      return ExtractLlama3Json(text);
    case ToolParser::kPythonic:
    case ToolParser::kLlama4Pythonic: {
      ExtractedToolCalls out = internal::ExtractPythonicToolCalls(
          text, /*llama4=*/parser == ToolParser::kLlama4Pythonic);
      for (ToolCall& call : out.calls) call.id = ToolCallId();
      return out;
    }
  }
  return {.content = std::string(text)};
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

std::string ToolCallStream::Push(std::string_view delta) {
  text_ += delta;
  if (parser_ != ToolParser::kHermes) {
    // vLLM streams as a call only an answer that starts as one: llama3_json's
    // with "{" or <|python_tag|>, pythonic's with "[", llama4_pythonic's
    // with "[" or <|python_start|>.
    if (!decided_) {
      const std::string_view tag = parser_ == ToolParser::kLlama3Json       ? kPythonTag
                                   : parser_ == ToolParser::kLlama4Pythonic ? "<|python_start|>"
                                                                            : "";
      const bool could_be_tag = !tag.empty() && tag.substr(0, std::min(text_.size(), tag.size())) ==
                                                    std::string_view(text_).substr(0, tag.size());
      if (text_.empty() || (could_be_tag && text_.size() < tag.size())) return "";
      in_call_ = text_[0] == (parser_ == ToolParser::kLlama3Json ? '{' : '[') || could_be_tag;
      decided_ = true;
    }
    if (in_call_) return "";
    std::string out = text_.substr(released_);
    released_ = text_.size();
    return out;
  }
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

ExtractedToolCalls ToolCallStream::Finish() {
  // Only an answer held as a call is extracted: before hermes' first tag
  // there is none, and a llama3_json answer that did not start as one went
  // out as content.
  ExtractedToolCalls all;
  if (in_call_) all = ExtractToolCalls(parser_, text_);
  if (all.calls.empty()) {
    all.content = text_.substr(released_);  // what was held: a tag that did not parse
  } else {
    all.content.reset();  // the text before the tag is out already
  }
  released_ = text_.size();
  return all;
}

}  // namespace tandem::frontend
