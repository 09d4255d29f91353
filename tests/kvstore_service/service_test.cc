// tandem.v1.KvStore over loopback gRPC against an in-process server: the
// client library, and bad input sent with the raw stub (DESIGN §9).
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "../kvstore/test_util.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kvstore_server.h"
#include "kvstore_service.h"
#include "loopback_server.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/kvstore/sync_point.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem {
namespace {

using kvconnector::KvStoreClient;
using kvconnector::LoadMiss;
using kvstore::SyncPoint;
using kvstore::testing::Crc;
using kvstore::testing::TempDir;
using kvstore::testing::TestHash;
using kvstore::testing::TestPayload;
using ::testing::HasSubstr;

constexpr uint64_t kBlock = 64 << 10;
constexpr uint64_t kBigBlock = (5 << 20) / 2;  // 2.5 MiB: several messages per block

class KvStoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SyncPoint::Get()->DisableProcessing();
    SyncPoint::Get()->ClearAll();
    auto store = kvstore::KvStoreEngine::Open({.data_dir = dir_.path(),
                                         .hot_capacity_bytes = 32 << 20,
                                         .hot_slot_bytes = 4 << 20,
                                         .lock_hot_memory = false,
                                         .clock = &clock_});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    ASSERT_TRUE(store_->CreateNamespace({.name = "ns", .block_bytes = kBlock}).ok());
    ASSERT_TRUE(store_->CreateNamespace({.name = "big", .block_bytes = kBigBlock}).ok());
    service_ = std::make_unique<kvstore_service::KvStoreServiceImpl>(
        store_.get(), kvstore_service::KvStoreServiceOptions{});
    testutil::LoopbackServer s = testutil::StartOnLoopback(service_.get());
    ASSERT_NE(s.server, nullptr);
    server_ = std::move(s.server);
    target_ = s.target;
    auto client = KvStoreClient::Create({.target = target_, .lookup_deadline_ms = 10'000});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    stub_ = v1::KvStore::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    SyncPoint::Get()->DisableProcessing();
    SyncPoint::Get()->ClearAll();
    client_.reset();
    server_->Shutdown();
  }

  // Stores blocks `ids` of `size` bytes in `ns` through the client.
  void StoreBlocks(const std::string& ns, const std::vector<uint64_t>& ids, uint64_t size) {
    std::vector<BlockHash> hashes;
    std::vector<std::vector<uint8_t>> payloads;
    for (uint64_t i : ids) {
      hashes.push_back(TestHash(i));
      payloads.push_back(TestPayload(i, size));
    }
    std::vector<std::span<const uint8_t>> src(payloads.begin(), payloads.end());
    auto r = client_->Store(ns, hashes, src);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->size(), ids.size());
    for (const auto& b : *r) EXPECT_TRUE(b.status.ok()) << b.status;
  }

  kvstore::KvStoreStats Stats() { return store_->GetStats(); }

  // One Store stream of `msg` through the generated stub, answered OK.
  void StoreRaw(const v1::StoreRequest& msg, v1::StoreResponse* resp) {
    grpc::ClientContext ctx;
    auto writer = stub_->Store(&ctx, resp);
    ASSERT_TRUE(writer->Write(msg));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }

