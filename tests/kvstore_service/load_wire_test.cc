// The service's hand-encoded LoadResponse messages (load_wire.h) are what
// the generated serializer produces, byte for byte, and every client using
// the generated types (C++ here; Python and grpcurl use the same wire
// format) parses them.
#include "load_wire.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvstore_service {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + i * 31);
  return out;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

TEST(LoadWireTest, EncodingEqualsTheGeneratedSerializerAndParsesWithIt) {
  // Pieces of several blocks (first, middle and last pieces, offsets that
  // need multi-byte varints, large sizes), misses, and a zero checksum
  // (omitted on the wire as proto3 does).
  const auto a = Bytes(300, 1), b = Bytes(70000, 2), c = Bytes(1, 3), d = Bytes(5, 4);
  LoadResponseEncoder enc;
  v1::LoadResponse want;
  auto piece = [&](int32_t index, uint64_t offset, uint64_t total, const std::vector<uint8_t>& data,
                   bool last, uint32_t checksum) {
    enc.AddPiece(index, offset, total, data, last);
    if (last) enc.SetLastPieceChecksum(checksum);
    v1::LoadChunk* ch = want.add_chunks();
    ch->set_block_index(index);
    ch->set_offset(offset);
    ch->set_data(data.data(), data.size());
    ch->set_total_size(total);
    ch->set_ok(true);
    ch->set_last(last);
    if (last) ch->set_checksum(checksum);
  };
  auto miss = [&](int32_t index, v1::MissReason reason) {
    enc.AddMiss(index, reason);
    v1::LoadChunk* ch = want.add_chunks();
    ch->set_block_index(index);
    ch->set_last(true);
    ch->set_miss_reason(reason);
  };
  piece(0, 0, 300, a, true, 0xFFFFFFFFu);
  miss(1, v1::MISS_REASON_NOT_FOUND);
  piece(2, 0, (uint64_t{1} << 40), b, false, 0);
  piece(2, (uint64_t{1} << 40) - 1, (uint64_t{1} << 40), c, true, 0);  // checksum 0: omitted
  miss(3, v1::MISS_REASON_CHECKSUM);
  piece(200000, 1 << 20, (1 << 20) + 5, d, true, 0x80);
  EXPECT_EQ(enc.num_chunks(), 6u);
  EXPECT_EQ(enc.payload_bytes(), a.size() + b.size() + c.size() + d.size());

  const std::string bytes = Flatten(enc.Finish());
  EXPECT_EQ(bytes, want.SerializeAsString());
  v1::LoadResponse got;
  ASSERT_TRUE(got.ParseFromString(bytes));
  ASSERT_EQ(got.chunks_size(), 6);
  EXPECT_EQ(got.chunks(2).data(), std::string(b.begin(), b.end()));
  EXPECT_EQ(got.chunks(2).total_size(), uint64_t{1} << 40);
  EXPECT_FALSE(got.chunks(2).last());
  EXPECT_EQ(got.chunks(0).checksum(), 0xFFFFFFFFu);
  EXPECT_EQ(got.chunks(4).miss_reason(), v1::MISS_REASON_CHECKSUM);
  EXPECT_FALSE(got.chunks(4).ok());
  EXPECT_EQ(got.chunks(5).block_index(), 200000);

  // Finish() resets: the next message holds only what was added after.
  EXPECT_EQ(enc.num_chunks(), 0u);
  EXPECT_EQ(enc.payload_bytes(), 0u);
  enc.AddMiss(0, v1::MISS_REASON_TIMEOUT);
  v1::LoadResponse one;
  ASSERT_TRUE(one.ParseFromString(Flatten(enc.Finish())));
  ASSERT_EQ(one.chunks_size(), 1);
  EXPECT_EQ(one.chunks(0).block_index(), 0);
  EXPECT_TRUE(one.chunks(0).last());
  EXPECT_EQ(one.chunks(0).miss_reason(), v1::MISS_REASON_TIMEOUT);
}

TEST(LoadWireTest, PayloadIsCopiedOnceAndOwnedByTheMessage) {
  auto data = Bytes(4096, 9);
  LoadResponseEncoder enc;
  enc.AddPiece(0, 0, data.size(), data, true);
  enc.SetLastPieceChecksum(7);
  data.assign(data.size(), 0);  // the source may change after AddPiece
  grpc::ByteBuffer buffer = enc.Finish();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  // Header, payload (its own slice), trailer.
  ASSERT_EQ(slices.size(), 3u);
  EXPECT_EQ(slices[1].size(), 4096u);
  v1::LoadResponse got;
  ASSERT_TRUE(got.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(got.chunks(0).data(),
            std::string(reinterpret_cast<const char*>(Bytes(4096, 9).data()), 4096));
}

}  // namespace
}  // namespace tandem::kvstore_service
