// The KV-store client's in-place LoadResponse parser (kvstore_client_wire.h):
// it reads what the generated serializer writes (any slicing of the bytes,
// chunked blocks, fields in any order, unknown fields), rejects malformed
// messages with a precise error where the generated parser rejects them too,
// and the client built on it reports checksum mismatches and malformed
// streams from a (fake) server.
#include "kvstore_client_wire.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/method_handler.h"
#include "gtest/gtest.h"
#include "../kvstore_service/loopback_server.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem::kvconnector {
namespace {

using ::testing::HasSubstr;
using wire::LoadChunkView;

std::string Bytes(size_t n, uint8_t seed) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(seed + i * 7);
  return out;
}

uint32_t Crc(const std::string& s) {
  return kvstore::Crc32cExtend(0, reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// The bytes as segments cut at `cuts` (offsets).
struct Split {
  std::vector<std::string> parts;
  std::vector<std::span<const uint8_t>> segments;
  Split(const std::string& bytes, std::vector<size_t> cuts) {
    size_t prev = 0;
    cuts.push_back(bytes.size());
    for (size_t c : cuts) {
      parts.push_back(bytes.substr(prev, c - prev));
      prev = c;
    }
    for (const std::string& p : parts) {
      segments.emplace_back(reinterpret_cast<const uint8_t*>(p.data()), p.size());
    }
  }
};

absl::Status Parse(const std::string& bytes, std::vector<LoadChunkView>* chunks) {
  Split s(bytes, {});
  return wire::ParseLoadResponse(s.segments, chunks);
}

// Encoding helpers for hand-built messages.
void Varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void Tag(std::string* out, uint32_t field, uint32_t type) { Varint(out, (field << 3) | type); }
std::string Delimited(uint32_t field, const std::string& body) {
  std::string out;
  Tag(&out, field, 2);
  Varint(&out, body.size());
  return out + body;
}

v1::LoadResponse ChunkedMessage(const std::string& block_a, const std::string& block_b) {
  v1::LoadResponse m;
  auto* c = m.add_chunks();  // block 0 whole
  c->set_block_index(0);
  c->set_data(block_a);
  c->set_total_size(block_a.size());
  c->set_ok(true);
  c->set_last(true);
  c->set_checksum(Crc(block_a));
  c = m.add_chunks();  // a miss
  c->set_block_index(1);
  c->set_last(true);
  c->set_miss_reason(v1::MISS_REASON_NOT_FOUND);
  const size_t half = block_b.size() / 2;  // block 2 in two pieces
  c = m.add_chunks();
  c->set_block_index(2);
  c->set_data(block_b.substr(0, half));
  c->set_total_size(block_b.size());
  c->set_ok(true);
  c = m.add_chunks();
  c->set_block_index(2);
  c->set_offset(half);
  c->set_data(block_b.substr(half));
  c->set_total_size(block_b.size());
  c->set_ok(true);
  c->set_last(true);
  c->set_checksum(Crc(block_b));
  return m;
}

// Copies every chunk's data into its block's buffer at its offset.
std::vector<std::string> Assemble(wire::Segments segs, const std::vector<LoadChunkView>& chunks,
                                  size_t blocks, std::vector<uint32_t>* crcs) {
  std::vector<std::string> out(blocks);
  crcs->assign(blocks, 0);
  for (const LoadChunkView& c : chunks) {
    std::string& b = out[c.block_index];
    b.resize(c.offset + c.data.size);
    wire::CopyLoadPayload(segs, c.data, reinterpret_cast<uint8_t*>(b.data()) + c.offset,
                          &(*crcs)[c.block_index]);
  }
  return out;
}

TEST(LoadWireParserTest, ReadsTheGeneratedSerializerOutputUnderAnySlicing) {
  const std::string a = Bytes(1000, 1), b = Bytes(3000, 2);
  const std::string bytes = ChunkedMessage(a, b).SerializeAsString();
  // Every cut point once, and pairs of cuts around the pieces' headers
  // (including empty segments).
  std::vector<std::vector<size_t>> cuttings = {{}};
  for (size_t i = 0; i <= bytes.size(); ++i) cuttings.push_back({i});
  for (size_t i = 0; i < 40; ++i) cuttings.push_back({i, i, i + 1, bytes.size() - i});
  for (const auto& cuts : cuttings) {
    Split s(bytes, cuts);
    std::vector<LoadChunkView> chunks;
    ASSERT_TRUE(wire::ParseLoadResponse(s.segments, &chunks).ok());
    ASSERT_EQ(chunks.size(), 4u);
    EXPECT_TRUE(chunks[0].ok && chunks[0].last);
    EXPECT_EQ(chunks[0].checksum, Crc(a));
    EXPECT_EQ(chunks[0].total_size, a.size());
    EXPECT_FALSE(chunks[1].ok);
    EXPECT_TRUE(chunks[1].last);
    EXPECT_EQ(chunks[1].block_index, 1);
    EXPECT_EQ(chunks[1].miss_reason, v1::MISS_REASON_NOT_FOUND);
    EXPECT_EQ(chunks[1].data.size, 0u);
    EXPECT_FALSE(chunks[2].last);
    EXPECT_EQ(chunks[3].offset, b.size() / 2);
    EXPECT_EQ(chunks[3].checksum, Crc(b));
    std::vector<uint32_t> crcs;
    std::vector<LoadChunkView> hits{chunks[0], chunks[2], chunks[3]};
    auto blocks = Assemble(s.segments, hits, 3, &crcs);
    EXPECT_EQ(blocks[0], a);
    EXPECT_EQ(blocks[2], b);
    EXPECT_EQ(crcs[0], Crc(a));  // the checksum of the copied bytes
    EXPECT_EQ(crcs[2], Crc(b));
  }
}

TEST(LoadWireParserTest, AcceptsAnyFieldOrderRepeatsAndSkipsUnknownFields) {
  const std::string data = Bytes(200, 5);
  std::string chunk;
  // Unknown fields of every wire type first, then the known ones in reverse
  // order, a repeated scalar (the last one wins), and a known field number
  // with another wire type (an unknown field to the generated parser too).
  Tag(&chunk, 100, 0);
  Varint(&chunk, 123456789);
  Tag(&chunk, 101, 1);
  chunk += std::string(8, 'x');
  Tag(&chunk, 102, 5);
  chunk += std::string(4, 'y');
  chunk += Delimited(103, "unknown bytes");
  Tag(&chunk, 104, 3);  // a group holding a varint and a nested group
  Tag(&chunk, 1, 0);
  Varint(&chunk, 5);
  Tag(&chunk, 105, 3);
  Tag(&chunk, 105, 4);
  Tag(&chunk, 104, 4);
  Tag(&chunk, 8, 0);
  Varint(&chunk, Crc(data));
  Tag(&chunk, 7, 0);
  Varint(&chunk, data.size());
  Tag(&chunk, 5, 0);
  Varint(&chunk, 1);
  Tag(&chunk, 4, 0);
  Varint(&chunk, 1);
  chunk += Delimited(3, "stale data, replaced below");
  Tag(&chunk, 2, 0);
  Varint(&chunk, 0);
  Tag(&chunk, 1, 0);
  Varint(&chunk, 7);
  Tag(&chunk, 1, 0);
  Varint(&chunk, 2);  // block_index 2 wins
  Tag(&chunk, 2, 2);  // field 2 (offset) as bytes: unknown
  Varint(&chunk, 3);
  chunk += "abc";
  chunk += Delimited(3, data);
  std::string msg;
  Tag(&msg, 9, 0);  // unknown field of LoadResponse
  Varint(&msg, 1);
  msg += Delimited(1, chunk);
  msg += Delimited(2, "unknown LoadResponse field");

  v1::LoadResponse generated;
  ASSERT_TRUE(generated.ParseFromString(msg));
  ASSERT_EQ(generated.chunks_size(), 1);
  std::vector<LoadChunkView> chunks;
  ASSERT_TRUE(Parse(msg, &chunks).ok());
  ASSERT_EQ(chunks.size(), 1u);
  const v1::LoadChunk& g = generated.chunks(0);
  EXPECT_EQ(chunks[0].block_index, g.block_index());
  EXPECT_EQ(chunks[0].block_index, 2);
  EXPECT_EQ(chunks[0].offset, g.offset());
  EXPECT_EQ(chunks[0].total_size, g.total_size());
  EXPECT_EQ(chunks[0].checksum, g.checksum());
  EXPECT_EQ(chunks[0].ok, g.ok());
  EXPECT_EQ(chunks[0].last, g.last());
  Split s(msg, {});
  std::string copy(chunks[0].data.size, '\0');
  uint32_t crc = 0;
  wire::CopyLoadPayload(s.segments, chunks[0].data, reinterpret_cast<uint8_t*>(copy.data()), &crc);
  EXPECT_EQ(copy, g.data());
  EXPECT_EQ(copy, data);
  EXPECT_EQ(crc, Crc(data));
}

TEST(LoadWireParserTest, MalformedMessagesGetAPreciseErrorAsTheGeneratedParserRejectsThem) {
  const std::string good = ChunkedMessage(Bytes(100, 1), Bytes(50, 2)).SerializeAsString();
  std::string chunk_overrun;  // a LoadChunk longer than the message
  Tag(&chunk_overrun, 1, 2);
  Varint(&chunk_overrun, 50);
  chunk_overrun += std::string(10, '\0');
  std::string data_overrun;  // data longer than its LoadChunk
  {
    std::string chunk;
    Tag(&chunk, 3, 2);
    Varint(&chunk, 20);
    chunk += std::string(5, 'z');
    Tag(&data_overrun, 1, 2);
    Varint(&data_overrun, chunk.size());
    data_overrun += chunk + std::string(30, '\0');
  }
  std::string long_varint;
  Tag(&long_varint, 1, 0);
  long_varint += std::string(10, '\x80') + "\x01";
  struct Case {
    std::string name, bytes, error;
  };
  const std::vector<Case> cases = {
      {"truncated message", good.substr(0, good.size() - 3), "at byte "},
      {"truncated varint", std::string("\x08\x80", 2), "at byte 1: truncated varint"},
      {"varint of 11 bytes", long_varint, "at byte 1: varint longer than 10 bytes"},
      {"field number 0", std::string("\x00\x01", 2), "at byte 0: invalid field tag 0"},
      {"wire type 6", std::string("\x0e\x01", 2), "at byte 0: field 1 has invalid wire type 6"},
      {"end group without a group", std::string("\x0c", 1), "end-group tag 1 without a group"},
      {"group without an end", std::string("\x0b\x08\x01", 3), "group 1 has no end"},
      {"LoadChunk overruns the message", chunk_overrun,
       "at byte 1: LoadChunk of 50 bytes overruns the message (10 bytes left)"},
      {"data overruns its LoadChunk", data_overrun,
       "at byte 4: LoadChunk.data of 20 bytes overruns its enclosing message (5 bytes left)"},
  };
  for (const Case& c : cases) {
    v1::LoadResponse generated;
    EXPECT_FALSE(generated.ParseFromString(c.bytes)) << c.name;
    std::vector<LoadChunkView> chunks;
    absl::Status s = Parse(c.bytes, &chunks);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << c.name;
    EXPECT_THAT(s.message(), HasSubstr("malformed LoadResponse")) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.error)) << c.name << ": " << s.message();
  }
}

