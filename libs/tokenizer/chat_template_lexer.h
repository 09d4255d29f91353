// The chat template's lexer (private): the source cut into text, {{ }} and
// {% %} pieces, each tag into tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tokenizer::internal::jinja {

struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp } kind;
  std::string text;  // name, string value or operator
  int64_t int_value = 0;
  double float_value = 0;
};

struct Piece {
  enum Kind { kText, kOutput, kStatement } kind;
  std::string text;
  std::vector<Token> tokens;
  int line = 1;
  bool strip_before = false;  // {%- / {{-
  bool strip_after = false;   // -%} / -}}
};

// The pieces of `source`, read as transformers reads a template (trim_blocks
// and lstrip_blocks on; a single trailing newline dropped), comments turned
// into empty text and whitespace control (-) applied. Throws TemplateError
// for an unterminated tag, comment or string, or a character no token starts
// with.
std::vector<Piece> Lex(std::string_view source);

}  // namespace tandem::tokenizer::internal::jinja
