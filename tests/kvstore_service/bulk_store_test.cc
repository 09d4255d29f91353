// Stores over the bulk port (services/kvstore/bulk_load_server.h, "Store
// connections"): the KV client's Store over plain TCP against an in-process
// server, the same per-block results as the gRPC Store, nothing stored from
// a batch whose connection breaks, and the fallback to gRPC.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../kvstore/test_util.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "bulk_load_server.h"
#include "bulk_test_store.h"
#include "gtest/gtest.h"
#include "kvstore_service.h"
#include "loopback_server.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem {
namespace {

using kvconnector::BlockStoreResult;
using kvconnector::KvStoreClient;
using kvstore::testing::TempDir;
using kvstore::testing::TestHash;
using kvstore::testing::TestPayload;
using kvstore::testing::WaitFor;

constexpr uint64_t kBlock = testutil::kBulkBlock;
constexpr uint64_t kBigBlock = testutil::kBulkBigBlock;  // many socket reads per block

class BulkStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = testutil::OpenBulkTestStore(
        dir_.path(), {{"ns", kBlock}, {"grpc", kBlock}, {"big", kBigBlock}});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    clients_.clear();
    if (server_) server_->Shutdown();
    if (bulk_) bulk_->Shutdown();
  }
  // `before_grpc_store` runs at the start of each gRPC Store.
  void Start(bool with_bulk = true, kvstore_service::BulkLoadServerOptions bulk_options = {},
             std::function<void()> before_grpc_store = {}) {
    if (with_bulk) {
      auto bulk = kvstore_service::BulkLoadServer::Start(store_.get(), std::move(bulk_options));
      ASSERT_TRUE(bulk.ok()) << bulk.status();
      bulk_ = std::move(*bulk);
    }
    service_ = std::make_unique<kvstore_service::KvStoreServiceImpl>(
        store_.get(),
        kvstore_service::KvStoreServiceOptions{.bulk_load = bulk_.get(),
                                               .debug_before_store = std::move(before_grpc_store)});
    testutil::LoopbackServer s = testutil::StartOnLoopback(service_.get());
    ASSERT_NE(s.server, nullptr);
    server_ = std::move(s.server);
    target_ = s.target;
  }
  // bulk: stores over the bulk port; otherwise over gRPC only.
  KvStoreClient* Client(bool bulk, int64_t rpc_deadline_ms = 30'000) {
    auto client = KvStoreClient::Create({.target = target_,
                                         .rpc_deadline_ms = rpc_deadline_ms,
                                         .bulk_load = false,
                                         .bulk_lookup = false,
                                         .bulk_store = bulk});
    EXPECT_TRUE(client.ok()) << client.status();
    clients_.push_back(std::move(*client));
    return clients_.back().get();
  }

  TempDir dir_;
  std::unique_ptr<kvstore::KvStoreEngine> store_;
  std::unique_ptr<kvstore_service::BulkLoadServer> bulk_;
  std::unique_ptr<kvstore_service::KvStoreServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::vector<std::unique_ptr<KvStoreClient>> clients_;
};

struct Batch {
  std::vector<BlockHash> hashes;
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<std::span<const uint8_t>> src() const { return {payloads.begin(), payloads.end()}; }
  void Add(uint64_t id, std::vector<uint8_t> p) {
    hashes.push_back(TestHash(id));
    payloads.push_back(std::move(p));
  }
};

std::string Describe(const absl::StatusOr<std::vector<BlockStoreResult>>& r) {
  if (!r.ok()) return absl::StatusCodeToString(r.status().code());
  std::string out;
  for (const BlockStoreResult& b : *r) {
    out += b.status.ok() ? (b.already_present ? "present " : "new ")
                         : absl::StatusCodeToString(b.status.code()) + " ";
  }
  return out;
}

// A store batch the store takes and stalls on fails after one deadline, sent
// neither again on a new connection nor over gRPC (BulkLoadTest's rule for
// loads): the worker's sender thread moves on to the next batch.
TEST_F(BulkStoreTest, ABatchTheStoreStallsOnFailsAfterOneDeadlineAndIsNotSentAgain) {
  testutil::StallSwitch stall;
  std::atomic<int> grpc_stores{0};
  Start(true, {.debug_before_store = stall.Hook()}, [&] { ++grpc_stores; });
  KvStoreClient* client = Client(true, /*rpc_deadline_ms=*/300);
  Batch first, second;
  first.Add(1, TestPayload(1, kBlock));
  second.Add(2, TestPayload(2, kBlock));
  ASSERT_EQ(Describe(client->Store("ns", first.hashes, first.src())), "new ");  // pools
  stall.on = true;
  auto stalled_store = client->Store("ns", second.hashes, second.src());
  EXPECT_EQ(stalled_store.status().code(), absl::StatusCode::kDeadlineExceeded)
      << Describe(stalled_store);
  EXPECT_EQ(stall.stalled, 1) << "the batch was sent again on a new connection";
  EXPECT_EQ(grpc_stores, 0) << "the batch was sent again over gRPC";
  stall.on = false;
  stall.gate.Open();
  Batch third;
  third.Add(3, TestPayload(3, kBlock));
  EXPECT_EQ(Describe(client->Store("ns", third.hashes, third.src())), "new ");
  EXPECT_EQ(client->bulk_stores(), 2u) << "after the stall, stores went over gRPC";
  EXPECT_EQ(grpc_stores, 0);
}

