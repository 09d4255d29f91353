// DESIGN §9: every bad input gets its status code and a precise message,
// while a valid request running at the same time finishes unaffected.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <limits>
#include <thread>

#include "gtest/gtest.h"
#include "harness.h"

namespace tandem::testing {
namespace {

struct BadCase {
  const char* name;
  v1::GenerateRequest request;
  grpc::StatusCode code;
  std::string message;  // substring expected in the message
};

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases;
  auto base = [] { return MakeRequest({1, 5, 9}, 8); };
  cases.push_back({"empty prompt", MakeRequest({}, 8), grpc::StatusCode::INVALID_ARGUMENT,
                   "prompt_token_ids is empty"});
  cases.push_back({"token id == vocab", MakeRequest({1, 512}, 8),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "prompt_token_ids[1] = 512 is outside the vocabulary [0, 512)"});
  cases.push_back({"negative token id", MakeRequest({1, 3, -4}, 8),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "prompt_token_ids[2] = -4 is outside the vocabulary [0, 512)"});
  cases.push_back({"prompt + max_tokens > max_model_len", MakeRequest({1, 2, 3}, 510),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "prompt (3 tokens) + max_tokens (510) = 513 exceeds max_model_len 512"});
  {
    // As vLLM: a priority the fcfs policy (the default) would not honour.
    auto r = base();
    r.set_priority(-3);
    cases.push_back({"priority under fcfs", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "priority = -3 but priority scheduling is not enabled"});
  }
  cases.push_back({"max_tokens 0", MakeRequest({1, 2}, 0), grpc::StatusCode::INVALID_ARGUMENT,
                   "max_tokens must be >= 1, got 0"});
  cases.push_back({"max_tokens negative", MakeRequest({1, 2}, -3),
                   grpc::StatusCode::INVALID_ARGUMENT, "max_tokens must be >= 1, got -3"});
  {
    auto r = base();
    r.mutable_sampling()->set_temperature(-0.5f);
    cases.push_back({"negative temperature", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "temperature must be a finite number >= 0, got -0.5"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_temperature(std::numeric_limits<float>::quiet_NaN());
    cases.push_back({"NaN temperature", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "temperature must be a finite number >= 0"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_top_p(1.5f);
    cases.push_back(
        {"top_p > 1", r, grpc::StatusCode::INVALID_ARGUMENT, "top_p must be in (0, 1], got 1.5"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_top_p(-0.25f);
    cases.push_back(
        {"top_p < 0", r, grpc::StatusCode::INVALID_ARGUMENT, "top_p must be in (0, 1], got -0.25"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_top_p(std::numeric_limits<float>::infinity());
    cases.push_back({"top_p infinite", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "top_p must be in (0, 1], got inf"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_top_k(513);
    cases.push_back({"top_k > vocab", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "top_k must be in [0, 512], got 513"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_top_k(-1);
    cases.push_back({"negative top_k", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "top_k must be in [0, 512], got -1"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_min_tokens(-2);
    cases.push_back({"negative min_tokens", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "min_tokens must be in [0, max_tokens=8], got -2"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_min_tokens(9);
    cases.push_back({"min_tokens > max_tokens", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "min_tokens must be in [0, max_tokens=8], got 9"});
  }
  {
    auto r = base();
    r.mutable_sampling()->add_stop_token_ids(600);
    cases.push_back({"stop token outside vocab", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "stop token id 600 is outside the vocabulary [0, 512)"});
  }
  {
    auto r = base();
    r.mutable_sampling()->add_allowed_token_ids(5);
    r.mutable_sampling()->add_allowed_token_ids(512);
    cases.push_back({"allowed token outside vocab", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "allowed_token_ids token id 512 is outside the vocabulary [0, 512)"});
  }
  {
    auto r = base();
    r.set_request_id("a\nforged log line");
    cases.push_back({"request_id with a newline", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "request_id byte 1 is 0x0a"});
  }
  {
    auto r = base();
    r.set_request_id(std::string(300, 'i'));
    cases.push_back({"request_id too long", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "request_id is 300 bytes long; at most 256"});
  }
  {
    auto r = base();
    r.set_cache_salt("tenant-a");
    cases.push_back({"cache_salt not allowed", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "cache_salt is not accepted here"});
  }
  return cases;
}

// A request streamed on a thread of its own: how many tokens have come so
// far, and its result once joined.
class BackgroundGenerate {
 public:
  BackgroundGenerate(v1::Generation::Stub* stub, v1::GenerateRequest request)
      : thread_([this, stub, request = std::move(request)] {
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
          auto reader = stub->Generate(&context, request);
          v1::GenerateResponse msg;
          while (reader->Read(&msg)) {
            result_.tokens.insert(result_.tokens.end(), msg.token_ids().begin(),
                                  msg.token_ids().end());
            streamed_.store(result_.tokens.size());
          }
          result_.status = reader->Finish();
        }) {}
  ~BackgroundGenerate() {
    if (thread_.joinable()) thread_.join();
  }
  size_t streamed() const { return streamed_.load(); }
  const GenerateResult& Join() {
    thread_.join();
    return result_;
  }

 private:
  GenerateResult result_;
  std::atomic<size_t> streamed_{0};
  std::thread thread_;
};

TEST(BadInputTest, EachRuleHasItsCodeAndMessageWhileAValidRequestRuns) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {});
  auto stub = GenerationStub(scheduler.address());

  const v1::GenerateRequest valid = MakeRequest({1, 300, 301, 302}, 500, 0.0f, {}, true);
  const GenerateResult alone = RunGenerate(stub.get(), valid);
  ASSERT_TRUE(alone.status.ok());
  ASSERT_EQ(alone.tokens.size(), 500u);

  // The valid request is running (has streamed a token) before the first bad
  // request is sent, and is still running after the last one.
  BackgroundGenerate runner(stub.get(), valid);
  ASSERT_TRUE(WaitFor([&] { return runner.streamed() > 0; })) << "the valid request never streamed";
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.name);
    GenerateResult r = RunGenerate(stub.get(), c.request);
    EXPECT_EQ(r.status.error_code(), c.code) << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.message), std::string::npos)
        << "message: " << r.status.error_message();
    EXPECT_TRUE(r.tokens.empty());
  }
  EXPECT_LT(runner.streamed(), alone.tokens.size())
      << "the valid request finished before the bad ones were answered; the test proves nothing";
  // A deadline that passes mid-stream ends the call and frees the request.
  GenerateResult late = RunGenerate(stub.get(), MakeRequest({1, 7}, 500 - 3, 0.0f, {}, true),
                                    std::chrono::milliseconds(30));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const GenerateResult& concurrent = runner.Join();
  ASSERT_TRUE(concurrent.status.ok()) << concurrent.status.error_message();
  EXPECT_EQ(concurrent.tokens, alone.tokens);
  EXPECT_TRUE(WaitFor([&] {
    auto s = GetStats(stub.get());
    return s.num_active_streams() == 0 && s.num_running() == 0 &&
           s.num_free_blocks() == s.num_total_blocks();
  })) << GetStats(stub.get()).DebugString();
}

// No valid request is this big (8 MiB without --max-model-len): gRPC
// refuses it before it is parsed, instead of holding hundreds of MB (issue
// 29), and the scheduler serves the next request.
TEST(BadInputTest, AMessageLargerThanAnyValidRequestIsRefusedUnparsed) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {});
  auto stub = GenerationStub(scheduler.address());
  v1::GenerateRequest huge = MakeRequest({1, 5, 9}, 8);
  for (int i = 0; i < 5'000'000; ++i) huge.add_prompt_token_ids(300);
  const GenerateResult refused = RunGenerate(stub.get(), huge);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_message();
  const GenerateResult fine = RunGenerate(stub.get(), MakeRequest({1, 5, 9}, 8));
  EXPECT_TRUE(fine.status.ok()) << fine.status.error_message();
}

TEST(BadInputTest, FullWaitingQueueIsResourceExhausted) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  // A slow sim worker keeps the first request running while we fill the queue.
  Service worker = StartWorker(dir, "worker", {"--backend", "sim", "--sim-step-us", "20000"});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(),
                                     {"--max-num-seqs", "1", "--max-waiting", "1"});
  auto stub = GenerationStub(scheduler.address());
  GenerateResult first, second;
  std::thread t1([&] { first = RunGenerate(stub.get(), MakeRequest({1, 2}, 40, 0, {}, true)); });
  ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() == 1; }));
  std::thread t2([&] { second = RunGenerate(stub.get(), MakeRequest({1, 3}, 5, 0, {}, true)); });
  ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_waiting() == 1; }));
  GenerateResult third = RunGenerate(stub.get(), MakeRequest({1, 4}, 5));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << third.status.error_message();
  EXPECT_EQ(third.status.error_message(), "waiting queue is full (1 requests)");
  t1.join();
  t2.join();
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.tokens.size(), 40u);
  EXPECT_TRUE(second.status.ok()) << second.status.error_message();
}

