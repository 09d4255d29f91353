// KvStoreConnectorScheduler and KvStoreConnectorWorker against a real
// tandem.v1.KvStore server in-process: asynchronous lookups (never blocking,
// late = zero hits), loads through staging into the cache, and every load
// failure (checksum, missing, store down) reported as an invalid block with
// the load finished. The stores' tests are in connector_store_test.cc.
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "connector_test_fixture.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tandem/common/pinned_memory.h"
#include "tandem/kernels/cuda_ops.h"
#include "tandem/rpc/tls.h"

namespace tandem::kvconnector {
namespace {

// The engine loop creates the scheduler role on every worker (re)connect:
// a store that hangs on CreateNamespace must not hold it. Create returns
// while the store holds the call, and the namespace is created when the
// store lets it go (with Create waiting, the call would have timed out
// first, 1 s after it was sent).
TEST_F(ConnectorTest, CreatingTheSchedulerRoleDoesNotWaitForCreateNamespace) {
  Gate gate;
  StartStore(0, {}, {}, [&gate] { gate.Pass(); });
  auto sc = MakeScheduler(2000, 100, /*wait_for_namespace=*/false);
  ASSERT_TRUE(sc);
  EXPECT_FALSE(namespace_outcome_->Wait(std::chrono::milliseconds(0)).has_value());
  ASSERT_TRUE(gate.Reached());
  gate.Open();
  std::optional<absl::Status> created = namespace_outcome_->Wait();
  ASSERT_TRUE(created.has_value());
  EXPECT_TRUE(created->ok()) << *created;
}

TEST_F(ConnectorTest, StoreThenLoadRoundTripsThroughStaging) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);

  // Request a: 18 prompt tokens = 4 full blocks + 2; a miss, then stored.
  sched::Request a = MakeRequest("a", Tokens(18), {1, 2, 3, 4, 5});
  int polls = 0;
  EXPECT_FALSE(sc->GetNumNewMatchedTokens(a, 0).has_value()) << "the first call must not block";
  EXPECT_EQ(PollMatch(sc.get(), a, 0, &polls).num_external_tokens, 0);
  sc->UpdateStateAfterAlloc(a, {}, 0);
  for (int b = 1; b <= 5; ++b) cache_.Fill(b, b);

