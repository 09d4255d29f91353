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
#include <string_view>

#include "matcher_checks.h"
#include "tandem/grammar/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos || nul > 512) return 0;
  auto schema = tandem::grammar::CompileRegexDocument(input.substr(0, nul));
  if (!schema.ok()) return 0;
  tandem::grammar::TokenMask mask;
  tandem::grammar::JsonMatcher after(*schema);
  if (!tandem::grammar::fuzz::CheckMatcher(*schema, input.substr(nul + 1), &mask, &after)) abort();
  // A byte may follow exactly where the mask allows one, and never a byte no
  // UTF-8 text has: C0, C1, F5-FF.
  bool any = false;
  for (int b = 0; b < 256; ++b) {
    const bool allowed = tandem::grammar::MaskAllows(mask, b);
    any |= allowed;
    if (allowed && (b == 0xC0 || b == 0xC1 || b >= 0xF5)) abort();
  }
  if (any != after.Open()) abort();
  return 0;
}
