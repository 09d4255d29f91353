// The model loaders' JSON reading (tandem::model::ParseJson: nlohmann::json with
// a depth limit, for config.json and safetensors headers) on arbitrary bytes:
// an error or a value, never a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tandem/model/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto v = tandem::model::ParseJson(std::string_view(reinterpret_cast<const char*>(data), size));
  if (v.ok()) (void)tandem::model::JsonMember(*v, "architectures");
  return 0;
}
