// Tool calls in generated text, as vLLM's `--tool-call-parser hermes` reads
// them (Qwen2.5, Qwen3, Hermes and the other models whose chat templates ask
// for <tool_call>{"name": ..., "arguments": ...}</tool_call>):
//  - every <tool_call>...</tool_call>, and a last <tool_call> left open up to
//    the end, is one call; its JSON must have a string "name" and
//    "arguments", which the call carries re-serialized as Python's
//    json.dumps(arguments, ensure_ascii=False) writes it;
//  - the content is the text before the first <tool_call> (null when empty);
//  - any call that does not parse leaves the whole text as content and no
//    call, as vLLM does.
// Streams (HermesToolStream): the text before the first <tool_call> goes out
// as it comes; from the tag on, the rest waits for the end, where the same
// extraction decides, so a stream carries exactly the non-streamed answer
// (its calls in one delta each, which OpenAI clients accumulate).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem::frontend {

// The parsers --tool-call-parser takes.
inline constexpr std::string_view kHermesToolParser = "hermes";

struct ToolCall {
  std::string id;         // "chatcmpl-tool-" + 32 hex digits, as vLLM's
  std::string name;
  std::string arguments;  // JSON text
};

struct ExtractedToolCalls {
  std::vector<ToolCall> calls;         // empty: no tool was called
  std::optional<std::string> content;  // nullopt: null
};

[[nodiscard]] ExtractedToolCalls ExtractHermesToolCalls(std::string_view text);

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators,
// keys in their order, non-ASCII as is.
[[nodiscard]] std::string PythonJsonDumps(const nlohmann::ordered_json& value);

// The OpenAI message's tool_calls list (streams add "index").
[[nodiscard]] nlohmann::ordered_json RenderToolCalls(const std::vector<ToolCall>& calls,
                                                     bool with_index);

class HermesToolStream {
 public:
  // Appends a delta of the choice's text; returns the content that may go
  // out now (none of a <tool_call> or of what may become one).
  [[nodiscard]] std::string Push(std::string_view delta);
  // At the end: the calls, and the content not yet out (all that was held
  // when no call parsed).
  [[nodiscard]] ExtractedToolCalls Finish();

 private:
  std::string text_;
  size_t released_ = 0;
  bool in_call_ = false;
};

}  // namespace tandem::frontend
