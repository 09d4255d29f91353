// Structured outputs' grammar (tandem/grammar) on client schemas and model
// bytes. The input is a schema's JSON text, a NUL, then document bytes.
// Never a crash; a schema either compiles or is refused; stepping the bytes
// one at a time reaches what stepping them at once does; and a document
// that is neither complete nor refused for ambiguity always has a next byte
// (the grammar has no dead ends), which the token mask over single bytes
// agrees with.
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
  if (nul == std::string_view::npos) return 0;
  const nlohmann::ordered_json schema_json =
      nlohmann::ordered_json::parse(input.substr(0, nul), nullptr, /*allow_exceptions=*/false);
  if (schema_json.is_discarded()) return 0;
  auto schema = CompileJsonSchema(schema_json);
  if (!schema.ok()) return 0;
  const std::string_view doc = input.substr(nul + 1);
  JsonMatcher whole(*schema), stepped(*schema);
  const bool all = whole.Accept(doc);
  size_t taken = 0;
  while (taken < doc.size() && stepped.Accept(doc.substr(taken, 1))) ++taken;
  if (all != (taken == doc.size())) abort();
  if (all && whole.Complete() != stepped.Complete()) abort();
  TokenMask mask;
  const int32_t allowed = AllowedTokens(stepped, Bytes(), &mask);
  for (int b = 0; b < 256; ++b) {
    JsonMatcher copy = stepped;
    if (MaskAllows(mask, b) != copy.Accept(std::string(1, static_cast<char>(b)))) abort();
    if (copy.overflowed()) return 0;
  }
  if (allowed == 0 && !stepped.Complete()) abort();
  return 0;
}
