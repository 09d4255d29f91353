// What the grammar's tests share: a schema compiled from its text, whether
// it takes a document, and a small vocabulary to make masks over.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/grammar/token_mask.h"

namespace tandem::grammar {

// Whether `doc` is a whole document of `schema`.
inline bool Matches(const std::shared_ptr<const Schema>& schema, std::string_view doc) {
  JsonMatcher m(schema);
  return m.Accept(doc) && m.Complete();
}

// Whether `doc` can begin a document (it may be one already).
inline bool Begins(const std::shared_ptr<const Schema>& schema, std::string_view doc) {
  JsonMatcher m(schema);
  return m.Accept(doc);
}

inline std::shared_ptr<const Schema> Compile(const std::string& text) {
  auto schema = CompileJsonSchema(nlohmann::ordered_json::parse(text));
  EXPECT_TRUE(schema.ok()) << schema.status();
  return schema.ok() ? *schema : nullptr;
}

// A vocabulary of JSON fragments, single bytes and multi-byte characters.
inline TokenVocabulary TestVocabulary() {
  std::vector<std::string> tokens = {"",      "{",    "}",           "[",
                                     "]",     ",",    ":",           "\"",
                                     "{\"",   "\":",  "\",\"",       "\"}",
                                     " ",     "\n",   "  ",          "name",
                                     "na",    "me",   "\"name\":\"", "score",
                                     "age",   "tags", "null",        "nu",
                                     "ll",    "true", "1",           "12",
                                     "-",     ".",    "5e",          "e+",
                                     "0",     "\\",   "\\u",         "00e9",
                                     "ab",    "a",    "b",           "c",
                                     "\xC3",  "\xA9", "\xC3\xA9",    "\xE2\x82\xAC",
                                     "\"a\"", "],",   "\"]",         "1}",
                                     "x\"y"};
  for (int c = 32; c < 127; ++c) tokens.emplace_back(1, static_cast<char>(c));
  return TokenVocabulary(std::move(tokens));
}

}  // namespace tandem::grammar
