// Tool calls in generated text, as vLLM's --tool-call-parser reads them.
//
// hermes (Qwen2.5, Qwen3, Hermes and the other models whose chat templates
// ask for <tool_call>{"name": ..., "arguments": ...}</tool_call>):
//  - every <tool_call>...</tool_call>, and a last <tool_call> left open up to
//    the end, is one call; its JSON must have a string "name" and
//    "arguments", which the call carries re-serialized as Python's
//    json.dumps(arguments, ensure_ascii=False) writes it;
//  - the content is the text before the first <tool_call> (null when empty);
//  - any call that does not parse leaves the whole text as content and no
//    call, as vLLM does.
// Streams (ToolCallStream): the text before the first <tool_call> goes out
// as it comes; from the tag on, the rest waits for the end, where the same
// extraction decides, so a stream carries exactly the non-streamed answer
// (its calls in one delta each, which OpenAI clients accumulate).
//
// llama3_json (Llama 3.1 to 3.3 with vLLM's JSON tool template; Llama 4's
// llama4_json is the same parser), as vLLM's current parser reads an answer:
//  - Python's JSONDecoder.raw_decode at every "{" not inside (or right
//    after) an object read before, nested to any depth; each must load as
//    an object with a string "name" and "arguments" (else "parameters");
//  - with calls, the content is null, whatever text surrounds them; any
//    "{" that does not load as a call leaves the whole text as content.
// JSON is read and written as Python's json module (python_json.h):
// NaN and Infinity, integers of any size, a repeated key's last value.
// Streams, as vLLM's: an answer that starts with "{" (or <|python_tag|>) is
// held to the end and extracted there; any other streams as content, and
// carries no calls even if a later part would (vLLM's streams do the same;
// its whole answers search the whole text).
//
// mistral (Mistral 7B Instruct v0.3 and the Mistral models whose Hugging
// Face tokenizer writes [TOOL_CALLS] before a JSON list of calls), as
// vLLM's parser reads it with such a tokenizer:
//  - the text after the one [TOOL_CALLS], stripped, must load as a list of
//    objects with a string "name" and "arguments" (json.dumps'd); where it
//    does not load, vLLM's fallback reads from its first "[{" to its last
//    "}]", whose arguments must then be strings (passed as they are);
//  - the content is the text before the tag (null when empty); calls get
//    Mistral's 9-character ids, which its chat templates demand back;
//  - anything else leaves the whole text as content. vLLM fails the
//    request outright where a second [TOOL_CALLS] follows, where the JSON
//    is no list of calls, or where the fallback's arguments are no strings,
//    and where nothing loads its content drops the text before the tag.
// Streams as hermes', held from [TOOL_CALLS] on.
//
// pythonic (Llama 3.2, ToolACE) and llama4_pythonic (Llama 4): an answer
// that is a Python list of calls, [f(a=1), g()]; pythonic_tool_calls.h
// says how it is read. Streams as llama3_json's, an answer that starts
// with "[" (or <|python_start|> for llama4_pythonic) held to the end.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem::frontend {

enum class ToolParser { kHermes, kLlama3Json, kPythonic, kLlama4Pythonic, kMistral };
// --tool-call-parser's names: hermes, llama3_json, llama4_json, pythonic,
// llama4_pythonic, mistral; nullopt for any other.
[[nodiscard]] std::optional<ToolParser> ToolParserNamed(std::string_view name);
inline constexpr std::string_view kToolParserNames =
    "hermes, llama3_json, llama4_json, pythonic, llama4_pythonic, mistral";

struct ToolCall {
  std::string id;         // "chatcmpl-tool-" + 32 hex digits, as vLLM's
  std::string name;
  std::string arguments;  // JSON text
};

struct ExtractedToolCalls {
  std::vector<ToolCall> calls;         // empty: no tool was called
  std::optional<std::string> content;  // nullopt: null
};

[[nodiscard]] ExtractedToolCalls ExtractToolCalls(ToolParser parser, std::string_view text);

// tool_choice "required" or a named tool: the output was held to the calls'
// JSON (the frontend's ParseForcedToolChoice gives vLLM's schema), and is
// read back as vLLM's _parse_tool_calls_from_content reads it:
//  - named: one call of that tool whose arguments are the text as it is;
//  - "required": a JSON list of {"name": ..., "parameters": ...}, each a
//    call whose arguments are json.dumps(parameters, ensure_ascii=False);
// with calls, the content is "" (vLLM's). An answer cut before its list
// closed has no calls and the text as content (vLLM fails the request).
struct ForcedToolChoice {
  std::optional<std::string> name;  // nullopt: "required"
};
[[nodiscard]] ExtractedToolCalls ExtractForcedToolCalls(const ForcedToolChoice& forced,
                                                        std::string_view text);

// The OpenAI message's tool_calls list (streams add "index").
[[nodiscard]] nlohmann::ordered_json RenderToolCalls(const std::vector<ToolCall>& calls,
                                                     bool with_index);

// A forced tool choice's stream holds the whole answer and gives its calls at
// the end (vLLM streams their arguments as they come; clients accumulate
// either).
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolParser parser) : parser_(parser) {}
  explicit ToolCallStream(ForcedToolChoice forced) : forced_(std::move(forced)) {}
  // Appends a delta of the choice's text; returns the content that may go
  // out now (none of a <tool_call> or of what may become one).
  [[nodiscard]] std::string Push(std::string_view delta);
  // At the end: the calls, and the content not yet out (all that was held
  // when no call parsed).
  [[nodiscard]] ExtractedToolCalls Finish();

 private:
  ToolParser parser_ = ToolParser::kHermes;
  std::optional<ForcedToolChoice> forced_;
  std::string text_;
  size_t released_ = 0;
  bool in_call_ = false;  // hermes, mistral: past the first tag; the others: starts as a call
  bool decided_ = false;  // not hermes: its first characters are in
};

}  // namespace tandem::frontend
