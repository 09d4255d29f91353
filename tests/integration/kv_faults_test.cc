// KV-store faults (DESIGN §9, issue 6 item 4): whatever the store does, the
// outputs equal a run without it and no request hangs.
//  - the store is killed (SIGKILL) mid-run: lookups miss, loads fail over;
//  - a block corrupted in the hot tier (memory) and one in RocksDB (disk):
//    the checksum catches it, the request recomputes, the bad block is never
//    cached (later requests that share it still match);
//  - lookups answered after their deadline count as misses.
// Faults come from tandem-kvstore's TEST-ONLY --debug-* flags.
#include "kv_util.h"
#include "tandem/kvconnector/kvstore_client.h"

namespace tandem::testing {
namespace {

class KvFaultsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir("tandem-kv-faults"));
    requests_ = new std::vector<v1::GenerateRequest>(SharedPrefixWorkload(40, 8, 96, 21));
    Service plain = StartWorker(*dir_, "worker-plain", {"--num-blocks", "48"});
    Service s = StartScheduler(*dir_, "sched-plain", plain.address(), {});
    baseline_ = new std::vector<GenerateResult>(RunAll(s.address(), *requests_, 10));
    for (const auto& r : *baseline_) ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }

  // Runs the workload twice against `kv` through one worker: the first
  // scheduler fills the store, the second (empty local cache) loads from it.
  // Both must match the baseline. Returns the second scheduler's stats.
  // The schedulers wait up to 5 s for a lookup unless `sched_flags` say
  // otherwise: a late lookup is a miss, and on a loaded CI machine a fresh
  // scheduler's first lookups have passed the 50 ms default
  // (LookupsAnsweredAfterTheirDeadline is the test of that).
  v1::GetStatsResponse RunTwice(
      const std::string& name, Service& kv,
      const std::vector<std::string>& sched_flags = {"--kvstore-lookup-deadline-ms", "5000"}) {
    Service worker =
        StartWorker(*dir_, name + "-worker", {"--num-blocks", "48", "--kvstore", kv.address()});
    std::vector<std::string> flags = {"--kvstore", kv.address()};
    flags.insert(flags.end(), sched_flags.begin(), sched_flags.end());
    {
      Service s = StartScheduler(*dir_, name + "-sched-1", worker.address(), flags);
      ExpectSameOutputs(RunAll(s.address(), *requests_, 10), *baseline_);
      IdleStats(s.address());
      Stop(s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // background stores land
    Service s = StartScheduler(*dir_, name + "-sched-2", worker.address(), flags);
    ExpectSameOutputs(RunAll(s.address(), *requests_, 10), *baseline_);
    v1::GetStatsResponse st = IdleStats(s.address());
    std::printf("[%s] lookups %lu (hits %lu, failed %lu), loaded %lu tokens, invalid blocks %lu\n",
                name.c_str(), static_cast<unsigned long>(st.external_lookups()),
                static_cast<unsigned long>(st.external_lookups_with_hits()),
                static_cast<unsigned long>(st.external_lookups_failed()),
                static_cast<unsigned long>(st.external_loaded_tokens()),
                static_cast<unsigned long>(st.external_invalid_blocks()));
    return st;
  }

  static std::string* dir_;
  static std::vector<v1::GenerateRequest>* requests_;
  static std::vector<GenerateResult>* baseline_;
};
std::string* KvFaultsTest::dir_ = nullptr;
std::vector<v1::GenerateRequest>* KvFaultsTest::requests_ = nullptr;
std::vector<GenerateResult>* KvFaultsTest::baseline_ = nullptr;

TEST_F(KvFaultsTest, StoreKilledMidRun) {
  Service kv = StartKvStore(*dir_, "kv-killed", {});
  Service worker =
      StartWorker(*dir_, "killed-worker", {"--num-blocks", "48", "--kvstore", kv.address()});
  Service s = StartScheduler(*dir_, "killed-sched", worker.address(), {"--kvstore", kv.address()});
  auto stub = GenerationStub(s.address());
  std::vector<GenerateResult> results(requests_->size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests_->size(); ++i) {
    threads.emplace_back([&, i] {
      // A deadline well above the run time: a hang fails the test.
      results[i] = RunGenerate(stub.get(), (*requests_)[i], std::chrono::seconds(60));
    });
    if (i == 10) {
      ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_requests_finished() >= 5; }));
      kv.process.Signal(SIGKILL);
      kv.process.Wait(std::chrono::seconds(10));
    }
  }
  for (auto& t : threads) t.join();
  ExpectSameOutputs(results, *baseline_);
  const v1::GetStatsResponse st = IdleStats(s.address());
  EXPECT_GT(st.external_lookups_failed(), 0u) << "no lookup saw the store gone";
}