// A passed deadline and a client cancel both abort the request; the client
// sees DEADLINE_EXCEEDED or CANCELLED, and the scheduler's log line of the
// request says which.
TEST(BadInputTest, DeadlineAndClientCancelAreToldApart) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  // 20 ms steps: 100 tokens take 2 s, so both calls end mid-stream.
  Service worker = StartWorker(dir, "worker", {"--backend", "sim", "--sim-step-us", "20000"});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {});
  auto stub = GenerationStub(scheduler.address());

  v1::GenerateRequest late = MakeRequest({1, 7}, 100, 0.0f, {}, true);
  late.set_request_id("late-deadline");
  GenerateResult late_result = RunGenerate(stub.get(), late, std::chrono::milliseconds(300));
  EXPECT_EQ(late_result.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << late_result.status.error_message();
  EXPECT_LT(late_result.tokens.size(), 100u);

  v1::GenerateRequest cancelled = MakeRequest({1, 8}, 100, 0.0f, {}, true);
  cancelled.set_request_id("client-cancel");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&context, cancelled);
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  context.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  std::string log;
  EXPECT_TRUE(WaitFor([&] {
    log = ReadFile(scheduler.log_path);
    return log.find("request client-cancel finished") != std::string::npos &&
           log.find("request late-deadline finished") != std::string::npos;
  })) << log;
  EXPECT_NE(log.find("request late-deadline finished: reason=abort status=DEADLINE_EXCEEDED"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("request client-cancel finished: reason=abort status=CANCELLED"),
            std::string::npos)
      << log;
}

