// KvStoreConnectorWorker's loads beside the steps (issue 32) against a real
// tandem.v1.KvStore server in process whose Load the test holds back: the
// step that carries a load does not wait for it, later steps go on without
// it, the cache is written only once the blocks have arrived, a step with
// nothing to compute waits for them unless the next step arrives, loads
// of a scheduler stream that ended are never copied in or reported, the
// next step's loads are read beside a held one, and a load whose copy into
// the cache runs beside the steps (as on a GPU) is reported only once that
// copy has ended.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "connector_test_fixture.h"
#include "gtest/gtest.h"

namespace tandem::kvconnector {
namespace {

// Opens `gate` after 20 s unless Cancel()ed first: a test whose rule broke
// fails instead of hanging, and can tell that the watchdog opened the gate.
class Watchdog {
 public:
  explicit Watchdog(Gate* gate)
      : thread_([this, gate] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return cancelled_; })) {
            fired_ = true;
            gate->Open();
          }
        }) {}
  ~Watchdog() {
    Cancel();
    thread_.join();
  }
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }
  bool fired() {
    std::lock_guard<std::mutex> lock(mu_);
    return fired_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
  bool fired_ = false;
  std::thread thread_;
};

// A copy into the cache that runs beside the steps, as the CUDA backend's
// does: each begun copy stays pending (done() false, the cache untouched)
// until the test ends it with Release, which copies from the staging the
// connector handed over (so staging reused too early shows as wrong bytes)
// or fails it. wait() blocks until then (5 s at most).
class AsyncCopier {
 public:
  explicit AsyncCopier(FakeCache* cache) : cache_(cache) {}
  ~AsyncCopier() { Release(); }  // a copy a test left pending ends before the worker waits

  KvStoreConnectorWorker::CopyFromHost FromHost() {
    return [this](std::span<const int32_t> ids, std::span<const std::span<const std::byte>> in)
               -> absl::StatusOr<KvStoreConnectorWorker::CopyIn> {
      auto copy = std::make_shared<Copy>();
      copy->ids.assign(ids.begin(), ids.end());
      copy->in.assign(in.begin(), in.end());
      {
        std::lock_guard<std::mutex> lock(mu_);
        pending_.push_back(copy);
        ++begun_;
      }
      cv_.notify_all();
      return KvStoreConnectorWorker::CopyIn{
          .done = [copy] { return copy->ended.load(); },
          .wait = [this, copy] {
            // A connector that waits where it must not fails the test, not hangs it.
            std::unique_lock<std::mutex> lock(mu_);
            if (!cv_.wait_for(lock, std::chrono::seconds(5), [&] { return copy->ended.load(); })) {
              return absl::DeadlineExceededError("the test never ended this copy");
            }
            return copy->status;
          }};
    };
  }
  // Ends every pending copy: copies it into the cache, or fails it with `s`.
  void Release(absl::Status s = absl::OkStatus()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::shared_ptr<Copy>& c : pending_) {
      if (s.ok()) {
        for (size_t i = 0; i < c->ids.size(); ++i) {
          std::memcpy(cache_->blocks.at(c->ids[i]).data(), c->in[i].data(), kBlockBytes);
        }
      }
      c->status = s;
      c->ended.store(true);
    }
    pending_.clear();
    cv_.notify_all();
  }
  // True once `n` copies have begun.
  bool Begun(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    return begun_ >= n;
  }

 private:
  struct Copy {
    std::vector<int32_t> ids;
    std::vector<std::span<const std::byte>> in;
    absl::Status status;
    std::atomic<bool> ended{false};
  };
  FakeCache* cache_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Copy>> pending_;
  int begun_ = 0;
};

