// KvStoreConnectorScheduler and KvStoreConnectorWorker against a real
// tandem.v1.KvStore server in-process: asynchronous lookups (never blocking,
// late = zero hits), stores bounded by known token ids and never repeated,
// loads through staging into the cache, and every load failure (checksum,
// missing, store down) reported as an invalid block with the load finished.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "../kvstore/test_util.h"
#include "../kvstore_service/loopback_server.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kvstore_service.h"
#include "tandem/kernels/cuda_ops.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/kvstore/kv_store.h"

namespace tandem::kvconnector {
namespace {

using kvstore::testing::TempDir;

constexpr int32_t kBlockSize = 4;
constexpr int64_t kBlockBytes = 256;
constexpr int32_t kCacheBlocks = 32;

// A fake block-major KV cache.
struct FakeCache {
  std::vector<std::vector<std::byte>> blocks =
      std::vector<std::vector<std::byte>>(kCacheBlocks, std::vector<std::byte>(kBlockBytes));
  void Fill(int32_t block, int seed) {
    for (int64_t i = 0; i < kBlockBytes; ++i) {
      blocks[block][i] = static_cast<std::byte>((seed * 131 + i * 7) & 0xff);
    }
  }
  KvStoreConnectorWorker::CopyToHost ToHost() {
    return [this](int32_t b, std::span<std::byte> out) {
      std::memcpy(out.data(), blocks.at(b).data(), kBlockBytes);
      return absl::OkStatus();
    };
  }
  KvStoreConnectorWorker::CopyFromHost FromHost() {
    return [this](int32_t b, std::span<const std::byte> in) {
      std::memcpy(blocks.at(b).data(), in.data(), kBlockBytes);
      return absl::OkStatus();
    };
  }
};

std::vector<int32_t> Tokens(int n, int base = 100) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(base + i);
  return t;
}

// Options of the worker role beside the store address.
struct WorkerOptions {
  int64_t max_pending_store_bytes = int64_t{256} << 20;
  std::string target;  // empty: the test's store
  bool use_cuda_host_alloc = true;
};

class ConnectorTest : public ::testing::Test {
 protected:
  void StartStore(int64_t lookup_delay_ms = 0, std::function<void()> before_store = {}) {
    auto store = kvstore::KvStoreEngine::Open({.data_dir = dir_.path(),
                                         .hot_capacity_bytes = 1 << 20,
                                         .hot_slot_bytes = 4096,
                                         .lock_hot_memory = false});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    service_ = std::make_unique<kvstore_service::KvStoreServiceImpl>(
        store_.get(),
        kvstore_service::KvStoreServiceOptions{.debug_lookup_delay_ms = lookup_delay_ms,
                                               .debug_before_store = std::move(before_store)});
    testutil::LoopbackServer s = testutil::StartOnLoopback(service_.get());
    ASSERT_NE(s.server, nullptr);
    server_ = std::move(s.server);
    target_ = s.target;
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  std::vector<double> lookup_latencies_;  // seconds, from on_lookup_latency
  std::unique_ptr<KvStoreConnectorScheduler> MakeScheduler(int64_t deadline_ms = 2000,
                                                           int64_t refresh_ms = 100) {
    auto c = KvStoreConnectorScheduler::Create(
        {.target = target_,
         .lookup_deadline_ms = deadline_ms,
         .lookup_refresh_ms = refresh_ms,
         .on_lookup_latency = [this](double s) { lookup_latencies_.push_back(s); }},
        "fp", "layout", kBlockBytes, kBlockSize);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::unique_ptr<KvStoreConnectorWorker> MakeWorker(const WorkerOptions& o = {}) {
    auto w = KvStoreConnectorWorker::Create({.target = o.target.empty() ? target_ : o.target,
                                             .transfer_deadline_ms = 2000,
                                             .max_pending_store_bytes = o.max_pending_store_bytes,
                                             .use_cuda_host_alloc = o.use_cuda_host_alloc},
                                            "fp", "layout", kBlockBytes, cache_.ToHost(),
                                            cache_.FromHost());
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }

  // A request whose prompt is `tokens`, with the hashes the scheduler keeps.
  static sched::Request MakeRequest(const std::string& id, std::vector<int32_t> tokens,
                                    std::vector<int32_t> block_ids, const std::string& salt = "") {
    sched::Request r;
    r.request_id = id;
    r.num_prompt_tokens = static_cast<int32_t>(tokens.size());
    r.all_token_ids = std::move(tokens);
    r.block_ids = std::move(block_ids);
    r.root_hash = ComputeRootHash(HashRootParams{.model_fingerprint = "fp",
                                                 .kv_layout = "layout",
                                                 .block_size = kBlockSize,
                                                 .cache_salt = salt});
    ExtendBlockHashes(r.root_hash, r.all_token_ids, kBlockSize, &r.block_hashes);
    return r;
  }

  // Polls like the scheduler does once per step, until an answer arrives.
  static sched::ExternalMatch PollMatch(KvStoreConnectorScheduler* c, const sched::Request& r,
                                        int32_t local, int* num_polls = nullptr) {
    for (int i = 0; i < 5000; ++i) {
      std::optional<sched::ExternalMatch> m = c->GetNumNewMatchedTokens(r, local);
      if (m.has_value()) {
        if (num_polls) *num_polls = i + 1;
        return *m;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "lookup never resolved";
    return {};
  }

  static void WaitSent(KvStoreConnectorWorker* w, size_t n, sched::KvConnectorReport* report) {
    for (int i = 0; i < 5000 && report->finished_sending.size() < n; ++i) {
      w->TakeFinishedSending(report);
      if (report->finished_sending.size() < n) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    ASSERT_EQ(report->finished_sending.size(), n);
  }

  // Request `id` (17 tokens: 4 full blocks in cache blocks 1..4) computes its
  // prompt in one step; returns the step's metadata (one store entry).
  sched::KvConnectorMetadata ComputeStep(KvStoreConnectorScheduler* sc, sched::Request* r) {
    (void)PollMatch(sc, *r, 0);
    sc->UpdateStateAfterAlloc(*r, {}, 0);
    for (int b = 1; b <= 4; ++b) cache_.Fill(b, b);
    sched::ScheduledRequestView v{.request = r, .num_scheduled_tokens = 17, .will_sample = true};
    sched::SchedulerOutput out;
    return sc->BuildConnectorMeta(out, {&v, 1});
  }

  // The blocks the scheduler emits for request `id` whose 4 full blocks are
  // a local prefix hit (no lookup asks the store about them).
  static std::vector<int32_t> StoredOnLocalHit(KvStoreConnectorScheduler* sc,
                                               const std::string& id) {
    sched::Request b = MakeRequest(id, Tokens(17), {1, 2, 3, 4, 5});
    EXPECT_EQ(sc->GetNumNewMatchedTokens(b, 16)->num_external_tokens, 0);
    sc->UpdateStateAfterAlloc(b, {}, 0);
    b.num_computed_tokens = 16;
    sched::ScheduledRequestView v{.request = &b, .num_scheduled_tokens = 1, .will_sample = true};
    sched::SchedulerOutput out;
    sched::KvConnectorMetadata meta = sc->BuildConnectorMeta(out, {&v, 1});
    return meta.stores.empty() ? std::vector<int32_t>{} : meta.stores[0].block_ids;
  }

  bool WaitActiveLeases(uint64_t n) {
    return kvstore::testing::WaitFor([&] { return store_->GetStats().active_leases == n; },
                                     std::chrono::seconds(2));
  }

  TempDir dir_;
  std::unique_ptr<kvstore::KvStoreEngine> store_;
  std::unique_ptr<kvstore_service::KvStoreServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  FakeCache cache_;
};

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
  wk->LoadBlocks(meta, &report);
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

// A store that stalls never holds up a step (issue 32): while a Store call
// waits in the store, the later steps' loads and snapshots on the step
// thread return; once the store goes on, the stored bytes are the ones
// computed at snapshot time, though the next steps overwrote the cache.
TEST_F(ConnectorTest, AStallingStoreNeverHoldsUpAStep) {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int stalled = 0;  // Store calls waiting at the gate
  StartStore(/*lookup_delay_ms=*/0, [&] {
    std::unique_lock<std::mutex> lock(mu);
    ++stalled;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  });
  auto release = [&] {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  };
  struct Release {
    std::function<void()> fn;
    ~Release() { fn(); }  // the server's shutdown waits for the stalled calls
  } guard{release};
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);

  // Three requests of 4 full blocks each, computed in one step each, in
  // cache blocks 1..4, 6..9 and 11..14.
  constexpr int kRequests = 3;
  std::vector<sched::Request> requests;
  for (int i = 0; i < kRequests; ++i) {
    const int32_t first = 1 + 5 * i;
    requests.push_back(MakeRequest("r" + std::to_string(i), Tokens(17, 1000 * (i + 1)),
                                   {first, first + 1, first + 2, first + 3, first + 4}));
  }
  auto step = [&](int i) {
    sched::Request& r = requests[i];
    (void)PollMatch(sc.get(), r, 0);
    sc->UpdateStateAfterAlloc(r, {}, 0);
    for (int b = 0; b < 4; ++b) cache_.Fill(r.block_ids[b], 10 * i + b);
    sched::ScheduledRequestView v{.request = &r, .num_scheduled_tokens = 17, .will_sample = true};
    sched::SchedulerOutput out;
    sched::KvConnectorMetadata meta = sc->BuildConnectorMeta(out, {&v, 1});
    ASSERT_EQ(meta.stores.size(), 1u);
    sched::KvConnectorReport report;
    wk->LoadBlocks(meta, &report);  // the step's loads (none), then its forward pass
    wk->SnapshotStores(meta);
  };
  step(0);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return stalled > 0; }))
        << "the first store never reached the store";
  }
  // The store is stuck in a Store call: the next steps run all the same. (A
  // step that waited for the store would never come back: the gate is shut.)
  auto later_steps = std::async(std::launch::async, [&] {
    for (int i = 1; i < kRequests; ++i) step(i);
  });
  ASSERT_EQ(later_steps.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "a step waited for the stalled store";
  later_steps.get();
  EXPECT_EQ(wk->stats().stores_in_flight, kRequests);
  // Later steps overwrite every block the snapshots were taken from.
  for (int b = 0; b < kCacheBlocks; ++b) cache_.Fill(b, 99);

  release();
  sched::KvConnectorReport sent;
  WaitSent(wk.get(), kRequests, &sent);
  sc->OnConnectorReport(sent);
  EXPECT_EQ(wk->stats().blocks_stored, 4u * kRequests);
  EXPECT_EQ(wk->stats().blocks_store_dropped, 0u);

  // Each request's blocks load back as they were computed.
  FakeCache expected;
  for (int i = 0; i < kRequests; ++i) {
    sched::Request again =
        MakeRequest("again" + std::to_string(i), Tokens(17, 1000 * (i + 1)), {20, 21, 22, 23, 24});
    ASSERT_EQ(PollMatch(sc.get(), again, 0).num_external_tokens, 16) << i;
    sc->UpdateStateAfterAlloc(again, std::span<const int32_t>(again.block_ids).first(4), 16);
    sched::SchedulerOutput out;
    sched::KvConnectorMetadata meta = sc->BuildConnectorMeta(out, {});
    ASSERT_EQ(meta.loads.size(), 1u);
    sched::KvConnectorReport report;
    wk->LoadBlocks(meta, &report);
    ASSERT_EQ(report.finished_recving, std::vector<std::string>{again.request_id});
    for (int b = 0; b < 4; ++b) {
      expected.Fill(0, 10 * i + b);
      EXPECT_EQ(cache_.blocks[20 + b], expected.blocks[0]) << "request " << i << " block " << b;
    }
    sc->OnConnectorReport(report);
    sc->OnLoadFinished(again, 16);
    EXPECT_FALSE(sc->RequestFinished(again, again.block_ids, 0));
  }
}

TEST_F(ConnectorTest, StoresStopAtKnownTokensInAsyncMode) {
  StartStore();
  auto sc = MakeScheduler();
  ASSERT_TRUE(sc);
  sched::Request a = MakeRequest("a", Tokens(16), {1, 2, 3, 4});
  (void)PollMatch(sc.get(), a, 0);
  sc->UpdateStateAfterAlloc(a, {}, 0);
  // The step computes all 16 prompt tokens and samples a placeholder: the
  // storable bound is min(num_computed + n, num_tokens) = 16 (exact: the
  // placeholder is not among the computed tokens) -> 4 blocks.
  sched::ScheduledRequestView v{
      .request = &a, .num_scheduled_tokens = 16, .will_sample = true, .adds_placeholder = true};
  sched::SchedulerOutput out;
  EXPECT_EQ(sc->BuildConnectorMeta(out, {&v, 1}).stores.at(0).block_ids.size(), 4u);

  // A decode request with 17 known tokens and 2 placeholders, the older of
  // which a step in flight computes: this step computes the newer one. Its
  // block made of tokens 16..19 contains placeholders and must not be
  // stored.
  sched::Request d = MakeRequest("d", Tokens(17, 500), {5, 6, 7, 8, 9});
  (void)PollMatch(sc.get(), d, 0);
  sc->UpdateStateAfterAlloc(d, {}, 0);
  d.num_computed_tokens = 18;  // 17 known + the older placeholder
  d.num_output_placeholders = 2;
  sched::ScheduledRequestView dv{
      .request = &d, .num_scheduled_tokens = 1, .will_sample = true, .adds_placeholder = true};
  ASSERT_EQ(dv.num_storable_tokens(), 17);
  auto meta = sc->BuildConnectorMeta(out, {&dv, 1});
  ASSERT_EQ(meta.stores.size(), 1u);
  EXPECT_EQ(meta.stores[0].block_ids, (std::vector<int32_t>{5, 6, 7, 8}));
}

// Puts blocks `first..last` (inclusive) of `tokens`' chain in the store,
// from cache blocks 10.. (filled with seed = block index), through the
// worker role.
void StoreBlocks(KvStoreConnectorWorker* wk, FakeCache* cache, const sched::Request& r, int first,
                 int last) {
  sched::KvConnectorMetadata meta;
  sched::KvStoreOp st{.request_id = "filler"};
  for (int b = first; b <= last; ++b) {
    cache->Fill(10 + b, b);
    st.block_ids.push_back(10 + b);
    st.block_hashes.push_back(r.block_hashes[static_cast<size_t>(b)]);
  }
  meta.stores.push_back(std::move(st));
  wk->SnapshotStores(meta);
  ASSERT_TRUE(wk->WaitForStores(5000));
  sched::KvConnectorReport sent;
  wk->TakeFinishedSending(&sent);
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

// Two requests of one step (async: each samples a placeholder) with the same
// prompt store each block once: the second finds the first's entry known.
TEST_F(ConnectorTest, BlocksOfTwoRequestsOfOneStepAreStoredOnce) {
  StartStore();
  auto sc = MakeScheduler();
  ASSERT_TRUE(sc);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  sched::Request b = MakeRequest("b", Tokens(17), {6, 7, 8, 9, 10});
  for (sched::Request* r : {&a, &b}) {
    (void)PollMatch(sc.get(), *r, 0);
    sc->UpdateStateAfterAlloc(*r, {}, 0);
  }
  const sched::ScheduledRequestView views[] = {
      {.request = &a, .num_scheduled_tokens = 17, .will_sample = true, .adds_placeholder = true},
      {.request = &b, .num_scheduled_tokens = 17, .will_sample = true, .adds_placeholder = true}};
  sched::SchedulerOutput out;
  const sched::KvConnectorMetadata meta = sc->BuildConnectorMeta(out, views);
  ASSERT_EQ(meta.stores.size(), 1u);
  EXPECT_EQ(meta.stores[0].request_id, "a");
  EXPECT_EQ(meta.stores[0].block_ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(sc->stats().stored_blocks, 4u);
}

// A request that ends before a step covered its last full block: its final
// store (RequestFinished) goes out in the next step's metadata, flagged
// before_forward, and the worker copies it out in LoadBlocks, before that
// step's loads write the (freed and reused) block.
TEST_F(ConnectorTest, AFinalStoreIsReadBeforeTheNextStepsLoadsReuseItsBlocks) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  // "a" (8 tokens) ran a step that stored block 0 (1 of its 2 full blocks
  // known then), and ends with its block 1 (cache block 2) complete.
  sched::Request a = MakeRequest("a", Tokens(8), {1, 2});
  (void)PollMatch(sc.get(), a, 0);
  sc->UpdateStateAfterAlloc(a, {}, 0);
  a.num_computed_tokens = 0;
  sched::ScheduledRequestView v{.request = &a, .num_scheduled_tokens = 4};
  sched::SchedulerOutput out;
  const sched::KvConnectorMetadata first = sc->BuildConnectorMeta(out, {&v, 1});
  ASSERT_EQ(first.stores.at(0).block_ids, std::vector<int32_t>{1});
  cache_.Fill(1, 41);
  sched::KvConnectorReport ignored;
  wk->LoadBlocks(first, &ignored);
  wk->SnapshotStores(first);
  cache_.Fill(2, 42);
  const std::vector<std::byte> a_block = cache_.blocks[2];
  EXPECT_FALSE(sc->RequestFinished(a, a.block_ids, 8)) << "its blocks are freed at once";
  // The next step reuses cache block 2 as the destination of b's load.
  sched::Request b = MakeRequest("b", Tokens(9, 300), {2, 3, 4});
  StoreBlocks(wk.get(), &cache_, b, 0, 0);
  ASSERT_EQ(PollMatch(sc.get(), b, 0).num_external_tokens, 4);
  sc->UpdateStateAfterAlloc(b, std::vector<int32_t>{2}, 4);
  sched::KvConnectorMetadata next = sc->BuildConnectorMeta(out, {});
  ASSERT_EQ(next.stores.size(), 1u);
  EXPECT_TRUE(next.stores[0].before_forward);
  EXPECT_EQ(next.stores[0].block_ids, std::vector<int32_t>{2});
  ASSERT_EQ(next.loads.size(), 1u);
  sched::KvConnectorReport report;
  wk->LoadBlocks(next, &report);
  EXPECT_NE(cache_.blocks[2], a_block) << "b's load wrote block 2";
  wk->SnapshotStores(next);
  ASSERT_TRUE(wk->WaitForStores(5000));
  // The store holds a's block as it was before the load.
  sched::Request probe = MakeRequest("probe", Tokens(8), {5, 6});
  ASSERT_EQ(PollMatch(sc.get(), probe, 0).num_external_tokens, 8);
  sc->UpdateStateAfterAlloc(probe, std::vector<int32_t>{5, 6}, 8);
  sched::KvConnectorReport loaded;
  wk->LoadBlocks(sc->BuildConnectorMeta(out, {}), &loaded);
  EXPECT_TRUE(loaded.invalid_block_ids.empty());
  EXPECT_EQ(cache_.blocks[6], a_block);
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
  wk->LoadBlocks(meta, &report);
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
  wk->LoadBlocks(meta, &report);
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"x"});
  EXPECT_EQ(report.invalid_block_ids, (std::vector<int32_t>{7, 8}));
}

// A store entry dropped because the worker's queue was full still finishes;
// the scheduler learns the store lacks its blocks and forgets them, so the
// next request holding them (here as a local prefix hit, which asks the
// store nothing) stores them again.
TEST_F(ConnectorTest, DroppedStoreIsForgottenAndStoredAgain) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker({.max_pending_store_bytes = kBlockBytes});  // 4 blocks never fit
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  const sched::KvConnectorMetadata meta = ComputeStep(sc.get(), &a);
  ASSERT_EQ(meta.stores.size(), 1u);
  wk->SnapshotStores(meta);
  ASSERT_TRUE(wk->WaitForStores(5000));
  sched::KvConnectorReport sent;
  wk->TakeFinishedSending(&sent);
  EXPECT_EQ(sent.finished_sending, std::vector<std::string>{"a"});
  EXPECT_EQ(wk->stats().blocks_store_dropped, 4u);
  EXPECT_EQ(wk->stats().stores_in_flight, 0);
  sc->OnConnectorReport(sent);
  EXPECT_EQ(sc->stats().stores_in_flight, 0);
  EXPECT_EQ(sc->stats().stored_blocks_lost, 4u);
  EXPECT_EQ(StoredOnLocalHit(sc.get(), "b"), (std::vector<int32_t>{1, 2, 3, 4}));
}

