// A Hugging Face tokenizer.json with a BPE model (private; use LoadTokenizer).
//
// Encode, as tokenizers.js and the Rust crate do it:
//   1. the text is cut at added tokens (leftmost, longest first; with
//      parse_special_tokens false only non-special ones), honouring their
//      lstrip/rstrip;
//   2. each section between them is normalized, cut again at added tokens
//      whose `normalized` is true, pre-tokenized (section index known, for
//      Metaspace's prepend_scheme "first") and run through the BPE model;
//   3. with add_special_tokens, the post-processor's tokens go around it
//      (TemplateProcessing's single template, Roberta/Bert cls+sep).
// Decode maps ids to token texts (added tokens' contents), drops special ones
// when asked, runs the decoder chain (hf_decoder.h) and, if enabled,
// clean_up_tokenization. Added tokens with single_word are not supported.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tokenizer_config.h"

namespace tandem::tokenizer::internal {

// `json_text` is tokenizer.json's content, `name` names it in errors;
// `config` (may be null) comes from tokenizer_config.json.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& name,
                                                           const std::string& json_text,
                                                           const TokenizerConfig* config);

}  // namespace tandem::tokenizer::internal
