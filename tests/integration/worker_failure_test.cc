// kill -9 of the worker mid-stream.
// - With --worker-loss-grace-s=0: every affected client gets UNAVAILABLE
//   within a few seconds (bound: kUnavailableWithin); the scheduler process
//   stays alive, reports NOT_SERVING, and serves again once a worker is back
//   on the same address.
// - With the default grace: the streams pause, resume on the next worker and
//   end with exactly the tokens of a run without the loss (greedy and seeded
//   sampling, the real model); without a worker within the grace they end
//   with UNAVAILABLE that names it.
#include <signal.h>
#include <sys/wait.h>

#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "gtest/gtest.h"
#include "harness.h"

namespace tandem::testing {
namespace {

// Issue 4: "every affected client gets UNAVAILABLE within a few seconds".
// Generous for a loaded CI machine; a stream that only ended through its 60 s
// deadline or the keepalive timeout (20 s) would exceed it.
constexpr double kUnavailableWithin = 10.0;

TEST(WorkerFailureTest, KillNineMidStreamThenRecover) {
  const std::string dir = MakeTempDir("tandem-worker-failure");
  // The sim backend makes each step last 20 ms: streams are surely mid-way.
  Service worker = StartWorker(dir, "worker", {"--backend", "sim", "--sim-step-us", "20000"});
  const std::string worker_address = worker.address();
  Service scheduler =
      StartScheduler(dir, "scheduler", worker_address, {"--worker-loss-grace-s", "0"});
  auto stub = GenerationStub(scheduler.address());
  EXPECT_EQ(HealthStatus(scheduler.address()), 1);
  ASSERT_TRUE(scheduler.process.running());

  constexpr int kStreams = 8;
  std::vector<GenerateResult> results(kStreams);
  std::vector<std::chrono::steady_clock::time_point> ended(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      // Generous client deadline: the failure must come from the scheduler
      // (UNAVAILABLE), not from the deadline.
      results[i] = RunGenerate(stub.get(), MakeRequest({1, 10 + i, 20}, 400, 0, {}, true),
                               std::chrono::seconds(60));
      ended[i] = std::chrono::steady_clock::now();
    });
  }
  ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() == kStreams; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto killed_at = std::chrono::steady_clock::now();
  worker.process.Signal(SIGKILL);
  ASSERT_TRUE(worker.process.Wait(std::chrono::seconds(5)).has_value());
  EXPECT_FALSE(worker.process.running());
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    EXPECT_EQ(results[i].status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << results[i].status.error_message();
    EXPECT_NE(results[i].status.error_message().find("lost the worker"), std::string::npos)
        << results[i].status.error_message();
    EXPECT_LT(results[i].tokens.size(), 400u);
    const double seconds = std::chrono::duration<double>(ended[i] - killed_at).count();
    std::printf("stream %d ended %.3f s after the kill with %zu tokens\n", i, seconds,
                results[i].tokens.size());
    EXPECT_LT(seconds, kUnavailableWithin) << "UNAVAILABLE came too late";
  }
  // The scheduler process is alive, reports NOT_SERVING and refuses new work
  // clearly.
  EXPECT_TRUE(scheduler.process.running()) << "the scheduler died with its worker";
  EXPECT_TRUE(WaitFor([&] { return HealthStatus(scheduler.address()) == 2; }));
  EXPECT_EQ(HealthStatus(scheduler.address(), "tandem.v1.Generation"), 2);
  EXPECT_EQ(HealthStatus(scheduler.address(), "tandem.liveness"), 1) << "worker dead, not us";
  GenerateResult refused = RunGenerate(stub.get(), MakeRequest({1, 2}, 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.status.error_message().find("no worker is connected"), std::string::npos)
      << refused.status.error_message();
  const v1::GetStatsResponse down = GetStats(stub.get());
  EXPECT_FALSE(down.worker_connected());
  EXPECT_EQ(down.num_active_streams(), 0);
  EXPECT_TRUE(scheduler.process.running());

  // A new worker on the same address: the scheduler reconnects and serves.
  Service again =
      StartWorker(dir, "worker-again",
                  {"--listen", worker_address, "--backend", "sim", "--sim-step-us", "1000"});
  ASSERT_TRUE(WaitFor([&] { return HealthStatus(scheduler.address()) == 1; }));
  GenerateResult ok = RunGenerate(stub.get(), MakeRequest({1, 2}, 12, 0, {}, true));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 12u);
  const v1::GetStatsResponse stats = GetStats(stub.get());
  EXPECT_EQ(stats.num_worker_connects(), 2u);
  EXPECT_TRUE(stats.worker_connected());
  EXPECT_TRUE(scheduler.process.running());
  // And it still drains and exits cleanly.
  scheduler.process.Signal(SIGTERM);
  auto status = scheduler.process.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value()) << "scheduler did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

