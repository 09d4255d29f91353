// RocksDB's CRC32C (private to libs/kvstore), replaced at link time by the
// hardware one the KV-store already uses for its blocks
// (tandem/kvtypes/checksum.h).
//
// Why: Debian builds RocksDB portable, without SSE4.2, so its CRC32C (the
// checksum of every WAL record, blob record and table block) runs a table:
// rocksdb::crc32c::ExtendImpl<Slow_CRC32> took 17% of bench_kvstore's CPU
// time, and a store's whole payload goes through it twice (the WAL record,
// then the blob record at flush). The library has no option to choose the
// implementation at run time (its choice is fixed when it is compiled).
//
// How: librocksdb.a's util/crc32c.cc.o defines exactly the three functions
// below (nm). This object defines all three, and the engine calls one of
// them when it opens (Impl::Init logs which CRC32C RocksDB runs), so this
// object is always linked
// before the archive is searched and the archive's crc32c.cc.o is never
// pulled in. Should a later RocksDB define another global symbol there and
// reference it, its object would be pulled in and the link fails with a
// duplicate definition: loud, never a silent mix. CRC32C is one function,
// so files written before (or by the slow code) read back the same; the
// values are tested against RocksDB's own test vectors
// (tests/kvstore/checksum_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rocksdb::crc32c {

// RocksDB's declarations (its util/crc32c.h, which Debian does not install),
// defined in rocksdb_crc32c.cc.
std::string IsFastCrc32Supported();
uint32_t Extend(uint32_t init_crc, const char* data, size_t n);
uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t crc2len);

// RocksDB's inline helpers over them, as util/crc32c.h has them.
inline uint32_t Value(const char* data, size_t n) { return Extend(0, data, n); }

}  // namespace rocksdb::crc32c
