// A Hugging Face tokenizer.json from arbitrary bytes (an untrusted model
// directory), then an encode and a decode with it when it loads: an error or
// a tokenizer, never a crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tandem/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/tandem-fuzz-XXXXXX";
    const char* d = mkdtemp(tmpl);
    return std::string(d != nullptr ? d : "/tmp");
  }();
  const std::string path = dir + "/tokenizer.json";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto tok = tandem::tokenizer::LoadTokenizer(path);
  if (tok.ok()) {
    auto ids = (*tok)->Encode("Hello, world! \xe4\xbd\xa0\xe5\xa5\xbd 123");
    if (ids.ok()) {
      auto text = (*tok)->Decode(*ids);
      (void)text;
    }
  }
  return 0;
}