  // Sync step computing the whole prompt: 18 known tokens -> 4 full blocks.
  sched::ScheduledRequestView view{.request = &a, .num_scheduled_tokens = 18, .will_sample = true};
  sched::SchedulerOutput out;
  sched::KvConnectorMetadata meta = sc->BuildConnectorMeta(out, {&view, 1});
  ASSERT_EQ(meta.stores.size(), 1u);
  EXPECT_EQ(meta.stores[0].block_ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(meta.stores[0].block_hashes,
            std::vector<BlockHash>(a.block_hashes.begin(), a.block_hashes.begin() + 4));
  wk->SnapshotStores(meta);
  // Overwriting the cache after the snapshot must not change what is stored.
  for (int b = 1; b <= 4; ++b) cache_.Fill(b, 99);
  for (int b = 1; b <= 4; ++b) cache_.Fill(b, b);  // (restore for the comparison below)
  sched::KvConnectorReport sent;
  WaitSent(wk.get(), 1, &sent);
  EXPECT_EQ(sent.finished_sending[0], "a");
  sc->OnConnectorReport(sent);
  EXPECT_EQ(sc->stats().stores_in_flight, 0);
  // Same step again (next decode): nothing new to store.
  a.num_computed_tokens = 18;
  view.num_scheduled_tokens = 1;
  EXPECT_TRUE(sc->BuildConnectorMeta(out, {&view, 1}).stores.empty());

  // Request b shares the 4 blocks: an external hit of 16 tokens.
  sched::Request b = MakeRequest("b", Tokens(18), {10, 11, 12, 13, 14});
  EXPECT_EQ(PollMatch(sc.get(), b, 0).num_external_tokens, 16);
  sc->UpdateStateAfterAlloc(b, std::span<const int32_t>(b.block_ids).first(4), 16);
  meta = sc->BuildConnectorMeta(out, {});
  ASSERT_EQ(meta.loads.size(), 1u);
  EXPECT_EQ(meta.loads[0].block_ids, (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_TRUE(meta.stores.empty());
  EXPECT_EQ(sc->stats().loads_in_flight, 1);
  sched::KvConnectorReport report;
  RunLoads(wk.get(), meta, &report);
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"b"});
  EXPECT_TRUE(report.invalid_block_ids.empty());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(cache_.blocks[10 + i], cache_.blocks[1 + i]) << i;
  sc->OnConnectorReport(report);
  sc->OnLoadFinished(b, 16);
  // A load is emitted once.
  EXPECT_TRUE(sc->BuildConnectorMeta(out, {}).loads.empty());

  const KvConnectorSchedulerStats s = sc->stats();
  EXPECT_EQ(s.lookups, 2u);
  EXPECT_EQ(s.lookups_with_hits, 1u);
  EXPECT_EQ(s.lookup_hit_tokens, 16u);
  EXPECT_EQ(s.loaded_tokens, 16u);
  EXPECT_EQ(s.loads_in_flight, 0);
  EXPECT_EQ(s.stored_blocks, 4u);
  EXPECT_EQ(wk->stats().blocks_loaded, 4u);
  EXPECT_EQ(wk->stats().blocks_stored, 4u);
  // b's lease was released when its load finished.
  EXPECT_TRUE(WaitActiveLeases(0)) << store_->GetStats().active_leases;

  // A request that finishes while its answered lookup waits for admission
  // releases the lease too.
  sched::Request c = MakeRequest("c", Tokens(18), {20, 21, 22, 23, 24});
  EXPECT_EQ(PollMatch(sc.get(), c, 0).num_external_tokens, 16);
  EXPECT_TRUE(WaitActiveLeases(1));
  EXPECT_FALSE(sc->RequestFinished(c, c.block_ids, 0));
  EXPECT_TRUE(WaitActiveLeases(0)) << store_->GetStats().active_leases;
}

// A lookup answered for a request that then finished (here: aborted while
// it waited) is never served to a later request with the same id: that one
// is looked up afresh.
TEST_F(ConnectorTest, ALookupAnswerOfAFinishedRequestIsNotServedToItsIdsNextRequest) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request first = MakeRequest("x", Tokens(17), {1, 2, 3, 4, 5});
  StoreBlocks(wk.get(), &cache_, first, 0, 3);
  EXPECT_EQ(PollMatch(sc.get(), first, 0).num_external_tokens, 16);
  EXPECT_FALSE(sc->RequestFinished(first, {}, 0));
  sched::Request next = MakeRequest("x", Tokens(17, 700), {1, 2, 3, 4, 5});
  EXPECT_FALSE(sc->GetNumNewMatchedTokens(next, 0).has_value()) << "not asked afresh";
  EXPECT_EQ(PollMatch(sc.get(), next, 0).num_external_tokens, 0);
}

// An answer is about the hashes after the local hit at the time it was
// asked. When the local hit shrinks (its blocks were evicted meanwhile), the
// store is asked again from the new hit: here it holds blocks 2-3 only, so
// from block 0 nothing matches (the old answer, read from block 0, would
// have claimed blocks 0-3).
TEST_F(ConnectorTest, ALookupIsAskedAgainWhenTheLocalHitShrinks) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request r = MakeRequest("r", Tokens(17), {1, 2, 3, 4, 5});
  StoreBlocks(wk.get(), &cache_, r, 2, 3);
  EXPECT_EQ(PollMatch(sc.get(), r, 8).num_external_tokens, 8) << "blocks 2-3 after a local 0-1";
  EXPECT_FALSE(sc->GetNumNewMatchedTokens(r, 0).has_value()) << "not asked again";
  EXPECT_EQ(PollMatch(sc.get(), r, 0).num_external_tokens, 0);
  EXPECT_EQ(sc->stats().lookups, 2u);
  // Each answered lookup's latency reaches the observer (the histogram).
  ASSERT_EQ(lookup_latencies_.size(), 2u);
  double sum = 0;
  for (double l : lookup_latencies_) {
    EXPECT_GT(l, 0.0);
    EXPECT_LT(l, 2.0);
    sum += l;
  }
  EXPECT_NEAR(sum, static_cast<double>(sc->stats().lookup_latency_ns_sum) * 1e-9, 1e-9);
}

