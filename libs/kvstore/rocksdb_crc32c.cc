#include "rocksdb_crc32c.h"

#include "tandem/kvtypes/checksum.h"

namespace rocksdb::crc32c {

std::string IsFastCrc32Supported() {
  return "tandem's CRC32C (VPCLMULQDQ folding, else the SSE4.2 crc32 instruction, else a table: "
         "the fastest this CPU has)";
}

uint32_t Extend(uint32_t init_crc, const char* data, size_t n) {
  return tandem::kvstore::Crc32cExtend(init_crc, reinterpret_cast<const uint8_t*>(data), n);
}

namespace {

// zlib's crc32_combine over GF(2), for CRC32C's reflected polynomial: the
// operator that appends `len` zero bytes to a CRC register, by squaring.
uint32_t Gf2Times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[i];
  }
  return sum;
}

void Gf2Square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2Times(mat, mat[n]);
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t crc2len) {
  if (crc2len == 0) return crc1;
  uint32_t even[32], odd[32];
  odd[0] = 0x82F63B78u;  // one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  Gf2Square(even, odd);  // two zero bits
  Gf2Square(odd, even);  // four
  do {
    Gf2Square(even, odd);  // the first pass: one zero byte
    if (crc2len & 1) crc1 = Gf2Times(even, crc1);
    crc2len >>= 1;
    if (crc2len == 0) break;
    Gf2Square(odd, even);
    if (crc2len & 1) crc1 = Gf2Times(odd, crc1);
    crc2len >>= 1;
  } while (crc2len != 0);
  return crc1 ^ crc2;
}

}  // namespace rocksdb::crc32c
