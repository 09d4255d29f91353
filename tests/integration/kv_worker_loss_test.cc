// Issue 16: a worker's death costs a pause, not an error, with the KV-store
// in the loop. 64 streaming requests (8 shared prompt prefixes, greedy and
// seeded sampling, EOS ignored) run on a worker + scheduler + KV-store; mid
// run the worker gets kill -9 (and, in the second test, the KV-store at the
// same moment); both restart on the same addresses. Every stream completes
// with exactly the tokens of a clean run and no client sees an error; when
// idle, every KV block is free again. With the store killed too, its
// acknowledged blocks survive the restart (RocksDB's WAL).
#include <signal.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "harness.h"
#include "kv_util.h"

namespace tandem::testing {
namespace {

std::vector<v1::GenerateRequest> SixtyFourStreams() {
  std::vector<v1::GenerateRequest> requests = SharedPrefixWorkload(64, 8, 40, /*seed=*/16);
  for (size_t i = 0; i < requests.size(); ++i) {
    v1::SamplingParams* s = requests[i].mutable_sampling();
    s->set_max_tokens(48);
    s->set_ignore_eos(true);  // every stream runs its full length
  }
  return requests;
}

void KillMidRunAndRestart(bool kill_store) {
  const std::string dir = MakeTempDir(kill_store ? "tandem-kv-both-loss" : "tandem-kv-worker-loss");
  Service kv = StartKvStore(dir, "kv", {});
  const std::string kv_address = kv.address();
  // 4 ms per step: 48 tokens take ~0.2 s at least, so the kill lands mid-run.
  const std::vector<std::string> worker_args = {"--kvstore", kv_address, "--debug-step-delay-us",
                                                "4000"};
  Service worker = StartWorker(dir, "worker", worker_args);
  const std::string worker_address = worker.address();
  Service scheduler = StartScheduler(dir, "scheduler", worker_address, {"--kvstore", kv_address});
  auto stub = GenerationStub(scheduler.address());
  const std::vector<v1::GenerateRequest> requests = SixtyFourStreams();

  // The clean run; it also fills the store, so the second run loads from it
  // until the kill.
  const std::vector<GenerateResult> clean = RunConcurrently(stub.get(), requests);
  for (const GenerateResult& r : clean) ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  StatsAfterStoresSettle(scheduler.address());  // the clean run's stores acknowledged
  const uint64_t blocks_before = KvStoreStatsRpc(kv_address).cold_blocks();
  ASSERT_GT(blocks_before, 0u);

  std::unique_ptr<Service> worker_again, kv_again;
  const std::vector<GenerateResult> results = RunConcurrently(stub.get(), requests, [&] {
    ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() >= 16; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    worker.process.Signal(SIGKILL);
    if (kill_store) kv.process.Signal(SIGKILL);
    ASSERT_TRUE(worker.process.Wait(std::chrono::seconds(5)).has_value());
    if (kill_store) {
      ASSERT_TRUE(kv.process.Wait(std::chrono::seconds(5)).has_value());
    }
    // Paused, not failed: every call stays open while no worker serves.
    ASSERT_TRUE(WaitFor([&] { return HealthStatus(scheduler.address()) == 2; }));
    EXPECT_GT(GetStats(stub.get()).num_active_streams(), 0);
    if (kill_store) {
      // The same data directory: RocksDB replays its WAL.
      kv_again = std::make_unique<Service>(StartKvStore(dir, "kv", {}, kv_address));
    }
    worker_again = std::make_unique<Service>(
        StartWorker(dir, "worker-again", [&] {
          std::vector<std::string> a = worker_args;
          a.insert(a.end(), {"--listen", worker_address});
          return a;
        }()));
  });
  ExpectSameOutputs(results, clean);
  for (const GenerateResult& r : results) EXPECT_EQ(r.usage.output_tokens(), 48);

  const v1::GetStatsResponse stats = StatsAfterStoresSettle(scheduler.address());
  EXPECT_EQ(stats.num_worker_connects(), 2u);
  EXPECT_EQ(stats.num_free_blocks(), stats.num_total_blocks()) << "KV blocks leaked";
  EXPECT_EQ(stats.num_stores_in_flight() + stats.num_loads_in_flight(), 0);
  if (kill_store) {
    // Every block the store acknowledged before the kill is still there.
    const v1::StatsResponse kv_stats = KvStoreStatsRpc(kv_address);
    EXPECT_GE(kv_stats.cold_blocks(), blocks_before)
        << "blocks acknowledged before the kill were lost";
  }
}

TEST(KvWorkerLossTest, SixtyFourStreamsSurviveAWorkerKill) { KillMidRunAndRestart(false); }

TEST(KvWorkerLossTest, SixtyFourStreamsSurviveAWorkerAndKvStoreKill) {
  KillMidRunAndRestart(true);
}

}  // namespace
}  // namespace tandem::testing