// An answer that missed blocks is asked again once it is older than
// lookup_refresh_ms (the store may hold more by then); a younger one is
// kept.
TEST_F(ConnectorTest, AStalePartialAnswerIsRefreshed) {
  StartStore();
  auto sc = MakeScheduler(/*deadline_ms=*/2000, /*refresh_ms=*/100);
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request r = MakeRequest("r", Tokens(17), {1, 2, 3, 4, 5});
  StoreBlocks(wk.get(), &cache_, r, 0, 1);
  EXPECT_EQ(PollMatch(sc.get(), r, 0).num_external_tokens, 8);
  StoreBlocks(wk.get(), &cache_, r, 2, 3);
  std::optional<sched::ExternalMatch> young = sc->GetNumNewMatchedTokens(r, 0);
  ASSERT_TRUE(young.has_value());
  EXPECT_EQ(young->num_external_tokens, 8) << "kept while fresh";
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_FALSE(sc->GetNumNewMatchedTokens(r, 0).has_value()) << "a stale partial answer is kept";
  EXPECT_EQ(PollMatch(sc.get(), r, 0).num_external_tokens, 16);
}

TEST_F(ConnectorTest, CorruptBlockIsReportedInvalidAndStoredAgain) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  (void)PollMatch(sc.get(), a, 0);
  sc->UpdateStateAfterAlloc(a, {}, 0);
  for (int b = 1; b <= 4; ++b) cache_.Fill(b, b);
  sched::ScheduledRequestView v{.request = &a, .num_scheduled_tokens = 17, .will_sample = true};
  sched::SchedulerOutput out;
  wk->SnapshotStores(sc->BuildConnectorMeta(out, {&v, 1}));
  sched::KvConnectorReport sent;
  WaitSent(wk.get(), 1, &sent);
  // Flip a byte of block 2 (index 1) wherever the store keeps it.
  const std::string ns = NamespaceFor("fp", "layout");
  if (store_->TEST_InHot(ns, a.block_hashes[1])) {
    ASSERT_TRUE(store_->TEST_CorruptHot(ns, a.block_hashes[1], 7).ok());
  }
  ASSERT_TRUE(store_->TEST_CorruptCold(ns, a.block_hashes[1], 7).ok());

  sched::Request b = MakeRequest("b", Tokens(17), {20, 21, 22, 23, 24});
  EXPECT_EQ(PollMatch(sc.get(), b, 0).num_external_tokens, 16);
  sc->UpdateStateAfterAlloc(b, std::span<const int32_t>(b.block_ids).first(4), 16);
  auto meta = sc->BuildConnectorMeta(out, {});
  sched::KvConnectorReport report;
  RunLoads(wk.get(), meta, &report);
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"b"});
  ASSERT_EQ(report.invalid_block_ids, std::vector<int32_t>{21});
  EXPECT_EQ(wk->stats().load_failed_checksum, 1u);
  sc->OnConnectorReport(report);
  sc->OnLoadFinished(b, 4);
  // b recomputes blocks 1..3; the store lost the bad one, so it is stored again.
  b.num_computed_tokens = 4;
  sched::ScheduledRequestView bv{.request = &b, .num_scheduled_tokens = 13, .will_sample = true};
  auto again = sc->BuildConnectorMeta(out, {&bv, 1});
  ASSERT_EQ(again.stores.size(), 1u);
  EXPECT_EQ(again.stores[0].block_ids, (std::vector<int32_t>{21, 22, 23}));
}

