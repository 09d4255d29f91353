#include "tandem/common/block_hash.h"

#include <openssl/sha.h>

#include <numeric>

#include "gtest/gtest.h"

namespace tandem {
namespace {

HashRootParams Params() {
  return {.model_fingerprint = "fp", .kv_layout = "L", .block_size = 4,
          .dtype = "f32", .cache_salt = ""};
}

TEST(BlockHashTest, BlockHashIsSha256OfParentAndLittleEndianTokens) {
  BlockHash parent;
  parent.bytes.fill(7);
  std::vector<int32_t> tokens = {1, 258, -1};
  unsigned char buf[32 + 12];
  std::memcpy(buf, parent.bytes.data(), 32);
  const unsigned char le[12] = {1, 0, 0, 0, 2, 1, 0, 0, 0xff, 0xff, 0xff, 0xff};
  std::memcpy(buf + 32, le, 12);
  BlockHash expected;
  SHA256(buf, sizeof(buf), expected.bytes.data());
  EXPECT_EQ(HashBlock(parent, tokens), expected);
}

TEST(BlockHashTest, RootCoversEveryField) {
  const BlockHash base = ComputeRootHash(Params());
  HashRootParams p = Params();
  p.model_fingerprint = "other";
  EXPECT_NE(ComputeRootHash(p), base);
  p = Params();
  p.kv_layout = "M";
  EXPECT_NE(ComputeRootHash(p), base);
  p = Params();
  p.block_size = 8;
  EXPECT_NE(ComputeRootHash(p), base);
  p = Params();
  p.dtype = "f16";
  EXPECT_NE(ComputeRootHash(p), base);
  p = Params();
  p.cache_salt = "tenant-a";
  EXPECT_NE(ComputeRootHash(p), base);
  EXPECT_EQ(ComputeRootHash(Params()), base);
}

TEST(BlockHashTest, FieldsAreLengthPrefixed) {
  HashRootParams a = Params(), b = Params();
  a.model_fingerprint = "ab";
  a.kv_layout = "c";
  b.model_fingerprint = "a";
  b.kv_layout = "bc";
  EXPECT_NE(ComputeRootHash(a), ComputeRootHash(b));
}

TEST(BlockHashTest, ExtendHashesOnlyFullBlocksAndChains) {
  const BlockHash root = ComputeRootHash(Params());
  std::vector<int32_t> tokens(10);
  std::iota(tokens.begin(), tokens.end(), 0);
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(root, tokens, 4, &hashes);
  ASSERT_EQ(hashes.size(), 2u);
  EXPECT_EQ(hashes[0], HashBlock(root, std::span(tokens).subspan(0, 4)));
  EXPECT_EQ(hashes[1], HashBlock(hashes[0], std::span(tokens).subspan(4, 4)));
  // Same second block after a different first block hashes differently.
  std::vector<int32_t> other = tokens;
  other[0] = 99;
  std::vector<BlockHash> other_hashes;
  ExtendBlockHashes(root, other, 4, &other_hashes);
  EXPECT_NE(other_hashes[1], hashes[1]);
  // Extending continues where it left off.
  tokens.push_back(10);
  tokens.push_back(11);
  ExtendBlockHashes(root, tokens, 4, &hashes);
  ASSERT_EQ(hashes.size(), 3u);
  EXPECT_EQ(hashes[2], HashBlock(hashes[1], std::span(tokens).subspan(8, 4)));
}

TEST(BlockHashTest, BytesRoundTripAndRejectWrongLength) {
  BlockHash h = ComputeRootHash(Params());
  BlockHash back;
  ASSERT_TRUE(BlockHash::FromBytes(h.ToBytes(), &back).ok());
  EXPECT_EQ(back, h);
  absl::Status s = BlockHash::FromBytes("short", &back);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("32 bytes"), absl::string_view::npos);
  EXPECT_EQ(h.ToHex().size(), 64u);
}

}  // namespace
}  // namespace tandem
