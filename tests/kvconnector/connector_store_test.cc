// KvStoreConnectorWorker's stores (and the scheduler role's store entries)
// against a real tandem.v1.KvStore server in process: a stalling store never
// holds up a step, stores stop at known token ids and are never repeated,
// and dropped, failed and failed-before-snapshot stores all finish and are
// stored again later.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "connector_test_fixture.h"
#include "gtest/gtest.h"
#include "tandem/worker/step_backend.h"
#include "tandem/worker/step_executor.h"

namespace tandem::kvconnector {
namespace {

// A store that stalls never holds up a step (issue 32): while a Store call
// waits in the store, the later steps' loads and snapshots on the step
// thread return; once the store goes on, the stored bytes are the ones
// computed at snapshot time, though the next steps overwrote the cache.
TEST_F(ConnectorTest, AStallingStoreNeverHoldsUpAStep) {
  Gate gate;  // opens by the test's end: the server's shutdown waits for the stalled calls
  StartStore(/*lookup_delay_ms=*/0, [&] { gate.Pass(); });
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
  ASSERT_TRUE(gate.Reached()) << "the first store never reached the store";
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

  gate.Open();
  sched::KvConnectorReport sent;
  WaitSent(wk.get(), kRequests, &sent);
  sc->OnConnectorReport(sent);
  EXPECT_EQ(wk->stats().blocks_stored, 4u * kRequests);
  EXPECT_EQ(wk->stats().blocks_store_dropped, 0u);

  // Each request's blocks load back as they were computed.
  FakeCache expected;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(
        LoadBack(sc.get(), wk.get(), "again" + std::to_string(i), Tokens(17, 1000 * (i + 1))));
    for (int b = 0; b < 4; ++b) {
      expected.Fill(0, 10 * i + b);
      EXPECT_EQ(cache_.blocks[20 + b], expected.blocks[0]) << "request " << i << " block " << b;
    }
  }
}

// With an asynchronous copier (the CUDA runner's copy stream), a step only
// begins the copies of its stores; the store thread waits for them. Here the
// "device" takes the blocks as the step left them but lands them in the
// staging memory only when the test opens a gate: the step returns with the
// gate shut, nothing is sent before the copies end, and the blocks stored
// are the ones computed.
TEST_F(ConnectorTest, StoresWaitForTheirCopiesOutOfTheCacheOffTheStep) {
  StartStore();
  Gate gate;
  std::vector<int32_t> begun;  // block ids, on the step thread
  auto async = [&](std::span<const int32_t> ids, std::span<const std::span<std::byte>> out)
      -> absl::StatusOr<std::function<absl::Status()>> {
    std::vector<std::vector<std::byte>> bytes;
    for (int32_t id : ids) bytes.push_back(cache_.blocks.at(id));
    begun.insert(begun.end(), ids.begin(), ids.end());
    std::vector<std::span<std::byte>> dst(out.begin(), out.end());
    return std::function<absl::Status()>([&, bytes = std::move(bytes), dst = std::move(dst)] {
      gate.Pass();
      for (size_t i = 0; i < dst.size(); ++i) {
        std::memcpy(dst[i].data(), bytes[i].data(), kBlockBytes);
      }
      return absl::OkStatus();
    });
  };
  auto sc = MakeScheduler();
  auto wk = MakeWorker({.to_host = async});
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  const sched::KvConnectorMetadata meta = ComputeStep(sc.get(), &a);
  auto snapshot = std::async(std::launch::async, [&] { wk->SnapshotStores(meta); });
  // Opens the gate before the snapshot's thread is joined and the worker's
  // destructor waits for the copies, also when an assertion ends the test.
  struct OpenFirst {
    Gate* gate;
    ~OpenFirst() { gate->Open(); }
  } open_first{&gate};
  ASSERT_EQ(snapshot.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the step waited for its copies out of the cache";
  EXPECT_EQ(begun, (std::vector<int32_t>{1, 2, 3, 4}));
  for (int b = 0; b < kCacheBlocks; ++b) cache_.Fill(b, 99);  // later steps
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(wk->stats().blocks_stored, 0u);
  EXPECT_EQ(wk->stats().stores_in_flight, 1);
  EXPECT_GE(wk->stats().store_staging_bytes, 4 * kBlockBytes);

  gate.Open();
  sched::KvConnectorReport sent;
  WaitSent(wk.get(), 1, &sent);
  EXPECT_TRUE(sent.failed_sending.empty());
  sc->OnConnectorReport(sent);
  EXPECT_EQ(wk->stats().blocks_stored, 4u);
  ASSERT_TRUE(LoadBack(sc.get(), wk.get(), "again", Tokens(17)));
  FakeCache expected;
  for (int b = 1; b <= 4; ++b) {
    expected.Fill(0, b);  // ComputeStep's fill
    EXPECT_EQ(cache_.blocks[19 + b], expected.blocks[0]) << "block " << b;
  }
}

// A copy out of the cache that fails to begin, or whose wait fails, fails
// only its own entry: it is reported finished and failed, its blocks count
// as failed, and the next entry is stored.
TEST_F(ConnectorTest, AFailedCopyOutOfTheCacheFailsOnlyItsEntry) {
  StartStore();
  int calls = 0;
  auto async = [&](std::span<const int32_t> ids, std::span<const std::span<std::byte>> out)
      -> absl::StatusOr<std::function<absl::Status()>> {
    if (++calls == 1) return absl::InternalError("device lost");
    for (size_t i = 0; i < ids.size(); ++i) {
      std::memcpy(out[i].data(), cache_.blocks.at(ids[i]).data(), kBlockBytes);
    }
    const bool fails = calls == 2;
    return std::function<absl::Status()>(
        [fails] { return fails ? absl::InternalError("copy failed") : absl::OkStatus(); });
  };
  auto sc = MakeScheduler();
  auto wk = MakeWorker({.to_host = async});
  ASSERT_TRUE(sc && wk);
  for (const char* id : {"a", "b", "c"}) {
    sched::Request r = MakeRequest(id, Tokens(17, 1000 * (id[0] - 'a' + 1)), {1, 2, 3, 4, 5});
    wk->SnapshotStores(ComputeStep(sc.get(), &r));
  }
  ASSERT_TRUE(wk->WaitForStores(5000));
  sched::KvConnectorReport sent;
  wk->TakeFinishedSending(&sent);
  EXPECT_EQ(sent.finished_sending, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(sent.failed_sending, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(wk->stats().blocks_store_failed, 8u);
  EXPECT_EQ(wk->stats().blocks_stored, 4u);
  EXPECT_EQ(wk->stats().stores_in_flight, 0);
  sc->OnConnectorReport(sent);
  EXPECT_EQ(sc->stats().stored_blocks_lost, 8u);
  ASSERT_TRUE(LoadBack(sc.get(), wk.get(), "again", Tokens(17, 3000)));
}

// The stores' staging memory is taken back and used again: a cap of 8
// blocks carries any number of 4-block entries sent one after another, and
// never grows past the cap.
TEST_F(ConnectorTest, StoreStagingIsReusedWithinItsCap) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker({.max_pending_store_bytes = 8 * kBlockBytes});
  ASSERT_TRUE(sc && wk);
  constexpr int kEntries = 10;
  for (int i = 0; i < kEntries; ++i) {
    sched::Request r =
        MakeRequest("r" + std::to_string(i), Tokens(17, 1000 * (i + 1)), {1, 2, 3, 4, 5});
    wk->SnapshotStores(ComputeStep(sc.get(), &r));
    ASSERT_TRUE(wk->WaitForStores(5000));
    EXPECT_LE(wk->stats().store_staging_bytes, 8 * kBlockBytes);
  }
  EXPECT_EQ(wk->stats().blocks_store_dropped, 0u);
  EXPECT_EQ(wk->stats().blocks_stored, 4u * kEntries);
  EXPECT_EQ(wk->stats().store_staging_bytes, 8 * kBlockBytes);
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
  RunLoads(wk.get(), next, &report);
  EXPECT_NE(cache_.blocks[2], a_block) << "b's load wrote block 2";
  wk->SnapshotStores(next);
  ASSERT_TRUE(wk->WaitForStores(5000));
  // The store holds a's block as it was before the load.
  sched::Request probe = MakeRequest("probe", Tokens(8), {5, 6});
  ASSERT_EQ(PollMatch(sc.get(), probe, 0).num_external_tokens, 8);
  sc->UpdateStateAfterAlloc(probe, std::vector<int32_t>{5, 6}, 8);
  sched::KvConnectorReport loaded;
  RunLoads(wk.get(), sc->BuildConnectorMeta(out, {}), &loaded);
  EXPECT_TRUE(loaded.invalid_block_ids.empty());
  EXPECT_EQ(cache_.blocks[6], a_block);
}

// A store entry larger than the worker's whole queue stores the leading
// blocks that fit and drops the rest (it used to drop all of them, every
// time: an 8B-class model's long prefill was never stored). It still
// finishes, failed: the scheduler forgets its blocks, so the next request
// holding them (here as a local prefix hit, which asks the store nothing)
// stores them again.
TEST_F(ConnectorTest, AStoreLargerThanTheQueueStoresItsPrefixAndIsForgotten) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker({.max_pending_store_bytes = kBlockBytes});  // 1 of 4 blocks fits
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  const sched::KvConnectorMetadata meta = ComputeStep(sc.get(), &a);
  ASSERT_EQ(meta.stores.size(), 1u);
  wk->SnapshotStores(meta);
  ASSERT_TRUE(wk->WaitForStores(5000));
  sched::KvConnectorReport sent;
  wk->TakeFinishedSending(&sent);
  EXPECT_EQ(sent.finished_sending, std::vector<std::string>{"a"});
  EXPECT_EQ(sent.failed_sending, std::vector<std::string>{"a"});
  EXPECT_EQ(wk->stats().blocks_store_dropped, 3u);
  EXPECT_EQ(wk->stats().blocks_stored, 1u);
  EXPECT_EQ(wk->stats().stores_in_flight, 0);
  sc->OnConnectorReport(sent);
  EXPECT_EQ(sc->stats().stores_in_flight, 0);
  EXPECT_EQ(sc->stats().stored_blocks_lost, 4u);
  EXPECT_EQ(StoredOnLocalHit(sc.get(), "b"), (std::vector<int32_t>{1, 2, 3, 4}));
  // The store holds the first block: another scheduler's lookup hits it.
  auto other = MakeScheduler();
  ASSERT_TRUE(other);
  EXPECT_EQ(PollMatch(other.get(), MakeRequest("probe", Tokens(17), {6, 7, 8, 9, 10}), 0)
                .num_external_tokens,
            4);
}

// With the queue full, an entry is dropped whole and still finishes.
TEST_F(ConnectorTest, AStoreBehindAFullQueueIsDroppedWhole) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  StartStore(0, [released] { released.wait(); });  // a's store waits, queued
  auto sc = MakeScheduler();
  auto wk = MakeWorker({.max_pending_store_bytes = 4 * kBlockBytes});
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  wk->SnapshotStores(ComputeStep(sc.get(), &a));
  sched::Request b = MakeRequest("b", Tokens(17, 900), {6, 7, 8, 9, 10});
  wk->SnapshotStores(ComputeStep(sc.get(), &b));
  release.set_value();
  ASSERT_TRUE(wk->WaitForStores(5000));
  sched::KvConnectorReport sent;
  wk->TakeFinishedSending(&sent);
  EXPECT_EQ(sent.finished_sending, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(sent.failed_sending, std::vector<std::string>{"b"});
  EXPECT_EQ(wk->stats().blocks_store_dropped, 4u);
  EXPECT_EQ(wk->stats().blocks_stored, 4u);
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

// The same through the worker's StepExecutor: the failed step's store entry
// is reported finished (and failed) once, by the connector with a later
// step. The executor reported it in the failed step's output too, and the
// scheduler took the second report for the request's next store entry.
TEST_F(ConnectorTest, AFailedStepsStoreIsReportedOnce) {
  StartStore();
  auto sc = MakeScheduler();
  auto wk = MakeWorker();
  ASSERT_TRUE(sc && wk);
  sched::Request a = MakeRequest("a", Tokens(17), {1, 2, 3, 4, 5});
  sched::SchedulerOutput step1{.step_id = 1};
  step1.scheduled_new_reqs.push_back(
      {.request_id = "a", .prompt_token_ids = Tokens(17), .block_ids = {1, 2, 3, 4, 5}});
  step1.num_scheduled_tokens = {17};
  step1.total_num_scheduled_tokens = 17;
  step1.kv_connector_metadata = ComputeStep(sc.get(), &a);
  ASSERT_EQ(step1.kv_connector_metadata.stores.size(), 1u);
  worker::SimBackend backend(512, {2}, 0, 0);
  worker::StepExecutor ex(&backend, wk.get(), {.debug_fail_steps = {1}});
  std::vector<sched::ModelRunnerOutput> outs;
  outs.push_back(ex.Execute(std::move(step1)));
  EXPECT_FALSE(outs[0].error.empty());
  // Empty steps, as the engine sends while stores are in flight.
  for (uint64_t id = 2; id <= 3; ++id) {
    outs.push_back(
        ex.Execute(sched::SchedulerOutput{.step_id = id, .last_processed_step_id = id - 1}));
    EXPECT_TRUE(outs.back().error.empty()) << outs.back().error;
    ASSERT_TRUE(wk->WaitForStores(5000));
  }
  int finished = 0, failed = 0;
  for (const sched::ModelRunnerOutput& o : outs) {
    finished += static_cast<int>(std::count(o.kv_connector_report.finished_sending.begin(),
                                            o.kv_connector_report.finished_sending.end(), "a"));
    failed += static_cast<int>(std::count(o.kv_connector_report.failed_sending.begin(),
                                          o.kv_connector_report.failed_sending.end(), "a"));
    sc->OnConnectorReport(o.kv_connector_report);
  }
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(sc->stats().stores_in_flight, 0);
  EXPECT_EQ(wk->stats().blocks_store_dropped, 4u);
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

}  // namespace
}  // namespace tandem::kvconnector