// A request without an id gets one from the scheduler that no client's own
// id can take: while a client's request named "req-1" runs, requests without
// an id are served. The scheduler counted "req-1", "req-2", ...: the first
// request without an id collided with the running one (ALREADY_EXISTS, an
// error it did not cause), and anyone could guess the ids to abort.
TEST(BadInputTest, IdsTheSchedulerGivesNeverCollideWithAClientsOwn) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {});
  auto stub = GenerationStub(scheduler.address());
  v1::GenerateRequest named = MakeRequest({1, 300, 301}, 400, 0.0f, {}, /*ignore_eos=*/true);
  named.set_request_id("req-1");
  BackgroundGenerate runner(stub.get(), named);
  ASSERT_TRUE(WaitFor([&] { return runner.streamed() > 0; })) << "req-1 never streamed";
  for (int i = 0; i < 3; ++i) {
    const GenerateResult r = RunGenerate(stub.get(), MakeRequest({1, 7}, 2));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  EXPECT_LT(runner.streamed(), 400u) << "req-1 finished first; the test proves nothing";
  const GenerateResult& named_result = runner.Join();
  EXPECT_TRUE(named_result.status.ok()) << named_result.status.error_message();
}

// A worker whose configuration the scheduler cannot use (here a smaller
// max_model_len than the scheduler's): Generate says why, naming it, and the
// scheduler asks again every 2 s, logging the reason once, where it
// reconnected as fast as the RPCs returned.
TEST(BadInputTest, ARefusedWorkerIsNamedAndRetriedSlowly) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {"--max-model-len", "200"});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {"--max-model-len", "300"},
                                     /*wait_for_worker=*/false);
  auto stub = GenerationStub(scheduler.address());
  GenerateResult r;
  ASSERT_TRUE(WaitFor([&] {
    r = RunGenerate(stub.get(), MakeRequest({1, 2}, 4));
    return r.status.error_message().find("cannot use") != std::string::npos;
  })) << r.status.error_message();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(r.status.error_message().find("max_model_len"), std::string::npos)
      << r.status.error_message();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const std::string log = ReadFile(scheduler.log_path);
  size_t connects = 0;
  for (size_t at = log.find("connected to worker"); at != std::string::npos;
       at = log.find("connected to worker", at + 1)) {
    ++connects;
  }
  EXPECT_LE(connects, 4u) << "reconnecting without a pause";
  EXPECT_EQ(log.find("retrying every 2 s"), log.rfind("retrying every 2 s"))
      << "the reason logged more than once";
  EXPECT_EQ(HealthStatus(scheduler.address()), 2);  // NOT_SERVING
}