  TempDir dir_;
  FakeClock clock_{1'000'000'000};  // lease expiry only
  std::unique_ptr<kvstore::KvStoreEngine> store_;
  std::unique_ptr<kvstore_service::KvStoreServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::unique_ptr<KvStoreClient> client_;
  std::unique_ptr<v1::KvStore::Stub> stub_;
};

TEST_F(KvStoreServiceTest, StoreAndLoadRoundTripBlocksSpanningSeveralMessages) {
  StoreBlocks("big", {1, 2, 3}, kBigBlock);
  StoreBlocks("ns", {1, 2, 3, 4, 5}, kBlock);
  for (auto [ns, size, n] : {std::tuple{"big", kBigBlock, 3}, std::tuple{"ns", kBlock, 5}}) {
    std::vector<BlockHash> hashes;
    std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(size));
    for (int i = 1; i <= n; ++i) hashes.push_back(TestHash(i));
    std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
    auto r = client_->Load(ns, hashes, dst);
    ASSERT_TRUE(r.ok()) << r.status();
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE((*r)[i].ok()) << ns << " " << i << " " << LoadMissName((*r)[i].miss);
      EXPECT_EQ(bufs[i], TestPayload(i + 1, size)) << ns << " " << i;
    }
  }
  // Idempotent: storing again reports already_present and writes nothing.
  auto p = TestPayload(1, kBlock);
  std::vector<BlockHash> h{TestHash(1)};
  std::vector<std::span<const uint8_t>> src{p};
  auto again = client_->Store("ns", h, src);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)[0].already_present);
  EXPECT_EQ(Stats().stores, 8u);
}

TEST_F(KvStoreServiceTest, LookupResolvesByPollingAndTheLoadReleasesItsLease) {
  StoreBlocks("ns", {0, 1, 2}, kBlock);
  std::vector<BlockHash> hashes{TestHash(0), TestHash(1), TestHash(2), TestHash(3), TestHash(4)};
  auto pending = client_->Lookup("ns", hashes, {.take_lease = true});
  std::optional<kvconnector::RemoteLookupResult> r;
  for (int i = 0; i < 10'000 && !r; ++i) {
    r = pending->Poll();  // never blocks
    if (!r) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->status.ok()) << r->status;
  EXPECT_EQ(r->num_hits, 3);
  EXPECT_EQ(r->num_hot_hits, 3);
  ASSERT_NE(r->lease.value(), 0u);
  EXPECT_EQ(Stats().active_leases, 1u);
  // Same answer on every later poll.
  EXPECT_EQ(pending->Poll()->num_hits, 3);

  std::vector<std::vector<uint8_t>> bufs(3, std::vector<uint8_t>(kBlock));
  std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
  auto loaded = client_->Load("ns", std::span(hashes).first(3), dst, r->lease);
  ASSERT_TRUE(loaded.ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bufs[i], TestPayload(i, kBlock));
  EXPECT_EQ(Stats().active_leases, 0u);
  EXPECT_FALSE(*client_->Release(r->lease));
}

TEST_F(KvStoreServiceTest, ReleaseFreesTheLease) {
  StoreBlocks("ns", {0}, kBlock);
  std::vector<BlockHash> hashes{TestHash(0)};
  auto r = client_->Lookup("ns", hashes)->Wait();
  ASSERT_EQ(r.num_hits, 1);
  EXPECT_EQ(Stats().active_leases, 1u);
  EXPECT_TRUE(*client_->Release(r.lease));
  EXPECT_EQ(Stats().active_leases, 0u);
}

// ReleaseAsync batching (KvStoreClientOptions.release_batch_ms).
class BatchedReleaseTest : public KvStoreServiceTest {
 protected:
  std::unique_ptr<KvStoreClient> Client(int64_t release_batch_ms) {
    auto c = KvStoreClient::Create({.target = target_,
                                    .lookup_deadline_ms = 10'000,
                                    .release_batch_ms = release_batch_ms});
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }
  LeaseId Leased(KvStoreClient* c, uint64_t id) {
    std::vector<BlockHash> hashes{TestHash(id)};
    kvconnector::RemoteLookupResult r = c->Lookup("ns", hashes, {.take_lease = true})->Wait();
    EXPECT_EQ(r.num_hits, 1);
    return r.lease;
  }
  bool EventuallyNoLeases() {
    return kvstore::testing::WaitFor([&] { return Stats().active_leases == 0; });
  }
};

