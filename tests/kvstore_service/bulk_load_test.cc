// The bulk load port (services/kvstore/bulk_load_server.h): the KV client's
// Load over plain TCP against an in-process server, its fallback to the
// gRPC stream, and bad input sent with a raw FramedSocket (DESIGN §9).
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../kvstore/test_util.h"
#include "bulk_load_server.h"
#include "bulk_test_store.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
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

using kvconnector::KvStoreClient;
using kvconnector::LoadMiss;
using kvstore::testing::TempDir;
using kvstore::testing::TestHash;
using kvstore::testing::TestPayload;
using kvstore::testing::WaitFor;
using ::testing::HasSubstr;

constexpr uint64_t kBlock = testutil::kBulkBlock;
constexpr uint64_t kBigBlock = testutil::kBulkBigBlock;  // many socket reads per block

std::span<const uint8_t> Preface() {
  return {reinterpret_cast<const uint8_t*>(rpc::kKvBulkLoadPreface.data()),
          rpc::kKvBulkLoadPreface.size()};
}

class BulkLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = testutil::OpenBulkTestStore(dir_.path(), {{"ns", kBlock}, {"big", kBigBlock}});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    clients_.clear();
    if (server_) server_->Shutdown();
    if (bulk_) bulk_->Shutdown();
  }

  // Starts the bulk load port (unless `with_bulk` is false) and the gRPC
  // service advertising it, on `grpc_port` (0: a free one).
  // `before_grpc_load` runs at the start of each gRPC Load.
  void Start(bool with_bulk = true, kvstore_service::BulkLoadServerOptions bulk_options = {},
             int grpc_port = 0, std::function<void()> before_grpc_load = {}) {
    if (with_bulk) {
      auto bulk = kvstore_service::BulkLoadServer::Start(store_.get(), bulk_options);
      ASSERT_TRUE(bulk.ok()) << bulk.status();
      bulk_ = std::move(*bulk);
    }
    service_ = std::make_unique<kvstore_service::KvStoreServiceImpl>(
        store_.get(),
        kvstore_service::KvStoreServiceOptions{.bulk_load = bulk_.get(),
                                               .debug_before_load = std::move(before_grpc_load)});
    testutil::LoopbackServer s = testutil::StartOnLoopback(service_.get(), grpc_port);
    ASSERT_NE(s.server, nullptr);
    server_ = std::move(s.server);
    target_ = s.target;
  }

  // Clients for the load tests open no lookup connection (so the server's
  // connection counts are the loads'); the lookup tests ask for one.
  // Lookups get 10 s (a slow, e.g. sanitized, build must not make them late)
  // unless a test asks for less per lookup.
  KvStoreClient* Client(kvconnector::KvStoreClientOptions o = {.bulk_lookup = false}) {
    o.target = target_;
    o.lookup_deadline_ms = 10'000;
    auto client = KvStoreClient::Create(o);
    EXPECT_TRUE(client.ok()) << client.status();
    clients_.push_back(std::move(*client));
    return clients_.back().get();
  }

  // A client that looks up over the bulk port, once its lookup connection
  // is up; null if it never comes up.
  KvStoreClient* LookupClient() {
    KvStoreClient* c = Client(kvconnector::KvStoreClientOptions{});
    return WaitFor([&] { return c->bulk_lookup_connected(); }) ? c : nullptr;
  }

  void Put(const std::string& ns, uint64_t id, uint64_t size) {
    ASSERT_TRUE(testutil::PutTestBlock(store_.get(), ns, id, size).ok());
  }

  // Loads `ids` of `size` bytes; buffers start filled with 0xEE.
  struct Loaded {
    absl::StatusOr<std::vector<kvconnector::BlockLoadResult>> results;
    std::vector<std::vector<uint8_t>> bufs;
  };
  Loaded Load(KvStoreClient* client, const std::string& ns, const std::vector<uint64_t>& ids,
              uint64_t size, LeaseId lease = LeaseId(0)) {
    Loaded out;
    std::vector<BlockHash> hashes;
    for (uint64_t id : ids) hashes.push_back(TestHash(id));
    out.bufs.assign(ids.size(), std::vector<uint8_t>(size, 0xEE));
    std::vector<std::span<uint8_t>> dst(out.bufs.begin(), out.bufs.end());
    out.results = client->Load(ns, hashes, dst, lease);
    return out;
  }

  // A raw connection to the bulk load port.
  std::unique_ptr<rpc::FramedSocket> Raw() {
    auto sock = rpc::FramedSocket::Connect("127.0.0.1", std::to_string(bulk_->port()), 5'000);
    EXPECT_TRUE(sock.ok()) << sock.status();
    return std::move(*sock);
  }

  TempDir dir_;
  std::unique_ptr<kvstore::KvStoreEngine> store_;
  std::unique_ptr<kvstore_service::BulkLoadServer> bulk_;
  std::unique_ptr<kvstore_service::KvStoreServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::vector<std::unique_ptr<KvStoreClient>> clients_;
};

