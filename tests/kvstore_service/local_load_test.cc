// The KV-store's local socket (services/kvstore/bulk_load_server.h, "Local
// socket"): the KV client's loads read the hot tier in place from shared
// memory, the store pins those blocks until the client has copied them, a
// corrupt block is a miss, and without the socket loads take the bulk port.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../kvstore/test_util.h"
#include "bulk_load_server.h"
#include "bulk_test_store.h"
#include "gtest/gtest.h"
#include "kvstore_service.h"
#include "local_socket_fixture.h"
#include "loopback_server.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/kvtypes/checksum.h"
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

constexpr uint64_t kLoadBlock = testutil::kBulkBlock;
constexpr uint64_t kBigLoadBlock = testutil::kBulkBigBlock;

using LocalLoadTest = testutil::LocalSocketTest;

TEST_F(LocalLoadTest, LoadsReadTheHotTierInPlace) {
  Loaded l = Load("ns", {1, 2, 99, 3}, kLoadBlock);  // 99 is not stored
  ASSERT_TRUE(l.results.ok()) << l.results.status();
  ASSERT_EQ(l.results->size(), 4u);
  for (size_t i : {0u, 1u, 3u}) {
    EXPECT_EQ((*l.results)[i].miss, LoadMiss::kNone) << i;
  }
  EXPECT_EQ((*l.results)[2].miss, LoadMiss::kNotFound);
  EXPECT_EQ(l.bufs[0], TestPayload(1, kLoadBlock));
  EXPECT_EQ(l.bufs[1], TestPayload(2, kLoadBlock));
  EXPECT_EQ(l.bufs[3], TestPayload(3, kLoadBlock));
  Loaded big = Load("big", {100}, kBigLoadBlock);
  ASSERT_TRUE(big.results.ok()) << big.results.status();
  EXPECT_EQ((*big.results)[0].miss, LoadMiss::kNone);
  EXPECT_EQ(big.bufs[0], TestPayload(100, kBigLoadBlock));
  EXPECT_EQ(client_->local_loads(), 2u);
  EXPECT_EQ(client_->bulk_loads(), 0u);
  // The blocks before the miss came by their place in shared memory (the
  // one after it is not pinned, so it came inline).
  EXPECT_EQ(bulk_->GetStats().blocks_shared, 3u);
  EXPECT_EQ(bulk_->GetStats().blocks_sent, 1u);
  EXPECT_EQ(store_->GetStats().active_leases, 0u);
  // The pins are part of the loads, not lookups of the store's.
  EXPECT_EQ(store_->GetStats().lookups, 0u);
  EXPECT_EQ(store_->GetStats().lookup_hits, 0u);
}

// The protocol by hand: the memfd comes with the answer to the preface; a
// pinned block's offset points at its bytes in the mapping, and the pins
// hold (an active lease) until the client's next frame.
TEST_F(LocalLoadTest, PinsHoldUntilTheClientsNextFrame) {
  std::unique_ptr<rpc::FramedSocket> sock = DialLocal(rpc::kKvLocalLoadPreface, PROT_READ);
  ASSERT_NE(sock, nullptr);
  ASSERT_NE(map_, nullptr);
  EXPECT_EQ(map_size_, store_->hot_tier_memory().bytes.size());

  v1::LoadRequest req;
  req.set_namespace_("ns");
  const std::vector<BlockHash> hashes = {TestHash(4), TestHash(5)};
  rpc::AppendBlockHashes(hashes, req.mutable_block_hashes());
  ASSERT_TRUE(sock->Write(req).ok());
  v1::BulkLoadFrame frame;
  int shared = 0;
  for (;;) {
    ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
    if (frame.done()) break;
    const v1::LoadChunk& c = frame.chunk();
    ASSERT_TRUE(c.ok() && c.in_shared_memory()) << c.DebugString();
    ASSERT_LE(c.shared_offset() + c.total_size(), map_size_);
    const auto* bytes = map_ + c.shared_offset();
    const std::vector<uint8_t> want = TestPayload(4 + c.block_index(), kLoadBlock);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), bytes)) << c.block_index();
    EXPECT_EQ(c.checksum(), kvstore::Crc32c(want));
    ++shared;
  }
  EXPECT_EQ(frame.status_code(), 0) << frame.status_message();
  EXPECT_EQ(shared, 2);
  EXPECT_EQ(store_->GetStats().active_leases, 1u) << "the blocks stay pinned while we copy";
  v1::LoadRequest unpin;
  unpin.set_namespace_("ns");
  ASSERT_TRUE(sock->Write(unpin).ok());
  ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  EXPECT_TRUE(frame.done());
  EXPECT_EQ(store_->GetStats().active_leases, 0u);

  // A connection that ends holding pins releases them too.
  ASSERT_TRUE(sock->Write(req).ok());
  do {
    ASSERT_TRUE(sock->Read(&frame, 1 << 20).ok());
  } while (!frame.done());
  EXPECT_EQ(store_->GetStats().active_leases, 1u);
  sock.reset();
  EXPECT_TRUE(kvstore::testing::WaitFor([&] { return store_->GetStats().active_leases == 0; }));
}

