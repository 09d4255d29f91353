// structured_outputs.regex (tandem/grammar/regex.h) on client patterns and
// model bytes. The input is a pattern, a NUL, then text. Never a crash; a
// pattern either compiles or is refused; stepping the text a byte at a time
// reaches what stepping it at once does; a text that is not a whole match
// always has a next byte (the automaton keeps no dead states), which the
// token mask over single bytes agrees with; and the automaton never takes a
// byte that cannot go on valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/grammar/token_mask.h"

namespace {

using namespace tandem::grammar;

const TokenVocabulary& Bytes() {
  static const TokenVocabulary* vocab = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    return new TokenVocabulary(std::move(bytes));
  }();
  return *vocab;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos || nul > 512) return 0;
  auto schema = CompileRegexDocument(input.substr(0, nul));
  if (!schema.ok()) return 0;
  const std::string_view text = input.substr(nul + 1);
  JsonMatcher whole(*schema), stepped(*schema);
  const bool all = whole.Accept(text);
  size_t taken = 0;
  while (taken < text.size() && stepped.Accept(text.substr(taken, 1))) ++taken;
  if (all != (taken == text.size())) abort();
  if (all && whole.Complete() != stepped.Complete()) abort();
  TokenMask mask;
  const int32_t allowed = AllowedTokens(stepped, Bytes(), &mask);
  for (int b = 0; b < 256; ++b) {
    JsonMatcher copy = stepped;
    if (MaskAllows(mask, b) != copy.Accept(std::string(1, static_cast<char>(b)))) abort();
    // Never a byte that no UTF-8 text has there: C0, C1, F5-FF.
    if (MaskAllows(mask, b) && (b == 0xC0 || b == 0xC1 || b >= 0xF5)) abort();
  }
  if (allowed == 0 && !stepped.Complete()) abort();
  if ((allowed > 0) != stepped.Open()) abort();
  return 0;
}
