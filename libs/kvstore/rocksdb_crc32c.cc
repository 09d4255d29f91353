#include "rocksdb_crc32c.h"

#include "tandem/kvtypes/checksum.h"

namespace rocksdb::crc32c {

std::string IsFastCrc32Supported() {
  return "tandem's CRC32C (VPCLMULQDQ or PCLMULQDQ folding, else the SSE4.2 crc32 instruction, "
         "else a table: the fastest this CPU has)";
}

uint32_t Extend(uint32_t init_crc, const char* data, size_t n) {
  return tandem::kvstore::Crc32cExtend(init_crc, reinterpret_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t crc2len) {
  // RocksDB calls this for every WAL append it verifies (a 2 MiB store's
  // record, fragment by fragment); zlib's matrix-squaring form it had here
  // was 9% of bench_kvstore's CPU time.
  return tandem::kvstore::Crc32cCombine(crc1, crc2, crc2len);
}

}  // namespace rocksdb::crc32c