TEST_F(KvFaultsTest, BlockCorruptedInMemory) {
  // Every 3rd new block gets a byte flipped in its hot-tier slot.
  Service kv = StartKvStore(*dir_, "kv-hot", {"--debug-corrupt-hot-every", "3"});
  const v1::GetStatsResponse st = RunTwice("hot", kv);
  EXPECT_GT(st.external_invalid_blocks(), 0u) << "no corrupted block was caught";
  // The store drops a block that fails its checksum, so a second load of the
  // same block (another request in the same step) finds it missing.
  EXPECT_GT(st.external_load_failed_checksum(), 0u);
  EXPECT_EQ(st.external_load_failed_checksum() + st.external_load_failed_not_found() +
                st.external_load_failed_rpc(),
            st.external_invalid_blocks());
  EXPECT_GT(st.external_loaded_tokens(), 0u);
}

TEST_F(KvFaultsTest, BlockCorruptedOnDisk) {
  // New blocks go to RocksDB only, every 3rd with a byte flipped; a lookup
  // stages cold hits into the hot tier, verifying them on the way, so the
  // store's checksum (or, for a block read directly, the worker's) catches
  // each bad block and the request recomputes it.
  Service kv =
      StartKvStore(*dir_, "kv-cold", {"--store-to-hot=false", "--debug-corrupt-cold-every", "3"});
  const v1::GetStatsResponse st = RunTwice("cold", kv);
  auto client = kvconnector::KvStoreClient::Create({.target = kv.address()});
  ASSERT_TRUE(client.ok());
  auto store_stats = (*client)->Stats();
  ASSERT_TRUE(store_stats.ok());
  EXPECT_GT(store_stats->checksum_failures + st.external_invalid_blocks(), 0u)
      << "no corrupted block was caught";
  EXPECT_GT(st.external_loaded_tokens(), 0u) << "the intact blocks were not loaded";
}

TEST_F(KvFaultsTest, LookupsAnsweredAfterTheirDeadline) {
  Service kv = StartKvStore(*dir_, "kv-slow", {"--debug-lookup-delay-ms", "300"});
  const v1::GetStatsResponse st = RunTwice("slow", kv, {"--kvstore-lookup-deadline-ms", "20"});
  EXPECT_GT(st.external_lookups_failed(), 0u);
  EXPECT_EQ(st.external_loaded_tokens(), 0u);
}