// A step that fails on the worker after LoadBlocks and before SnapshotStores:
// its store entries are reported finished with the next step (not never),
// and their blocks are stored again later.
TEST_F(ConnectorTest, StoresOfAStepThatFailedBeforeItsSnapshotFinish) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  const sched::KvConnectorMetadata failed_step = ComputeStep(sc.get(), &a);
  ASSERT_EQ(failed_step.stores.size(), 1u);
  sched::KvConnectorReport report;
  wk->LoadBlocks(failed_step, &report);  // ... and the forward pass fails
  EXPECT_EQ(sc->stats().stores_in_flight, 1);
  const sched::KvConnectorMetadata next_step;
  wk->LoadBlocks(next_step, &report);
  wk->SnapshotStores(next_step);
  ASSERT_TRUE(wk->WaitForStores(5000));
  wk->TakeFinishedSending(&report);
  EXPECT_EQ(report.finished_sending, std::vector<std::string>{"a"});
  EXPECT_EQ(wk->stats().blocks_store_dropped, 4u);
  sc->OnConnectorReport(report);
  EXPECT_EQ(sc->stats().stores_in_flight, 0);
  EXPECT_EQ(StoredOnLocalHit(sc.get(), "b"), (std::vector<int32_t>{1, 2, 3, 4}));
}