// A step's loads go into the cache in one call (one wait on a GPU); when
// it fails, every block of it is reported invalid (recomputed) and counted
// as a failed load, and the load still finishes. Each step's loads are
// timed (on_load).
TEST_F(ConnectorTest, AFailedCopyIntoTheCacheRecomputesEveryLoadedBlock) {
  StartStore();
  auto sc = MakeScheduler();
  std::vector<std::vector<int32_t>> calls;
  bool fail = false;
  KvStoreConnectorWorker::CopyFromHost into_cache = cache_.FromHost();
  std::vector<KvLoadTiming> timings;
  auto wk = MakeWorker(
      {.from_host =
           [&](std::span<const int32_t> ids, std::span<const std::span<const std::byte>> in)
               -> absl::StatusOr<KvStoreConnectorWorker::CopyIn> {
             calls.emplace_back(ids.begin(), ids.end());
             std::this_thread::sleep_for(std::chrono::milliseconds(20));
             if (fail) return absl::InternalError("device lost");
             return into_cache(ids, in);
           },
       .on_load = [&](const KvLoadTiming& t) { timings.push_back(t); }});
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  wk->SnapshotStores(ComputeStep(sc.get(), &a));
  sched::KvConnectorReport sent;
  WaitSent(wk.get(), 1, &sent);
  sc->OnConnectorReport(sent);

  ASSERT_TRUE(LoadBack(sc.get(), wk.get(), "b", Tokens(17)));
  ASSERT_EQ(calls, (std::vector<std::vector<int32_t>>{{20, 21, 22, 23}}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(cache_.blocks[20 + i], cache_.blocks[1 + i]) << i;
  // The step's load is timed by phase for the worker's metrics: the copy
  // into the cache (here 20 ms) apart from the read from the store.
  ASSERT_EQ(timings.size(), 1u);
  EXPECT_EQ(timings[0].blocks, 4);
  EXPECT_EQ(timings[0].bytes, 4 * kBlockBytes);
  EXPECT_GE(timings[0].copy_seconds, 0.02);
  EXPECT_GT(timings[0].read_seconds, 0.0);

  fail = true;
  sched::Request c = MakeRequest("c", Tokens(17), {26, 27, 28, 29, 30});
  EXPECT_EQ(PollMatch(sc.get(), c, 0).num_external_tokens, 16);
  sc->UpdateStateAfterAlloc(c, std::span<const int32_t>(c.block_ids).first(4), 16);
  sched::SchedulerOutput out;
  sched::KvConnectorReport report;
  RunLoads(wk.get(), sc->BuildConnectorMeta(out, {}), &report);
  EXPECT_EQ(calls.size(), 2u);
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"c"});
  EXPECT_EQ(report.invalid_block_ids, (std::vector<int32_t>{26, 27, 28, 29}));
  EXPECT_EQ(report.num_load_failed_rpc, 4);
  EXPECT_EQ(wk->stats().load_failed_rpc, 4u);
  EXPECT_EQ(wk->stats().blocks_loaded, 4u);  // b's only
  ASSERT_EQ(timings.size(), 2u);
  EXPECT_EQ(timings[1].blocks, 4);
  EXPECT_EQ(timings[1].bytes, 4 * kBlockBytes);  // arrived, then failed into the cache
}

