// The chat template's parser (private): the lexer's pieces into the syntax
// tree, expressions by Jinja's precedence (a if c else b, or, and, not,
// comparisons and in, + -, ~, * / // %, unary -, filters and tests, then
// attributes, items, slices and calls).
#pragma once

#include <vector>

#include "chat_template_ast.h"
#include "chat_template_lexer.h"

namespace tandem::tokenizer::internal::jinja {

// The template's top-level nodes. Throws TemplateError: INVALID_ARGUMENT for
// a syntax error, UNIMPLEMENTED for a construct, filter or test outside the
// subset chat_template.h lists.
NodeList ParseTemplate(std::vector<Piece> pieces);

}  // namespace tandem::tokenizer::internal::jinja
