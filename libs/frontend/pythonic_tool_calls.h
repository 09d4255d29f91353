// vLLM's pythonic and llama4_pythonic tool-call parsers (Llama 3.2, Llama 4,
// ToolACE): an answer that is a Python list of calls,
// [get_weather(city="Paris", days=[1, 2]), now()].
//
// As vLLM's extract_tool_calls reads an answer:
//  - the answer must match vLLM's TOOL_CALL_REGEX at its start (a "[", a
//    name, "(", then keyword arguments or ")" ... "]"; RE2 runs it, in
//    linear time, where vLLM runs Python's regex under a timeout);
//  - the whole answer must parse as Python whose first statement is a list
//    of calls of plain names; each call's keyword arguments are its
//    arguments, written as json.dumps writes them (ensure_ascii=False for
//    pythonic, True for llama4_pythonic); positional arguments are
//    dropped; a keyword's value must be a literal vLLM's
//    _get_parameter_value reads: a str, int, float, True, False or None
//    constant, or a list or dict of them (a dict's keys constants), so
//    -1 (a unary minus), a tuple or a name leave the answer as content,
//    as they do in vLLM;
//  - with calls the content is null; anything else leaves the whole answer
//    as content. llama4_pythonic first drops a leading <|python_start|> and
//    every <|python_end|>.
// What Python would parse that this does not (the answer stays content
// where vLLM would find calls): lambdas, comprehensions, f-strings,
// \N{...} escapes, integers past 64 bits, await and yield, and statements
// other than expressions and assignments (def, if, import, ...) after the
// calls. Expressions are read as far as Python's grammar decides whether
// they parse (operators, comparisons, conditionals, named expressions,
// unpacking, slices), with no precedence: none of them is a literal.
// Identifiers may hold any non-ASCII letters, read byte for byte (Python
// would NFKC-normalize them).
#pragma once

#include <string_view>

#include "tandem/frontend/tool_calls.h"

namespace tandem::frontend::internal {

[[nodiscard]] ExtractedToolCalls ExtractPythonicToolCalls(std::string_view text, bool llama4);

}  // namespace tandem::frontend::internal
