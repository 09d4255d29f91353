#include "tandem/kvtypes/checksum.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
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
    crc = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
          t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
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

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p, size_t n) {
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

#if defined(__x86_64__)
// x^n mod P (reflected).
constexpr uint32_t XPowMod(uint64_t n) {
  uint32_t x2k = 1u << 30;  // x^1, squared to x^(2^k) as k grows
  uint32_t p = 1u << 31;    // x^0
  while (n) {
    if (n & 1) p = MultModP(x2k, p);
    x2k = MultModP(x2k, x2k);
    n >>= 1;
  }
  return p;
}

// Folding constants for moving a 16-byte block `bytes` forward (see
// ExtendVpclmul): the low qword (earlier bytes, higher degree) multiplies
// x^(8 bytes + 64), the high qword x^(8 bytes). A carry-less product of two
// reflected operands comes out one bit short (times x^-1), hence the "- 1";
// a 32-bit reflected constant sits in the top half of its qword.
constexpr uint64_t FoldConstant(uint64_t bits) { return uint64_t{XPowMod(bits - 1)} << 32; }
struct Fold {
  uint64_t lo, hi;
};
constexpr Fold FoldBy(uint64_t bytes) {
  return {FoldConstant(8 * bytes + 64), FoldConstant(8 * bytes)};
}
constexpr Fold kFold256 = FoldBy(256), kFold64 = FoldBy(64), kFold48 = FoldBy(48),
               kFold32 = FoldBy(32), kFold16 = FoldBy(16);

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) inline __m512i Fold512(__m512i acc,
                                                                                   __m512i k,
                                                                                   __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00),
                                   _mm512_clmulepi64_epi128(acc, k, 0x11), next, 0x96);
}
__attribute__((target("avx512f"))) inline __m512i Broadcast(Fold k) {
  const auto lo = static_cast<int64_t>(k.lo), hi = static_cast<int64_t>(k.hi);
  return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
}
__attribute__((target("pclmul,sse4.2"))) inline __m128i Fold128(__m128i acc, Fold k) {
  const __m128i kk = _mm_set_epi64x(static_cast<int64_t>(k.hi), static_cast<int64_t>(k.lo));
  return _mm_xor_si128(_mm_clmulepi64_si128(acc, kk, 0x00), _mm_clmulepi64_si128(acc, kk, 0x11));
}

// CRC32C by carry-less multiplication, 256 bytes per step in four 512-bit
// accumulators (each 128-bit lane a 16-byte block of the message). Folding
// keeps the accumulated blocks congruent (mod P) to the message read so far,
// aligned at its end, so the raw CRC of the message equals the raw CRC of
// the final 16-byte block, which the crc32 instruction then computes. The
// starting register enters as an XOR into the first 4 bytes (for a raw
// reflected CRC the two are the same). The tail (< 256 bytes) goes to the
// crc32 instruction.
__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) uint32_t ExtendVpclmul(uint32_t crc,
                                                                                   const uint8_t* p,
                                                                                   size_t n) {
  if (n < 1024) return ExtendSse42(crc, p, n);
  const __m512i k256 = Broadcast(kFold256);
  __m512i a0 = _mm512_xor_si512(
      _mm512_loadu_si512(p),
      _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, static_cast<int>(crc)));
  __m512i a1 = _mm512_loadu_si512(p + 64);
  __m512i a2 = _mm512_loadu_si512(p + 128);
  __m512i a3 = _mm512_loadu_si512(p + 192);
  p += 256;
  n -= 256;
  while (n >= 256) {
    a0 = Fold512(a0, k256, _mm512_loadu_si512(p));
    a1 = Fold512(a1, k256, _mm512_loadu_si512(p + 64));
    a2 = Fold512(a2, k256, _mm512_loadu_si512(p + 128));
    a3 = Fold512(a3, k256, _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  const __m512i k64 = Broadcast(kFold64);
  a1 = Fold512(a0, k64, a1);
  a2 = Fold512(a1, k64, a2);
  a3 = Fold512(a2, k64, a3);
  // The four lanes of a3: fold lanes 0-2 forward onto lane 3.
  __m128i r = _mm512_maskz_extracti32x4_epi32(0xF, a3, 3);
  r = _mm_xor_si128(r, Fold128(_mm512_maskz_extracti32x4_epi32(0xF, a3, 0), kFold48));
  r = _mm_xor_si128(r, Fold128(_mm512_maskz_extracti32x4_epi32(0xF, a3, 1), kFold32));
  r = _mm_xor_si128(r, Fold128(_mm512_maskz_extracti32x4_epi32(0xF, a3, 2), kFold16));
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(r)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(r, 1)));
  return ExtendSse42(static_cast<uint32_t>(c), p, n);
}
#endif

