// A Hugging Face model directory from arbitrary bytes (an untrusted --model
// directory): the input is split into config.json and model.safetensors (the
// first two bytes give config.json's length), then read as a checkpoint. An
// error or a model, never a crash or an allocation the files cannot back.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tandem/model/checkpoint.h"

namespace {

bool WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/tandem-fuzz-hf-XXXXXX";
    const char* d = mkdtemp(tmpl);
    return std::string(d != nullptr ? d : "/tmp");
  }();
  if (size < 2) return 0;
  const size_t config_len = std::min<size_t>(data[0] | (data[1] << 8), size - 2);
  if (!WriteFile(dir + "/config.json", data + 2, config_len) ||
      !WriteFile(dir + "/model.safetensors", data + 2 + config_len, size - 2 - config_len)) {
    return 0;
  }
  auto ckpt = tandem::model::ReadHfCheckpoint(dir);
  (void)ckpt;
  return 0;
}