TEST_F(ConnectorTest, LateLookupCountsAsZeroHits) {
  StartStore(/*lookup_delay_ms=*/400);
  auto wk = MakeWorker();
  auto sc = MakeScheduler(/*deadline_ms=*/30);
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(9), {1, 2, 3});
  sched::SchedulerOutput out;
  (void)PollMatch(sc.get(), a, 0);
  sc->UpdateStateAfterAlloc(a, {}, 0);
  sched::ScheduledRequestView v{.request = &a, .num_scheduled_tokens = 9, .will_sample = true};
  wk->SnapshotStores(sc->BuildConnectorMeta(out, {&v, 1}));
  sched::KvConnectorReport sent;
  WaitSent(wk.get(), 1, &sent);
  ASSERT_EQ(wk->stats().blocks_stored, 2u);

  sched::Request b = MakeRequest("b", Tokens(9), {4, 5, 6});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(PollMatch(sc.get(), b, 0).num_external_tokens, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(350))
      << "the lookup waited for the late answer";
  EXPECT_EQ(sc->stats().lookups_failed, 2u);
}

TEST_F(ConnectorTest, SaltsDoNotShareBlocks) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(9), {1, 2, 3}, "tenant-1");
  (void)PollMatch(sc.get(), a, 0);
  sc->UpdateStateAfterAlloc(a, {}, 0);
  sched::ScheduledRequestView v{.request = &a, .num_scheduled_tokens = 9, .will_sample = true};
  sched::SchedulerOutput out;
  wk->SnapshotStores(sc->BuildConnectorMeta(out, {&v, 1}));
  sched::KvConnectorReport sent;
  WaitSent(wk.get(), 1, &sent);
  EXPECT_EQ(PollMatch(sc.get(), MakeRequest("b", Tokens(9), {4, 5, 6}, "tenant-2"), 0)
                .num_external_tokens,
            0);
  EXPECT_EQ(PollMatch(sc.get(), MakeRequest("c", Tokens(9), {4, 5, 6}, "tenant-1"), 0)
                .num_external_tokens,
            8);
}

TEST_F(ConnectorTest, StoreDownMeansMissesAndFailedLoadsNotHangs) {
  // A port nothing listens on.
  target_ = "127.0.0.1:1";
  auto sc = MakeScheduler(/*deadline_ms=*/200);
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(9), {1, 2, 3});
  EXPECT_EQ(PollMatch(sc.get(), a, 0).num_external_tokens, 0);
  sched::KvConnectorMetadata meta;
  meta.loads.push_back({.request_id = "x",
                        .block_hashes = {a.block_hashes[0], a.block_hashes[1]},
                        .block_ids = {7, 8}});
  sched::KvConnectorReport report;
  RunLoads(wk.get(), meta, &report);
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"x"});
  EXPECT_EQ(report.invalid_block_ids, (std::vector<int32_t>{7, 8}));
}

bool HaveCudaDevice() {
#if defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA
  return kernels::cuda::DeviceCount() > 0;
#else
  return false;
#endif
}

// Loads land in staging memory first: CUDA-pinned (cudaHostAlloc) when a
// device is present, so the copies into a GPU cache are DMA; page-aligned
// (locked where allowed) otherwise, or when the option is off.
TEST_F(ConnectorTest, LoadStagingIsCudaPinnedWhenADeviceIsPresent) {
  StartStore();
  auto sc = MakeScheduler();
  ASSERT_TRUE(sc);
  for (bool use_cuda : {true, false}) {
    SCOPED_TRACE(use_cuda ? "use_cuda_host_alloc" : "no cudaHostAlloc");
    auto wk = MakeWorker({.use_cuda_host_alloc = use_cuda});
    ASSERT_TRUE(wk);
    EXPECT_EQ(wk->stats().staging, StagingMemory::kNone);
    sched::Request a =
        MakeRequest(use_cuda ? "a" : "b", Tokens(17, use_cuda ? 100 : 900), {1, 2, 3, 4, 5});
    wk->SnapshotStores(ComputeStep(sc.get(), &a));
    ASSERT_TRUE(wk->WaitForStores(5000));
    sched::KvConnectorMetadata meta;
    meta.loads.push_back({.request_id = "l",
                          .block_hashes = {a.block_hashes.begin(), a.block_hashes.begin() + 4},
                          .block_ids = {10, 11, 12, 13}});
    sched::KvConnectorReport report;
    RunLoads(wk.get(), meta, &report);
    EXPECT_TRUE(report.invalid_block_ids.empty());
    for (int i = 0; i < 4; ++i) EXPECT_EQ(cache_.blocks[10 + i], cache_.blocks[1 + i]) << i;
    const KvConnectorWorkerStats st = wk->stats();
    EXPECT_GE(st.staging_bytes, 4 * kBlockBytes);
    if (use_cuda && HaveCudaDevice()) {
      EXPECT_EQ(st.staging, StagingMemory::kCudaPinned) << StagingMemoryName(st.staging);
    } else {
      EXPECT_TRUE(st.staging == StagingMemory::kLocked || st.staging == StagingMemory::kPageable)
          << StagingMemoryName(st.staging);
    }
  }
}

