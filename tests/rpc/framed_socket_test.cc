// rpc::FramedSocket over a socketpair: frames and payload in any split the
// kernel chooses, the lookahead buffer, and every way a peer can end.
#include "tandem/rpc/framed_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::rpc {
namespace {

struct Pair {
  std::unique_ptr<FramedSocket> a, b;
};

Pair MakePair() {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  return {std::make_unique<FramedSocket>(fds[0]), std::make_unique<FramedSocket>(fds[1])};
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

v1::LoadChunk Chunk(int32_t index, uint64_t size) {
  v1::LoadChunk c;
  c.set_block_index(index);
  c.set_total_size(size);
  c.set_ok(true);
  return c;
}

TEST(FramedSocketTest, FramesAndPayloadsArriveInOrderWhateverTheKernelSplits) {
  Pair p = MakePair();
  const std::vector<uint8_t> small = Bytes(100, 1), big = Bytes(3 << 20, 2);
  std::thread writer([&] {
    ASSERT_TRUE(p.a->Write(Chunk(0, small.size()), small).ok());
    ASSERT_TRUE(p.a->Write(Chunk(1, big.size()), big).ok());
    ASSERT_TRUE(p.a->Write(Chunk(2, 0)).ok());  // a frame with no payload
  });
  v1::LoadChunk c;
  ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
  EXPECT_EQ(c.block_index(), 0);
  std::vector<uint8_t> got(c.total_size());
  ASSERT_TRUE(p.b->ReadRaw(got).ok());
  EXPECT_EQ(got, small);
  ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
  EXPECT_EQ(c.block_index(), 1);
  got.assign(c.total_size(), 0);
  // on_piece sees every byte once, in order.
  std::vector<uint8_t> seen;
  ASSERT_TRUE(p.b->ReadRaw(got, [&](std::span<const uint8_t> piece) {
                   seen.insert(seen.end(), piece.begin(), piece.end());
                 }).ok());
  EXPECT_EQ(got, big);
  EXPECT_EQ(seen, big);
  ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
  EXPECT_EQ(c.block_index(), 2);
  writer.join();
  const uint64_t frames = 12 + Chunk(0, small.size()).ByteSizeLong() +
                         Chunk(1, big.size()).ByteSizeLong() + Chunk(2, 0).ByteSizeLong();
  EXPECT_EQ(p.b->bytes_received(), frames + small.size() + big.size());
}

// A scatter read fills each dst in turn as one stream (empty dsts included,
// more dsts than one readv takes), tells on_piece whose piece it is, and
// leaves what follows the last dst for the next frame.
TEST(FramedSocketTest, AScatterReadFillsEachDstInTurnAndKeepsWhatFollows) {
  Pair p = MakePair();
  std::vector<size_t> sizes = {7, 0, 300000, 1, 0};
  for (int i = 0; i < 100; ++i) sizes.push_back(1000 + i * 37);  // past one readv's 64
  sizes.push_back(2 << 20);
  size_t total = 0;
  for (size_t n : sizes) total += n;
  const std::vector<uint8_t> payload = Bytes(total, 3);
  std::thread writer([&] {
    ASSERT_TRUE(p.a->Write(Chunk(0, total), payload).ok());
    ASSERT_TRUE(p.a->Write(Chunk(1, 0)).ok());
  });
  v1::LoadChunk c;
  ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
  // Bytes of the frame's payload already in the lookahead buffer are served first.
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::span<uint8_t>> dsts;
  for (size_t n : sizes) bufs.emplace_back(n, 0);
  for (auto& b : bufs) dsts.emplace_back(b);
  std::vector<std::vector<uint8_t>> seen(sizes.size());
  ASSERT_TRUE(p.b->ReadRawScatter(dsts, [&](size_t k, std::span<const uint8_t> piece) {
                   ASSERT_LT(k, sizes.size());
                   ASSERT_FALSE(piece.empty());
                   // A piece lies in its dst, right after what came before it.
                   ASSERT_EQ(piece.data(), bufs[k].data() + seen[k].size());
                   seen[k].insert(seen[k].end(), piece.begin(), piece.end());
                 }).ok());
  size_t offset = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const std::vector<uint8_t> want(payload.begin() + offset, payload.begin() + offset + sizes[k]);
    EXPECT_EQ(bufs[k], want) << "dst " << k;
    EXPECT_EQ(seen[k], want) << "dst " << k;
    offset += sizes[k];
  }
  ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
  EXPECT_EQ(c.block_index(), 1);
  writer.join();
}

TEST(FramedSocketTest, APayloadAlreadyInTheLookaheadBufferIsServedFromIt) {
  Pair p = MakePair();
  // Two frames, each with a 10-byte payload, sent in one write: the reader's
  // first recv takes all of it into the lookahead buffer.
  std::string wire;
  for (int i = 0; i < 2; ++i) {
    const std::string f = Chunk(i, 10).SerializeAsString();
    const uint32_t n = static_cast<uint32_t>(f.size());
    wire.append(reinterpret_cast<const char*>(&n), 4);  // little-endian host
    wire += f;
    wire.append(10, static_cast<char>('a' + i));
  }
  ASSERT_TRUE(p.a->WriteRaw({reinterpret_cast<const uint8_t*>(wire.data()), wire.size()}).ok());
  for (int i = 0; i < 2; ++i) {
    v1::LoadChunk c;
    ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
    EXPECT_EQ(c.block_index(), i);
    std::vector<uint8_t> got(10);
    ASSERT_TRUE(p.b->ReadRaw(got).ok());
    EXPECT_EQ(got, std::vector<uint8_t>(10, static_cast<uint8_t>('a' + i)));
  }
}

TEST(FramedSocketTest, AFrameOverTheLimitIsInvalidArgumentBeforeItsBytesAreRead) {
  Pair p = MakePair();
  ASSERT_TRUE(p.a->Write(Chunk(0, 1)).ok());
  v1::LoadChunk c;
  absl::Status s = p.b->Read(&c, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("at most 2"), absl::string_view::npos) << s;
}

TEST(FramedSocketTest, BytesThatDoNotParseAreInvalidArgumentNamingTheType) {
  Pair p = MakePair();
  const uint8_t junk[] = {3, 0, 0, 0, 0x00, 0xff, 0xff};
  ASSERT_TRUE(p.a->WriteRaw(junk).ok());
  v1::LoadChunk c;
  absl::Status s = p.b->Read(&c, 1 << 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("tandem.v1.LoadChunk"), absl::string_view::npos) << s;
}

TEST(FramedSocketTest, ClosingBetweenFramesIsCleanAndInsideOneIsNot) {
  {
    Pair p = MakePair();
    ASSERT_TRUE(p.a->Write(Chunk(0, 0)).ok());
    p.a.reset();
    v1::LoadChunk c;
    ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
    EXPECT_EQ(p.b->Read(&c, 1 << 10).code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(p.b->closed_cleanly());
  }
  {
    Pair p = MakePair();
    const uint8_t half[] = {20, 0, 0, 0, 0x08};  // announces 20 bytes, sends 1
    ASSERT_TRUE(p.a->WriteRaw(half).ok());
    p.a.reset();
    v1::LoadChunk c;
    EXPECT_EQ(p.b->Read(&c, 1 << 10).code(), absl::StatusCode::kUnavailable);
    EXPECT_FALSE(p.b->closed_cleanly());
  }
  {
    Pair p = MakePair();
    const std::vector<uint8_t> part = Bytes(5, 3);
    ASSERT_TRUE(p.a->Write(Chunk(0, 10), part).ok());  // 5 of 10 payload bytes
    p.a.reset();
    v1::LoadChunk c;
    ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
    std::vector<uint8_t> got(10);
    EXPECT_EQ(p.b->ReadRaw(got).code(), absl::StatusCode::kUnavailable);
    EXPECT_FALSE(p.b->closed_cleanly());
  }
}

TEST(FramedSocketTest, ASilentPeerIsDeadlineExceededAfterTheReceiveTimeout) {
  Pair p = MakePair();
  p.b->SetTimeouts(1000, 50);
  v1::LoadChunk c;
  EXPECT_EQ(p.b->Read(&c, 1 << 10).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(FramedSocketTest, SkipDropsAPayloadAndKeepsTheFraming) {
  Pair p = MakePair();
  const std::vector<uint8_t> big = Bytes(5 << 20, 4);
  std::thread writer([&] {
    ASSERT_TRUE(p.a->Write(Chunk(0, big.size()), big).ok());
    ASSERT_TRUE(p.a->Write(Chunk(7, 0)).ok());
  });
  v1::LoadChunk c;
  ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
  ASSERT_TRUE(p.b->Skip(c.total_size()).ok());
  ASSERT_TRUE(p.b->Read(&c, 1 << 10).ok());
  EXPECT_EQ(c.block_index(), 7);
  writer.join();
}

}  // namespace
}  // namespace tandem::rpc