TEST(BadInputTest, NoWorkerIsUnavailable) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  // Nothing listens on port 1.
  Service scheduler =
      StartScheduler(dir, "scheduler", "127.0.0.1:1", {}, /*wait_for_worker=*/false);
  auto stub = GenerationStub(scheduler.address());
  GenerateResult r = RunGenerate(stub.get(), MakeRequest({1, 2}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(r.status.error_message().find("no worker is connected"), std::string::npos)
      << r.status.error_message();
  EXPECT_EQ(HealthStatus(scheduler.address()), 2);  // NOT_SERVING
  // Not ready, but alive: the liveness probe must not restart it.
  EXPECT_EQ(HealthStatus(scheduler.address(), "tandem.v1.Generation"), 2);
  EXPECT_EQ(HealthStatus(scheduler.address(), "tandem.liveness"), 1);
}

TEST(BadInputTest, DrainingRejectsNewCallsAndFinishesRunningOnes) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {"--backend", "sim", "--sim-step-us", "10000"});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {});
  auto stub = GenerationStub(scheduler.address());
  GenerateResult running;
  std::thread t([&] { running = RunGenerate(stub.get(), MakeRequest({1, 2}, 60, 0, {}, true)); });
  ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() == 1; }));
  scheduler.process.Signal(SIGTERM);
  ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).draining(); }));
  GenerateResult rejected = RunGenerate(stub.get(), MakeRequest({1, 3}, 4));
  EXPECT_EQ(rejected.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(rejected.status.error_message().find("draining"), std::string::npos)
      << rejected.status.error_message();
  t.join();
  EXPECT_TRUE(running.status.ok()) << running.status.error_message();
  EXPECT_EQ(running.tokens.size(), 60u);
  auto status = scheduler.process.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value()) << "scheduler did not exit after draining";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

// Kubernetes stops a pod by signalling all its containers at once: the
// worker runs the draining scheduler's steps until it detaches, so the
// requests it had accepted finish. The worker used to leave after 5 s and
// the request (8 s of steps) failed after the scheduler's drain timeout.
TEST(BadInputTest, SignallingTheWorkerWithItsSchedulerLetsTheSchedulerDrain) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {"--backend", "sim", "--sim-step-us", "20000"});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {});
  auto stub = GenerationStub(scheduler.address());
  GenerateResult running;
  std::thread t([&] { running = RunGenerate(stub.get(), MakeRequest({1, 2}, 400, 0, {}, true)); });
  ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() == 1; }));
  worker.process.Signal(SIGTERM);
  scheduler.process.Signal(SIGTERM);
  t.join();
  EXPECT_TRUE(running.status.ok()) << running.status.error_message();
  EXPECT_EQ(running.tokens.size(), 400u);
  for (Service* s : {&scheduler, &worker}) {
    auto status = s->process.Wait(std::chrono::seconds(30));
    ASSERT_TRUE(status.has_value()) << "did not exit after the drain";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  }
}

// A worker whose step never comes back (here: it sleeps 60 s in each) is
// wedged; after --step-timeout-s the scheduler drops it and the request ends
// with UNAVAILABLE naming the flag, instead of waiting for good; after its
// own --liveness-stall-s the worker's liveness reads NOT_SERVING, so that
// Kubernetes restarts it.
TEST(BadInputTest, AWedgedWorkerIsDroppedAndReadsNotLive) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker",
                               {"--backend", "sim", "--debug-step-delay-us", "60000000",
                                "--liveness-stall-s", "2"});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(),
                                     {"--step-timeout-s", "1", "--worker-loss-grace-s", "0"});
  EXPECT_EQ(HealthStatus(worker.address(), "tandem.liveness"), 1);
  auto stub = GenerationStub(scheduler.address());
  GenerateResult r = RunGenerate(stub.get(), MakeRequest({1, 2}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("--step-timeout-s"), std::string::npos)
      << r.status.error_message();
  EXPECT_TRUE(WaitFor([&] { return HealthStatus(worker.address(), "tandem.liveness") == 2; }))
      << "the worker stuck in a step still reads live";
}