#if defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA

// The tree's pinned buffer (tandem/common/pinned_memory.h) is CUDA-pinned
// with a device and round-trips through it.
TEST(CudaHostAllocTest, PinnedMemoryRoundTripsThroughTheDevice) {
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr size_t kBytes = 3 << 20;
  absl::StatusOr<PinnedBuffer> buffer = PinnedBuffer::Allocate(kBytes, {.what = "test"});
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->kind(), PinnedKind::kCudaPinned) << PinnedKindName(buffer->kind());
  void* host = buffer->data();
  auto* bytes = static_cast<uint8_t*>(host);
  for (size_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  void* device = nullptr;
  ASSERT_EQ(kernels::cuda::Malloc(&device, kBytes), 0);
  ASSERT_EQ(kernels::cuda::CopyToDevice(device, host, kBytes), 0);
  std::memset(host, 0, kBytes);
  ASSERT_EQ(kernels::cuda::CopyToHost(host, device, kBytes), 0);
  for (size_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(bytes[i], static_cast<uint8_t>(i * 31 + 7)) << "byte " << i;
  }
  EXPECT_EQ(kernels::cuda::Free(device), 0);
}
#endif

TEST(KvStoreConnectorOptionsTest, BulkLoadIsAutoOffOrAnAddress) {
  for (const char* ok : {"auto", "off", "kvstore:50071", "[::1]:7"}) {
    const KvStoreConnectorOptions o{.target = "h:1", .bulk_load = ok};
    EXPECT_TRUE(o.Validate().ok()) << ok;
  }
  for (const char* bad : {"", "on", "kvstore", "kvstore:port"}) {
    const KvStoreConnectorOptions o{.target = "h:1", .bulk_load = bad};
    absl::Status s = o.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("bulk_load"), absl::string_view::npos) << bad << ": " << s;
  }
}

TEST(KvStoreConnectorOptionsTest, LoadThreadsAreOneTo64) {
  for (int32_t ok : {1, 4, 64}) {
    EXPECT_TRUE((KvStoreConnectorOptions{.target = "h:1", .load_threads = ok}.Validate().ok()))
        << ok;
  }
  for (int32_t bad : {0, -1, 65}) {
    const absl::Status s = KvStoreConnectorOptions{.target = "h:1", .load_threads = bad}.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("load_threads"), absl::string_view::npos) << bad << ": " << s;
  }
}

// The bulk port speaks TLS too: an explicit address is taken under TLS as
// without it (it used to be refused as plain TCP).
TEST(KvStoreConnectorOptionsTest, AnExplicitBulkPortIsTakenUnderTls) {
  rpc::SetClientTls({.ca_file = "/etc/ssl/certs/ca-certificates.crt"});
  const KvStoreConnectorOptions o{.target = "h:1", .bulk_load = "kvstore:50071"};
  const absl::Status s = o.Validate();
  rpc::SetClientTls({});
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace tandem::kvconnector
