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
// Not thread-safe (one per request); the tokenizer must outlive it. Stop
// strings are the frontend's business, not this class's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::tokenizer {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, const DecodeOptions& options = {})
      : stream_(tokenizer.NewDecodeStream(options)) {}

  // The text `id` completes (often empty). INVALID_ARGUMENT for an id outside
  // the vocabulary, which is then ignored: the stream stays as it was.
  [[nodiscard]] absl::StatusOr<std::string> Push(int32_t id);
  // The text held back at the end of the stream; call once, after the last
  // Push.
  [[nodiscard]] std::string Finish();

  int64_t num_ids() const { return num_ids_; }

 private:
  std::unique_ptr<DecodeStream> stream_;
  int64_t num_ids_ = 0;
  bool finished_ = false;
};

}  // namespace tandem::tokenizer