class ConnectorLoadTest : public ConnectorTest {
 protected:
  // A store whose every Load waits at gate_; request "a"'s 4 full blocks
  // are in it (from cache blocks 10..13).
  void SetUp() override {
    StartStore(0, {}, [this] { gate_.Pass(); });
    wk_ = MakeWorker();
    ASSERT_NE(wk_, nullptr);
    a_ = MakeRequest("a", Tokens(17), {10, 11, 12, 13, 14});
    StoreBlocks(wk_.get(), &cache_, a_, 0, 3);
    ASSERT_TRUE(wk_->WaitForStores(5000));
    sched::KvConnectorReport ignored;
    wk_->TakeFinishedSending(&ignored);
  }
  void TearDown() override {
    gate_.Open();  // a load still held back ends before the server stops
    ConnectorTest::TearDown();
  }
  // A step carrying the load of a's blocks into cache blocks `ids`, for `id`.
  sched::KvConnectorMetadata LoadStep(const std::string& id, std::vector<int32_t> ids) const {
    sched::KvConnectorMetadata meta;
    meta.loads.push_back(
        sched::KvLoad{.request_id = id,
                      .block_hashes = {a_.block_hashes.begin(), a_.block_hashes.begin() + 4},
                      .block_ids = std::move(ids)});
    return meta;
  }
  bool Untouched(int first) const {
    for (int i = 0; i < 4; ++i) {
      if (cache_.blocks[first + i] != std::vector<std::byte>(kBlockBytes)) return false;
    }
    return true;
  }
  bool HoldsA(int first) const {
    for (int i = 0; i < 4; ++i) {
      if (cache_.blocks[first + i] != cache_.blocks[10 + i]) return false;
    }
    return true;
  }

  Gate gate_;
  std::unique_ptr<KvStoreConnectorWorker> wk_;
  sched::Request a_;
};

// The step that carries a load returns while the store still holds it back;
// the steps after it run and report nothing of it and the cache blocks stay
// as they were; once the blocks arrive, the next step copies them in and
// reports the load.
TEST_F(ConnectorLoadTest, ALoadArrivesInALaterStepAndHoldsNoStepUp) {
  Watchdog watchdog(&gate_);
  sched::KvConnectorReport report;
  wk_->LoadBlocks(LoadStep("b", {20, 21, 22, 23}), &report);
  ASSERT_TRUE(gate_.Reached());
  EXPECT_FALSE(watchdog.fired()) << "the step waited for its load";
  EXPECT_TRUE(report.finished_recving.empty());
  EXPECT_EQ(wk_->stats().loads_in_flight, 1);
  for (int step = 0; step < 3; ++step) {  // steps that compute: no wait
    wk_->LoadBlocks({}, &report);
    wk_->FinishLoads(&report, std::chrono::microseconds(0));
  }
  wk_->FinishLoads(&report, std::chrono::milliseconds(20));  // one with nothing to compute
  EXPECT_FALSE(watchdog.fired());
  EXPECT_TRUE(report.finished_recving.empty());
  EXPECT_TRUE(Untouched(20)) << "the cache was written before the blocks arrived";
  watchdog.Cancel();
  gate_.Open();
  // The next steps, until one finds the load arrived.
  for (int i = 0; i < 30000 && report.finished_recving.empty(); ++i) {
    wk_->LoadBlocks({}, &report);
    if (report.finished_recving.empty()) {
      wk_->FinishLoads(&report, std::chrono::milliseconds(1));
    }
  }
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"b"});
  EXPECT_TRUE(report.invalid_block_ids.empty());
  EXPECT_TRUE(HoldsA(20));
  EXPECT_EQ(wk_->stats().loads_in_flight, 0);
  EXPECT_EQ(wk_->stats().blocks_loaded, 4u);
}

// A step with nothing to compute waits for a load in flight, but not once
// the next step has arrived (SetStepQueued, also when it came first).
TEST_F(ConnectorLoadTest, AWaitForALoadEndsWhenTheNextStepArrives) {
  Watchdog watchdog(&gate_);
  sched::KvConnectorReport report;
  wk_->LoadBlocks(LoadStep("b", {20, 21, 22, 23}), &report);
  ASSERT_TRUE(gate_.Reached());
  std::thread next_step([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    wk_->SetStepQueued(true);
  });
  // Without the interrupt this waits until the watchdog opens the gate
  // (20 s, less than the 60 s asked for) and returns the load.
  wk_->FinishLoads(&report, std::chrono::seconds(60));
  next_step.join();
  EXPECT_FALSE(watchdog.fired());
  EXPECT_TRUE(report.finished_recving.empty());
  // The queued step runs, with nothing queued behind it.
  wk_->SetStepQueued(false);
  wk_->SetStepQueued(true);  // one queued before the wait begins
  wk_->FinishLoads(&report, std::chrono::seconds(60));
  EXPECT_FALSE(watchdog.fired());
  EXPECT_TRUE(report.finished_recving.empty());
  watchdog.Cancel();
  gate_.Open();
  // With nothing queued, the wait ends with the load.
  wk_->SetStepQueued(false);
  wk_->FinishLoads(&report, std::chrono::seconds(60));
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"b"});
  EXPECT_TRUE(HoldsA(20));
}

