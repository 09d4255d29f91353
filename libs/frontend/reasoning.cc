#include "tandem/frontend/reasoning.h"

#include <algorithm>

namespace tandem::frontend {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = kReasoningEnd;

// The length of the longest suffix of `text` that is a proper prefix of
// `tag` (what may still become the tag).
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (tag.substr(0, n) == text.substr(text.size() - n)) return n;
  }
  return 0;
}

}  // namespace

std::optional<ReasoningParser> ReasoningParserNamed(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningParser::kDeepSeekR1;
  if (name == "qwen3") return ReasoningParser::kQwen3;
  return std::nullopt;
}

bool StartsInReasoning(ReasoningParser parser, std::string_view prompt_text,
                       const nlohmann::ordered_json& chat_template_kwargs) {
  if (parser == ReasoningParser::kQwen3 && chat_template_kwargs.is_object()) {
    auto it = chat_template_kwargs.find("enable_thinking");
    if (it != chat_template_kwargs.end() && it->is_boolean() && !it->get<bool>()) return false;
  }
  const size_t start = prompt_text.rfind(kThinkStart);
  const size_t end = prompt_text.rfind(kThinkEnd);
  return end == std::string_view::npos || (start != std::string_view::npos && start > end);
}

ReasoningSplit SplitReasoning(std::string_view text, bool starts_in_reasoning) {
  if (!starts_in_reasoning) return {.content = std::string(text)};
  if (text.substr(0, kThinkStart.size()) == kThinkStart) text.remove_prefix(kThinkStart.size());
  const size_t end = text.find(kThinkEnd);
  if (end == std::string_view::npos) return {.reasoning = std::string(text)};
  ReasoningSplit split{.reasoning = std::string(text.substr(0, end))};
  if (end + kThinkEnd.size() < text.size())
    split.content = std::string(text.substr(end + kThinkEnd.size()));
  return split;
}

ReasoningStream::Piece ReasoningStream::Push(std::string_view delta) {
  Piece out;
  if (!in_reasoning_) {
    out.content = std::string(delta);
    return out;
  }
  held_ += delta;
  if (at_start_) {
    if (held_.size() < kThinkStart.size() && kThinkStart.substr(0, held_.size()) == held_)
      return out;
    if (std::string_view(held_).substr(0, kThinkStart.size()) == kThinkStart)
      held_.erase(0, kThinkStart.size());
    at_start_ = false;
  }
  const size_t end = held_.find(kThinkEnd);
  if (end != std::string::npos) {
    out.reasoning = held_.substr(0, end);
    out.content = held_.substr(end + kThinkEnd.size());
    held_.clear();
    in_reasoning_ = false;
    return out;
  }
  const size_t keep = PartialTagSuffix(held_, kThinkEnd);
  out.reasoning = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

ReasoningStream::Piece ReasoningStream::Finish() {
  Piece out;
  out.reasoning = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace tandem::frontend