// A drain that times out: the stream still running gets the engine's own
// UNAVAILABLE (its last write goes out after the engine loop has stopped,
// through the stream writer's final flush), not a cut connection.
TEST(BadInputTest, ADrainThatTimesOutEndsRunningStreamsWithUnavailable) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {"--backend", "sim", "--sim-step-us", "10000"});
  Service scheduler =
      StartScheduler(dir, "scheduler", worker.address(), {"--drain-timeout-s", "1"});
  auto stub = GenerationStub(scheduler.address());
  GenerateResult running;
  std::thread t([&] { running = RunGenerate(stub.get(), MakeRequest({1, 2}, 400, 0, {}, true)); });
  ASSERT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() == 1; }));
  scheduler.process.Signal(SIGTERM);
  t.join();
  EXPECT_EQ(running.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << running.status.error_message();
  EXPECT_NE(running.status.error_message().find("the scheduler is shutting down"),
            std::string::npos)
      << running.status.error_message();
  EXPECT_GT(running.tokens.size(), 0u);
  EXPECT_LT(running.tokens.size(), 400u);
  auto status = scheduler.process.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value()) << "scheduler did not exit after its drain timed out";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

}  // namespace
}  // namespace tandem::testing

namespace tandem::testing {
namespace {

// The drain race: calls the service accepted before SIGTERM but the engine
// had not taken yet (held in its queue by the TEST-ONLY submit delay) finish
// normally; a call after SIGTERM gets UNAVAILABLE; then the scheduler exits 0.
TEST(BadInputTest, DrainFinishesCallsAcceptedBeforeTheSignal) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {"--backend", "sim", "--sim-step-us", "1000"});
  Service scheduler =
      StartScheduler(dir, "scheduler", worker.address(), {"--debug-submit-delay-ms", "1500"});
  auto stub = GenerationStub(scheduler.address());
  ASSERT_EQ(HealthStatus(scheduler.address()), 1);
  GenerateResult a, b;
  std::thread ta([&] { a = RunGenerate(stub.get(), MakeRequest({1, 2}, 20, 0, {}, true)); });
  std::thread tb([&] { b = RunGenerate(stub.get(), MakeRequest({1, 3}, 20, 0, {}, true)); });
  // Both calls reach the service within milliseconds; the engine takes the
  // first 1.5 s later and the second 3 s later.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  scheduler.process.Signal(SIGTERM);
  ASSERT_TRUE(WaitFor([&] { return HealthStatus(scheduler.address()) == 2; }));
  // Draining: not ready, still alive.
  EXPECT_EQ(HealthStatus(scheduler.address(), "tandem.v1.Generation"), 2);
  EXPECT_EQ(HealthStatus(scheduler.address(), "tandem.liveness"), 1);
  GenerateResult rejected = RunGenerate(stub.get(), MakeRequest({1, 4}, 4));
  EXPECT_EQ(rejected.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(rejected.status.error_message().find("draining"), std::string::npos)
      << rejected.status.error_message();
  ta.join();
  tb.join();
  for (const GenerateResult* r : {&a, &b}) {
    EXPECT_TRUE(r->status.ok()) << r->status.error_code() << " " << r->status.error_message();
    EXPECT_EQ(r->tokens.size(), 20u);
    EXPECT_EQ(r->finish_reason, v1::FINISH_REASON_LENGTH);
  }
  auto status = scheduler.process.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value()) << "scheduler did not exit after draining";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

}  // namespace
}  // namespace tandem::testing

namespace tandem::testing {
namespace {

// The liveness watchdog: while the engine loop is stuck (here: held by the
// TEST-ONLY submit delay) tandem.liveness reads NOT_SERVING, so the kubelet
// would restart the process; once it goes round again, SERVING. An idle
// loop is not a stall.
TEST(BadInputTest, LivenessFollowsTheEngineLoop) {
  const std::string dir = MakeTempDir("tandem-bad-input");
  Service worker = StartWorker(dir, "worker", {"--backend", "sim", "--sim-step-us", "1000"});
  Service scheduler =
      StartScheduler(dir, "scheduler", worker.address(),
                     {"--debug-submit-delay-ms", "3000", "--liveness-stall-s", "1"});
  auto stub = GenerationStub(scheduler.address());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // idle for longer than 1 s
  EXPECT_EQ(HealthStatus(scheduler.address(), "tandem.liveness"), 1) << "idle is not stuck";
  GenerateResult r;
  std::thread t([&] { r = RunGenerate(stub.get(), MakeRequest({1, 2}, 4, 0, {}, true)); });
  EXPECT_TRUE(WaitFor([&] { return HealthStatus(scheduler.address(), "tandem.liveness") == 2; }))
      << "a stuck loop must read NOT_SERVING";
  t.join();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_TRUE(WaitFor([&] { return HealthStatus(scheduler.address(), "tandem.liveness") == 1; }));
}

}  // namespace
}  // namespace tandem::testing
