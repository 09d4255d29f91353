// The model's thinking out of its answer, as vLLM's --reasoning-parser
// gives it: models that think in <think>...</think> (DeepSeek-R1 and its
// distills: deepseek_r1; Qwen3: qwen3) answer chat with the thinking in
// the message's "reasoning" (vLLM's field since 0.11; also under
// "reasoning_content", the name DeepSeek's API and older vLLM use, which
// many clients read) and the rest in "content"; /v1/responses gives it as a
// reasoning item before the message.
//
// The split (vLLM's BaseThinkingReasoningParser.extract_reasoning, which
// both parsers share):
//  - a "<think>" that opens the output is dropped (older Qwen3 templates
//    let the model write it; DeepSeek-R1's and newer Qwen3's put it in the
//    prompt);
//  - the text up to the first "</think>" is the reasoning, the rest the
//    content (null when empty);
//  - without "</think>" the whole output is reasoning (the answer was cut
//    while thinking);
//  - the whole output is content instead when the prompt already closed a
//    think block (vLLM's prompt_is_reasoning_end: the last "</think>" in the
//    rendered prompt comes after its last "<think>", as Qwen3's template
//    writes with enable_thinking false), and for qwen3 when the request's
//    chat_template_kwargs set enable_thinking false (vLLM's
//    thinking_enabled).
// Where vLLM differs, here: vLLM drops the first "<think>" wherever it is
// (and the text before it) when not streaming and keeps it when streaming;
// here only an opening one is dropped, the same both ways. vLLM's qwen3
// also ends the reasoning at a "<tool_call>" followed by "<function=" (the
// Qwen3-Coder / Qwen3.5 tool format, which no tool parser here reads): not
// here.
// A stream (ReasoningStream) carries exactly the split of the whole text:
// it holds back only what may still become a tag.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"

namespace tandem::frontend {

enum class ReasoningParser { kDeepSeekR1, kQwen3 };
// The tag that ends the thinking (both parsers').
inline constexpr std::string_view kReasoningEnd = "</think>";
// --reasoning-parser's names; nullopt for any other.
[[nodiscard]] std::optional<ReasoningParser> ReasoningParserNamed(std::string_view name);
inline constexpr std::string_view kReasoningParserNames = "deepseek_r1, qwen3";

// Whether the output starts as reasoning: false when the prompt closed a
// think block, or (qwen3) when chat_template_kwargs turn thinking off.
[[nodiscard]] bool StartsInReasoning(ReasoningParser parser, std::string_view prompt_text,
                                     const nlohmann::ordered_json& chat_template_kwargs);

struct ReasoningSplit {
  std::optional<std::string> reasoning;  // nullopt: none
  std::optional<std::string> content;    // nullopt: null
};
[[nodiscard]] ReasoningSplit SplitReasoning(std::string_view text, bool starts_in_reasoning);

// The same split over a stream of text deltas.
class ReasoningStream {
 public:
  explicit ReasoningStream(bool starts_in_reasoning) : in_reasoning_(starts_in_reasoning) {}
  struct Piece {
    std::string reasoning;
    std::string content;
  };
  // What of the output so far may go out now.
  [[nodiscard]] Piece Push(std::string_view delta);
  // At the end: what was held back (as reasoning: no tag completed it).
  [[nodiscard]] Piece Finish();

 private:
  bool in_reasoning_;
  bool at_start_ = true;  // an opening "<think>" may still come
  std::string held_;      // a tag's possible beginning
};

}  // namespace tandem::frontend