// The bitwise definition of CRC32C (reflected Castagnoli polynomial).
uint32_t ReferenceCrc32c(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

// The copy's checksum (Crc32cExtend: crc32 instruction or carry-less
// multiplication folding, by CPU and length) equals the definition, for
// lengths around the fast paths' thresholds, unaligned data, pieces split
// across segments, and a nonzero starting value.
TEST(LoadWireParserTest, CopyChecksumMatchesTheCrc32cDefinition) {
  EXPECT_EQ(kvstore::Crc32cExtend(0, reinterpret_cast<const uint8_t*>("123456789"), 9),
            0xE3069283u);
  const std::string data = Bytes((1 << 20) + 64, 11);
  for (size_t n : {0ul, 1ul, 255ul, 256ul, 1023ul, 1024ul, 1025ul, 1279ul, 1280ul, 4096ul, 65536ul,
                   100003ul, (size_t{1} << 20) + 17}) {
    for (size_t off : {0ul, 1ul, 13ul}) {
      const auto* src = reinterpret_cast<const uint8_t*>(data.data()) + off;
      for (uint32_t init : {0u, 0xDEADBEEFu}) {
        EXPECT_EQ(kvstore::Crc32cExtend(init, src, n), ReferenceCrc32c(init, src, n))
            << n << " " << off << " " << init;
      }
      // Through CopyLoadPayload with the bytes in three segments.
      const std::string bytes = data.substr(off, n);
      Split s(bytes, {n / 3, n / 3 + n / 5});
      std::string copy(n, '\0');
      uint32_t crc = 0;
      wire::CopyLoadPayload(s.segments, {0, 0, n}, reinterpret_cast<uint8_t*>(copy.data()), &crc);
      EXPECT_EQ(copy, bytes);
      EXPECT_EQ(crc, ReferenceCrc32c(0, src, n)) << n << " " << off;
    }
  }
}

// A fake tandem.v1.KvStore whose Load answers with fixed raw messages.
class FakeLoadService final : public v1::KvStore::Service {
 public:
  explicit FakeLoadService(std::vector<std::string> messages) : messages_(std::move(messages)) {
    MarkMethodStreamed(
        2, new grpc::internal::SplitServerStreamingHandler<v1::LoadRequest, grpc::ByteBuffer>(
               [this](grpc::ServerContext*,
                      grpc::ServerSplitStreamer<v1::LoadRequest, grpc::ByteBuffer>* stream) {
                 v1::LoadRequest req;
                 if (!stream->Read(&req)) return grpc::Status(grpc::StatusCode::INTERNAL, "");
                 for (const std::string& m : messages_) {
                   grpc::Slice slice(m.data(), m.size());
                   if (!stream->Write(grpc::ByteBuffer(&slice, 1))) break;
                 }
                 return grpc::Status::OK;
               }));
  }

 private:
  std::vector<std::string> messages_;
};

struct FakeServer {
  explicit FakeServer(std::vector<std::string> messages) : service(std::move(messages)) {
    testutil::LoopbackServer s = testutil::StartOnLoopback(&service);
    server = std::move(s.server);
    auto c = KvStoreClient::Create({.target = s.target});
    EXPECT_TRUE(c.ok());
    client = std::move(*c);
  }
  ~FakeServer() {
    client.reset();
    server->Shutdown();
  }
  FakeLoadService service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<KvStoreClient> client;
};

TEST(KvStoreClientLoadTest, ChunkedStreamWithUnknownFieldsLoadsAndBadChecksumIsAMiss) {
  const std::string a = Bytes(1000, 1), b = Bytes(3000, 2), c = Bytes(1000, 3);
  v1::LoadResponse first = ChunkedMessage(a, b);
  first.mutable_chunks(3)->set_last(false);  // block 2 continues in the next message
  first.mutable_chunks(3)->clear_checksum();
  v1::LoadResponse second;
  auto* p = second.add_chunks();  // block 2: a last, empty piece with the checksum
  p->set_block_index(2);
  p->set_offset(b.size());
  p->set_total_size(b.size());
  p->set_ok(true);
  p->set_last(true);
  p->set_checksum(Crc(b));
  p = second.add_chunks();  // block 3 with a wrong checksum
  p->set_block_index(3);
  p->set_data(c);
  p->set_total_size(c.size());
  p->set_ok(true);
  p->set_last(true);
  p->set_checksum(Crc(c) ^ 1);
  std::string second_bytes = second.SerializeAsString();
  Tag(&second_bytes, 77, 0);  // an unknown field a newer server might send
  Varint(&second_bytes, 3);
  FakeServer fake({first.SerializeAsString(), second_bytes});

  std::vector<BlockHash> hashes(4);
  std::vector<std::string> bufs = {std::string(a.size(), '\0'), std::string(b.size(), '\0'),
                                   std::string(b.size(), '\0'), std::string(c.size(), '\0')};
  std::vector<std::span<uint8_t>> dst;
  for (std::string& s : bufs) dst.emplace_back(reinterpret_cast<uint8_t*>(s.data()), s.size());
  auto r = fake.client->Load("ns", hashes, dst);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].miss, LoadMiss::kNone);
  EXPECT_EQ((*r)[1].miss, LoadMiss::kNotFound);
  EXPECT_EQ((*r)[2].miss, LoadMiss::kNone);
  EXPECT_EQ((*r)[3].miss, LoadMiss::kChecksum);
  EXPECT_EQ(bufs[0], a);
  EXPECT_EQ(bufs[2], b);
}

