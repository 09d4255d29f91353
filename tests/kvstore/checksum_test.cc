#include "tandem/kvtypes/checksum.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvstore {
namespace {

// Bit-at-a-time CRC32C, the definition, as an independent reference.
uint32_t NaiveCrc32c(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

TEST(Crc32cTest, MatchesPublishedCheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(Crc32cExtend(0, reinterpret_cast<const uint8_t*>(s.data()), s.size()), 0xE3069283u);
}

TEST(Crc32cTest, MatchesBitwiseDefinitionAtEveryLengthAndAlignment) {
  std::vector<uint8_t> buf(300);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t off = 0; off < 8; ++off) {
    for (size_t n = 0; n + off <= buf.size(); n += 13) {
      EXPECT_EQ(Crc32cExtend(0, buf.data() + off, n), NaiveCrc32c(buf.data() + off, n))
          << "offset " << off << " length " << n;
    }
  }
}

TEST(Crc32cTest, MatchesBitwiseDefinitionOnLongBuffers) {
  std::vector<uint8_t> buf(3 * 4096 * 5 + 1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  for (size_t n : {size_t{3 * 4096}, size_t{3 * 4096 + 1}, size_t{3 * 4096 * 2 - 1}, size_t{40000},
                   buf.size() - 3}) {
    EXPECT_EQ(Crc32cExtend(0, buf.data() + 3, n), NaiveCrc32c(buf.data() + 3, n)) << n;
  }
  // Extending an existing CRC through the striped path.
  const uint32_t head = Crc32cExtend(0, buf.data(), 5);
  EXPECT_EQ(Crc32cExtend(head, buf.data() + 5, 30000), NaiveCrc32c(buf.data(), 30005));
}

TEST(Crc32cTest, EveryImplementationMatchesTheBitwiseDefinition) {
  std::vector<uint8_t> buf(3 * 4096 * 5 + 1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  const auto impls = Crc32cImplementationsForTest();
  ASSERT_GE(impls.size(), 1u);
  for (const Crc32cImplementation& impl : impls) {
    for (size_t off : {size_t{0}, size_t{3}}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{63}, size_t{64}, size_t{255},
                       size_t{256}, size_t{257}, size_t{319}, size_t{1023}, size_t{1024},
                       size_t{1087}, size_t{4096}, size_t{3 * 4096 + 1}, size_t{40000},
                       buf.size() - 3}) {
        EXPECT_EQ(impl.extend(0, buf.data() + off, n), NaiveCrc32c(buf.data() + off, n))
            << impl.name << " offset " << off << " length " << n;
      }
    }
    const uint32_t head = impl.extend(0, buf.data(), 5);
    EXPECT_EQ(impl.extend(head, buf.data() + 5, 30000), NaiveCrc32c(buf.data(), 30005))
        << impl.name;
  }
}

TEST(Crc32cTest, CombineEqualsTheChecksumOfTheConcatenation) {
  std::vector<uint8_t> buf(70000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 2654435761u >> 11);
  for (size_t split : {size_t{0}, size_t{1}, size_t{5}, size_t{4096}, size_t{33333}}) {
    for (size_t len2 : {size_t{0}, size_t{1}, size_t{3}, size_t{8}, size_t{1000}, size_t{32768},
                        buf.size() - split}) {
      if (split + len2 > buf.size()) continue;
      const uint32_t a = Crc32cExtend(0, buf.data(), split);
      const uint32_t b = Crc32cExtend(0, buf.data() + split, len2);
      EXPECT_EQ(Crc32cCombine(a, b, len2), NaiveCrc32c(buf.data(), split + len2))
          << "split " << split << " len2 " << len2;
    }
  }
  // A long second part (as RocksDB's WAL files reach): 5 MiB of zeros.
  std::vector<uint8_t> zeros(5 << 20, 0);
  const uint32_t a = Crc32cExtend(0, buf.data(), 100);
  EXPECT_EQ(Crc32cCombine(a, Crc32cExtend(0, zeros.data(), zeros.size()), zeros.size()),
            Crc32cExtend(a, zeros.data(), zeros.size()));
}

// The copy holds the source's bytes, writes nothing past them, and the
// checksum is theirs, from a running checksum: Crc32cCopy, and each
// implementation's copy (fused with the fold, or 256 KiB pieces) at lengths
// around the fold's 64-byte steps and the pieces' edges, at odd alignments.
TEST(Crc32cTest, CopyCopiesAndChecksumsTheBytes) {
  std::vector<uint8_t> src((600 << 10) + 5);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + (i >> 11));
  const uint32_t head = Crc32cExtend(0, src.data(), 3);
  std::vector<Crc32cImplementation> impls = Crc32cImplementationsForTest();
  impls.push_back({"Crc32cCopy", nullptr, &Crc32cCopy});
  const std::vector<size_t> lengths = {
      0, 1, 63, 255, 256, 257, 319, 320, 4097, 256 << 10, (256 << 10) + 1, src.size() - 3};
  std::vector<uint32_t> want;
  for (size_t n : lengths) want.push_back(NaiveCrc32c(src.data(), n + 3));
  for (const Crc32cImplementation& impl : impls) {
    for (size_t at : {size_t{0}, size_t{1}, size_t{5}}) {  // dst's misalignment
      for (size_t k = 0; k < lengths.size(); ++k) {
        const size_t n = lengths[k];
        std::vector<uint8_t> dst(at + n + 1, 0xAB);
        EXPECT_EQ(impl.copy(head, dst.data() + at, src.data() + 3, n), want[k])
            << impl.name << " at " << at << " length " << n;
        EXPECT_TRUE(std::equal(dst.begin() + at, dst.begin() + at + n, src.begin() + 3))
            << impl.name << " at " << at << " length " << n;
        EXPECT_EQ(dst[at + n], 0xAB) << impl.name << ": nothing past n is written";
        EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + at, [](uint8_t b) { return b == 0xAB; }))
            << impl.name << ": nothing before dst is written";
      }
    }
  }
}

TEST(Crc32cTest, ExtendEqualsOneShot) {
  std::vector<uint8_t> buf(1000, 0xAB);
  const uint32_t a = Crc32cExtend(0, buf.data(), 400);
  EXPECT_EQ(Crc32cExtend(a, buf.data() + 400, 600), Crc32cExtend(0, buf.data(), 1000));
}

}  // namespace
}  // namespace tandem::kvstore