// Loads in flight when the scheduler's stream ends belong to no scheduler:
// they never write the cache (whose blocks the next scheduler hands out
// afresh) and are never reported; the next stream's loads are.
TEST_F(ConnectorLoadTest, LoadsOfAnEndedStreamAreNeverCopiedInNorReported) {
  // One load thread, so that the next load is read after the forgotten one.
  std::unique_ptr<KvStoreConnectorWorker> wk = MakeWorker({.load_threads = 1});
  ASSERT_NE(wk, nullptr);
  sched::KvConnectorReport report;
  wk->LoadBlocks(LoadStep("old", {20, 21, 22, 23}), &report);
  ASSERT_TRUE(gate_.Reached());
  wk->ForgetLoads();
  EXPECT_EQ(wk->stats().loads_in_flight, 0);
  gate_.Open();
  // Behind the forgotten load on the load thread: once it is reported, the
  // forgotten one has arrived too.
  RunLoads(wk.get(), LoadStep("new", {24, 25, 26, 27}), &report);
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"new"});
  EXPECT_TRUE(report.invalid_block_ids.empty());
  EXPECT_TRUE(HoldsA(24));
  EXPECT_TRUE(Untouched(20)) << "a forgotten load wrote the cache";
  wk->FinishLoads(&report, std::chrono::milliseconds(50));
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"new"});
  EXPECT_EQ(wk->stats().loads_in_flight, 0);
}

// Several steps' loads in flight at once each land in their own blocks and
// are each reported once, whatever step finishes them.
TEST_F(ConnectorLoadTest, LoadsOfSeveralStepsInFlightEachArriveOnce) {
  sched::KvConnectorReport report;
  wk_->LoadBlocks(LoadStep("b", {20, 21, 22, 23}), &report);
  ASSERT_TRUE(gate_.Reached());
  wk_->LoadBlocks(LoadStep("c", {24, 25, 26, 27}), &report);
  wk_->LoadBlocks(LoadStep("d", {28, 29, 30, 31}), &report);
  EXPECT_EQ(wk_->stats().loads_in_flight, 3);
  gate_.Open();
  for (int i = 0; i < 3000 && report.finished_recving.size() < 3; ++i) {
    wk_->LoadBlocks({}, &report);
    wk_->FinishLoads(&report, std::chrono::milliseconds(10));
  }
  std::sort(report.finished_recving.begin(), report.finished_recving.end());
  EXPECT_EQ(report.finished_recving, (std::vector<std::string>{"b", "c", "d"}));
  EXPECT_TRUE(HoldsA(20) && HoldsA(24) && HoldsA(28));
  EXPECT_EQ(wk_->stats().loads, 3u);
  EXPECT_EQ(wk_->stats().loads_in_flight, 0);
}

// The next step's loads are read while the store holds the first step's
// (load_threads, default 4): a slow read holds up no other step's. With one
// load thread the second read begins only once the first has ended.
TEST_F(ConnectorLoadTest, TheNextStepsLoadsAreReadBesideAHeldOne) {
  Watchdog watchdog(&gate_);
  sched::KvConnectorReport report;
  wk_->LoadBlocks(LoadStep("b", {20, 21, 22, 23}), &report);
  wk_->LoadBlocks(LoadStep("c", {24, 25, 26, 27}), &report);
  EXPECT_TRUE(gate_.Reached(2));
  EXPECT_FALSE(watchdog.fired()) << "the second step's read waited for the first's";
  // The first is still held: the second did not begin when the first's
  // read ended at its deadline (2 s).
  wk_->FinishLoads(&report, std::chrono::microseconds(0));
  EXPECT_TRUE(report.finished_recving.empty()) << "the second step's read waited for the first's";
  // One load thread: the reads at the gate stay the two above.
  std::unique_ptr<KvStoreConnectorWorker> one = MakeWorker({.load_threads = 1});
  ASSERT_NE(one, nullptr);
  sched::KvConnectorReport one_report;
  one->LoadBlocks(LoadStep("d", {0, 1, 2, 3}), &one_report);
  one->LoadBlocks(LoadStep("e", {4, 5, 6, 7}), &one_report);
  EXPECT_TRUE(gate_.Reached(3));
  EXPECT_FALSE(gate_.Reached(4, std::chrono::milliseconds(300)))
      << "one load thread read two steps' loads at once";
  EXPECT_FALSE(watchdog.fired());
  watchdog.Cancel();
  gate_.Open();
  for (int i = 0; i < 3000 && report.finished_recving.size() < 2; ++i) {
    wk_->LoadBlocks({}, &report);
    wk_->FinishLoads(&report, std::chrono::milliseconds(10));
  }
  std::sort(report.finished_recving.begin(), report.finished_recving.end());
  EXPECT_EQ(report.finished_recving, (std::vector<std::string>{"b", "c"}));
  EXPECT_TRUE(HoldsA(20) && HoldsA(24));
  AwaitLoads(one.get(), &one_report, 2);  // d and e, in turn
  std::sort(one_report.finished_recving.begin(), one_report.finished_recving.end());
  EXPECT_EQ(one_report.finished_recving, (std::vector<std::string>{"d", "e"}));
  EXPECT_TRUE(HoldsA(0) && HoldsA(4));
}