TEST_F(BatchedReleaseTest, AReleasedLeaseRidesOnTheNextLookup) {
  StoreBlocks("ns", {0, 1}, kBlock);
  auto c = Client(/*release_batch_ms=*/600'000);  // the timer never sends it
  const LeaseId a = Leased(c.get(), 0), b = Leased(c.get(), 1);
  c->ReleaseAsync(a);
  c->ReleaseAsync(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(Stats().active_leases, 2u);  // still batched in the client
  std::vector<BlockHash> hashes{TestHash(0)};
  kvconnector::RemoteLookupResult r = c->Lookup("ns", hashes, {.take_lease = false})->Wait();
  EXPECT_EQ(r.num_hits, 1);
  EXPECT_EQ(Stats().active_leases, 0u);  // released before the lookup answered
}

TEST_F(BatchedReleaseTest, WithoutALookupTheBatchGoesInOneReleaseAfterTheWindow) {
  StoreBlocks("ns", {0, 1}, kBlock);
  auto c = Client(/*release_batch_ms=*/20);
  const LeaseId a = Leased(c.get(), 0), b = Leased(c.get(), 1);
  EXPECT_EQ(Stats().active_leases, 2u);
  c->ReleaseAsync(a);
  c->ReleaseAsync(b);
  EXPECT_TRUE(EventuallyNoLeases());
}

TEST_F(BatchedReleaseTest, DestroyingTheClientSendsItsBatchedReleases) {
  StoreBlocks("ns", {0}, kBlock);
  auto c = Client(/*release_batch_ms=*/600'000);
  c->ReleaseAsync(Leased(c.get(), 0));
  EXPECT_EQ(Stats().active_leases, 1u);
  c.reset();
  EXPECT_TRUE(EventuallyNoLeases());
}

TEST_F(BatchedReleaseTest, ReleaseRpcFreesEveryLeaseOfTheBatch) {
  StoreBlocks("ns", {0, 1, 2}, kBlock);
  const LeaseId a = Leased(client_.get(), 0), b = Leased(client_.get(), 1),
                d = Leased(client_.get(), 2);
  v1::ReleaseRequest req;
  req.set_lease_id(a.value());
  req.add_more_lease_ids(b.value());
  req.add_more_lease_ids(987654321);  // unknown: ignored
  req.add_more_lease_ids(d.value());
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Release(&ctx, req, &resp).ok());
  EXPECT_TRUE(resp.found());
  EXPECT_EQ(Stats().active_leases, 0u);
}

// The server holds the lookup (after pinning) until the client has given up:
// the client sees zero hits with DEADLINE_EXCEEDED. The server notices the
// passed deadline and releases what it pinned; should the cancellation race
// that check, the lease still ends at its expiry. Either way none is left.
TEST_F(KvStoreServiceTest, LateLookupCountsAsZeroHitsAndLeavesNoLease) {
  StoreBlocks("ns", {0, 1}, kBlock);
  std::atomic<bool> server_done{false};
  SyncPoint::Get()->LoadDependency({{"Test:ClientGaveUp", "KvStoreEngine::Lookup:AfterPin"}});
  SyncPoint::Get()->SetCallBack("KvStoreEngine::Lookup:End", [&] { server_done = true; });
  SyncPoint::Get()->EnableProcessing();
  std::vector<BlockHash> hashes{TestHash(0), TestHash(1)};
  auto pending = client_->Lookup("ns", hashes, {.take_lease = true, .deadline_ms = 30});
  kvconnector::RemoteLookupResult r = pending->Wait();
  EXPECT_EQ(r.num_hits, 0);
  EXPECT_EQ(r.lease.value(), 0u);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  SyncPoint::Get()->Process("Test:ClientGaveUp");
  ASSERT_TRUE(kvstore::testing::WaitFor([&] { return server_done.load(); }));
  SyncPoint::Get()->DisableProcessing();
  // (The handler may release its lease after this; releasing an expired
  // lease is a no-op.)
  clock_.AdvanceNanos(int64_t{31} * 1'000'000'000);  // past the default lease TTL
  store_->ExpireLeases();
  EXPECT_EQ(Stats().active_leases, 0u);
}

TEST_F(KvStoreServiceTest, LookupOfUnreachableStoreIsZeroHits) {
  auto client = KvStoreClient::Create({.target = "127.0.0.1:1", .lookup_deadline_ms = 200});
  ASSERT_TRUE(client.ok());
  std::vector<BlockHash> hashes{TestHash(0)};
  kvconnector::RemoteLookupResult r = (*client)->Lookup("ns", hashes)->Wait();
  EXPECT_EQ(r.num_hits, 0);
  EXPECT_FALSE(r.status.ok());
}

TEST_F(KvStoreServiceTest, HashOfWrongLengthIsInvalidArgument) {
  v1::LookupRequest req;
  req.set_namespace_("ns");
  req.add_block_hashes(TestHash(0).ToBytes());
  req.add_block_hashes(std::string(31, 'x'));
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->Lookup(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("block_hashes[1] has 31 bytes; a block hash has 32"));

  v1::LoadRequest load;
  load.set_namespace_("ns");
  load.add_block_hashes("short");
  grpc::ClientContext ctx2;
  auto reader = stub_->Load(&ctx2, load);
  v1::LoadResponse chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("block_hashes[0] has 5 bytes"));
}

TEST_F(KvStoreServiceTest, UnknownNamespaceIsNotFoundOnEveryRpc) {
  std::vector<BlockHash> hashes{TestHash(0)};
  auto r = client_->Lookup("nope", hashes)->Wait();
  EXPECT_EQ(r.num_hits, 0);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("namespace 'nope' is not registered"));

  std::vector<uint8_t> buf(kBlock);
  std::vector<std::span<uint8_t>> dst{buf};
  auto load = client_->Load("nope", hashes, dst);
  EXPECT_EQ(load.status().code(), absl::StatusCode::kNotFound);

  auto p = TestPayload(0, kBlock);
  std::vector<std::span<const uint8_t>> src{p};
  auto store = client_->Store("nope", hashes, src);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("namespace 'nope'"));
  EXPECT_EQ(Stats().cold_blocks, 0u);
}

