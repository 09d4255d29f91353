// The values a chat template computes with and what Python does with them
// (private): truth, printing, json.dumps, strings indexed by code point, item
// access, `in`, and the arithmetic and comparison operators. Each function
// that fails throws TemplateError naming `line`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "chat_template_ast.h"

namespace tandem::tokenizer::internal::jinja {

// A value: JSON, or undefined.
struct Value {
  Json json;
  bool undefined = false;
  static Value Undefined() { return Value{nullptr, true}; }
};

bool Truthy(const Value& v);

// Python's json.dumps (", " and ": " separators, or "," and ": " with one
// item a line when indented; non-ASCII kept), as both transformers' and
// @huggingface/jinja's tojson write it.
std::string ToJson(const Json& j, int indent = -1, bool sort_keys = false, int depth = 0);

// As the template prints a value.
std::string ToString(const Value& v);

// The characters (code points) of UTF-8 text, as Python's str indexes,
// slices and measures it.
std::vector<std::string> Chars(const std::string& s);

bool IsInt(const Json& j);

// Python's str.strip (lstrip with `right` false, rstrip with `left` false):
// whitespace, or the characters in `chars`.
std::string Strip(std::string s, bool left, bool right, const std::optional<std::string>& chars);
// Python's str.isspace for one UTF-8 character.
bool IsPythonSpace(std::string_view c);
// Python's s.split() (no separator): runs of whitespace split, at most
// maxsplit times (negative: no limit).
std::vector<std::string> SplitWhitespace(const std::string& s, int64_t maxsplit);

// Python's str.title on ASCII letters.
std::string Title(const std::string& s);

// j[key] (or j.key) in place; nullptr when undefined. Not for strings.
const Json* Item(const Json& j, const Json& key, int line);

// v[key] (or v.key), by code point for strings; undefined when absent.
Value GetItem(const Value& v, const Json& key, int line);

// `needle in haystack`: a substring, a list element or a dict key.
bool Contains(const Value& haystack, const Value& needle, int line);

// `a op b` for the binary operators but `and` and `or`.
Value BinaryOp(const std::string& op, const Value& a, const Value& b, int line);

}  // namespace tandem::tokenizer::internal::jinja