TEST_F(BulkStoreTest, BytesStoredOverTheBulkPortLoadByteForByteOverGrpc) {
  Start();
  KvStoreClient* bulk = Client(true);
  Batch small, big;
  for (uint64_t id = 0; id < 8; ++id) small.Add(id, TestPayload(id, kBlock));
  for (uint64_t id = 100; id < 103; ++id) big.Add(id, TestPayload(id, kBigBlock));
  ASSERT_EQ(Describe(bulk->Store("ns", small.hashes, small.src())),
            "new new new new new new new new ");
  ASSERT_EQ(Describe(bulk->Store("big", big.hashes, big.src())), "new new new ");
  EXPECT_EQ(bulk->bulk_stores(), 2u);
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok());
  KvStoreClient* grpc = Client(false);
  for (const auto& [ns, batch, size] :
       {std::tuple{"ns", &small, kBlock}, std::tuple{"big", &big, kBigBlock}}) {
    std::vector<std::vector<uint8_t>> bufs(batch->hashes.size(), std::vector<uint8_t>(size, 0xEE));
    std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
    auto r = grpc->Load(ns, batch->hashes, dst);
    ASSERT_TRUE(r.ok()) << r.status();
    for (size_t i = 0; i < bufs.size(); ++i) {
      ASSERT_TRUE((*r)[i].ok()) << ns << " " << i;
      EXPECT_EQ(bufs[i], batch->payloads[i]) << ns << " " << i;
    }
  }
  EXPECT_EQ(grpc->bulk_loads(), 0u);
}

// One batch of every kind of block, over the bulk port into "ns" and over
// gRPC into "grpc", each holding blocks 1 and 2 before.
TEST_F(BulkStoreTest, PerBlockResultsEqualTheGrpcStores) {
  Start();
  KvStoreClient* bulk = Client(true);
  KvStoreClient* grpc = Client(false);
  for (const char* ns : {"ns", "grpc"}) {
    for (uint64_t id : {1, 2}) {
      auto p = TestPayload(id, kBlock);
      ASSERT_TRUE(store_->Store(ns, TestHash(id), p, kvstore::Crc32c(p)).ok());
    }
  }
  Batch m;
  m.Add(10, TestPayload(10, kBlock));      // new
  m.Add(1, TestPayload(1, kBlock));        // already present
  m.Add(2, TestPayload(2, kBlock, 7));     // present with other bytes: first write wins
  m.Add(11, TestPayload(11, kBlock / 2));  // wrong size
  m.Add(12, TestPayload(12, kBlock));      // new
  m.Add(12, TestPayload(12, kBlock));      // the same again
  const auto want = grpc->Store("grpc", m.hashes, m.src());
  EXPECT_EQ(Describe(want), "new present present INVALID_ARGUMENT new present ");
  const auto got = bulk->Store("ns", m.hashes, m.src());
  EXPECT_EQ(Describe(got), Describe(want));
  EXPECT_EQ(bulk->bulk_stores(), 1u);
  ASSERT_TRUE(got.ok() && want.ok());
  // The same words, but for the namespace's name.
  EXPECT_EQ((*got)[3].status.message(),
            absl::StrReplaceAll((*want)[3].status.message(), {{"'grpc'", "'ns'"}}));
  // The first write's bytes are kept.
  std::vector<uint8_t> out(kBlock);
  auto r = store_->ReadInto("ns", TestHash(2), out);
  ASSERT_TRUE(r.ok() && r->ok());
  EXPECT_EQ(out, TestPayload(2, kBlock));
  EXPECT_EQ(store_->GetStats().stores_mismatched, 2u);
  // Unknown namespace: the whole call fails NOT_FOUND on both.
  EXPECT_EQ(Describe(bulk->Store("nope", m.hashes, m.src())), "NOT_FOUND");
  EXPECT_EQ(Describe(grpc->Store("nope", m.hashes, m.src())), "NOT_FOUND");
  EXPECT_TRUE(store_->TEST_CheckColdTier().ok());
}