// Appends a whole block to a raw Store message as one last chunk.
void AddWholeBlock(v1::StoreRequest* msg, const std::string& raw_hash,
                   const std::vector<uint8_t>& data, uint32_t checksum) {
  v1::StoreChunk* c = msg->add_chunks();
  c->set_block_hash(raw_hash);
  c->set_total_size(data.size());
  c->set_data(data.data(), data.size());
  c->set_last(true);
  c->set_checksum(checksum);
}

TEST_F(KvStoreServiceTest, BadBlocksGetPreciseStatusesAndNothingPartialIsStored) {
  auto good = TestPayload(1, kBlock);
  auto small = TestPayload(2, kBlock - 1);
  std::vector<BlockHash> hashes{TestHash(1), TestHash(2), TestHash(3)};
  // Block 3 is sent with a checksum that does not match (via the raw stub).
  v1::StoreRequest msg;
  msg.set_namespace_("ns");
  AddWholeBlock(&msg, TestHash(1).ToBytes(), good, Crc(good));
  AddWholeBlock(&msg, TestHash(2).ToBytes(), small, Crc(small));
  AddWholeBlock(&msg, TestHash(3).ToBytes(), good, Crc(good) ^ 0xFF);
  AddWholeBlock(&msg, std::string(31, 'h'), good, Crc(good));
  v1::StoreResponse resp;
  ASSERT_NO_FATAL_FAILURE(StoreRaw(msg, &resp));
  ASSERT_EQ(resp.blocks_size(), 4);
  EXPECT_TRUE(resp.blocks(0).ok());
  EXPECT_FALSE(resp.blocks(1).ok());
  EXPECT_EQ(resp.blocks(1).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(resp.blocks(1).error(),
              HasSubstr("total_size 65535 but blocks of namespace 'ns' have 65536 bytes"));
  EXPECT_EQ(resp.blocks(2).code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(resp.blocks(2).error(), HasSubstr("does not match"));
  EXPECT_EQ(resp.blocks(3).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(resp.blocks(3).error(), HasSubstr("block_hash has 31 bytes"));
  auto r = client_->Lookup("ns", hashes, {.take_lease = false})->Wait();
  EXPECT_EQ(r.num_hits, 1);
  EXPECT_EQ(Stats().cold_blocks, 1u);
}

// The blocks of one message are stored together (one StoreBatch): a hash
// that comes twice is stored once and answered present the second time,
// each in its own place of the response.
TEST_F(KvStoreServiceTest, AHashTwiceInOneMessageIsStoredOnceAndAnsweredInOrder) {
  v1::StoreRequest msg;
  msg.set_namespace_("ns");
  for (uint64_t id : {5, 6, 5}) {
    const std::vector<uint8_t> data = TestPayload(id, kBlock);
    AddWholeBlock(&msg, TestHash(id).ToBytes(), data, Crc(data));
  }
  v1::StoreResponse resp;
  ASSERT_NO_FATAL_FAILURE(StoreRaw(msg, &resp));
  ASSERT_EQ(resp.blocks_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(resp.blocks(i).ok()) << i << ": " << resp.blocks(i).error();
    EXPECT_EQ(resp.blocks(i).block_hash(), TestHash(i == 1 ? 6 : 5).ToBytes());
  }
  EXPECT_FALSE(resp.blocks(0).already_present());
  EXPECT_FALSE(resp.blocks(1).already_present());
  EXPECT_TRUE(resp.blocks(2).already_present());
  EXPECT_EQ(Stats().cold_blocks, 2u);
}

TEST_F(KvStoreServiceTest, StreamEndingMidBlockIsInvalidArgumentAndStoresNoPartialBlock) {
  auto a = TestPayload(1, kBlock);
  auto b = TestPayload(2, kBlock);
  v1::StoreRequest msg;
  msg.set_namespace_("ns");
  v1::StoreChunk* c = msg.add_chunks();  // block 0: complete
  c->set_block_hash(TestHash(1).ToBytes());
  c->set_total_size(kBlock);
  c->set_data(a.data(), a.size());
  c->set_last(true);
  c->set_checksum(Crc(a));
  c = msg.add_chunks();  // block 1: half, then the stream ends
  c->set_block_hash(TestHash(2).ToBytes());
  c->set_total_size(kBlock);
  c->set_data(b.data(), kBlock / 2);
  grpc::ClientContext ctx;
  v1::StoreResponse resp;
  auto writer = stub_->Store(&ctx, &resp);
  ASSERT_TRUE(writer->Write(msg));
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("ended in the middle of block 1"));
  EXPECT_THAT(s.error_message(), HasSubstr("after 32768 of 65536 bytes"));
  std::vector<BlockHash> h2{TestHash(2)};
  EXPECT_EQ(client_->Lookup("ns", h2, {.take_lease = false})->Wait().num_hits, 0);
  EXPECT_EQ(Stats().cold_blocks, 1u);  // only the complete block
}

TEST_F(KvStoreServiceTest, OversizedBlockStreamIsRejected) {
  auto a = TestPayload(1, kBlock);
  v1::StoreRequest msg;
  msg.set_namespace_("ns");
  for (int piece = 0; piece < 3; ++piece) {  // 3 halves of a block
    v1::StoreChunk* c = msg.add_chunks();
    if (piece == 0) {
      c->set_block_hash(TestHash(1).ToBytes());
      c->set_total_size(kBlock);
    }
    c->set_data(a.data(), kBlock / 2);
    c->set_last(piece == 2);
  }
  v1::StoreResponse resp;
  ASSERT_NO_FATAL_FAILURE(StoreRaw(msg, &resp));
  ASSERT_EQ(resp.blocks_size(), 1);
  EXPECT_THAT(resp.blocks(0).error(), HasSubstr("more than total_size 65536 bytes"));
  EXPECT_EQ(Stats().cold_blocks, 0u);
}

TEST_F(KvStoreServiceTest, LoadOfMissingBlockIsAMissNotAnError) {
  StoreBlocks("ns", {1}, kBlock);
  std::vector<BlockHash> hashes{TestHash(1), TestHash(9)};
  std::vector<std::vector<uint8_t>> bufs(2, std::vector<uint8_t>(kBlock));
  std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
  auto r = client_->Load("ns", hashes, dst);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)[0].ok());
  EXPECT_EQ((*r)[1].miss, LoadMiss::kNotFound);

  v1::LoadRequest req;
  req.set_namespace_("ns");
  req.add_block_hashes(TestHash(9).ToBytes());
  grpc::ClientContext ctx;
  auto reader = stub_->Load(&ctx, req);
  v1::LoadResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  ASSERT_EQ(resp.chunks_size(), 1);
  EXPECT_FALSE(resp.chunks(0).ok());
  EXPECT_TRUE(resp.chunks(0).data().empty());
  EXPECT_EQ(resp.chunks(0).miss_reason(), v1::MISS_REASON_NOT_FOUND);
  EXPECT_FALSE(reader->Read(&resp));
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(KvStoreServiceTest, CorruptBlockInEitherTierIsReportedInvalidWithoutBytes) {
  StoreBlocks("ns", {1, 2}, kBlock);
  ASSERT_TRUE(store_->TEST_CorruptHot("ns", TestHash(1), 10).ok());
  ASSERT_TRUE(store_->TEST_CorruptCold("ns", TestHash(2), 10).ok());
  ASSERT_TRUE(store_->TEST_CorruptHot("ns", TestHash(2), 20).ok());  // hot copy bad too
  v1::LoadRequest req;
  req.set_namespace_("ns");
  req.add_block_hashes(TestHash(1).ToBytes());
  req.add_block_hashes(TestHash(2).ToBytes());
  grpc::ClientContext ctx;
  auto reader = stub_->Load(&ctx, req);
  v1::LoadResponse resp;
  int chunks = 0;
  while (reader->Read(&resp)) {
    for (const auto& c : resp.chunks()) {
      ++chunks;
      EXPECT_FALSE(c.ok());
      EXPECT_TRUE(c.data().empty());
      EXPECT_EQ(c.miss_reason(), v1::MISS_REASON_CHECKSUM);
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(chunks, 2);
  EXPECT_EQ(Stats().checksum_failures, 2u);
  std::vector<BlockHash> h{TestHash(1)};
  EXPECT_EQ(client_->Lookup("ns", h, {.take_lease = false})->Wait().num_hits, 0);
}

// Load's messages are hand-encoded (load_wire.h): a client using the
// generated types reads the chunked blocks, every message under the 4 MiB
// limit and at most load_chunk_bytes of payload, pieces in order, the
// verified checksum on each block's last piece.
TEST_F(KvStoreServiceTest, GeneratedStubReadsTheHandEncodedChunkedLoad) {
  StoreBlocks("big", {1, 2}, kBigBlock);
  v1::LoadRequest req;
  req.set_namespace_("big");
  req.add_block_hashes(TestHash(1).ToBytes());
  req.add_block_hashes(TestHash(9).ToBytes());  // a miss between two hits
  req.add_block_hashes(TestHash(2).ToBytes());
  grpc::ClientContext ctx;
  auto reader = stub_->Load(&ctx, req);
  v1::LoadResponse resp;
  std::vector<std::string> got(3);
  std::vector<uint32_t> checksum(3, 0);
  std::vector<bool> last(3, false);
  int messages = 0;
  while (reader->Read(&resp)) {
    ++messages;
    EXPECT_LT(resp.ByteSizeLong(), 4u << 20);
    size_t payload = 0;
    for (const v1::LoadChunk& c : resp.chunks()) {
      ASSERT_GE(c.block_index(), 0);
      ASSERT_LT(c.block_index(), 3);
      const int i = c.block_index();
      EXPECT_FALSE(last[i]) << "piece after the last one of block " << i;
      if (i == 1) {
        EXPECT_FALSE(c.ok());
        EXPECT_EQ(c.miss_reason(), v1::MISS_REASON_NOT_FOUND);
      } else {
        EXPECT_TRUE(c.ok());
        EXPECT_EQ(c.offset(), got[i].size());
        EXPECT_EQ(c.total_size(), kBigBlock);
        got[i] += c.data();
        payload += c.data().size();
        if (c.last()) checksum[i] = c.checksum();
      }
      last[i] = c.last();
    }
    EXPECT_LE(payload,
              static_cast<size_t>(kvstore_service::KvStoreServiceOptions{}.load_chunk_bytes));
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_GE(messages, 5);  // 5 MiB of payload in messages of at most 1 MiB
  for (int i : {0, 2}) {
    const auto want = TestPayload(i == 0 ? 1 : 2, kBigBlock);
    EXPECT_TRUE(last[i]);
    EXPECT_EQ(got[i], std::string(want.begin(), want.end())) << i;
    EXPECT_EQ(checksum[i], Crc(want)) << i;
  }
  EXPECT_TRUE(last[1]);
}

TEST_F(KvStoreServiceTest, ClientReportsCorruptBlocksAsChecksumMissesBesideGoodOnes) {
  StoreBlocks("ns", {1, 2, 3}, kBlock);
  ASSERT_TRUE(store_->TEST_CorruptHot("ns", TestHash(2), 100).ok());
  std::vector<BlockHash> hashes{TestHash(1), TestHash(2), TestHash(3)};
  std::vector<std::vector<uint8_t>> bufs(3, std::vector<uint8_t>(kBlock));
  std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
  auto r = client_->Load("ns", hashes, dst);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)[0].ok());
  EXPECT_EQ((*r)[1].miss, LoadMiss::kChecksum);
  EXPECT_TRUE((*r)[2].ok());
  EXPECT_EQ(bufs[0], TestPayload(1, kBlock));
  EXPECT_EQ(bufs[1], std::vector<uint8_t>(kBlock, 0));  // no byte of the bad block
  EXPECT_EQ(bufs[2], TestPayload(3, kBlock));
}

TEST_F(KvStoreServiceTest, CreateNamespaceAndStatsThroughTheClient) {
  EXPECT_TRUE(*client_->CreateNamespace({.name = "fresh", .block_bytes = 128, .layout = "L"}));
  EXPECT_FALSE(*client_->CreateNamespace({.name = "fresh", .block_bytes = 128, .layout = "L"}));
  auto conflict = client_->CreateNamespace({.name = "fresh", .block_bytes = 256});
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  auto bad = client_->CreateNamespace({.name = "", .block_bytes = 256});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  StoreBlocks("ns", {1, 2}, kBlock);
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->cold_blocks, 2u);
  EXPECT_EQ(stats->stores, 2u);
  EXPECT_EQ(stats->hot_capacity_blocks, 8u);
}

// KvStoreServer (the entry point bench_kvstore and tandem-kvstore use): a
// listener that keeps the bulk port unadvertised, as under TLS, says 0 in
// Stats; the default listener advertises the bulk port it started.
TEST(KvStoreServerTest, ListenAdvertisesTheBulkPortOnlyWhereAsked) {
  TempDir dir;
  auto server = kvstore_service::KvStoreServer::Open(
      {.store = {.data_dir = dir.path()}, .bulk = kvstore_service::BulkLoadServerOptions{}});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_NE((*server)->bulk(), nullptr);
  auto stats_of = [](int port) {
    auto stub = v1::KvStore::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                         grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::StatsResponse resp;
    EXPECT_TRUE(stub->Stats(&ctx, v1::StatsRequest(), &resp).ok());
    return resp;
  };
  absl::StatusOr<int> with = (*server)->Listen("127.0.0.1:0", grpc::InsecureServerCredentials());
  absl::StatusOr<int> without = (*server)->Listen("127.0.0.1:0", grpc::InsecureServerCredentials(),
                                                  /*advertise_bulk_port=*/false);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(stats_of(*with).bulk_load_port(), static_cast<uint32_t>((*server)->bulk()->port()));
  EXPECT_EQ(stats_of(*without).bulk_load_port(), 0u);
}

}  // namespace
}  // namespace tandem
