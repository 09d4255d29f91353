// Streaming detokenization for the frontend: feed generated ids one at a time,
// send each piece of newly completed text to the client.
//
//   IncrementalDetokenizer detok(*tokenizer, {.skip_special_tokens = true});
//   for (int32_t id : generated) {
//     TANDEM_ASSIGN_OR_RETURN(std::string delta, detok.Push(id));
//     Send(delta);                        // may be empty
//   }
//   Send(detok.Finish());
//
// Guarantees, for every tokenizer kind:
//   - the concatenation of all deltas and Finish() is exactly
//     tokenizer.Decode(ids, options) (tokenizer.bin and tokenizer.json decode
//     through the same streams; tokenizer.model's stream is tested against
//     libsentencepiece's Decode);
//   - every delta is well-formed UTF-8 on its own: bytes of a character split
//     across tokens (an emoji as four <0xXX> tokens, GPT-2's byte alphabet)
//     wait until the character is complete;
//   - SentencePiece-style leading spaces are stripped exactly where a full
//     decode strips them (the first token after BOS), never again later.
// Text is held back only as long as it may still change: an incomplete
// character, a run of byte tokens that tokenizers.js decodes as one, a
// decoder's trailing-strip candidates, or the three bytes clean_up_tokenization
// needs to look at. Push costs O(1) amortized per id (SentencePiece: one
// libsentencepiece decode of at most a few ids).
//
// A continuation of a prompt: construct with the prompt's ids, and the deltas
// add up to Decode(prompt + ids) minus Decode(prompt), as vLLM's incremental
// detokenizer (primed with the prompt's last tokens) returns them, so the
// first generated word keeps its leading space ("▁Vil" after "Once upon a
// time" is " Vil"; a fresh stream strips it as the start of a text). The
// stream is primed with the prompt's last tokens only (at least
// kMinPromptContext, going back to the start of a character that decodes to
// text, at most kMaxPromptContext; the whole prompt when it is shorter): what
// a decode does at a token depends only on the few characters before it.
// Text of the prompt the stream still held (an unfinished character, a
// candidate for clean-up) is left out of the deltas as far as the output
// repeats it; when the output changes it (it completes a character the
// prompt's last byte tokens began) the deltas start with the changed
// character.
//
// Not thread-safe (one per request); the tokenizer must outlive it. Stop
// strings are the frontend's business, not this class's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::tokenizer {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, const DecodeOptions& options = {})
      : stream_(tokenizer.NewDecodeStream(options)) {}
  // A stream of the ids that continue `prompt` (see above).
  IncrementalDetokenizer(const Tokenizer& tokenizer, const DecodeOptions& options,
                         absl::Span<const int32_t> prompt);

  static constexpr size_t kMinPromptContext = 8;
  static constexpr size_t kMaxPromptContext = 32;

  // The text `id` completes (often empty). INVALID_ARGUMENT for an id outside
  // the vocabulary, which is then ignored: the stream stays as it was.
  [[nodiscard]] absl::StatusOr<std::string> Push(int32_t id);
  // The text held back at the end of the stream; call once, after the last
  // Push.
  [[nodiscard]] std::string Finish();

  int64_t num_ids() const { return num_ids_; }

 private:
  // Drops the leading characters of `delta` that repeat prompt_held_.
  std::string SkipPromptText(std::string delta);

  std::unique_ptr<DecodeStream> stream_;
  std::string prompt_held_;  // the prompt's text the stream held back, not yet matched
  int64_t num_ids_ = 0;
  bool finished_ = false;
};

}  // namespace tandem::tokenizer
