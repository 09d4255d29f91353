// The llama2.c and SentencePiece tokenizers of ../shared/models on arbitrary
// input: the first byte picks the tokenizer and whether the rest is text to
// encode or ids to decode (two bytes each, spread a little beyond the
// vocabulary so out-of-range ids are tried too). An error or a result, never
// a crash.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/tokenizer/tokenizer.h"

namespace {

const tandem::tokenizer::Tokenizer* Get(int which) {
  static const std::unique_ptr<tandem::tokenizer::Tokenizer> toks[2] = {
      [] {
        auto t = tandem::tokenizer::LoadTokenizer(std::string(TANDEM_SHARED_DIR) +
                                                  "/models/tokenizer.bin");
        return t.ok() ? std::move(*t) : nullptr;
      }(),
      [] {
        auto t = tandem::tokenizer::LoadTokenizer(std::string(TANDEM_SHARED_DIR) +
                                                  "/models/tokenizer.model");
        return t.ok() ? std::move(*t) : nullptr;
      }()};
  return toks[which].get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const tandem::tokenizer::Tokenizer* tok = Get(data[0] & 1);
  if (tok == nullptr) __builtin_trap();  // the shared models must load
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 2) {
    std::vector<int32_t> ids;
    for (size_t i = 1; i + 1 < size; i += 2) {
      const int32_t raw = data[i] | (data[i + 1] << 8);
      ids.push_back(raw % (tok->vocab_size() + 8) - 4);
    }
    auto text = tok->Decode(ids);
    (void)text;
  } else {
    auto ids = tok->Encode(rest);
    if (ids.ok()) {
      auto back = tok->Decode(*ids);
      (void)back;
    }
  }
  return 0;
}
