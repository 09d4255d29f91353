// A SentencePiece tokenizer.model through libsentencepiece (private; use
// LoadTokenizer).
//
// Encode is libsentencepiece's Encode, with BOS first when
// add_special_tokens (as Llama 2 adds it). Decode is libsentencepiece's
// Decode: control pieces (<s>, </s>) are invisible, <unk> is " ⁇ ", the dummy
// prefix space of the first visible piece is stripped, and each byte of a run
// of byte pieces that is not UTF-8 becomes U+FFFD. skip_special_tokens also
// drops <unk>. The DecodeStream asks libsentencepiece for per-piece surfaces
// of a short window (see the .cc) and is tested to agree with Decode.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::tokenizer::internal {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path);

}  // namespace tandem::tokenizer::internal