// Durability memory crosses both wires: the blocks land in the hot tier
// only, and a later durable store of them is refused in the same words.
TEST_F(BulkStoreTest, MemoryStoresLandInTheHotTierOnlyOverBothPaths) {
  Start();
  KvStoreClient* bulk = Client(true);
  KvStoreClient* grpc = Client(false);
  Batch m;
  for (uint64_t id = 20; id < 23; ++id) m.Add(id, TestPayload(id, kBlock));
  for (const auto& [ns, client] : {std::pair{"ns", bulk}, std::pair{"grpc", grpc}}) {
    ASSERT_EQ(Describe(client->Store(ns, m.hashes, m.src(), kvstore::Durability::kMemory)),
              "new new new ")
        << ns;
    for (const BlockHash& h : m.hashes) {
      EXPECT_TRUE(store_->TEST_InHot(ns, h)) << ns;
      EXPECT_FALSE(store_->TEST_InCold(ns, h)) << ns;
    }
  }
  EXPECT_EQ(bulk->bulk_stores(), 1u);
  EXPECT_EQ(store_->GetStats().cold_blocks, 0u);
  const auto want = grpc->Store("grpc", m.hashes, m.src(), kvstore::Durability::kWal);
  EXPECT_EQ(Describe(want), "FAILED_PRECONDITION FAILED_PRECONDITION FAILED_PRECONDITION ");
  const auto got = bulk->Store("ns", m.hashes, m.src(), kvstore::Durability::kWal);
  EXPECT_EQ(Describe(got), Describe(want));
  ASSERT_TRUE(got.ok() && want.ok());
  EXPECT_EQ((*got)[0].status.message(), (*want)[0].status.message());
  EXPECT_NE((*got)[0].status.message().find("held in memory only"), std::string::npos);
}

std::unique_ptr<rpc::FramedSocket> StoreConnection(int port) {
  auto sock = rpc::FramedSocket::Connect("127.0.0.1", std::to_string(port), 5000);
  EXPECT_TRUE(sock.ok()) << sock.status();
  if (!sock.ok()) return nullptr;
  const auto& preface = rpc::kKvBulkStorePreface;
  EXPECT_TRUE((*sock)->WriteRaw({reinterpret_cast<const uint8_t*>(preface.data()), 8}).ok());
  return std::move(*sock);
}

