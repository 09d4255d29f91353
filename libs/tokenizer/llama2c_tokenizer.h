// llama2.c's tokenizer.bin (private; use LoadTokenizer).
//
// File: int32 max_token_length, then per piece float32 score, int32 length
// and that many bytes (little-endian; the piece count is not stored: pieces
// run to the end of the file). Pieces 0, 1, 2 are <unk>, BOS and EOS; pieces
// 3..258 are the byte tokens <0x00>..<0xFF>, as run.c assumes.
//
// Encode is run.c's encode(): BOS, then (for non-empty text) the " " piece as
// the dummy prefix, then one piece per UTF-8 character (run.c's grouping: a
// byte plus up to three following continuation bytes) or its bytes as byte
// tokens, then merges of the adjacent pair whose concatenation is the piece
// with the highest score (leftmost on ties; pieces scoring <= -1e10 never
// merge) until none applies. The text is taken as bytes to its end (run.c
// stops at a NUL; here a NUL is the byte token <0x00>). Added tokens written
// in the text are not matched (run.c matches none).
//
// Decode is run.c's decode(): the piece, minus its leading space when the
// previous id is BOS (1); byte tokens become their byte. Runs of byte tokens
// that are not UTF-8 become one U+FFFD per offending byte, as SentencePiece
// decodes them (the README's contract: text equal to SentencePiece's decode;
// run.c itself prints raw bytes). Special pieces (0, 1, 2) decode to their
// stored text ("<unk>", "\n<s>\n", "\n</s>\n") unless skipped.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::tokenizer::internal {

// `bytes` is the file's content; `name` names it in errors.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& name,
                                                                std::string_view bytes);

}  // namespace tandem::tokenizer::internal