// The reader verifies the bytes it copies out of shared memory: a block
// corrupted in the hot tier is a checksum miss, never data, and the store,
// told, drops it.
TEST_F(LocalLoadTest, ACorruptBlockInSharedMemoryIsAChecksumMiss) {
  ASSERT_TRUE(store_->TEST_CorruptHot("ns", TestHash(2), 100).ok());
  Loaded l = Load("ns", {1, 2}, kLoadBlock);
  ASSERT_TRUE(l.results.ok()) << l.results.status();
  EXPECT_EQ((*l.results)[0].miss, LoadMiss::kNone);
  EXPECT_EQ((*l.results)[1].miss, LoadMiss::kChecksum);
  EXPECT_NE(l.bufs[1], TestPayload(2, kLoadBlock));
  EXPECT_EQ(client_->local_loads(), 1u);
  EXPECT_FALSE(store_->TEST_InHot("ns", TestHash(2)));
}

// Without the socket (gone, or another host's) loads take the bulk port.
// As over the bulk port (BulkLoadTest.ALoadTheStoreStallsOn...): a load the
// store takes on the local socket and stalls on fails after one deadline; it
// is sent neither again on a new connection, nor over the bulk port, nor
// over gRPC, each of which would wait out another deadline. The socket is
// not written off: once the store answers, loads read the hot tier again.
TEST_F(LocalLoadTest, ALoadTheStoreStallsOnFailsAfterOneDeadlineAndGoesNowhereElse) {
  auto client = kvconnector::KvStoreClient::Create(
      {.target = target_, .rpc_deadline_ms = 300, .bulk_lookup = false});
  ASSERT_TRUE(client.ok()) << client.status();
  auto load = [&] {
    std::vector<uint8_t> buf(kLoadBlock, 0xEE);
    std::vector<std::span<uint8_t>> dst = {buf};
    const BlockHash hash = TestHash(1);
    auto results = (*client)->Load("ns", {&hash, 1}, dst, LeaseId(0));
    if (results.ok() && (*results)[0].ok()) {
      EXPECT_EQ(buf, TestPayload(1, kLoadBlock));
    }
    return results;
  };
  ASSERT_TRUE(load().ok());  // pools a connection
  ASSERT_EQ((*client)->local_loads(), 1u);
  stall_.on = true;
  auto stalled = load();
  EXPECT_EQ(stalled.status().code(), absl::StatusCode::kDeadlineExceeded) << stalled.status();
  EXPECT_EQ(stall_.stalled, 1) << "the load was sent again on a new connection or the bulk port";
  EXPECT_EQ(grpc_loads_, 0) << "the load was sent again over gRPC";
  stall_.on = false;
  stall_.gate.Open();
  auto after = load();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE((*after)[0].ok());
  EXPECT_EQ((*client)->local_loads(), 2u) << "after the stall, loads left the local socket";
  EXPECT_EQ((*client)->bulk_loads(), 0u);
  EXPECT_EQ(grpc_loads_, 0);
}

TEST_F(LocalLoadTest, WithoutTheSocketLoadsTakeTheBulkPort) {
  ASSERT_EQ(unlink(socket_.c_str()), 0);
  Loaded l = Load("ns", {1, 2}, kLoadBlock);
  ASSERT_TRUE(l.results.ok()) << l.results.status();
  EXPECT_EQ((*l.results)[0].miss, LoadMiss::kNone);
  EXPECT_EQ(l.bufs[1], TestPayload(2, kLoadBlock));
  EXPECT_EQ(client_->local_loads(), 0u);
  EXPECT_EQ(client_->bulk_loads(), 1u);
}

// The socket is for clients on the store's own host: a store that
// advertises another host's id is loaded from over the bulk port, though
// its socket path would connect here.
TEST_F(LocalLoadTest, AStoreThatAdvertisesAnotherHostIsLoadedOverTheBulkPort) {
  kvstore_service::KvStoreServiceImpl remote(
      store_.get(), kvstore_service::KvStoreServiceOptions{
                        .bulk_load = bulk_.get(), .debug_host_id = "boot-id-of-another-host"});
  testutil::LoopbackServer s = testutil::StartOnLoopback(&remote);
  ASSERT_NE(s.server, nullptr);
  auto client = KvStoreClient::Create({.target = s.target, .bulk_lookup = false});
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<uint8_t> buf(kLoadBlock, 0xEE);
  const std::span<uint8_t> dst[] = {buf};
  const BlockHash hash[] = {TestHash(3)};
  auto results = (*client)->Load("ns", hash, dst, LeaseId(0));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].miss, LoadMiss::kNone);
  EXPECT_EQ(buf, TestPayload(3, kLoadBlock));
  EXPECT_EQ((*client)->local_loads(), 0u);
  EXPECT_EQ((*client)->bulk_loads(), 1u);
  EXPECT_EQ(bulk_->GetStats().local_loads, 0u);
  client->reset();
  s.server->Shutdown();
}

TEST_F(LocalLoadTest, TheSocketNeedsASharedHotTierAndAPathNoOneServes) {
  TempDir other;
  auto unshared = testutil::OpenBulkTestStore(other.path(), {{"ns", kLoadBlock}});
  ASSERT_TRUE(unshared.ok());
  auto refused = kvstore_service::BulkLoadServer::Start(
      unshared->get(), {.local_socket = other.path() + "/kv.sock"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  auto taken = kvstore_service::BulkLoadServer::Start(store_.get(), {.local_socket = socket_});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists) << taken.status();
}

}  // namespace
}  // namespace tandem