// The client computes every checksum itself, so a bad one is sent raw: in
// the request's blocks, or after the payload (checksums_follow, as the
// client sends them).
TEST_F(BulkStoreTest, ABadChecksumFailsOnlyItsBlockWithDataLoss) {
  Start();
  for (bool follow : {false, true}) {
    SCOPED_TRACE(follow ? "checksums after the payload" : "checksums in the request");
    std::unique_ptr<rpc::FramedSocket> sock = StoreConnection(bulk_->port());
    ASSERT_NE(sock, nullptr);
    const uint64_t first = follow ? 60 : 20;
    v1::BulkStoreRequest req;
    req.set_namespace_("ns");
    req.set_checksums_follow(follow);
    v1::BulkStoreChecksums checksums;
    std::vector<uint8_t> payload;
    for (uint64_t id = first; id < first + 3; ++id) {
      const std::vector<uint8_t> p = TestPayload(id, kBlock);
      v1::BulkStoreBlock* b = req.add_blocks();
      b->set_block_hash(TestHash(id).ToBytes());
      b->set_size(p.size());
      const uint32_t crc = kvstore::Crc32c(p) ^ (id == first + 1 ? 1 : 0);
      if (follow) {
        checksums.add_checksums(crc);
      } else {
        b->set_checksum(crc);
      }
      payload.insert(payload.end(), p.begin(), p.end());
    }
    req.mutable_blocks(2)->set_block_hash(std::string(31, 'x'));  // not 32 bytes
    ASSERT_TRUE(sock->Write(req, payload).ok());
    if (follow) {
      ASSERT_TRUE(sock->Write(checksums).ok());
    }
    v1::BulkStoreAnswer answer;
    ASSERT_TRUE(sock->Read(&answer, 1 << 20).ok());
    ASSERT_EQ(answer.status_code(), 0) << answer.status_message();
    ASSERT_EQ(answer.response().blocks_size(), 3);
    EXPECT_TRUE(answer.response().blocks(0).ok());
    EXPECT_EQ(answer.response().blocks(1).code(), static_cast<int>(absl::StatusCode::kDataLoss));
    EXPECT_EQ(answer.response().blocks(2).code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(store_->TEST_InCold("ns", TestHash(first)));
    EXPECT_FALSE(store_->TEST_InCold("ns", TestHash(first + 1)));
  }
}

// Checksums after the payload must be one per block: another count loses
// the framing, so the batch is refused, nothing stored, the connection closed.
TEST_F(BulkStoreTest, ChecksumsAfterThePayloadMustBeOnePerBlock) {
  Start();
  for (int count : {1, 3}) {
    std::unique_ptr<rpc::FramedSocket> sock = StoreConnection(bulk_->port());
    ASSERT_NE(sock, nullptr);
    v1::BulkStoreRequest req;
    req.set_namespace_("ns");
    req.set_checksums_follow(true);
    v1::BulkStoreChecksums checksums;
    std::vector<uint8_t> payload;
    for (uint64_t id : {70, 71}) {
      const std::vector<uint8_t> p = TestPayload(id, kBlock);
      v1::BulkStoreBlock* b = req.add_blocks();
      b->set_block_hash(TestHash(id).ToBytes());
      b->set_size(p.size());
      payload.insert(payload.end(), p.begin(), p.end());
    }
    for (int i = 0; i < count; ++i) checksums.add_checksums(kvstore::Crc32c(TestPayload(70, kBlock)));
    ASSERT_TRUE(sock->Write(req, payload).ok());
    ASSERT_TRUE(sock->Write(checksums).ok());
    v1::BulkStoreAnswer answer;
    ASSERT_TRUE(sock->Read(&answer, 1 << 20).ok());
    EXPECT_EQ(answer.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(answer.status_message().find(absl::StrCat(count, " checksums after a batch of 2")),
              std::string::npos)
        << answer.status_message();
    EXPECT_FALSE(sock->Read(&answer, 1 << 20).ok());  // closed
  }
  EXPECT_EQ(store_->GetStats().stores, 0u);
  EXPECT_FALSE(store_->TEST_InCold("ns", TestHash(70)));
}

TEST_F(BulkStoreTest, AConnectionThatBreaksMidPayloadStoresNothing) {
  Start();
  std::unique_ptr<rpc::FramedSocket> sock = StoreConnection(bulk_->port());
  ASSERT_NE(sock, nullptr);
  v1::BulkStoreRequest req;
  req.set_namespace_("ns");
  std::vector<uint8_t> payload;
  for (uint64_t id : {30, 31}) {
    const std::vector<uint8_t> p = TestPayload(id, kBlock);
    v1::BulkStoreBlock* b = req.add_blocks();
    b->set_block_hash(TestHash(id).ToBytes());
    b->set_size(p.size());
    b->set_checksum(kvstore::Crc32c(p));
    payload.insert(payload.end(), p.begin(), p.end());
  }
  // The whole first block, half of the second, then the connection closes.
  ASSERT_TRUE(sock->Write(req, std::span(payload).first(kBlock + kBlock / 2)).ok());
  ASSERT_TRUE(WaitFor([&] { return bulk_->GetStats().connections_accepted == 1; }));
  sock.reset();
  ASSERT_TRUE(WaitFor([&] { return bulk_->GetStats().connections_open == 0; }));
  EXPECT_FALSE(store_->TEST_InCold("ns", TestHash(30)));
  EXPECT_FALSE(store_->TEST_InCold("ns", TestHash(31)));
  EXPECT_EQ(store_->GetStats().stores, 0u);
}

TEST_F(BulkStoreTest, FallsBackToGrpcWhenThePortIsOffOrGone) {
  Start(/*with_bulk=*/false);
  KvStoreClient* client = Client(true);
  Batch b;
  b.Add(40, TestPayload(40, kBlock));
  EXPECT_EQ(Describe(client->Store("ns", b.hashes, b.src())), "new ");
  EXPECT_EQ(client->bulk_stores(), 0u);
  EXPECT_TRUE(store_->TEST_InCold("ns", TestHash(40)));
}

TEST_F(BulkStoreTest, FallsBackToGrpcWhenTheAdvertisedPortStopsServing) {
  Start();
  KvStoreClient* client = Client(true);
  Batch first, second;
  first.Add(50, TestPayload(50, kBlock));
  second.Add(51, TestPayload(51, kBlock));
  EXPECT_EQ(Describe(client->Store("ns", first.hashes, first.src())), "new ");
  EXPECT_EQ(client->bulk_stores(), 1u);
  bulk_->Shutdown();
  EXPECT_EQ(Describe(client->Store("ns", second.hashes, second.src())), "new ");
  EXPECT_EQ(client->bulk_stores(), 1u);
  EXPECT_TRUE(store_->TEST_InCold("ns", TestHash(51)));
}

}  // namespace
}  // namespace tandem
