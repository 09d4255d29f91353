// GPT-2's byte-level alphabet (private): each byte is written as one
// printable character (bytes_to_unicode() in GPT-2's encoder.py), so
// byte-level BPE vocabularies hold only printable strings.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace tandem::tokenizer::internal {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& Get();

  // The UTF-8 of the character standing for byte `b` ("Ġ" for ' ').
  const std::string& CharOf(uint8_t b) const { return chars_[b]; }
  // The byte a character stands for; nullopt when it stands for none.
  std::optional<uint8_t> ByteOf(char32_t cp) const {
    if (cp >= byte_of_.size() || byte_of_[cp] < 0) return std::nullopt;
    return static_cast<uint8_t>(byte_of_[cp]);
  }

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> chars_;
  std::array<int16_t, 324> byte_of_;  // the alphabet ends at U+0143
};

}  // namespace tandem::tokenizer::internal
