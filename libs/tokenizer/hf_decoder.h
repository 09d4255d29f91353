// tokenizer.json's decoders, as streams (private).
//
// A decoder turns the list of tokens into text (tokens.join("") after the
// chain). Each decoder here is a stage that consumes tokens one at a time and
// passes on the parts whose text is final, so decoding a whole list and
// streaming it are the same code. A part carries `first`/`last` marks: a
// stage may emit one logical token (say the text of a run of byte tokens, or
// everything after Fuse) in several parts, and later stages that work per
// token (Strip, Metaspace, Replace) see where tokens begin and end.
//
// Supported: ByteLevel, Metaspace, Replace (String pattern), ByteFallback,
// Fuse, Strip, Sequence, and no decoder (tokens joined by " "). Semantics are
// tokenizers.js's, where it differs from the Rust crate:
//   - ByteLevel passes added tokens through unchanged and decodes each run of
//     other tokens as one byte string (as transformers' Python tokenizers and
//     tokenizers.js do; Rust byte-decodes added tokens too).
//   - ByteFallback decodes a run of byte tokens with the WHATWG decoder (one
//     U+FFFD per maximal ill-formed subpart, like TextDecoder); Rust replaces
//     every byte of an ill-formed run. Unlike tokenizers.js we keep a U+FEFF
//     at the start of a run: its TextDecoder strips it as a byte-order mark,
//     which loses text (the Rust crate keeps it).
//   - Metaspace strips the first token's leading space only when
//     prepend_scheme is not "never" (Rust; tokenizers.js always strips).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hf_components.h"

namespace tandem::tokenizer::internal {

struct DecoderPart {
  std::string text;
  bool added = false;  // an added token's content, which ByteLevel leaves alone
  bool first = true;   // starts a logical token
  bool last = true;    // ends it
};

class DecoderStage {
 public:
  virtual ~DecoderStage() = default;
  // Consumes one part; appends the parts that are now final to `out`.
  virtual void Push(DecoderPart part, std::vector<DecoderPart>* out) = 0;
  // End of input: appends what was held back.
  virtual void Finish(std::vector<DecoderPart>* out) = 0;
};

// The parsed decoder configuration; makes fresh stages for each stream.
class DecoderSpec {
 public:
  virtual ~DecoderSpec() = default;
  virtual void AppendStages(std::vector<std::unique_ptr<DecoderStage>>* stages) const = 0;
};

// A null decoder is "join with spaces".
absl::StatusOr<std::unique_ptr<DecoderSpec>> ParseDecoder(const Json& json,
                                                          const std::string& where);

// Runs parts through a list of stages.
class DecoderPipeline {
 public:
  explicit DecoderPipeline(const DecoderSpec& spec) { spec.AppendStages(&stages_); }
  // Appends the final text that `part` completes to `out`.
  void Push(DecoderPart part, std::string* out);
  void Finish(std::string* out);

 private:
  void Run(size_t stage, std::vector<DecoderPart>& parts, std::string* out);
  std::vector<std::unique_ptr<DecoderStage>> stages_;
};

// transformers' clean_up_tokenization as a stream: the replacements
// " ." -> ".", " ?" -> "?", " !" -> "!", " ," -> ",", " ' " -> "'",
// " n't" -> "n't", " 'm" -> "'m", " 's" -> "'s", " 've" -> "'ve",
// " 're" -> "'re", applied one after the other to the whole text. Every
// pattern starts with a space and is at most 4 bytes long, and applying them
// only deletes spaces, so no match can span a point with three non-space bytes
// before it: text up to such a point is cleaned and emitted.
class CleanUpStream {
 public:
  void Push(std::string_view text, std::string* out);
  void Finish(std::string* out);

 private:
  std::string pending_;
};

// The whole-text version (tests use it).
std::string CleanUpTokenization(std::string text);

}  // namespace tandem::tokenizer::internal
