// Text <-> token ids for the frontend: one interface over three formats.
//
//   TANDEM_ASSIGN_OR_RETURN(auto tok, LoadTokenizer("models/llama3"));
//   TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("Hello"));
//   TANDEM_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));
//
// LoadTokenizer() accepts
//   - a llama2.c `tokenizer.bin` (pieces with merge scores; encoded exactly as
//     llama2.c's run.c encodes, decoded as run.c decodes),
//   - a SentencePiece `tokenizer.model` (Debian's libsentencepiece does the
//     work),
//   - a Hugging Face `tokenizer.json` (BPE models: byte-level like GPT-2,
//     Llama 3 and Qwen2, or Metaspace/byte-fallback like Llama 2, Mistral and
//     Gemma); a `tokenizer_config.json` beside it supplies bos/eos tokens, the
//     chat template and clean_up_tokenization_spaces, and a
//     `chat_template.jinja` beside it (as transformers >= 4.43 saves one) is
//     the chat template, before tokenizer_config.json's, as in transformers,
//   - a directory holding `tokenizer.json` (preferred) or `tokenizer.model`,
//     plus `tokenizer_config.json` and `chat_template.jinja` when present: a
//     Hugging Face model directory.
// The format is chosen by content, not by name. Anything it cannot load is a
// Status that names the file and the problem ("tokenizer.json: model.type
// 'Unigram' is not supported", "tokenizer.bin: truncated at offset 1234 in
// piece 17"); nothing is half-loaded.
//
// Reference behaviour, which the tests check against implementations we did
// not write (see tests/tokenizer/README.md):
//   - tokenizer.json: @huggingface/tokenizers (tokenizers.js). Where
//     tokenizers.js and the Rust `tokenizers` crate differ we follow the one
//     named in the code's comments and say why.
//   - tokenizer.model: libsentencepiece itself.
//   - tokenizer.bin: llama2.c's run.c.
//
// Every method is const and safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::tokenizer {

struct EncodeOptions {
  // Add what the tokenizer's own configuration adds around a text: the
  // tokenizer.json post-processor's template (BOS for Llama 2/3.1, nothing
  // for GPT-2 or Qwen2), or BOS for llama2.c and SentencePiece models.
  // Default true, as Hugging Face's encode() does. A prompt rendered from a
  // chat template that already starts with bos_token wants false.
  bool add_special_tokens = true;
  // tokenizer.json only: added tokens written in the text (say the 13
  // characters "<|eot_id|>") become their ids, as Hugging Face does (default).
  // false tokenizes them as ordinary text, so user text cannot forge control
  // tokens. llama2.c and SentencePiece never match them (neither do their
  // references).
  bool parse_special_tokens = true;
};

struct DecodeOptions {
  // Leave out special tokens (BOS, EOS, tokenizer.json added tokens marked
  // `special`, and additional_special_tokens of tokenizer_config.json).
  // SentencePiece control tokens (<s>, </s>) decode to nothing either way, as
  // libsentencepiece decodes them.
  bool skip_special_tokens = false;
  // tokenizer.json only: transformers' clean_up_tokenization (" ." -> ".",
  // " n't" -> "n't", ...). nullopt: what tokenizer_config.json says (GPT-2 and
  // Llama 3 say true), false when it says nothing: the Rust crate never cleans
  // up, transformers is moving its default to false (tokenizers.js still
  // defaults to true). A server streaming text usually wants false: the
  // cleanup rewrites text the model wrote (`x .y` in code).
  std::optional<bool> clean_up_tokenization_spaces;
};

enum class TokenizerKind {
  kLlama2c,        // llama2.c tokenizer.bin
  kSentencePiece,  // tokenizer.model through libsentencepiece
  kHuggingFace,    // tokenizer.json
};

// Ids of the tokens the frontend needs by role; nullopt when the tokenizer has
// none.
struct SpecialTokenIds {
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
  std::optional<int32_t> unk;
  std::optional<int32_t> pad;
};

