// Stores through the KV-store's local socket (services/kvstore/
// bulk_load_server.h, "Local socket"): the client writes each block the
// store reserves a hot slot for straight into the shared memory, the store
// checks it there against the writer's CRC32C before it keeps it, a block
// that does not match and a batch cut off keep nothing, and without the
// socket stores take the bulk port.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "local_socket_fixture.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem {
namespace {

using kvconnector::BlockStoreResult;
using kvconnector::LoadMiss;
using kvstore::testing::TestHash;
using kvstore::testing::TestPayload;

constexpr uint64_t kStoreBlock = testutil::kBulkBlock;
constexpr uint64_t kBigStoreBlock = testutil::kBulkBigBlock;

class LocalStoreTest : public testutil::LocalSocketTest {
 protected:
  absl::StatusOr<std::vector<BlockStoreResult>> Store(
      const std::string& ns, const std::vector<uint64_t>& ids,
      const std::vector<std::vector<uint8_t>>& payloads,
      std::optional<kvstore::Durability> durability) {
    std::vector<BlockHash> hashes;
    for (uint64_t id : ids) hashes.push_back(TestHash(id));
    std::vector<std::span<const uint8_t>> src(payloads.begin(), payloads.end());
    return client_->Store(ns, hashes, src, durability);
  }

  // A store connection by hand, the hot tier mapped read-write into map_.
  std::unique_ptr<rpc::FramedSocket> DialStores() {
    return DialLocal(rpc::kKvLocalStorePreface, PROT_READ | PROT_WRITE);
  }
  // A request for test blocks `ids` of namespace "ns", in memory, with the
  // checksums after the payload.
  static v1::BulkStoreRequest Request(const std::vector<uint64_t>& ids) {
    v1::BulkStoreRequest req;
    req.set_namespace_("ns");
    req.set_durability(v1::DURABILITY_MEMORY);
    req.set_checksums_follow(true);
    for (uint64_t id : ids) {
      v1::BulkStoreBlock* b = req.add_blocks();
      b->set_block_hash(TestHash(id).ToBytes());
      b->set_size(kStoreBlock);
    }
    return req;
  }
};

TEST_F(LocalStoreTest, StoresWriteTheHotTierInPlace) {
  // New blocks 7 and 8, block 1 already stored, and one of the wrong size.
  const std::vector<std::vector<uint8_t>> payloads = {
      TestPayload(7, kStoreBlock), TestPayload(1, kStoreBlock), TestPayload(8, kStoreBlock),
      TestPayload(9, kStoreBlock / 2)};
  auto results = Store("ns", {7, 1, 8, 9}, payloads, kvstore::Durability::kMemory);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 4u);
  for (size_t i : {0u, 2u}) {
    EXPECT_TRUE((*results)[i].status.ok()) << i << ": " << (*results)[i].status;
    EXPECT_FALSE((*results)[i].already_present) << i;
  }
  EXPECT_TRUE((*results)[1].status.ok()) << (*results)[1].status;
  EXPECT_TRUE((*results)[1].already_present);
  EXPECT_EQ((*results)[3].status.code(), absl::StatusCode::kInvalidArgument)
      << (*results)[3].status;
  EXPECT_EQ(client_->local_stores(), 1u);
  EXPECT_EQ(client_->bulk_stores(), 0u);
  // Only the two new blocks got slots; the others came inline.
  EXPECT_EQ(bulk_->GetStats().local_stores, 1u);
  EXPECT_EQ(bulk_->GetStats().blocks_written_in_place, 2u);
  EXPECT_TRUE(store_->TEST_InHot("ns", TestHash(7)));
  EXPECT_FALSE(store_->TEST_InCold("ns", TestHash(7))) << "durability memory";
  EXPECT_FALSE(store_->TEST_InHot("ns", TestHash(9)));
  Loaded l = Load("ns", {7, 8}, kStoreBlock);
  ASSERT_TRUE(l.results.ok()) << l.results.status();
  EXPECT_EQ((*l.results)[0].miss, LoadMiss::kNone);
  EXPECT_EQ((*l.results)[1].miss, LoadMiss::kNone);
  EXPECT_EQ(l.bufs[0], TestPayload(7, kStoreBlock));
  EXPECT_EQ(l.bufs[1], TestPayload(8, kStoreBlock));