std::vector<v1::GenerateRequest> MixedRequests() {
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    // Half greedy, half sampled with a client seed; EOS ignored so every
    // stream runs its full length.
    requests.push_back(MakeRequest({1, 40 + 7 * i, 300 + i}, 120, i % 2 == 0 ? 0.0f : 0.9f,
                                   i % 2 == 0 ? std::optional<uint64_t>() : 1000 + i, true));
  }
  return requests;
}

TEST(WorkerFailureTest, AWorkerDeathIsAPauseWithTheSameTokens) {
  const std::string dir = MakeTempDir("tandem-worker-loss");
  // 4 ms per step: 120 tokens take ~0.5 s, so the kill lands mid-stream.
  const std::vector<std::string> slow = {"--debug-step-delay-us", "4000"};
  Service worker = StartWorker(dir, "worker", slow);
  const std::string worker_address = worker.address();
  Service scheduler = StartScheduler(dir, "scheduler", worker_address, {});
  auto stub = GenerationStub(scheduler.address());
  const std::vector<v1::GenerateRequest> requests = MixedRequests();

  const std::vector<GenerateResult> reference = RunConcurrently(stub.get(), requests);
  for (const GenerateResult& r : reference) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.tokens.size(), 120u);
  }

  std::unique_ptr<Service> again;
  std::thread late;
  GenerateResult late_result;
  const std::vector<GenerateResult> results = RunConcurrently(stub.get(), requests, [&] {
    ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() == 8; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    worker.process.Signal(SIGKILL);
    ASSERT_TRUE(worker.process.Wait(std::chrono::seconds(5)).has_value());
    // Paused, not failed: the calls stay open while no worker serves.
    ASSERT_TRUE(WaitFor([&] { return HealthStatus(scheduler.address()) == 2; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(GetStats(stub.get()).num_active_streams(), 8);
    // A request that arrives during the pause waits with the others.
    late = std::thread([&] { late_result = RunGenerate(stub.get(), requests[3]); });
    ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_active_streams() == 9; }));
    again =
        std::make_unique<Service>(StartWorker(dir, "worker-again", {"--listen", worker_address}));
  });
  if (late.joinable()) late.join();
  ASSERT_TRUE(late_result.status.ok()) << late_result.status.error_message();
  EXPECT_EQ(late_result.tokens, reference[3].tokens);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, reference[i].tokens);
    EXPECT_EQ(results[i].usage.output_tokens(), 120);
    EXPECT_EQ(results[i].usage.prompt_tokens(), 3);
  }
  const v1::GetStatsResponse stats = GetStats(stub.get());
  EXPECT_EQ(stats.num_worker_connects(), 2u);
  EXPECT_TRUE(stats.worker_connected());
  // Resumed cleanly: no step of the new worker failed (a failed step would
  // also recover the tokens, by recompute).
  EXPECT_EQ(stats.num_preemptions(), 0u);
}

TEST(WorkerFailureTest, WithoutAWorkerWithinTheGraceStreamsEndUnavailable) {
  const std::string dir = MakeTempDir("tandem-worker-loss");
  Service worker = StartWorker(dir, "worker", {"--debug-step-delay-us", "4000"});
  Service scheduler =
      StartScheduler(dir, "scheduler", worker.address(), {"--worker-loss-grace-s", "1"});
  auto stub = GenerationStub(scheduler.address());
  std::chrono::steady_clock::time_point killed_at;
  const std::vector<GenerateResult> results = RunConcurrently(stub.get(), MixedRequests(), [&] {
    ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() == 8; }));
    killed_at = std::chrono::steady_clock::now();
    worker.process.Signal(SIGKILL);
  });
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  for (const GenerateResult& r : results) {
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
    EXPECT_NE(r.status.error_message().find("none came back within 1 s"), std::string::npos)
        << r.status.error_message();
  }
  EXPECT_GE(waited, 1.0) << "ended before the grace ran out";
  EXPECT_LT(waited, kUnavailableWithin);
  EXPECT_EQ(GetStats(stub.get()).num_active_streams(), 0);
}

}  // namespace
}  // namespace tandem::testing