TEST(KvStoreClientLoadTest, MalformedMessageFailsTheLoadWithAPreciseError) {
  FakeServer fake({std::string("\x0a\x32\x00", 3)});  // LoadChunk of 50 bytes, 1 there
  std::vector<BlockHash> hashes(1);
  std::string buf(10, '\0');
  std::vector<std::span<uint8_t>> dst{{reinterpret_cast<uint8_t*>(buf.data()), buf.size()}};
  auto r = fake.client->Load("ns", hashes, dst);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.status().message(),
              HasSubstr("malformed LoadResponse at byte 1: LoadChunk of 50 bytes overruns"));

  // After a completed block, the malformed message fails only the rest.
  v1::LoadResponse ok;
  auto* c = ok.add_chunks();
  c->set_data(std::string(10, 'q'));
  c->set_total_size(10);
  c->set_ok(true);
  c->set_last(true);
  c->set_checksum(Crc(std::string(10, 'q')));
  FakeServer fake2({ok.SerializeAsString(), std::string("\x0a\x32\x00", 3)});
  std::vector<BlockHash> two(2);
  std::string buf2(10, '\0');
  std::vector<std::span<uint8_t>> dst2{{reinterpret_cast<uint8_t*>(buf.data()), buf.size()},
                                       {reinterpret_cast<uint8_t*>(buf2.data()), buf2.size()}};
  auto r2 = fake2.client->Load("ns", two, dst2);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ((*r2)[0].miss, LoadMiss::kNone);
  EXPECT_EQ((*r2)[1].miss, LoadMiss::kFailed);
  EXPECT_EQ(buf, std::string(10, 'q'));
}

}  // namespace
}  // namespace tandem::kvconnector
