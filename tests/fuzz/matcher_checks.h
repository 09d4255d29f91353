// What fuzz_json_schema and fuzz_regex check of a compiled grammar and
// bytes: stepping them one at a time reaches what stepping them at once
// does; the token mask over single bytes equals what Accept takes; and a
// document that is neither complete nor refused for ambiguity always has a
// next byte (the grammar has no dead ends). Aborts when one does not hold.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/token_mask.h"

namespace tandem::grammar::fuzz {

inline const TokenVocabulary& SingleBytes() {
  static const TokenVocabulary* vocab = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    return new TokenVocabulary(std::move(bytes));
  }();
  return *vocab;
}

// The checks above on `schema` and `doc`; the mask after the longest prefix
// of `doc` the grammar takes, into `mask`; false when the checks stopped
// early for ambiguity (JsonMatcher::overflowed).
inline bool CheckMatcher(const std::shared_ptr<const Schema>& schema, std::string_view doc,
                         TokenMask* mask, JsonMatcher* after) {
  JsonMatcher whole(schema), stepped(schema);
  const bool all = whole.Accept(doc);
  size_t taken = 0;
  while (taken < doc.size() && stepped.Accept(doc.substr(taken, 1))) ++taken;
  if (all != (taken == doc.size())) abort();
  if (all && whole.Complete() != stepped.Complete()) abort();
  const int32_t allowed = AllowedTokens(stepped, SingleBytes(), mask);
  for (int b = 0; b < 256; ++b) {
    JsonMatcher copy = stepped;
    if (MaskAllows(*mask, b) != copy.Accept(std::string(1, static_cast<char>(b)))) abort();
    if (copy.overflowed()) return false;
  }
  if (allowed == 0 && !stepped.Complete()) abort();
  *after = std::move(stepped);
  return true;
}

}  // namespace tandem::grammar::fuzz