TEST_F(BulkLoadTest, LoadGoesOverTheBulkPortAndAnswersAsTheGrpcStream) {
  Start();
  for (uint64_t id : {1, 2, 3}) Put("ns", id, kBlock);
  KvStoreClient* bulk = Client();
  KvStoreClient* grpc = Client({.bulk_load = false, .bulk_lookup = false});
  const std::vector<uint64_t> ids = {1, 2, 99, 3};  // 99 was never stored
  Loaded a = Load(bulk, "ns", ids, kBlock);
  Loaded b = Load(grpc, "ns", ids, kBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  ASSERT_TRUE(b.results.ok()) << b.results.status();
  for (size_t i = 0; i < ids.size(); ++i) {
    const LoadMiss want = ids[i] == 99 ? LoadMiss::kNotFound : LoadMiss::kNone;
    EXPECT_EQ((*a.results)[i].miss, want) << i;
    EXPECT_EQ((*b.results)[i].miss, want) << i;
    if (want == LoadMiss::kNone) {
      EXPECT_EQ(a.bufs[i], TestPayload(ids[i], kBlock)) << i;
    }
    EXPECT_EQ(a.bufs[i], b.bufs[i]) << i;
  }
  EXPECT_EQ(bulk->bulk_loads(), 1u);
  EXPECT_EQ(grpc->bulk_loads(), 0u);
  const auto stats = bulk_->GetStats();
  EXPECT_EQ(stats.loads, 1u);
  EXPECT_EQ(stats.blocks_sent, 3u);
  EXPECT_EQ(stats.bytes_sent, 3 * kBlock);
}

TEST_F(BulkLoadTest, BlocksLargerThanTheSocketBuffersArriveWhole) {
  Start();
  for (uint64_t id : {1, 2, 3}) Put("big", id, kBigBlock);
  KvStoreClient* client = Client();
  Loaded a = Load(client, "big", {3, 1, 2}, kBigBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE((*a.results)[i].ok()) << i;
  EXPECT_EQ(a.bufs[0], TestPayload(3, kBigBlock));
  EXPECT_EQ(a.bufs[1], TestPayload(1, kBigBlock));
  EXPECT_EQ(a.bufs[2], TestPayload(2, kBigBlock));
  EXPECT_EQ(client->bulk_loads(), 1u);
}

// Over the bulk port the reader verifies: a flipped byte (in either tier) is
// a checksum miss, the load hands out none of the block's bytes, and the
// store, told by the client, checks the block and drops it.
class BulkLoadCorruptTest : public BulkLoadTest, public ::testing::WithParamInterface<bool> {};

TEST_P(BulkLoadCorruptTest,
       AFlippedByteIsAChecksumMissItsBytesAreNotHandedOutAndTheBlockIsDropped) {
  const bool in_hot = GetParam();
  if (!in_hot) {
    // Cold only: a store whose hot tier holds no block of this size.
    store_.reset();
    auto store = kvstore::KvStoreEngine::Open(
        {.data_dir = dir_.path(), .hot_capacity_bytes = 0, .lock_hot_memory = false});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  Start();
  for (uint64_t id : {1, 2, 3}) Put("ns", id, kBlock);
  ASSERT_EQ(store_->TEST_InHot("ns", TestHash(2)), in_hot);
  ASSERT_TRUE((in_hot ? store_->TEST_CorruptHot("ns", TestHash(2), 100)
                      : store_->TEST_CorruptCold("ns", TestHash(2), 100))
                  .ok());
  KvStoreClient* client = Client();
  Loaded a = Load(client, "ns", {1, 2, 3}, kBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  EXPECT_TRUE((*a.results)[0].ok());
  EXPECT_EQ((*a.results)[1].miss, LoadMiss::kChecksum);
  EXPECT_TRUE((*a.results)[2].ok());
  EXPECT_EQ(a.bufs[0], TestPayload(1, kBlock));
  EXPECT_EQ(a.bufs[1], std::vector<uint8_t>(kBlock, 0)) << "bytes of a corrupt block handed out";
  EXPECT_EQ(a.bufs[2], TestPayload(3, kBlock));
  EXPECT_EQ(client->bulk_loads(), 1u);
  // The client's report reached the store before Load returned.
  const kvstore::KvStoreStats stats = store_->GetStats();
  EXPECT_EQ(stats.corrupt_reports, 1u);
  EXPECT_EQ(stats.checksum_failures, 1u);
  EXPECT_FALSE(store_->TEST_InHot("ns", TestHash(2)));
  EXPECT_FALSE(store_->TEST_InCold("ns", TestHash(2)));
  EXPECT_TRUE(store_->TEST_InCold("ns", TestHash(1)));
  // The next load of it is an honest miss.
  Loaded again = Load(client, "ns", {2}, kBlock);
  ASSERT_TRUE(again.results.ok()) << again.results.status();
  EXPECT_EQ((*again.results)[0].miss, LoadMiss::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Tiers, BulkLoadCorruptTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Hot" : "Cold"; });

TEST_F(BulkLoadTest, AReportOfAnIntactBlockIsCheckedAndTheBlockKept) {
  Start();
  Put("ns", 1, kBlock);
  auto sock = Raw();
  ASSERT_TRUE(sock->WriteRaw(Preface()).ok());
  v1::LoadRequest report;
  report.set_namespace_("ns");
  rpc::AppendBlockHashes(std::vector<BlockHash>{TestHash(1), TestHash(9)},
                         report.mutable_corrupt_block_hashes());
  ASSERT_TRUE(sock->Write(report).ok());
  v1::BulkLoadFrame frame;
  ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  EXPECT_TRUE(frame.done());
  EXPECT_EQ(frame.status_code(), 0) << frame.status_message();
  EXPECT_EQ(store_->GetStats().corrupt_reports, 2u);
  EXPECT_EQ(store_->GetStats().checksum_failures, 0u);
  EXPECT_TRUE(store_->TEST_InCold("ns", TestHash(1)));
  Loaded a = Load(Client(), "ns", {1}, kBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  EXPECT_EQ(a.bufs[0], TestPayload(1, kBlock));
  // A malformed report is refused as a whole, naming the field.
  report.add_corrupt_block_hashes("short");
  ASSERT_TRUE(sock->Write(report).ok());
  ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  EXPECT_TRUE(frame.done());
  EXPECT_EQ(frame.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(frame.status_message(), HasSubstr("corrupt_block_hashes[2]"));
  EXPECT_EQ(store_->GetStats().corrupt_reports, 2u);
}

TEST_F(BulkLoadTest, UnknownNamespaceIsNotFoundAndTheConnectionServesTheNextLoad) {
  Start();
  Put("ns", 1, kBlock);
  KvStoreClient* client = Client();
  Loaded bad = Load(client, "nope", {1}, kBlock);
  ASSERT_FALSE(bad.results.ok());
  EXPECT_EQ(bad.results.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bad.results.status().message(), HasSubstr("nope"));
  Loaded good = Load(client, "ns", {1}, kBlock);
  ASSERT_TRUE(good.results.ok()) << good.results.status();
  EXPECT_TRUE((*good.results)[0].ok());
  EXPECT_EQ(client->bulk_loads(), 2u);
  EXPECT_EQ(bulk_->GetStats().connections_accepted, 1u);  // the pooled connection
}

TEST_F(BulkLoadTest, TheLoadReleasesItsLease) {
  Start();
  for (uint64_t id : {1, 2}) Put("ns", id, kBlock);
  KvStoreClient* client = Client();
  std::vector<BlockHash> hashes{TestHash(1), TestHash(2)};
  kvconnector::RemoteLookupResult r = client->Lookup("ns", hashes, {.take_lease = true})->Wait();
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_NE(r.lease.value(), 0u);
  EXPECT_EQ(store_->GetStats().active_leases, 1u);
  Loaded a = Load(client, "ns", {1, 2}, kBlock, r.lease);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  EXPECT_EQ(client->bulk_loads(), 1u);
  EXPECT_EQ(store_->GetStats().active_leases, 0u);
}

TEST_F(BulkLoadTest, UsesGrpcWhenTheStoreHasNoBulkPort) {
  Start(/*with_bulk=*/false);
  Put("ns", 1, kBlock);
  KvStoreClient* client = Client();
  Loaded a = Load(client, "ns", {1}, kBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  EXPECT_TRUE((*a.results)[0].ok());
  EXPECT_EQ(a.bufs[0], TestPayload(1, kBlock));
  EXPECT_EQ(client->bulk_loads(), 0u);
}

TEST_F(BulkLoadTest, UsesGrpcWhenTheBulkPortCannotBeReached) {
  Start();
  Put("ns", 1, kBlock);
  // A port nothing listens on (bound, then closed).
  int unused_port = 0;
  {
    auto probe = kvstore_service::BulkLoadServer::Start(store_.get(), {});
    ASSERT_TRUE(probe.ok());
    unused_port = (*probe)->port();
  }
  KvStoreClient* client = Client(
      {.bulk_lookup = false, .bulk_load_target = "127.0.0.1:" + std::to_string(unused_port)});
  Loaded a = Load(client, "ns", {1}, kBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  EXPECT_TRUE((*a.results)[0].ok());
  EXPECT_EQ(a.bufs[0], TestPayload(1, kBlock));
  EXPECT_EQ(client->bulk_loads(), 0u);
  EXPECT_EQ(bulk_->GetStats().loads, 0u);
}

TEST_F(BulkLoadTest, AfterTheServerClosesAnIdleConnectionTheNextLoadReconnects) {
  Start(true, {.idle_timeout_ms = 50});
  Put("ns", 1, kBlock);
  KvStoreClient* client = Client();
  ASSERT_TRUE(Load(client, "ns", {1}, kBlock).results.ok());
  ASSERT_TRUE(WaitFor([&] { return bulk_->GetStats().connections_open == 0; }));
  Loaded a = Load(client, "ns", {1}, kBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  EXPECT_TRUE((*a.results)[0].ok());
  EXPECT_EQ(client->bulk_loads(), 2u);  // both over the port, the second on a new connection
  EXPECT_EQ(bulk_->GetStats().connections_accepted, 2u);
}

TEST_F(BulkLoadTest, AfterTheStoreRestartsOnANewBulkPortTheNextLoadUsesIt) {
  Start();
  Put("ns", 1, kBlock);
  KvStoreClient* client = Client();
  ASSERT_TRUE(Load(client, "ns", {1}, kBlock).results.ok());
  ASSERT_EQ(client->bulk_loads(), 1u);
  // Restart on the same gRPC address; the new bulk port is another one.
  const int grpc_port = std::stoi(target_.substr(target_.rfind(':') + 1));
  const int old_bulk_port = bulk_->port();
  server_->Shutdown();
  server_.reset();  // before Start() replaces the service it serves
  bulk_->Shutdown();
  Start(true, {}, grpc_port);
  ASSERT_NE(server_, nullptr);
  if (bulk_->port() == old_bulk_port) GTEST_SKIP() << "the kernel gave the same port again";
  Loaded a = Load(client, "ns", {1}, kBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  EXPECT_EQ(a.bufs[0], TestPayload(1, kBlock));
  EXPECT_EQ(client->bulk_loads(), 2u) << "the load after the restart went over gRPC";
}

TEST_F(BulkLoadTest, AfterTheBulkPortShutsDownLoadsGoOverGrpc) {
  Start();
  Put("ns", 1, kBlock);
  KvStoreClient* client = Client();
  ASSERT_TRUE(Load(client, "ns", {1}, kBlock).results.ok());
  bulk_->Shutdown();
  Loaded a = Load(client, "ns", {1}, kBlock);
  ASSERT_TRUE(a.results.ok()) << a.results.status();
  EXPECT_TRUE((*a.results)[0].ok());
  EXPECT_EQ(a.bufs[0], TestPayload(1, kBlock));
  EXPECT_EQ(client->bulk_loads(), 1u);
}

// A store that takes a load and stalls costs the load one deadline: the
// load fails (the worker recomputes), and is sent neither again on a new
// connection nor over gRPC, each of which would wait out another deadline.
// The port is not written off: once the store answers again, loads use it.
TEST_F(BulkLoadTest, ALoadTheStoreStallsOnFailsAfterOneDeadlineAndIsNotSentAgain) {
  testutil::StallSwitch stall;  // the stalled loads wait at its gate until the end
  std::atomic<int> grpc_loads{0};
  Start(true, {.debug_before_load = stall.Hook()}, 0, [&] { ++grpc_loads; });
  Put("ns", 1, kBlock);
  KvStoreClient* client = Client({.rpc_deadline_ms = 300, .bulk_lookup = false});
  ASSERT_TRUE(Load(client, "ns", {1}, kBlock).results.ok());  // pools a connection
  stall.on = true;
  Loaded a = Load(client, "ns", {1}, kBlock);
  EXPECT_EQ(a.results.status().code(), absl::StatusCode::kDeadlineExceeded) << a.results.status();
  EXPECT_THAT(a.results.status().message(), HasSubstr("did not answer"));
  EXPECT_EQ(stall.stalled, 1) << "the load was sent again on a new connection";
  EXPECT_EQ(grpc_loads, 0) << "the load was sent again over gRPC";
  stall.on = false;
  stall.gate.Open();
  Loaded b = Load(client, "ns", {1}, kBlock);
  ASSERT_TRUE(b.results.ok()) << b.results.status();
  EXPECT_TRUE((*b.results)[0].ok());
  EXPECT_EQ(b.bufs[0], TestPayload(1, kBlock));
  EXPECT_EQ(client->bulk_loads(), 2u) << "after the stall, loads went over gRPC";
  EXPECT_EQ(grpc_loads, 0);
}

TEST_F(BulkLoadTest, ConcurrentLoadsThroughOneClientEachGetTheirBlocks) {
  Start();
  for (uint64_t id = 0; id < 16; ++id) Put("ns", id, kBlock);
  KvStoreClient* client = Client();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        std::vector<uint64_t> ids;
        for (int k = 0; k < 4; ++k) ids.push_back((t * 4 + k + round) % 16);
        Loaded a = Load(client, "ns", ids, kBlock);
        if (!a.results.ok()) {
          ++wrong;
          continue;
        }
        for (size_t k = 0; k < ids.size(); ++k) {
          if (!(*a.results)[k].ok() || a.bufs[k] != TestPayload(ids[k], kBlock)) ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(client->bulk_loads(), 80u);
  EXPECT_LE(bulk_->GetStats().connections_accepted, 4u);  // pooled, one per thread at most
}

// ---- bad input on the raw port ---------------------------------------------------------

TEST_F(BulkLoadTest, AConnectionWithoutThePrefaceIsClosedAndOthersAreServed) {
  Start();
  Put("ns", 1, kBlock);
  auto sock = Raw();
  const std::string http2 = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  ASSERT_TRUE(sock->WriteRaw({reinterpret_cast<const uint8_t*>(http2.data()), http2.size()}).ok());
  v1::BulkLoadFrame frame;
  absl::Status s = sock->Read(&frame, 1 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;  // closed, nothing answered
  EXPECT_EQ(sock->bytes_received(), 0u);
  EXPECT_EQ(bulk_->GetStats().bad_prefaces, 1u);
  KvStoreClient* client = Client();
  Loaded a = Load(client, "ns", {1}, kBlock);
  ASSERT_TRUE(a.results.ok());
  EXPECT_TRUE((*a.results)[0].ok());
  EXPECT_EQ(client->bulk_loads(), 1u);
}

TEST_F(BulkLoadTest, AFrameThatIsNotALoadRequestGetsInvalidArgumentAndTheConnectionCloses) {
  Start();
  auto sock = Raw();
  ASSERT_TRUE(sock->WriteRaw(Preface()).ok());
  // Length 4, then bytes that are no valid protobuf (field 0 is illegal).
  const uint8_t junk[] = {4, 0, 0, 0, 0x00, 0xff, 0xff, 0xff};
  ASSERT_TRUE(sock->WriteRaw(junk).ok());
  v1::BulkLoadFrame frame;
  ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  EXPECT_TRUE(frame.done());
  EXPECT_EQ(frame.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(frame.status_message(), HasSubstr("LoadRequest"));
  EXPECT_FALSE(sock->Read(&frame, 1 << 20).ok());  // closed
  EXPECT_TRUE(sock->closed_cleanly());
}

TEST_F(BulkLoadTest, AnOversizedFrameIsRefusedBeforeItIsRead) {
  Start();
  auto sock = Raw();
  ASSERT_TRUE(sock->WriteRaw(Preface()).ok());
  const uint8_t header[] = {0xff, 0xff, 0xff, 0x7f};  // ~2 GiB announced, none sent
  ASSERT_TRUE(sock->WriteRaw(header).ok());
  v1::BulkLoadFrame frame;
  ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  EXPECT_TRUE(frame.done());
  EXPECT_EQ(frame.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(frame.status_message(), HasSubstr("2147483647 bytes"));
}

TEST_F(BulkLoadTest, ABadHashIsInvalidArgumentNamingItAndTheConnectionStaysUsable) {
  Start();
  Put("ns", 1, kBlock);
  auto sock = Raw();
  ASSERT_TRUE(sock->WriteRaw(Preface()).ok());
  v1::LoadRequest req;
  req.set_namespace_("ns");
  rpc::AppendBlockHashes(std::vector<BlockHash>{TestHash(1)}, req.mutable_block_hashes());
  req.add_block_hashes(std::string(31, 'x'));
  ASSERT_TRUE(sock->Write(req).ok());
  v1::BulkLoadFrame frame;
  ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  EXPECT_TRUE(frame.done());  // nothing of the request was served
  EXPECT_EQ(frame.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(frame.status_message(), HasSubstr("block_hashes[1]"));
  EXPECT_EQ(bulk_->GetStats().blocks_sent, 0u);
  // The same connection then serves a valid request.
  req.mutable_block_hashes()->RemoveLast();
  ASSERT_TRUE(sock->Write(req).ok());
  ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  ASSERT_TRUE(frame.has_chunk());
  EXPECT_TRUE(frame.chunk().ok());
  ASSERT_EQ(frame.chunk().total_size(), kBlock);
  std::vector<uint8_t> payload(kBlock);
  ASSERT_TRUE(sock->ReadRaw(payload).ok());
  EXPECT_EQ(payload, TestPayload(1, kBlock));
  EXPECT_EQ(frame.chunk().checksum(), kvstore::Crc32c(payload));
  ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  EXPECT_TRUE(frame.done());
  EXPECT_EQ(frame.status_code(), 0);
}

TEST_F(BulkLoadTest, AClientThatHangsUpMidLoadLeavesNoLeaseAndNoStuckThread) {
  Start();
  for (uint64_t id = 0; id < 8; ++id) Put("big", id, kBigBlock);
  KvStoreClient* client = Client();
  std::vector<BlockHash> hashes;
  for (uint64_t id = 0; id < 8; ++id) hashes.push_back(TestHash(id));
  kvconnector::RemoteLookupResult r = client->Lookup("big", hashes, {.take_lease = true})->Wait();
  ASSERT_EQ(r.num_hits, 8);
  {
    auto sock = Raw();
    ASSERT_TRUE(sock->WriteRaw(Preface()).ok());
    v1::LoadRequest req;
    req.set_namespace_("big");
    rpc::AppendBlockHashes(hashes, req.mutable_block_hashes());
    req.set_lease_id(r.lease.value());
    ASSERT_TRUE(sock->Write(req).ok());
    v1::BulkLoadFrame frame;
    ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());  // the first block's header, then hang up
  }
  EXPECT_TRUE(WaitFor([&] { return store_->GetStats().active_leases == 0; }));
  EXPECT_TRUE(WaitFor([&] { return bulk_->GetStats().connections_open == 0; }));
  Loaded a = Load(client, "big", {7}, kBigBlock);  // still serving
  ASSERT_TRUE(a.results.ok());
  EXPECT_TRUE((*a.results)[0].ok());
}

// ---- lookups over the bulk port's lookup connection ----

TEST_F(BulkLoadTest, LookupsGoOverTheLookupConnectionAndAnswerAsGrpc) {
  Start();
  for (uint64_t id : {1, 2, 3}) Put("ns", id, kBlock);
  KvStoreClient* fast = LookupClient();
  ASSERT_NE(fast, nullptr);
  KvStoreClient* grpc = Client();
  const std::vector<BlockHash> hashes{TestHash(1), TestHash(2), TestHash(9), TestHash(3)};
  kvconnector::RemoteLookupResult a = fast->Lookup("ns", hashes, {.lease_ttl_ms = 60'000})->Wait();
  kvconnector::RemoteLookupResult b = grpc->Lookup("ns", hashes, {.take_lease = false})->Wait();
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_EQ(a.num_hits, 2);
  EXPECT_EQ(a.num_hits, b.num_hits);
  EXPECT_EQ(a.num_hot_hits, b.num_hot_hits);
  EXPECT_GT(a.answered_after_us, 0);
  EXPECT_EQ(fast->bulk_lookups(), 1u);
  EXPECT_EQ(grpc->bulk_lookups(), 0u);
  EXPECT_EQ(bulk_->GetStats().lookups, 1u);
  // The lease is the store's, as over gRPC.
  ASSERT_NE(a.lease.value(), 0u);
  EXPECT_EQ(store_->GetStats().active_leases, 1u);
  absl::StatusOr<bool> released = grpc->Release(a.lease);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_TRUE(*released);
  // An unknown namespace: that lookup's error, and the connection goes on.
  kvconnector::RemoteLookupResult bad = fast->Lookup("nope", hashes)->Wait();
  EXPECT_EQ(bad.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bad.status.message(), HasSubstr("nope"));
  EXPECT_EQ(fast->Lookup("ns", hashes, {.take_lease = false})->Wait().num_hits, 2);
  EXPECT_EQ(fast->bulk_lookups(), 3u);
  EXPECT_EQ(bulk_->GetStats().connections_accepted, 1u);
}

TEST_F(BulkLoadTest, ALateAnswersLeaseIsReleasedByTheClient) {
  Start(true, {.debug_lookup_delay_ms = 200});
  Put("ns", 1, kBlock);
  KvStoreClient* fast = LookupClient();
  ASSERT_NE(fast, nullptr);
  kvconnector::RemoteLookupResult r = fast->Lookup("ns", std::vector<BlockHash>{TestHash(1)},
                                             {.lease_ttl_ms = 600'000, .deadline_ms = 20})
                                    ->Wait();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.num_hits, 0);
  // The store granted a lease (for 10 minutes) after the caller gave up; the
  // client releases it.
  ASSERT_TRUE(WaitFor([&] { return fast->bulk_lookups() == 1; }));
  EXPECT_TRUE(WaitFor([&] { return store_->GetStats().active_leases == 0; }));
  EXPECT_EQ(store_->GetStats().leases_expired, 0u);
}

TEST_F(BulkLoadTest, WhenTheLookupConnectionBreaksItsLookupsFailAndLaterOnesGoOverGrpc) {
  Start(true, {.debug_lookup_delay_ms = 300});
  Put("ns", 1, kBlock);
  KvStoreClient* fast = LookupClient();
  ASSERT_NE(fast, nullptr);
  const std::vector<BlockHash> hashes{TestHash(1)};
  auto inflight = fast->Lookup("ns", hashes, {.take_lease = false, .deadline_ms = 10'000});
  bulk_->Shutdown();  // closes the connection under the sleeping lookup
  kvconnector::RemoteLookupResult lost = inflight->Wait();
  EXPECT_EQ(lost.status.code(), absl::StatusCode::kUnavailable) << lost.status;
  EXPECT_EQ(lost.num_hits, 0);
  ASSERT_TRUE(WaitFor([&] { return !fast->bulk_lookup_connected(); }));
  kvconnector::RemoteLookupResult next = fast->Lookup("ns", hashes, {.take_lease = false})->Wait();
  ASSERT_TRUE(next.status.ok()) << next.status;  // over gRPC (no delay there)
  EXPECT_EQ(next.num_hits, 1);
  EXPECT_EQ(fast->bulk_lookups(), 0u);
}

TEST_F(BulkLoadTest, LookupsBeyondWhatTheConnectionHoldsUnansweredGoOverGrpc) {
  // A slow store on the bulk port only: while the loop below sends, hardly
  // any answer frees room.
  Start(true, {.debug_lookup_delay_ms = 100});
  Put("ns", 1, kBlock);
  KvStoreClient* fast = LookupClient();
  ASSERT_NE(fast, nullptr);
  // 64 hashes: about 2.2 KB a lookup, so about 30 fill the 64 KiB bound.
  std::vector<BlockHash> hashes{TestHash(1)};
  for (uint64_t i = 100; i < 163; ++i) hashes.push_back(TestHash(i));
  constexpr int kLookups = 60;
  std::vector<std::unique_ptr<kvconnector::PendingLookup>> pending;
  for (int i = 0; i < kLookups; ++i) {
    pending.push_back(fast->Lookup("ns", hashes, {.take_lease = false}));
  }
  for (auto& p : pending) {
    kvconnector::RemoteLookupResult r = p->Wait();
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.num_hits, 1);
  }
  const uint64_t over_bulk = fast->bulk_lookups();
  EXPECT_GT(over_bulk, 0u);
  EXPECT_LT(over_bulk, static_cast<uint64_t>(kLookups)) << "no lookup fell back to gRPC";
}

TEST_F(BulkLoadTest, ABadLookupFrameIsAnsweredWithItsErrorAndAGarbledOneClosesTheConnection) {
  Start();
  Put("ns", 1, kBlock);
  auto sock = Raw();
  ASSERT_TRUE(sock->WriteRaw({reinterpret_cast<const uint8_t*>(rpc::kKvBulkLookupPreface.data()),
                              rpc::kKvBulkLookupPreface.size()})
                  .ok());
  v1::LookupRequest req;
  req.set_namespace_("ns");
  rpc::AppendBlockHashes(std::vector<BlockHash>{TestHash(1)}, req.mutable_block_hashes());
  req.add_block_hashes(std::string(31, 'x'));
  ASSERT_TRUE(sock->Write(req).ok());
  v1::BulkLookupAnswer answer;
  ASSERT_TRUE(sock->Read(&answer, 1 << 20).ok());
  EXPECT_EQ(answer.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answer.status_message(), HasSubstr("block_hashes[1]"));
  EXPECT_EQ(store_->GetStats().active_leases, 0u);
  req.mutable_block_hashes()->RemoveLast();
  req.set_take_lease(true);
  ASSERT_TRUE(sock->Write(req).ok());
  ASSERT_TRUE(sock->Read(&answer, 1 << 20).ok());
  EXPECT_EQ(answer.status_code(), 0) << answer.status_message();
  EXPECT_EQ(answer.response().num_hits(), 1);
  EXPECT_NE(answer.response().lease_id(), 0u);
  // Bytes that do not parse as a LookupRequest: answered, then closed.
  const uint8_t garbage[] = {4, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF};
  ASSERT_TRUE(sock->WriteRaw(garbage).ok());
  ASSERT_TRUE(sock->Read(&answer, 1 << 20).ok());
  EXPECT_EQ(answer.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(sock->Read(&answer, 1 << 20).ok());
}

TEST(SplitHostPort, AcceptsTheAddressFormsGrpcTakes) {
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(*rpc::SplitHostPort("127.0.0.1:50070"), P("127.0.0.1", "50070"));
  EXPECT_EQ(*rpc::SplitHostPort("kvstore.default.svc:50070"), P("kvstore.default.svc", "50070"));
  EXPECT_EQ(*rpc::SplitHostPort("dns:///kvstore:1"), P("kvstore", "1"));
  EXPECT_EQ(*rpc::SplitHostPort("ipv4:10.0.0.1:2"), P("10.0.0.1", "2"));
  EXPECT_EQ(*rpc::SplitHostPort("[::1]:3"), P("::1", "3"));
  EXPECT_EQ(*rpc::SplitHostPort("ipv6:[::1]:4"), P("::1", "4"));
  for (const char* bad : {"", "host", "host:", ":80", "host:http", "::1:80", "unix:/tmp/s",
                          "[::1]80", "host:123456"}) {
    EXPECT_EQ(rpc::SplitHostPort(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace tandem
