#include "tandem/frontend/tool_calls.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "python_json.h"
#include "pythonic_tool_calls.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kToolCallStart = "<tool_call>";
constexpr std::string_view kToolCallEnd = "</tool_call>";
constexpr std::string_view kMistralStart = "[TOOL_CALLS]";

// The tag from which hermes and mistral streams hold the answer.
std::string_view HeldFrom(ToolParser parser) {
  return parser == ToolParser::kMistral ? kMistralStart : kToolCallStart;
}

// Mistral's ids: 9 letters and digits (mistral_common's validator, which
// Mistral's chat templates enforce when the call comes back).
std::string MistralToolCallId() {
  static constexpr std::string_view kAlphanumeric =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id;
  for (int k = 0; k < 9; ++k) id += kAlphanumeric[rng() % kAlphanumeric.size()];
  return id;
}

std::string ToolCallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("chatcmpl-tool-%016x%016x", rng(), rng());
}

}  // namespace

namespace {

// A call's name and json.dumps of its arguments (ensure_ascii=False), or
// nullopt where vLLM raises: the name must be a string (pydantic's
// FunctionCall.name), the arguments present.
// llama3_json reads "parameters" where "arguments" is missing.
std::optional<ToolCall> CallOf(const internal::PyJson& call, bool parameters_alias) {
  if (call.type != internal::PyJson::Type::kObject) return std::nullopt;
  const internal::PyJson* name = call.Find("name");
  const internal::PyJson* arguments = call.Find("arguments");
  if (arguments == nullptr && parameters_alias) arguments = call.Find("parameters");
  if (name == nullptr || name->type != internal::PyJson::Type::kString || arguments == nullptr ||
      internal::PyJsonHasLoneSurrogate(name->text)) {
    return std::nullopt;
  }
  std::optional<std::string> dumped = internal::PyJsonDumps(*arguments, /*ensure_ascii=*/false);
  if (!dumped) return std::nullopt;
  return ToolCall{.id = ToolCallId(), .name = name->text, .arguments = *std::move(dumped)};
}

ExtractedToolCalls ExtractHermes(std::string_view text) {
  const size_t first = text.find(kToolCallStart);
  if (first == std::string_view::npos) return {.content = std::string(text)};
  // vLLM's regex <tool_call>(.*?)</tool_call>|<tool_call>(.*), DOTALL, each
  // match through json.loads.
  ExtractedToolCalls out;
  for (size_t at = first; at != std::string_view::npos; at = text.find(kToolCallStart, at)) {
    const size_t body = at + kToolCallStart.size();
    const size_t end = text.find(kToolCallEnd, body);
    const std::string_view json =
        text.substr(body, end == std::string_view::npos ? std::string_view::npos : end - body);
    std::optional<internal::PyJson> loaded = internal::PyJsonLoads(json);
    std::optional<ToolCall> call =
        loaded ? CallOf(*loaded, /*parameters_alias=*/false) : std::nullopt;
    if (!call) return {.content = std::string(text)};
    out.calls.push_back(*std::move(call));
    at = end == std::string_view::npos ? end : end + kToolCallEnd.size();
  }
  if (first > 0) out.content = std::string(text.substr(0, first));
  return out;
}

constexpr std::string_view kPythonTag = "<|python_tag|>";

// A list of {"name": str, "arguments": ...} objects as calls; nullopt for
// anything else. `verbatim_string_arguments`: a string's arguments go out
// as the string (vLLM's regex fallback passes them unencoded) and others
// are refused (there vLLM's FunctionCall refuses them).
std::optional<std::vector<ToolCall>> MistralCalls(const internal::PyJson& list,
                                                  bool verbatim_string_arguments) {
  if (list.type != internal::PyJson::Type::kArray) return std::nullopt;
  std::vector<ToolCall> calls;
  for (const internal::PyJson& item : list.items) {
    std::optional<ToolCall> call = CallOf(item, /*parameters_alias=*/false);
    if (!call) return std::nullopt;
    if (verbatim_string_arguments) {
      const internal::PyJson& arguments = *item.Find("arguments");
      if (arguments.type != internal::PyJson::Type::kString) return std::nullopt;
      call->arguments = arguments.text;
    }
    call->id = MistralToolCallId();
    calls.push_back(*std::move(call));
  }
  return calls;
}

// Python's str.strip() set, ASCII only.
bool IsPythonSpace(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

// vLLM's mistral parser with a Hugging Face tokenizer (its "pre-v11"
// path): content[TOOL_CALLS] [{"name": ..., "arguments": ...}, ...].
ExtractedToolCalls ExtractMistral(std::string_view text) {
  const ExtractedToolCalls none{.content = std::string(text)};
  const size_t first = text.find(kMistralStart);
  if (first == std::string_view::npos) return none;
  std::string_view rest = text.substr(first + kMistralStart.size());
  if (rest.find(kMistralStart) != std::string_view::npos) return none;  // vLLM raises
  while (!rest.empty() && IsPythonSpace(rest.front())) rest.remove_prefix(1);
  while (!rest.empty() && IsPythonSpace(rest.back())) rest.remove_suffix(1);
  std::optional<std::vector<ToolCall>> calls;
  if (std::optional<internal::PyJson> list = internal::PyJsonLoads(rest)) {
    calls = MistralCalls(*list, /*verbatim_string_arguments=*/false);
  } else {
    // vLLM's fallback, the regex \[{.*}\] (DOTALL): from the first "[{" to
    // the last "}]" after it.
    const size_t open = rest.find("[{");
    const size_t close = rest.rfind("}]");
    if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
      return none;
    }
    std::optional<internal::PyJson> found =
        internal::PyJsonLoads(rest.substr(open, close + 2 - open));
    if (found) calls = MistralCalls(*found, /*verbatim_string_arguments=*/true);
  }
  if (!calls) return none;
  ExtractedToolCalls out{.calls = *std::move(calls)};
  if (first > 0) out.content = std::string(text.substr(0, first));
  return out;
}

// vLLM's extract_tool_calls: JSONDecoder.raw_decode at every "{" that is
// not inside (or right after: vLLM's end index is inclusive) an object read
// before; each must be a call, or the whole text is content.
ExtractedToolCalls ExtractLlama3Json(std::string_view text) {
  const ExtractedToolCalls none{.content = std::string(text)};
  ExtractedToolCalls out;  // content null, as vLLM's
  size_t next = 0;         // the first "{" vLLM reads
  for (size_t at = text.find('{'); at != std::string_view::npos; at = text.find('{', at + 1)) {
    if (at < next) continue;
    std::optional<std::pair<internal::PyJson, size_t>> decoded =
        internal::PyJsonRawDecode(text, at);
    if (!decoded) return none;
    next = decoded->second + 1;
    std::optional<ToolCall> call = CallOf(decoded->first, /*parameters_alias=*/true);
    if (!call) return none;
    out.calls.push_back(*std::move(call));
  }
  return out.calls.empty() ? none : out;
}

}  // namespace

