// The model loaders' JSON parser (config.json, safetensors headers) on
// arbitrary bytes: an error or a value, never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/model/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto v = tandem::model::JsonValue::Parse(std::string(reinterpret_cast<const char*>(data), size));
  (void)v;
  return 0;
}