#if defined(__x86_64__)
// The raw CRC of the last 64 bytes folded into a0..a3 (at offsets 0, 16, 32
// and 48 of them): a0..a2 folded onto a3, whose 16 bytes the crc32
// instruction then takes.
__attribute__((target("pclmul,sse4.2"))) inline uint32_t FoldFour(__m128i a0, __m128i a1,
                                                                  __m128i a2, __m128i a3) {
  __m128i r = a3;
  r = _mm_xor_si128(r, Fold128(a0, kFold48));
  r = _mm_xor_si128(r, Fold128(a1, kFold32));
  r = _mm_xor_si128(r, Fold128(a2, kFold16));
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(r)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(r, 1)));
  return static_cast<uint32_t>(c);
}

// As ExtendVpclmul with 128-bit registers, for CPUs with PCLMULQDQ but not
// VPCLMULQDQ: 64 bytes per step in four accumulators, each a 16-byte block.
// Why: on this project's 2-core AMD EPYC (family 23) the crc32 instruction
// does not pipeline: ExtendSse42's three streams ran 5.6 GB/s in L2, and it
// was 48% of bench_kvstore_engine's memory-store profile; this runs 9.7 GB/s
// there (2 MiB in L2; PCLMULQDQ issues every other cycle on that core).
__attribute__((target("pclmul,sse4.2"))) uint32_t ExtendPclmul(uint32_t crc, const uint8_t* p,
                                                               size_t n) {
  if (n < 256) return ExtendSse42(crc, p, n);
  const auto load = [](const uint8_t* q) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  };
  __m128i a0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i a1 = load(p + 16), a2 = load(p + 32), a3 = load(p + 48);
  p += 64;
  n -= 64;
  while (n >= 64) {
    a0 = _mm_xor_si128(Fold128(a0, kFold64), load(p));
    a1 = _mm_xor_si128(Fold128(a1, kFold64), load(p + 16));
    a2 = _mm_xor_si128(Fold128(a2, kFold64), load(p + 32));
    a3 = _mm_xor_si128(Fold128(a3, kFold64), load(p + 48));
    p += 64;
    n -= 64;
  }
  return ExtendSse42(FoldFour(a0, a1, a2, a3), p, n);
}
#endif

#if defined(__x86_64__)
// ExtendPclmul fused with a copy: each 64 bytes are loaded once, stored to
// dst and folded from the same registers. Why: a memcpy and then the
// checksum of the copy (CopyByPieces) read every byte twice. On this
// project's 2-core AMD EPYC, blocks from memory (bench_kvstore_engine's
// BM_Crc32cCopy): 5.6-6.0 GB/s fused against 3.9-4.3 in two passes, and
// memcpy alone 7.3-8.0.
__attribute__((target("pclmul,sse4.2"))) uint32_t CopyPclmul(uint32_t crc, uint8_t* dst,
                                                             const uint8_t* src, size_t n) {
  if (n < 256) {
    std::memcpy(dst, src, n);
    return ExtendSse42(crc, dst, n);
  }
  const auto load = [](const uint8_t* q) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  };
  const auto store = [](uint8_t* q, __m128i v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), v);
  };
  __m128i b0 = load(src), b1 = load(src + 16), b2 = load(src + 32), b3 = load(src + 48);
  store(dst, b0);
  store(dst + 16, b1);
  store(dst + 32, b2);
  store(dst + 48, b3);
  __m128i a0 = _mm_xor_si128(b0, _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i a1 = b1, a2 = b2, a3 = b3;
  src += 64;
  dst += 64;
  n -= 64;
  while (n >= 64) {
    b0 = load(src);
    b1 = load(src + 16);
    b2 = load(src + 32);
    b3 = load(src + 48);
    store(dst, b0);
    store(dst + 16, b1);
    store(dst + 32, b2);
    store(dst + 48, b3);
    a0 = _mm_xor_si128(Fold128(a0, kFold64), b0);
    a1 = _mm_xor_si128(Fold128(a1, kFold64), b1);
    a2 = _mm_xor_si128(Fold128(a2, kFold64), b2);
    a3 = _mm_xor_si128(Fold128(a3, kFold64), b3);
    src += 64;
    dst += 64;
    n -= 64;
  }
  std::memcpy(dst, src, n);
  return ExtendSse42(FoldFour(a0, a1, a2, a3), dst, n);
}
#endif

using ExtendFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);
ExtendFn PickExtend() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
      __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2")) {
    return &ExtendVpclmul;
  }
  if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2")) return &ExtendPclmul;
  if (__builtin_cpu_supports("sse4.2")) return &ExtendSse42;
#endif
  return &ExtendPortable;
}

// A copy, then the checksum of the copy, a 256 KiB piece at a time, so the
// checksum reads each piece while it is still in cache. Raw registers (no
// inversions), as the Extend* functions.
template <ExtendFn kExtend>
uint32_t CopyByPieces(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n) {
  constexpr size_t kPiece = 256 << 10;
  for (size_t off = 0; off < n; off += kPiece) {
    const size_t len = std::min(kPiece, n - off);
    std::memcpy(dst + off, src + off, len);
    crc = kExtend(crc, dst + off, len);
  }
  return crc;
}

using CopyFn = uint32_t (*)(uint32_t, uint8_t*, const uint8_t*, size_t);
CopyFn PickCopy() {
  // Fused where the fold is slow enough for the second pass to cost (the
  // 128-bit fold); AVX-512's fold runs at several times memcpy's speed.
#if defined(__x86_64__)
  const ExtendFn extend = PickExtend();
  if (extend == &ExtendVpclmul) return &CopyByPieces<&ExtendVpclmul>;
  if (extend == &ExtendPclmul) return &CopyPclmul;
  if (extend == &ExtendSse42) return &CopyByPieces<&ExtendSse42>;
#endif
  return &CopyByPieces<&ExtendPortable>;
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const uint8_t* data, size_t n) {
  static const ExtendFn fn = PickExtend();
  return ~fn(~crc, data, n);
}

uint32_t Crc32cCopy(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n) {
  static const CopyFn fn = PickCopy();
  return ~fn(~crc, dst, src, n);
}

uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t len2) {
  // As zlib's crc32_combine (1.2.12 on): append len2 zero bytes to crc1 by
  // multiplying with x^(8 len2) mod P, built from the squares x^(2^k).
  static constexpr std::array<uint32_t, 64> kX2n = [] {
    std::array<uint32_t, 64> t{};
    uint32_t p = 1u << 30;  // x^1
    for (auto& v : t) {
      v = p;
      p = MultModP(p, p);
    }
    return t;
  }();
  uint64_t bits = uint64_t{len2} * 8;
  for (int k = 0; bits != 0; ++k, bits >>= 1) {
    if (bits & 1) crc1 = MultModP(kX2n[k], crc1);
  }
  return crc1 ^ crc2;
}

namespace {
// The public functions' form (a finished checksum in and out) of a raw one.
template <ExtendFn kExtend>
uint32_t Finished(uint32_t crc, const uint8_t* p, size_t n) {
  return ~kExtend(~crc, p, n);
}
template <CopyFn kCopy>
uint32_t FinishedCopy(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n) {
  return ~kCopy(~crc, dst, src, n);
}
}  // namespace

std::vector<Crc32cImplementation> Crc32cImplementationsForTest() {
  std::vector<Crc32cImplementation> out;
  out.push_back(
      {"portable", &Finished<&ExtendPortable>, &FinishedCopy<&CopyByPieces<&ExtendPortable>>});
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) {
    out.push_back({"sse4.2", &Finished<&ExtendSse42>, &FinishedCopy<&CopyByPieces<&ExtendSse42>>});
  }
  if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2")) {
    out.push_back({"pclmulqdq", &Finished<&ExtendPclmul>, &FinishedCopy<&CopyPclmul>});
    // The two-pass copy CopyPclmul replaced, which bench_kvstore_engine
    // times beside it.
    out.push_back({"pclmulqdq, copy then fold", &Finished<&ExtendPclmul>,
                   &FinishedCopy<&CopyByPieces<&ExtendPclmul>>});
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
      __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2")) {
    out.push_back(
        {"vpclmulqdq", &Finished<&ExtendVpclmul>, &FinishedCopy<&CopyByPieces<&ExtendVpclmul>>});
  }
#endif
  return out;
}

}  // namespace tandem::kvstore