std::optional<ToolParser> ToolParserNamed(std::string_view name) {
  if (name == "hermes") return ToolParser::kHermes;
  if (name == "llama3_json" || name == "llama4_json") return ToolParser::kLlama3Json;
  if (name == "pythonic") return ToolParser::kPythonic;
  if (name == "llama4_pythonic") return ToolParser::kLlama4Pythonic;
  if (name == "mistral") return ToolParser::kMistral;
  return std::nullopt;
}

ExtractedToolCalls ExtractToolCalls(ToolParser parser, std::string_view text) {
  switch (parser) {
    case ToolParser::kHermes:
      return ExtractHermes(text);
    case ToolParser::kLlama3Json:
      return ExtractLlama3Json(text);
    case ToolParser::kMistral:
      return ExtractMistral(text);
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

ExtractedToolCalls ExtractForcedToolCalls(const ForcedToolChoice& forced, std::string_view text) {
  const ExtractedToolCalls none{.content = std::string(text)};
  if (forced.name) {
    return {.calls = {{.id = ToolCallId(), .name = *forced.name, .arguments = std::string(text)}},
            .content = ""};
  }
  std::optional<internal::PyJson> list = internal::PyJsonLoads(text);
  if (!list || list->type != internal::PyJson::Type::kArray) return none;
  ExtractedToolCalls out{.content = ""};
  for (const internal::PyJson& item : list->items) {
    const internal::PyJson* name = item.Find("name");
    const internal::PyJson* parameters = item.Find("parameters");
    if (name == nullptr || name->type != internal::PyJson::Type::kString || parameters == nullptr) {
      return none;
    }
    std::optional<std::string> arguments =
        internal::PyJsonDumps(*parameters, /*ensure_ascii=*/false);
    if (!arguments) return none;
    out.calls.push_back(
        {.id = ToolCallId(), .name = name->text, .arguments = *std::move(arguments)});
  }
  return out.calls.empty() ? none : out;
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
  if (forced_) return "";
  if (parser_ != ToolParser::kHermes && parser_ != ToolParser::kMistral) {
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
  const std::string_view tag = HeldFrom(parser_);
  size_t until = text_.find(tag, released_);
  if (until != std::string::npos) {
    in_call_ = true;
  } else {
    // Hold a tail that may be the start of the tag.
    until = text_.size();
    for (size_t k = std::min(tag.size() - 1, text_.size()); k > 0; --k) {
      if (std::string_view(text_).substr(text_.size() - k) == tag.substr(0, k)) {
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
  if (forced_) {
    released_ = text_.size();
    return ExtractForcedToolCalls(*forced_, text_);
  }
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
