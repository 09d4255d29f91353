// The chat template's renderer (private): the syntax tree walked with the
// inputs as global variables, a scope for each for loop's variables and
// loop.*, and the filters, tests, functions and methods chat_template.h
// lists.
#pragma once

#include <string>

#include "chat_template_ast.h"
#include "tandem/tokenizer/chat_template.h"

namespace tandem::tokenizer::internal::jinja {

// The text `nodes` render to. Throws TemplateError when the template raises
// an exception or an expression fails, and may let nlohmann::json's
// exceptions through.
std::string RenderTemplate(const NodeList& nodes, const ChatTemplateInputs& inputs);

}  // namespace tandem::tokenizer::internal::jinja
