// tandem-worker on its own: health during a slow model load, hand-built
// Execute streams (the placeholder check, the overlap of steps, an empty
// step's wait for KV-store loads), and the per-request log line.
#include <thread>

#include "gtest/gtest.h"
#include "harness.h"
#include "kv_util.h"

namespace tandem::testing {
namespace {

// Health is NOT_SERVING from the moment the port is known until the model is
// loaded (gRPC's default health service would say SERVING in between), and
// Describe refuses until then.
TEST(WorkerTest, NotServingWhileTheModelLoads) {
  const std::string dir = MakeTempDir("tandem-worker");
  const auto started = std::chrono::steady_clock::now();
  Service worker = StartWorker(dir, "worker", {"--debug-load-delay-ms", "5000"},
                               /*wait_for_serving=*/false);
  ASSERT_GT(worker.port, 0);
  // The port file appears before the load delay starts, so there are ~5 s.
  EXPECT_EQ(HealthStatus(worker.address()), 2) << "SERVING before the model is loaded";
  EXPECT_EQ(HealthStatus(worker.address(), "tandem.v1.Worker"), 2);
  EXPECT_EQ(HealthStatus(worker.address(), "tandem.liveness"), 1) << "loading is alive";
  auto stub = WorkerStub(worker.address());
  {
    grpc::ClientContext context;
    v1::DescribeResponse d;
    grpc::Status s = stub->Describe(&context, {}, &d);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(s.error_message(), "model is still loading");
  }
  EXPECT_EQ(HealthStatus(worker.address()), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(4000))
      << "too slow to be inside the load delay; the checks above prove nothing";
  ASSERT_TRUE(WaitFor([&] { return HealthStatus(worker.address()) == 1; }));
  const v1::DescribeResponse d = Describe(stub.get());
  EXPECT_GT(d.vocab_size(), 0);
  // The KV layout names the backend that makes the values, so that a CPU
  // and a CUDA worker (whose K/V differ in rounding) never share blocks
  // through a KV-store: it is in the namespace and every block's hash.
  EXPECT_EQ(d.backend(), "cpu");
  EXPECT_TRUE(d.kv_layout().ends_with("/f32/cpu")) << d.kv_layout();
}

class ExecuteStream {
 public:
  explicit ExecuteStream(v1::Worker::Stub* stub) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream_ = stub->Execute(&context_);
  }
  v1::ModelRunnerOutput Run(const v1::SchedulerOutput& step) {
    EXPECT_TRUE(stream_->Write(step));
    v1::ModelRunnerOutput out;
    EXPECT_TRUE(stream_->Read(&out));
    EXPECT_EQ(out.step_id(), step.step_id());
    return out;
  }
  grpc::Status Close() {
    stream_->WritesDone();
    return stream_->Finish();
  }
  grpc::ClientReaderWriter<v1::SchedulerOutput, v1::ModelRunnerOutput>& raw() { return *stream_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SchedulerOutput, v1::ModelRunnerOutput>> stream_;
};

v1::SchedulerOutput DecodeStep(uint64_t step_id, const std::string& id, int32_t computed,
                               int32_t placeholders, uint64_t last_processed) {
  v1::SchedulerOutput step;
  step.set_step_id(step_id);
  v1::CachedRequestData* r = step.add_scheduled_cached_reqs();
  r->set_request_id(id);
  r->set_num_computed_tokens(computed);
  r->set_num_output_placeholders(placeholders);
  step.add_num_scheduled_tokens(1);
  step.set_total_num_scheduled_tokens(1);
  step.set_last_processed_step_id(last_processed);
  return step;
}

// Step 1 of request "p": its 3-token prompt in block 1, 10 tokens at most,
// EOS ignored.
v1::SchedulerOutput PrefillStep(bool seeded = false) {
  v1::SchedulerOutput prefill;
  prefill.set_step_id(1);
  v1::NewRequestData* r = prefill.add_scheduled_new_reqs();
  r->set_request_id("p");
  for (int32_t t : {1, 5, 9}) r->add_prompt_token_ids(t);
  r->mutable_sampling()->set_max_tokens(10);
  r->mutable_sampling()->set_ignore_eos(true);
  if (seeded) r->mutable_sampling()->set_has_seed(true);
  r->add_block_ids(1);
  prefill.add_num_scheduled_tokens(3);
  prefill.set_total_num_scheduled_tokens(3);
  return prefill;
}

// The async pipeline as the scheduler drives it, then a step whose
// num_output_placeholders disagrees with what the worker sampled: the step
// fails with a precise error instead of feeding a wrong token.
TEST(WorkerTest, PlaceholderCountMustMatchTheTokensTheWorkerSampled) {
  const std::string dir = MakeTempDir("tandem-worker");
  Service worker = StartWorker(dir, "worker", {"--num-blocks", "8"});
  auto stub = WorkerStub(worker.address());
  ExecuteStream stream(stub.get());

  v1::ModelRunnerOutput out = stream.Run(PrefillStep(/*seeded=*/true));
  ASSERT_TRUE(out.error().empty()) << out.error();
  ASSERT_EQ(out.sampled_size(), 1);
  ASSERT_EQ(out.sampled(0).token_ids_size(), 1);

  // Step 2 was built before step 1's output: one placeholder.
  out = stream.Run(DecodeStep(2, "p", 3, 1, 0));
  ASSERT_TRUE(out.error().empty()) << out.error();
  // Step 3 was built after step 1's output, before step 2's: one placeholder.
  out = stream.Run(DecodeStep(3, "p", 4, 1, 1));
  ASSERT_TRUE(out.error().empty()) << out.error();
  // Step 4 claims no placeholder though step 3's token was not processed.
  out = stream.Run(DecodeStep(4, "p", 5, 0, 2));
  EXPECT_EQ(out.error(),
            "step 4: request p has 0 output placeholders on the scheduler, but this worker "
            "sampled 1 tokens for it after step 2, the last step the scheduler had processed");
  EXPECT_EQ(out.sampled_size(), 0);
  // Built before step 4's failure was processed: it names step 4, not its
  // placeholders.
  out = stream.Run(DecodeStep(5, "p", 5, 2, 3));
  EXPECT_EQ(out.error(), "step 5 was built on step 4, which failed; it is not run");
  // And one built after it that claims too many.
  out = stream.Run(DecodeStep(6, "p", 5, 2, 5));
  EXPECT_EQ(out.error(),
            "step 6: request p has 2 output placeholders on the scheduler, but this worker "
            "sampled 0 tokens for it after step 5, the last step the scheduler had processed");
  EXPECT_TRUE(stream.Close().ok());
  // Closing the stream drops the request, with its log line.
  EXPECT_TRUE(WaitFor([&] {
    return ReadFile(worker.log_path).find("request p dropped: reason=scheduler-detached") !=
           std::string::npos;
  })) << ReadFile(worker.log_path);
}

// A step's output is written on a thread of its own: a stream that ends
// while outputs are queued still gets each of them, in order, before the
// worker lets it go (with the writer held back 300 ms an output).
TEST(WorkerTest, AStreamThatEndsGetsTheOutputsStillQueued) {
  const std::string dir = MakeTempDir("tandem-worker");
  Service worker =
      StartWorker(dir, "worker", {"--num-blocks", "8", "--debug-send-delay-us", "300000"});
  auto stub = WorkerStub(worker.address());
  ExecuteStream stream(stub.get());
  ASSERT_TRUE(stream.raw().Write(PrefillStep()));
  ASSERT_TRUE(stream.raw().Write(DecodeStep(2, "p", 3, 1, 0)));
  stream.raw().WritesDone();  // the end, while both outputs wait for the writer
  for (uint64_t id : {1, 2}) {
    v1::ModelRunnerOutput out;
    ASSERT_TRUE(stream.raw().Read(&out)) << "output of step " << id << " lost";
    EXPECT_EQ(out.step_id(), id);
    EXPECT_TRUE(out.error().empty()) << out.error();
    EXPECT_EQ(out.sampled_size(), 1);
  }
  EXPECT_TRUE(stream.raw().Finish().ok());
}

// A step that arrives while the one before runs, when the scheduler runs
// ahead (async scheduling: step 2 was built before step 1's output, step 3
// before step 2's), is prepared meanwhile and fed the token that step
// samples, as when each step is prepared after the one before
// (--overlap-steps=false): the same outputs, and the worker counts the
// overlap. Step 1 is not ahead of anything, so the worker finishes it at
// once (a scheduler that waits for it) and prepares step 2 after it. The
// sim backend's 300 ms steps leave the next step time to arrive.
TEST(WorkerTest, AStepPreparedWhileTheOneBeforeRunsGivesTheSameTokens) {
  const std::string dir = MakeTempDir("tandem-worker");
  std::vector<std::vector<int32_t>> tokens;
  std::vector<double> overlapped;
  for (const char* overlap : {"--overlap-steps=true", "--overlap-steps=false"}) {
    Service worker =
        StartWorker(dir, std::string("worker") + overlap,
                    {"--num-blocks", "8", "--backend", "sim", "--sim-step-us", "300000", overlap});
    auto stub = WorkerStub(worker.address());
    ExecuteStream stream(stub.get());
    ASSERT_TRUE(stream.raw().Write(PrefillStep()));
    ASSERT_TRUE(stream.raw().Write(DecodeStep(2, "p", 3, 1, 0)));
    ASSERT_TRUE(stream.raw().Write(DecodeStep(3, "p", 4, 1, 1)));
    tokens.emplace_back();
    for (uint64_t id : {1, 2, 3}) {
      v1::ModelRunnerOutput out;
      ASSERT_TRUE(stream.raw().Read(&out));
      EXPECT_EQ(out.step_id(), id);
      ASSERT_TRUE(out.error().empty()) << out.error();
      ASSERT_EQ(out.sampled_size(), 1);
      ASSERT_EQ(out.sampled(0).token_ids_size(), 1);
      tokens.back().push_back(out.sampled(0).token_ids(0));
    }
    EXPECT_TRUE(stream.Close().ok());
    overlapped.push_back(ScrapeMetric(worker, "tandem_worker_steps_overlapped_total"));
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(overlapped, (std::vector<double>{1, 0}));
}

// A step with nothing to compute waits for the KV-store loads in flight
// (--kvstore-empty-step-wait-ms), unless a step is queued behind it. Here
// the scheduler runs ahead: step 2, empty, is launched while its load
// takes 500 ms (the wait is 1 s), and step 3, a prefill, arrives before the
// worker finishes step 2 (or while it waits). Either way step 2 stops
// waiting, so it answers before the load arrives (its report has no load)
// and step 3 runs; the load is reported by a later empty step. Without the
// rule that a step taken from the queue counts as queued while the
// launched step is unfinished, step 2 held the prefill until the load came.
TEST(WorkerTest, AnEmptyStepStopsWaitingForLoadsWhenAStepIsQueuedBehindIt) {
  const std::string dir = MakeTempDir("tandem-worker");
  Service kv = StartKvStore(dir, "kv", {"--debug-load-delay-ms", "500"});
  Service worker = StartWorker(
      dir, "worker",
      {"--num-blocks", "8", "--kvstore", kv.address(), "--kvstore-empty-step-wait-ms", "1000"});
  auto stub = WorkerStub(worker.address());
  ExecuteStream stream(stub.get());
  // Step 1 begins a load of one block the store does not have.
  v1::SchedulerOutput load;
  load.set_step_id(1);
  v1::KvLoad* l = load.mutable_kv_connector_metadata()->add_loads();
  l->set_request_id("loaded");
  l->add_block_hashes(std::string(32, '\x5a'));
  l->add_block_ids(2);
  v1::SchedulerOutput empty;
  empty.set_step_id(2);
  v1::SchedulerOutput prefill = PrefillStep();
  prefill.set_step_id(3);
  prefill.set_last_processed_step_id(1);
  for (const v1::SchedulerOutput* step : {&load, &empty, &prefill}) {
    ASSERT_TRUE(stream.raw().Write(*step));
  }
  for (uint64_t id : {1, 2, 3}) {
    v1::ModelRunnerOutput out;
    ASSERT_TRUE(stream.raw().Read(&out));
    ASSERT_EQ(out.step_id(), id);
    EXPECT_TRUE(out.error().empty()) << out.error();
    EXPECT_EQ(out.kv_connector_report().finished_recving_size(), 0)
        << "step " << id << " waited for the load";
    if (id == 3) {
      EXPECT_EQ(out.sampled_size(), 1);
    }
  }
  // Nothing behind these: each waits for the load (a miss) up to 1 s.
  v1::ModelRunnerOutput out;
  for (uint64_t id = 4; id < 24 && out.kv_connector_report().finished_recving_size() == 0; ++id) {
    empty.set_step_id(id);
    empty.set_last_processed_step_id(id - 1);
    out = stream.Run(empty);
    EXPECT_TRUE(out.error().empty()) << out.error();
  }
  ASSERT_EQ(out.kv_connector_report().finished_recving_size(), 1);
  EXPECT_EQ(out.kv_connector_report().finished_recving(0), "loaded");
  EXPECT_EQ(out.kv_connector_report().num_load_failed_not_found(), 1);
  EXPECT_TRUE(stream.Close().ok());
}

// One log line per request when the worker drops its state: id, reason,
// tokens computed and sampled, steps, preemptions, time held.
TEST(WorkerTest, LogsEachRequestWhenItDropsItsState) {
  const std::string dir = MakeTempDir("tandem-worker");
  Service worker = StartWorker(dir, "worker", {});
  Service scheduler =
      StartScheduler(dir, "scheduler", worker.address(), {"--async-scheduling=false"});
  auto stub = GenerationStub(scheduler.address());
  v1::GenerateRequest request = MakeRequest({1, 5, 9}, 12, 0, {}, /*ignore_eos=*/true);
  request.set_request_id("log-me");
  GenerateResult result = RunGenerate(stub.get(), request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.tokens.size(), 12u);
  std::string log;
  ASSERT_TRUE(WaitFor([&] {
    log = ReadFile(worker.log_path);
    return log.find("request log-me dropped") != std::string::npos;
  })) << log;
  // Sync scheduling: one prefill step and 11 decode steps; the 12th token's
  // KV is never computed.
  EXPECT_NE(log.find("request log-me dropped: reason=finished prompt_tokens=3 computed_tokens=14 "
                     "sampled_tokens=12 steps=12 preemptions=0 held_ms="),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace tandem::testing