// The worker cannot reach the store (the scheduler can): its Store RPC fails,
// the entry finishes, and the scheduler forgets the blocks.
TEST_F(ConnectorTest, FailedStoreIsForgottenAndStoredAgain) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker({.target = "127.0.0.1:1"});
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  wk->SnapshotStores(ComputeStep(sc.get(), &a));
  ASSERT_TRUE(wk->WaitForStores(10'000));
  sched::KvConnectorReport sent;
  wk->TakeFinishedSending(&sent);
  EXPECT_EQ(sent.finished_sending, std::vector<std::string>{"a"});
  EXPECT_EQ(wk->stats().blocks_store_failed, 4u);
  sc->OnConnectorReport(sent);
  EXPECT_EQ(sc->stats().stored_blocks_lost, 4u);
  EXPECT_EQ(sc->stats().stores_in_flight, 0);
  EXPECT_EQ(StoredOnLocalHit(sc.get(), "b"), (std::vector<int32_t>{1, 2, 3, 4}));
}

// A store that succeeded keeps its blocks known: a local hit stores nothing,
// and many entries queued at once all finish (in one batched RPC or more).
TEST_F(ConnectorTest, SucceededStoresStayKnownAndEveryEntryFinishes) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  wk->SnapshotStores(ComputeStep(sc.get(), &a));
  for (int i = 0; i < 20; ++i) {
    sched::Request r =
        MakeRequest("r" + std::to_string(i), Tokens(17, 1000 * (i + 1)), {1, 2, 3, 4, 5});
    wk->SnapshotStores(ComputeStep(sc.get(), &r));
  }
  EXPECT_EQ(sc->stats().stores_in_flight, 21);
  ASSERT_TRUE(wk->WaitForStores(5000));
  sched::KvConnectorReport sent;
  wk->TakeFinishedSending(&sent);
  EXPECT_EQ(sent.finished_sending.size(), 21u);
  EXPECT_EQ(sent.finished_sending[0], "a");
  sc->OnConnectorReport(sent);
  EXPECT_EQ(sc->stats().stores_in_flight, 0);
  EXPECT_EQ(sc->stats().stored_blocks_lost, 0u);
  EXPECT_EQ(wk->stats().blocks_stored, 21u * 4);
  EXPECT_TRUE(StoredOnLocalHit(sc.get(), "b").empty());
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
    wk->LoadBlocks(meta, &report);
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
// The host-allocation wrappers: pinned memory round-trips through the device.
TEST(CudaHostAllocTest, PinnedMemoryRoundTripsThroughTheDevice) {
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr size_t kBytes = 3 << 20;
  void* host = nullptr;
  ASSERT_EQ(kernels::cuda::HostAlloc(&host, kBytes), 0);
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
  EXPECT_EQ(kernels::cuda::HostFree(host), 0);
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

}  // namespace
}  // namespace tandem::kvconnector
