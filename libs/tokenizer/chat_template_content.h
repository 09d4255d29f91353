// Which shape of message content a chat template reads (private; see
// chat_template_content.cc).
#pragma once

#include "chat_template_ast.h"

namespace tandem::tokenizer::internal::jinja {

ContentFormat DetectContentFormat(const NodeList& body);

}  // namespace tandem::tokenizer::internal::jinja
