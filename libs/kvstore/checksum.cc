#include "tandem/kvstore/checksum.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace tandem::kvstore {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};
constexpr Tables kTables;

uint32_t ExtendPortable(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& t = kTables.t;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^
          t[4][(v >> 24) & 0xFF] ^ t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^
          t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

// a * b mod P in the reflected domain (as zlib's multmodp); x^0 = 1 << 31.
constexpr uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 * bytes) mod P: multiplying a raw CRC register by it appends `bytes`
// zero bytes.
constexpr uint32_t ShiftOperator(uint64_t bytes) {
  uint32_t x2n = 1u << 30;  // x^1, squared to x^(2^k) as k grows
  uint32_t p = 1u << 31;    // x^0
  uint64_t n = bytes * 8;
  while (n) {
    if (n & 1) p = MultModP(x2n, p);
    x2n = MultModP(x2n, x2n);
    n >>= 1;
  }
  return p;
}

#if defined(__x86_64__)
// Three independent crc32 streams over consecutive stripes hide the
// instruction's 3-cycle latency; the raw registers are linear, so
// crc(A|B) = shift(crc(A), |B|) ^ crc0(B).
constexpr size_t kStripe = 4096;
constexpr uint32_t kStripeShift = ShiftOperator(kStripe);

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p,
                                                        size_t n) {
  uint64_t c = crc;
  while (n >= 3 * kStripe) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t k = 0; k < kStripe; k += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p + k, 8);
      std::memcpy(&v1, p + kStripe + k, 8);
      std::memcpy(&v2, p + 2 * kStripe + k, 8);
      c = _mm_crc32_u64(c, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c = MultModP(kStripeShift, static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1);
    c = MultModP(kStripeShift, static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c2);
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

using ExtendFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);
ExtendFn PickExtend() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return &ExtendSse42;
#endif
  return &ExtendPortable;
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const uint8_t* data, size_t n) {
  static const ExtendFn fn = PickExtend();
  return ~fn(~crc, data, n);
}

}  // namespace tandem::kvstore