class DecodeStream;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual TokenizerKind kind() const = 0;
  // Ids are 0 .. vocab_size() - 1 (tokenizer.json: the largest id of the
  // model or the added tokens, plus one).
  virtual int32_t vocab_size() const = 0;

  // Text to ids. Errors: tokenizer.json needs valid UTF-8 (INVALID_ARGUMENT
  // naming the byte offset otherwise); llama2.c takes any bytes as run.c
  // does; SentencePiece takes what libsentencepiece takes.
  [[nodiscard]] virtual absl::StatusOr<std::vector<int32_t>> Encode(
      std::string_view text, const EncodeOptions& options = {}) const = 0;

  // Ids to text, always valid UTF-8: bytes from byte tokens (<0xE6>, GPT-2's
  // byte alphabet) that do not form UTF-8 become U+FFFD as each reference
  // does it. Any id outside [0, vocab_size()) is INVALID_ARGUMENT naming it
  // and its position; nothing is decoded then. Never crashes on any input.
  [[nodiscard]] virtual absl::StatusOr<std::string> Decode(
      absl::Span<const int32_t> ids, const DecodeOptions& options = {}) const;

  // The vocabulary entry of `id` as stored (e.g. "▁Hello", "ĠHello",
  // "<0x0A>", "<|eot_id|>"); INVALID_ARGUMENT when out of range.
  [[nodiscard]] virtual absl::StatusOr<std::string> IdToPiece(int32_t id) const = 0;
  // The id of a vocabulary entry (the inverse of IdToPiece), or nullopt.
  virtual std::optional<int32_t> PieceToId(std::string_view piece) const = 0;
  // Whether `id` is a special token in the sense of skip_special_tokens.
  virtual bool IsSpecial(int32_t id) const = 0;

  const SpecialTokenIds& special_ids() const { return special_ids_; }
  std::optional<int32_t> bos_id() const { return special_ids_.bos; }
  std::optional<int32_t> eos_id() const { return special_ids_.eos; }
  // The text of BOS/EOS, as chat templates see them (bos_token, eos_token);
  // empty when there is none.
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // chat_template.jinja's text when the tokenizer's directory has one, else
  // tokenizer_config.json's chat_template (the default one when it lists
  // several by name), else nullopt.
  const std::optional<std::string>& chat_template() const { return chat_template_; }
  // The template transformers renders for a request with tools when the
  // tokenizer names one "tool_use": additional_chat_templates/tool_use.jinja
  // (transformers >= 4.43 saves it there), else tokenizer_config.json's
  // entry of that name; nullopt when it has none.
  const std::optional<std::string>& tool_use_chat_template() const {
    return tool_use_chat_template_;
  }

  // A streaming decoder over this tokenizer; IncrementalDetokenizer is the
  // interface to use. The tokenizer must outlive it.
  virtual std::unique_ptr<DecodeStream> NewDecodeStream(const DecodeOptions& options) const = 0;

 protected:
  SpecialTokenIds special_ids_;
  std::string bos_token_;
  std::string eos_token_;
  std::optional<std::string> chat_template_;
  std::optional<std::string> tool_use_chat_template_;
};

// Decodes ids one at a time. Decode() of every tokenizer is defined as
// "push every id, then finish", so the text a stream produces is exactly the
// text Decode() returns.
class DecodeStream {
 public:
  virtual ~DecodeStream() = default;
  // Consumes one id and appends the text that is now final to `out` (never a
  // part of a UTF-8 character). An out-of-range id is INVALID_ARGUMENT and
  // leaves the stream as it was.
  [[nodiscard]] virtual absl::Status Push(int32_t id, std::string* out) = 0;
  // End of input: appends what was held back (bytes of an unfinished
  // character become U+FFFD as in Decode()). Push must not be called after.
  virtual void Finish(std::string* out) = 0;
};

// Loads a tokenizer from a file or a directory (see the top of this file).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

// The bytes a vocabulary entry (Tokenizer::IdToPiece) stands for when
// decoded alone: a byte token "<0xNN>" that byte; with `byte_level` (GPT-2's
// byte alphabet) the bytes its characters stand for (a piece with a
// character outside the alphabet, an added token, as it is); otherwise
// SentencePiece's "▁" is a space.
[[nodiscard]] std::string PieceBytes(std::string_view piece, bool byte_level);
// PieceBytes of every id of `tok` ("" for an id IdToPiece refuses); a
// tokenizer.json whose vocabulary has GPT-2's "Ġ" (a space in its byte
// alphabet) is read byte-level: every byte-level vocabulary has all 256 byte
// characters, a SentencePiece-style one spells a space "▁".
[[nodiscard]] std::vector<std::string> VocabularyBytes(const Tokenizer& tok);
// `bytes` with each maximal ill-formed UTF-8 subpart replaced by U+FFFD
// (Python's errors="replace", TextDecoder).
[[nodiscard]] std::string ReplaceInvalidUtf8(std::string_view bytes);
// Python's str.lstrip(): `s` without its leading Unicode whitespace
// (str.isspace), as vLLM strips the words of bad_words.
[[nodiscard]] std::string PythonLstrip(std::string_view s);

}  // namespace tandem::tokenizer
