// RocksDB's CRC32C as the engine links it (libs/kvstore/rocksdb_crc32c.h:
// tandem's hardware CRC32C in place of Debian's table-driven build): the
// override is the one linked, and it gives RocksDB's own test vectors
// (rocksdb/util/crc32c_test.cc), so the WAL, blob and table checksums it
// writes are the ones RocksDB's code computes and reads back, and files
// written before the override still verify.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rocksdb::crc32c {

// As RocksDB's own code declares and calls them (util/crc32c.h).
std::string IsFastCrc32Supported();
uint32_t Extend(uint32_t init_crc, const char* data, size_t n);
uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t crc2len);

namespace {

uint32_t Value(const char* data, size_t n) { return Extend(0, data, n); }

TEST(RocksDbCrc32cTest, TheEngineLinksTandemsCrc32c) {
  // Debian's own build answers "Not supported on x86".
  EXPECT_NE(IsFastCrc32Supported().find("tandem's CRC32C"), std::string::npos)
      << IsFastCrc32Supported();
}

TEST(RocksDbCrc32cTest, GivesRocksDbsTestVectors) {
  char buf[32];
  std::memset(buf, 0, sizeof buf);
  EXPECT_EQ(Value(buf, sizeof buf), 0x8a9136aau);
  std::memset(buf, 0xff, sizeof buf);
  EXPECT_EQ(Value(buf, sizeof buf), 0x62a8ab43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<char>(i);
  EXPECT_EQ(Value(buf, sizeof buf), 0x46dd794eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<char>(31 - i);
  EXPECT_EQ(Value(buf, sizeof buf), 0x113fdb5cu);
  const unsigned char iscsi_read[48] = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00,
                                        0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00,
                                        0x00, 0x18, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                        0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(Value(reinterpret_cast<const char*>(iscsi_read), sizeof iscsi_read), 0xd9963a56u);
  EXPECT_NE(Value("a", 1), Value("foo", 3));
  EXPECT_EQ(Value("hello world", 11), Extend(Value("hello ", 6), "world", 5));
}

// Crc32cCombine(crc(A), crc(B), |B|) == crc(A + B), for lengths around the
// operator's powers of two and a large one.
TEST(RocksDbCrc32cTest, CombineIsTheCrcOfTheConcatenation) {
  std::mt19937 rng(7);
  std::vector<char> data(1 << 20);
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t a : {size_t{0}, size_t{1}, size_t{5}, size_t{4096}}) {
    for (size_t b : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{8}, size_t{255},
                     size_t{256}, size_t{1000}, size_t{65537}, (size_t{1} << 20) - a}) {
      const uint32_t whole = Value(data.data(), a + b);
      EXPECT_EQ(Crc32cCombine(Value(data.data(), a), Value(data.data() + a, b), b), whole)
          << a << " + " << b;
    }
  }
}

}  // namespace
}  // namespace rocksdb::crc32c