  // The store's default durability (the WAL, and the hot tier too) and
  // blocks of many 256 KiB pieces, each followed by its own frame of
  // checksums: written in place, and on disk.
  auto big =
      Store("big", {101, 102}, {TestPayload(101, kBigStoreBlock), TestPayload(102, kBigStoreBlock)},
            std::nullopt);
  ASSERT_TRUE(big.ok()) << big.status();
  for (const BlockStoreResult& b : *big) EXPECT_TRUE(b.status.ok()) << b.status;
  EXPECT_EQ(bulk_->GetStats().blocks_written_in_place, 4u);
  EXPECT_TRUE(store_->TEST_InHot("big", TestHash(101)));
  EXPECT_TRUE(store_->TEST_InCold("big", TestHash(101)));
  std::vector<uint8_t> read(kBigStoreBlock);
  auto r = store_->ReadInto("big", TestHash(101), read);
  ASSERT_TRUE(r.ok() && r->ok()) << r.status();
  EXPECT_EQ(read, TestPayload(101, kBigStoreBlock));
  EXPECT_EQ(client_->local_stores(), 2u);
}

// The store checks each slot against the writer's checksum: a block written
// wrong is DATA_LOSS and is not kept (its slot goes back), its neighbour is
// kept, and the connection goes on.
TEST_F(LocalStoreTest, ABlockWrittenWrongIsDataLossAndNotKept) {
  std::unique_ptr<rpc::FramedSocket> sock = DialStores();
  ASSERT_NE(sock, nullptr);
  ASSERT_NE(map_, nullptr);
  EXPECT_EQ(map_size_, store_->hot_tier_memory().bytes.size());
  // Round 0 writes block 10 wrong; round 1 sends it again (9, stored, is
  // not offered a slot then: it comes inline).
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(sock->Write(Request({9, 10})).ok());
    v1::BulkStoreSlots slots;
    ASSERT_TRUE(sock->Read(&slots, 1 << 20).ok());
    ASSERT_EQ(slots.status_code(), 0) << slots.status_message();
    ASSERT_EQ(slots.shared_offsets_size(), 2);
    v1::BulkStoreChecksums checksums;
    for (int i = 0; i < 2; ++i) {
      const int64_t offset = slots.shared_offsets(i);
      const std::vector<uint8_t> p = TestPayload(9 + i, kStoreBlock);
      if (round == 1 && i == 0) {
        ASSERT_EQ(offset, -1) << "a stored block gets no slot";
        ASSERT_TRUE(sock->WriteRaw(p).ok());
      } else {
        ASSERT_GE(offset, 0);
        ASSERT_LE(offset + kStoreBlock, map_size_);
        std::memcpy(map_ + offset, p.data(), p.size());
        if (round == 0 && i == 1) map_[offset + 1000] ^= 0x40;  // written wrong
      }
      checksums.add_checksums(kvstore::Crc32c(p));
    }
    // 128 KiB of blocks: their checksums follow the last one, in one frame.
    ASSERT_FALSE(rpc::KvLocalStoreChecksumsDue(kStoreBlock, false));
    ASSERT_TRUE(sock->Write(checksums).ok());
    v1::BulkStoreAnswer answer;
    ASSERT_TRUE(sock->Read(&answer, 1 << 20).ok());
    ASSERT_EQ(answer.status_code(), 0) << answer.status_message();
    ASSERT_EQ(answer.response().blocks_size(), 2);
    const v1::BlockStatus& nine = answer.response().blocks(0);
    const v1::BlockStatus& ten = answer.response().blocks(1);
    if (round == 0) {
      EXPECT_TRUE(nine.ok()) << nine.error();
      EXPECT_FALSE(ten.ok());
      EXPECT_EQ(ten.code(), static_cast<int32_t>(absl::StatusCode::kDataLoss)) << ten.error();
      EXPECT_TRUE(store_->TEST_InHot("ns", TestHash(9)));
      EXPECT_FALSE(store_->TEST_InHot("ns", TestHash(10)));
    } else {
      // Written right this time, on the same connection.
      EXPECT_TRUE(nine.ok() && nine.already_present()) << nine.error();
      EXPECT_TRUE(ten.ok() && !ten.already_present()) << ten.error();
    }
  }
  EXPECT_EQ(bulk_->GetStats().blocks_written_in_place, 3u);
  Loaded l = Load("ns", {10}, kStoreBlock);
  ASSERT_TRUE(l.results.ok()) << l.results.status();
  EXPECT_EQ((*l.results)[0].miss, LoadMiss::kNone);
  EXPECT_EQ(l.bufs[0], TestPayload(10, kStoreBlock));
}

