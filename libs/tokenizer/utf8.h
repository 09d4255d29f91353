// UTF-8 helpers of the tokenizer library (private).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer::internal {

// Debian's Abseil has its own absl::string_view class, which converts from
// neither std::string_view nor to it; absl calls get their views through this.
inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Decodes one well-formed UTF-8 character at the start of `s`: its code point
// and length, or nullopt when `s` does not start with one (empty, a stray
// continuation byte, an overlong form, a surrogate, > U+10FFFF, truncated).
struct DecodedChar {
  char32_t cp;
  size_t len;
};
std::optional<DecodedChar> DecodeChar(std::string_view s);

// The byte offset of the first ill-formed sequence in `s`, or nullopt when all
// of `s` is well-formed UTF-8.
std::optional<size_t> FindInvalidUtf8(std::string_view s);

// How many bytes at the end of `s` are a proper prefix of a well-formed
// character (0 to 3): bytes that more input could still complete.
size_t IncompleteUtf8Suffix(std::string_view s);

// Turns a byte stream into well-formed UTF-8 as it arrives, holding back the
// bytes of a character that is not complete yet.
class Utf8Repairer {
 public:
  enum class Policy {
    // One U+FFFD per maximal ill-formed subpart: the WHATWG Encoding
    // Standard's decoder (TextDecoder), Rust's String::from_utf8_lossy and
    // Python's errors="replace" all do this.
    kMaximalSubpart,
    // One U+FFFD per byte that does not start a well-formed character:
    // SentencePiece's decoder of byte pieces (string_util::DecodeUTF8).
    kPerByte,
  };
  explicit Utf8Repairer(Policy policy) : policy_(policy) {}

  // Appends the characters `bytes` completes to `out`.
  void Push(std::string_view bytes, std::string* out);
  // Appends a U+FFFD (or one per byte under kPerByte) for held-back bytes.
  void Finish(std::string* out);
  bool has_pending() const { return !pending_.empty(); }

 private:
  Policy policy_;
  std::string pending_;  // at most 3 bytes: an incomplete character
};

// The value of a hex digit (0-9, A-F, a-f), or -1: for "<0xAB>" byte tokens.
inline int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace tandem::tokenizer::internal
