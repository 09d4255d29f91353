#include "utf8.h"

namespace tandem::tokenizer::internal {
namespace {

// Bytes a character starting with `lead` has; 0 when `lead` starts none.
size_t CharLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `b` may follow `lead` at position `index` (1-based) of a character.
// The second byte's narrower ranges exclude overlong forms, surrogates and
// code points above U+10FFFF (Unicode Table 3-7).
bool ContinuationOk(uint8_t lead, size_t index, uint8_t b) {
  uint8_t lower = 0x80, upper = 0xBF;
  if (index == 1) {
    if (lead == 0xE0) lower = 0xA0;
    if (lead == 0xED) upper = 0x9F;
    if (lead == 0xF0) lower = 0x90;
    if (lead == 0xF4) upper = 0x8F;
  }
  return b >= lower && b <= upper;
}

// Length of the longest prefix of `s` (at most one character long) that can
// begin a well-formed character; 0 when s[0] cannot.
size_t WellFormedPrefix(std::string_view s) {
  if (s.empty()) return 0;
  const auto lead = static_cast<uint8_t>(s[0]);
  const size_t n = CharLength(lead);
  if (n == 0) return 0;
  size_t i = 1;
  while (i < n && i < s.size() && ContinuationOk(lead, i, static_cast<uint8_t>(s[i]))) ++i;
  return i;
}

}  // namespace

std::optional<DecodedChar> DecodeChar(std::string_view s) {
  if (s.empty()) return std::nullopt;
  const auto lead = static_cast<uint8_t>(s[0]);
  const size_t n = CharLength(lead);
  if (n == 0 || WellFormedPrefix(s) != n) return std::nullopt;
  if (n == 1) return DecodedChar{lead, 1};
  char32_t cp = lead & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[i]) & 0x3F);
  return DecodedChar{cp, n};
}

std::optional<size_t> FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const auto c = DecodeChar(s.substr(i));
    if (!c) return i;
    i += c->len;
  }
  return std::nullopt;
}

size_t IncompleteUtf8Suffix(std::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const std::string_view tail = s.substr(s.size() - k);
    const size_t n = CharLength(static_cast<uint8_t>(tail[0]));
    if (n == 0) continue;  // a continuation byte: look further back
    return (n > k && WellFormedPrefix(tail) == k) ? k : 0;
  }
  return 0;
}

void Utf8Repairer::Push(std::string_view bytes, std::string* out) {
  std::string joined;
  if (!pending_.empty()) {
    joined = pending_;
    joined.append(bytes);
    bytes = joined;
    pending_.clear();
  }
  size_t i = 0;
  while (i < bytes.size()) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (b < 0x80) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    const std::string_view rest = bytes.substr(i);
    const size_t n = CharLength(b);
    const size_t ok = WellFormedPrefix(rest);
    if (n != 0 && ok == n) {
      out->append(rest.substr(0, n));
      i += n;
    } else if (n != 0 && ok == rest.size()) {
      pending_.assign(rest);  // may still complete
      return;
    } else {
      out->append(kReplacementChar);
      i += (policy_ == Policy::kMaximalSubpart && ok > 1) ? ok : 1;
    }
  }
}

void Utf8Repairer::Finish(std::string* out) {
  if (pending_.empty()) return;
  const size_t n = policy_ == Policy::kPerByte ? pending_.size() : 1;
  for (size_t i = 0; i < n; ++i) out->append(kReplacementChar);
  pending_.clear();
}

}  // namespace tandem::tokenizer::internal