// A connection that ends after its blocks were written but before the
// checksums keeps nothing: no block of the batch is stored, and the store
// stores them afresh later.
TEST_F(LocalStoreTest, ABatchCutOffBeforeItsChecksumsStoresNothing) {
  std::unique_ptr<rpc::FramedSocket> sock = DialStores();
  ASSERT_NE(sock, nullptr);
  ASSERT_NE(map_, nullptr);
  ASSERT_TRUE(sock->Write(Request({11, 12})).ok());
  v1::BulkStoreSlots slots;
  ASSERT_TRUE(sock->Read(&slots, 1 << 20).ok());
  ASSERT_EQ(slots.shared_offsets_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const std::vector<uint8_t> p = TestPayload(11 + i, kStoreBlock);
    std::memcpy(map_ + slots.shared_offsets(i), p.data(), p.size());
  }
  sock.reset();
  EXPECT_TRUE(kvstore::testing::WaitFor([&] { return bulk_->GetStats().connections_open == 0; }));
  EXPECT_FALSE(store_->TEST_InHot("ns", TestHash(11)));
  EXPECT_FALSE(store_->TEST_InHot("ns", TestHash(12)));
  auto results = Store("ns", {11, 12}, {TestPayload(11, kStoreBlock), TestPayload(12, kStoreBlock)},
                       kvstore::Durability::kMemory);
  ASSERT_TRUE(results.ok()) << results.status();
  for (const BlockStoreResult& r : *results) {
    EXPECT_TRUE(r.status.ok() && !r.already_present) << r.status;
  }
}

