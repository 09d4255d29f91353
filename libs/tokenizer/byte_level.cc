#include "byte_level.h"

#include "tandem/common/utf8.h"
#include "utf8.h"

namespace tandem::tokenizer::internal {

const ByteLevelAlphabet& ByteLevelAlphabet::Get() {
  static const ByteLevelAlphabet* const alphabet = new ByteLevelAlphabet();
  return *alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_.fill(-1);
  // Printable Latin-1 bytes stand for themselves; the others, in order, for
  // U+0100, U+0101, ...
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
    AppendUtf8(cp, &chars_[b]);
    byte_of_[cp] = static_cast<int16_t>(b);
  }
}

}  // namespace tandem::tokenizer::internal