// A load whose copy into the cache runs beside the steps: the steps after
// the copy began go on without it and report nothing, the cache and the
// load's staging stay as they were; the first step after the copy ended
// reports the load. A step with nothing to compute waits for a copy under
// way and reports it. A copy that fails (its wait's error) fails every
// block, recomputed. A load forgotten with its stream while its copy runs
// is never reported.
TEST_F(ConnectorLoadTest, ALoadIsReportedOnlyOnceItsCopyIntoTheCacheHasEnded) {
  gate_.Open();
  AsyncCopier copier(&cache_);
  std::unique_ptr<KvStoreConnectorWorker> wk = MakeWorker({.from_host = copier.FromHost()});
  ASSERT_NE(wk, nullptr);
  sched::KvConnectorReport report;
  // Steps that compute (no wait: a step with nothing to compute would wait
  // for the copy it begins) until the n-th copy has begun.
  auto step_until_copy = [&](int n) {
    for (int i = 0; i < 10000 && !copier.Begun(n); ++i) {
      wk->FinishLoads(&report, std::chrono::microseconds(0));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return copier.Begun(n);
  };
  wk->LoadBlocks(LoadStep("b", {20, 21, 22, 23}), &report);
  ASSERT_TRUE(step_until_copy(1));
  for (int step = 0; step < 3; ++step) {
    wk->LoadBlocks({}, &report);
    wk->FinishLoads(&report, std::chrono::microseconds(0));
  }
  EXPECT_TRUE(report.finished_recving.empty()) << "reported before its copy ended";
  EXPECT_TRUE(Untouched(20));
  EXPECT_EQ(wk->stats().loads_in_flight, 1);
  copier.Release();
  wk->FinishLoads(&report, std::chrono::microseconds(0));
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"b"});
  EXPECT_TRUE(report.invalid_block_ids.empty());
  EXPECT_TRUE(HoldsA(20)) << "the copy read staging that was reused";
  EXPECT_EQ(wk->stats().loads_in_flight, 0);
  EXPECT_EQ(wk->stats().blocks_loaded, 4u);

  // A step with nothing to compute: it waits for the copy under way.
  report = {};
  wk->LoadBlocks(LoadStep("c", {24, 25, 26, 27}), &report);
  ASSERT_TRUE(step_until_copy(2));
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    copier.Release();
  });
  wk->FinishLoads(&report, std::chrono::milliseconds(10));
  releaser.join();
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"c"});
  EXPECT_TRUE(HoldsA(24));

  // A copy that fails: every block of it is recomputed.
  report = {};
  wk->LoadBlocks(LoadStep("d", {28, 29, 30, 31}), &report);
  ASSERT_TRUE(step_until_copy(3));
  copier.Release(absl::InternalError("device lost"));
  wk->FinishLoads(&report, std::chrono::microseconds(0));
  EXPECT_EQ(report.finished_recving, std::vector<std::string>{"d"});
  EXPECT_EQ(report.invalid_block_ids, (std::vector<int32_t>{28, 29, 30, 31}));
  EXPECT_EQ(report.num_load_failed_rpc, 4);

  // Forgotten while its copy runs: never reported, its staging kept until
  // the copy has ended.
  report = {};
  wk->LoadBlocks(LoadStep("e", {0, 1, 2, 3}), &report);
  ASSERT_TRUE(step_until_copy(4));
  wk->ForgetLoads();
  copier.Release();
  wk->FinishLoads(&report, std::chrono::milliseconds(10));
  EXPECT_TRUE(report.finished_recving.empty());
  EXPECT_EQ(wk->stats().loads_in_flight, 0);
  EXPECT_EQ(wk->stats().loads, 3u);
}

}  // namespace
}  // namespace tandem::kvconnector