// While a request waits for a slow lookup, the scheduler waits for the
// answer (it wakes the engine) instead of streaming empty steps to the
// worker as fast as they come back: one 4-token request whose lookup takes
// 150 ms costs a handful of steps plus at most one empty step per
// millisecond (Engine::kEmptyStepPace), not one per worker round trip.
TEST_F(KvFaultsTest, WaitingForALookupDoesNotSpinEmptySteps) {
  Service kv = StartKvStore(*dir_, "kv-pace", {"--debug-lookup-delay-ms", "150"});
  Service worker = StartWorker(*dir_, "pace-worker", {"--kvstore", kv.address()});
  Service s = StartScheduler(*dir_, "pace-sched", worker.address(),
                             {"--kvstore", kv.address(), "--kvstore-lookup-deadline-ms", "2000"});
  v1::GenerateRequest r = requests_->front();
  r.mutable_sampling()->set_max_tokens(4);
  const std::vector<GenerateResult> out = RunAll(s.address(), {r}, 1);
  ASSERT_TRUE(out[0].status.ok()) << out[0].status.error_message();
  const v1::GetStatsResponse st = IdleStats(s.address());
  EXPECT_EQ(st.external_lookups(), 1u);
  EXPECT_EQ(st.external_lookups_failed(), 0u);
  std::printf("steps sent for one request behind a 150 ms lookup: %lu\n",
              static_cast<unsigned long>(st.num_steps_sent()));
  // Paced: <= 150 empty steps + the request's own + idle store flushes.
  // Unpaced, a worker round trip of 100-300 us gives 500-1500.
  EXPECT_LT(st.num_steps_sent(), 400u);
}

// A slow load holds up no other request (issue 32): while one request's
// prefix takes 3 s to come from the store, a request that arrived after it
// on the same worker streams all its tokens and finishes first, and the
// loaded request still gives the baseline's tokens. When a step waited for
// its loads, the second request's steps queued behind that wait, and the
// loaded request (4 tokens) finished long before it (24 tokens). While the
// load is the only work, the worker holds each empty step until the load
// arrives or 10 ms pass (StepExecutorOptions::empty_step_load_wait), so the
// engine does not send empty steps as fast as they come back.
TEST_F(KvFaultsTest, ASlowLoadHoldsUpNoOtherRequest) {
  Service kv = StartKvStore(*dir_, "kv-slow-load", {"--debug-load-delay-ms", "3000"});
  Service worker =
      StartWorker(*dir_, "slow-load-worker", {"--num-blocks", "48", "--kvstore", kv.address()});
  const std::vector<std::string> flags = {"--kvstore", kv.address(),
                                          "--kvstore-lookup-deadline-ms", "5000"};
  const v1::GenerateRequest& loaded = requests_->front();  // 4 tokens, greedy
  {
    Service s = StartScheduler(*dir_, "slow-load-sched-1", worker.address(), flags);
    ExpectSameOutputs(RunAll(s.address(), {loaded}), {baseline_->front()});
    StatsAfterStoresSettle(s.address());
    Stop(s);
  }
  Service s = StartScheduler(*dir_, "slow-load-sched-2", worker.address(), flags);
  auto stub = GenerationStub(s.address());
  using Clock = std::chrono::steady_clock;
  GenerateResult loaded_result;
  Clock::time_point loaded_done;
  std::thread first([&] {
    loaded_result = RunGenerate(stub.get(), loaded);
    loaded_done = Clock::now();
  });
  ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_waiting_for_load() == 1; }))
      << "the request never started its load";
  const uint64_t steps_before = GetStats(stub.get()).num_steps_sent();
  // A prompt of its own (no token of the workload's: nothing to load).
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 40; ++i) prompt.push_back(2 + (i * 7) % 500);
  const GenerateResult other =
      RunGenerate(stub.get(), MakeRequest(prompt, 24, 0.0f, {}, /*ignore_eos=*/true));
  const Clock::time_point other_done = Clock::now();
  first.join();
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.tokens.size(), 24u);
  ExpectSameOutputs({loaded_result}, {baseline_->front()});
  EXPECT_LT(other_done, loaded_done) << "the other request waited for the load";
  const v1::GetStatsResponse st = IdleStats(s.address());
  EXPECT_GT(st.external_loaded_tokens(), 0u);
  EXPECT_EQ(st.external_invalid_blocks(), 0u);
  const uint64_t steps = st.num_steps_sent() - steps_before;
  std::printf("steps sent while a 3 s load ran: %lu\n", static_cast<unsigned long>(steps));
  // About one per 10 ms (300) plus the other request's; unheld, a worker
  // round trip of 100-300 us gives 10,000-30,000.
  EXPECT_LT(steps, 1500u);
}

}  // namespace
}  // namespace tandem::testing
