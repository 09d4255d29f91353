// Structured outputs' grammar (tandem/grammar) on client schemas and model
// bytes. The input is a schema's JSON text, a NUL, then document bytes.
// Never a crash; a schema either compiles or is refused; stepping the bytes
// one at a time reaches what stepping them at once does; and a document
// that is neither complete nor refused for ambiguity always has a next byte
// (the grammar has no dead ends), which the token mask over single bytes
// agrees with.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "matcher_checks.h"
#include "tandem/grammar/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return 0;
  const nlohmann::ordered_json schema_json =
      nlohmann::ordered_json::parse(input.substr(0, nul), nullptr, /*allow_exceptions=*/false);
  if (schema_json.is_discarded()) return 0;
  auto schema = tandem::grammar::CompileJsonSchema(schema_json);
  if (!schema.ok()) return 0;
  tandem::grammar::TokenMask mask;
  tandem::grammar::JsonMatcher after(*schema);
  tandem::grammar::fuzz::CheckMatcher(*schema, input.substr(nul + 1), &mask, &after);
  return 0;
}
