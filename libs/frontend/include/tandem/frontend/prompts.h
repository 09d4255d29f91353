// The tokenizer as tandem-frontend serves it, and the prompts of a request
// turned into token ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/common/model_info.h"
#include "tandem/frontend/openai.h"
#include "tandem/tokenizer/chat_template.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::frontend {

// A tokenizer, its model's chat template (if any) and what the frontend
// derives from its vocabulary once: each token's own bytes (logprobs) and
// the longest entry (prompt byte bound). Immutable; any thread.
class ServedTokenizer {
 public:
  // `tool_use`: the template for requests with tools
  // (ChatTemplate::SelectToolUse), or why it cannot be rendered.
  ServedTokenizer(std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
                  std::optional<tokenizer::ChatTemplate> chat_template,
                  absl::StatusOr<std::optional<tokenizer::ChatTemplate>> tool_use = std::nullopt);

  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::optional<tokenizer::ChatTemplate>& chat_template() const { return chat_template_; }
  const absl::StatusOr<std::optional<tokenizer::ChatTemplate>>& tool_use_chat_template() const {
    return tool_use_;
  }
  // The bytes token `id` stands for, decoded alone (tokenizer::PieceBytes);
  // "" outside the vocabulary.
  const std::string& TokenBytes(int32_t id) const;
  // The longest vocabulary entry, in bytes (at least 1).
  int64_t max_token_bytes() const { return max_token_bytes_; }
  // The most bytes of prompt text worth tokenizing for `model` (issue 29):
  // max_model_len x the longest vocabulary entry in bytes. A prompt the
  // model can take has fewer than max_model_len tokens, and each token
  // stands for at most its entry's bytes (an entry is never shorter than
  // the text it encodes: "▁" and GPT-2's byte alphabet take 2-3 bytes for
  // one, "<0x0A>" 6 for one), so no valid prompt is longer. Larger prompts
  // are refused before any tokenizer (or chat template) work, even with
  // truncate_prompt_tokens: truncation is for prompts near the context,
  // not for megabytes of text that would cost seconds of CPU to encode and
  // then be thrown away. Text a normalizer deletes (control characters
  // some drop, accents BERT's strips) still counts. Without a described
  // model (max_model_len unknown) nothing is refused here.
  int64_t PromptByteLimit(const ModelInfo& model) const;

 private:
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::optional<tokenizer::ChatTemplate> chat_template_;
  absl::StatusOr<std::optional<tokenizer::ChatTemplate>> tool_use_;
  int64_t max_token_bytes_ = 1;
  std::vector<std::string> token_bytes_;  // by id
};

// The token ids of each prompt of `request` (one for chat: the rendered
// conversation), the prompt texts for echo, and the checks every path
// shares: non-empty, ids inside the vocabulary, shorter than max_model_len.
struct PreparedPrompts {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> texts;
  // The request's bad_words as vLLM tokenizes them (update_from_tokenizer):
  // each word lstripped, encoded without special tokens, then with a space
  // before it where that gives a new first token in as many tokens.
  std::vector<std::vector<int32_t>> bad_words;
};
// `check_context` false (/tokenize): a prompt with no room for a completion
// is counted, not refused (as vLLM's /tokenize); the byte bound still holds.
[[nodiscard]] std::optional<ApiError> PreparePrompts(const ServedTokenizer& tokenizer,
                                                     const CompletionRequest& request,
                                                     const ModelInfo& model, PreparedPrompts* out,
                                                     bool check_context = true);

// OpenAI's 400 for a request longer than the context (code
// "context_length_exceeded").
[[nodiscard]] ApiError ContextLengthError(const std::string& message, const std::string& param);

}  // namespace tandem::frontend