// A batch over the size limit is refused with the slots frame, before any
// payload, and the connection closes.
TEST_F(LocalStoreTest, AnOversizedBatchIsRefusedBeforeAnyPayload) {
  std::unique_ptr<rpc::FramedSocket> sock = DialStores();
  ASSERT_NE(sock, nullptr);
  v1::BulkStoreRequest req = Request({});
  const uint64_t blocks = rpc::kKvBulkStoreMaxBatchBytes / kStoreBlock + 1;
  for (uint64_t id = 1000; id < 1000 + blocks; ++id) {
    v1::BulkStoreBlock* b = req.add_blocks();
    b->set_block_hash(TestHash(id).ToBytes());
    b->set_size(kStoreBlock);
  }
  ASSERT_TRUE(sock->Write(req).ok());
  v1::BulkStoreSlots slots;
  ASSERT_TRUE(sock->Read(&slots, 1 << 20).ok());
  EXPECT_EQ(slots.status_code(), static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(slots.status_message().find("at most"), std::string::npos) << slots.status_message();
  EXPECT_EQ(slots.shared_offsets_size(), 0);
  v1::BulkStoreAnswer answer;
  EXPECT_FALSE(sock->Read(&answer, 1 << 20).ok()) << "the store closes the connection";
}

// The checksums follow the blocks: a request that does not say so, and a
// frame with a count other than the blocks' since the last frame, are
// refused, and nothing is stored.
TEST_F(LocalStoreTest, TheChecksumsMustFollowTheBlocks) {
  std::unique_ptr<rpc::FramedSocket> sock = DialStores();
  ASSERT_NE(sock, nullptr);
  v1::BulkStoreRequest req = Request({14});
  req.set_checksums_follow(false);
  req.mutable_blocks(0)->set_checksum(kvstore::Crc32c(TestPayload(14, kStoreBlock)));
  ASSERT_TRUE(sock->Write(req).ok());
  v1::BulkStoreSlots slots;
  ASSERT_TRUE(sock->Read(&slots, 1 << 20).ok());
  EXPECT_EQ(slots.status_code(), static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(slots.status_message().find("checksums_follow"), std::string::npos)
      << slots.status_message();

  sock = DialStores();
  ASSERT_NE(sock, nullptr);
  ASSERT_TRUE(sock->Write(Request({14, 15})).ok());
  ASSERT_TRUE(sock->Read(&slots, 1 << 20).ok());
  ASSERT_EQ(slots.shared_offsets_size(), 2);
  v1::BulkStoreChecksums one;  // after both blocks, but only the first's
  for (int i = 0; i < 2; ++i) {
    const std::vector<uint8_t> p = TestPayload(14 + i, kStoreBlock);
    std::memcpy(map_ + slots.shared_offsets(i), p.data(), p.size());
  }
  one.add_checksums(kvstore::Crc32c(TestPayload(14, kStoreBlock)));
  ASSERT_TRUE(sock->Write(one).ok());
  v1::BulkStoreAnswer answer;
  ASSERT_TRUE(sock->Read(&answer, 1 << 20).ok());
  EXPECT_EQ(answer.status_code(), static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(answer.status_message().find("1 checksums after blocks 0-1"), std::string::npos)
      << answer.status_message();
  EXPECT_FALSE(store_->TEST_InHot("ns", TestHash(14)));
  EXPECT_FALSE(store_->TEST_InHot("ns", TestHash(15)));
}

// Without the socket stores take the bulk port.
// As over the bulk port (BulkStoreTest.ABatchTheStoreStallsOn...): a batch
// the store takes on the local socket and stalls on fails after one
// deadline, sent neither again on a new connection, nor over the bulk port,
// nor over gRPC.
TEST_F(LocalStoreTest, ABatchTheStoreStallsOnFailsAfterOneDeadlineAndGoesNowhereElse) {
  auto client = kvconnector::KvStoreClient::Create(
      {.target = target_, .rpc_deadline_ms = 300, .bulk_lookup = false});
  ASSERT_TRUE(client.ok()) << client.status();
  auto store = [&](uint64_t id) {
    const BlockHash hash = TestHash(id, 7);
    const std::vector<uint8_t> payload = TestPayload(id, kStoreBlock, 7);
    const std::span<const uint8_t> src = payload;
    return (*client)->Store("ns", {&hash, 1}, {&src, 1}, kvstore::Durability::kMemory);
  };
  ASSERT_TRUE(store(1).ok());  // pools a connection
  ASSERT_EQ((*client)->local_stores(), 1u);
  stall_.on = true;
  auto stalled = store(2);
  EXPECT_EQ(stalled.status().code(), absl::StatusCode::kDeadlineExceeded) << stalled.status();
  EXPECT_EQ(stall_.stalled, 1) << "the batch was sent again on a new connection or the bulk port";
  EXPECT_EQ(grpc_stores_, 0) << "the batch was sent again over gRPC";
  stall_.on = false;
  stall_.gate.Open();
  auto after = store(3);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE((*after)[0].status.ok()) << (*after)[0].status;
  EXPECT_EQ((*client)->local_stores(), 2u) << "after the stall, stores left the local socket";
  EXPECT_EQ(grpc_stores_, 0);
}

TEST_F(LocalStoreTest, WithoutTheSocketStoresTakeTheBulkPort) {
  ASSERT_EQ(unlink(socket_.c_str()), 0);
  auto results = Store("ns", {13}, {TestPayload(13, kStoreBlock)}, kvstore::Durability::kMemory);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].status.ok()) << (*results)[0].status;
  EXPECT_EQ(client_->local_stores(), 0u);
  EXPECT_EQ(client_->bulk_stores(), 1u);
  EXPECT_EQ(bulk_->GetStats().blocks_written_in_place, 0u);
  EXPECT_TRUE(store_->TEST_InHot("ns", TestHash(13)));
}

}  // namespace
}  // namespace tandem
