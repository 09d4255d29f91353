// StepExecutor in process (issue 13): the worker's step logic without gRPC,
// with a fake backend (records what it was fed, samples a token from the
// position) and a fake KV connector (records the order of its calls). These
// run under ASan/UBSan in CI, which the multi-process tests cannot. The
// overlap (a step prepared while the one before runs; issue 31) with a
// backend whose steps end only at Finish.
#include "tandem/worker/step_executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

using sched::CachedRequestData;
using sched::ModelRunnerOutput;
using sched::NewRequestData;
using sched::SchedulerOutput;

// Token = 100 + the position it is sampled for; remembers every batch.
class FakeBackend final : public StepBackend {
 public:
  absl::Status ForwardSample(std::span<const model::SequenceInput> batch,
                             std::span<const model::SampleRequest> sample,
                             std::vector<int32_t>* tokens,
                             std::vector<model::SampleLogprobs>* logprobs) override {
    calls.push_back("forward");
    if (logprobs != nullptr) logprobs->assign(batch.size(), {});
    if (!fail_with.ok()) return fail_with;
    fed.emplace_back();
    tokens->assign(batch.size(), -1);
    for (size_t i = 0; i < batch.size(); ++i) {
      fed.back().emplace_back(batch[i].token_ids.begin(), batch[i].token_ids.end());
      const model::SampleRequest& r = sample[i];
      histories.push_back({{r.prompt_token_ids.begin(), r.prompt_token_ids.end()},
                           {r.output_token_ids.begin(), r.output_token_ids.end()}});
      if (sample[i].params != nullptr) {
        (*tokens)[i] = 100 + batch[i].start_pos + static_cast<int32_t>(batch[i].token_ids.size());
      }
    }
    return absl::OkStatus();
  }
  std::vector<std::string>& calls;
  absl::Status fail_with;
  std::vector<std::vector<std::vector<int32_t>>> fed;  // per step, per request
  // The history each sample request carried (prompt, output): per step and
  // request, one after another.
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> histories;
  explicit FakeBackend(std::vector<std::string>& c) : calls(c) {}
};

// A device that runs each launched step until Finish: its tokens are those
// of `inner` (ForwardSample at Launch, as the sim backend computes them),
// given only at Finish, which fails with `fail_at_finish` when it is set.
class LaterBackend final : public StepBackend {
 public:
  explicit LaterBackend(FakeBackend& inner) : inner_(inner) {}
  absl::Status ForwardSample(std::span<const model::SequenceInput>,
                             std::span<const model::SampleRequest>, std::vector<int32_t>*,
                             std::vector<model::SampleLogprobs>*) override {
    return absl::InternalError("not called with overlap");
  }
  absl::Status Launch(std::span<const model::SequenceInput> batch,
                      std::span<const model::SampleRequest> sample, bool want_logprobs,
                      std::function<void()> on_done) override {
    EXPECT_FALSE(launched) << "launched before the step before was finished";
    launched = true;
    logprobs_.clear();
    status_ = inner_.ForwardSample(batch, sample, &tokens_, want_logprobs ? &logprobs_ : nullptr);
    on_done_ = std::move(on_done);
    return absl::OkStatus();
  }
  absl::Status Finish(std::vector<int32_t>* tokens,
                      std::vector<model::SampleLogprobs>* logprobs) override {
    EXPECT_TRUE(launched);
    launched = false;
    on_done_();
    *tokens = tokens_;
    *logprobs = logprobs_;
    return std::exchange(fail_at_finish, absl::OkStatus()).ok()
               ? status_
               : absl::InternalError("lost at the end");
  }
  bool launched = false;
  absl::Status fail_at_finish;

 private:
  FakeBackend& inner_;
  absl::Status status_;
  std::vector<int32_t> tokens_;
  std::vector<model::SampleLogprobs> logprobs_;
  std::function<void()> on_done_;
};

class FakeConnector final : public sched::KvConnectorWorker {
 public:
  explicit FakeConnector(std::vector<std::string>& c) : calls(c) {}
  void LoadBlocks(const sched::KvConnectorMetadata& meta,
                  sched::KvConnectorReport* report) override {
    calls.push_back("load");
    for (const sched::KvLoad& l : meta.loads) {
      report->finished_recving.push_back(l.request_id);
      report->invalid_block_ids.push_back(l.block_ids.front());  // the first never arrives
      ++report->num_load_failed_rpc;
    }
  }
  void SnapshotStores(const sched::KvConnectorMetadata& meta) override {
    calls.push_back("snapshot");
    for (const sched::KvStoreOp& s : meta.stores) done.push_back(s.request_id);
  }
  void TakeFinishedSending(sched::KvConnectorReport* report) override {
    report->finished_sending.insert(report->finished_sending.end(), done.begin(), done.end());
    done.clear();
  }
  void FinishLoads(sched::KvConnectorReport* report, std::chrono::microseconds wait) override {
    waits.push_back(wait);
    report->finished_recving.insert(report->finished_recving.end(), arrived.begin(), arrived.end());
    arrived.clear();
  }
  void ForgetLoads() override { ++forgotten; }
  std::vector<std::string>& calls;
  std::vector<std::string> done;
  std::vector<std::string> arrived;  // loads FinishLoads reports next
  std::vector<std::chrono::microseconds> waits;
  int forgotten = 0;
};

SchedulerOutput NewStep(uint64_t id, uint64_t last_processed, const std::string& req,
                        std::vector<int32_t> prompt, SamplingParams sampling = {}) {
  SchedulerOutput s{.step_id = id, .last_processed_step_id = last_processed};
  const int32_t n = static_cast<int32_t>(prompt.size());
  s.scheduled_new_reqs.push_back(NewRequestData{.request_id = req,
                                                .prompt_token_ids = std::move(prompt),
                                                .sampling = std::move(sampling),
                                                .block_ids = {0, 1}});
  s.num_scheduled_tokens = {n};
  s.total_num_scheduled_tokens = n;
  return s;
}

SchedulerOutput DecodeStep(uint64_t id, uint64_t last_processed, const std::string& req,
                           int32_t num_computed, int32_t placeholders) {
  SchedulerOutput s{.step_id = id, .last_processed_step_id = last_processed};
  s.scheduled_cached_reqs.push_back(CachedRequestData{.request_id = req,
                                                      .num_computed_tokens = num_computed,
                                                      .num_output_placeholders = placeholders});
  s.num_scheduled_tokens = {1};
  s.total_num_scheduled_tokens = 1;
  return s;
}

class StepExecutorTest : public ::testing::Test {
 protected:
  std::vector<std::string> calls_;
  FakeBackend backend_{calls_};
  FakeConnector connector_{calls_};
};

TEST_F(StepExecutorTest, AsyncStepsFeedTheirOwnSamplesAndCheckThePlaceholders) {
  StepExecutor ex(&backend_, nullptr);
  ModelRunnerOutput o1 = ex.Execute(NewStep(1, 0, "a", {1, 2, 3}));
  ASSERT_TRUE(o1.error.empty()) << o1.error;
  ASSERT_EQ(o1.sampled.size(), 1u);
  EXPECT_EQ(o1.sampled[0].token_ids, std::vector<int32_t>{103});
  // Built before step 1's output was processed: one placeholder, which the
  // worker fills with the token it sampled.
  ModelRunnerOutput o2 = ex.Execute(DecodeStep(2, 0, "a", 3, 1));
  ASSERT_TRUE(o2.error.empty()) << o2.error;
  EXPECT_EQ(backend_.fed[1][0], std::vector<int32_t>{103});
  EXPECT_EQ(o2.sampled[0].token_ids, std::vector<int32_t>{104});
  ModelRunnerOutput o3 = ex.Execute(DecodeStep(3, 1, "a", 4, 1));  // step 2's token unseen
  ASSERT_TRUE(o3.error.empty()) << o3.error;
  // The scheduler processed step 3, so nothing is a placeholder, but it
  // claims one: the two sides would feed different tokens.
  ModelRunnerOutput o4 = ex.Execute(DecodeStep(4, 3, "a", 5, 1));
  EXPECT_NE(o4.error.find("1 output placeholders on the scheduler, but this worker sampled 0"),
            std::string::npos)
      << o4.error;
  EXPECT_TRUE(o4.sampled.empty());
  EXPECT_EQ(backend_.fed.size(), 3u) << "a step failing the check must not run";
}

// The penalties read the request's history: its prompt and every output
// token before the one drawn, those the worker sampled itself (async
// placeholders) included. Without penalties nothing is carried.
TEST_F(StepExecutorTest, PenalizedRequestsCarryTheirHistoryToTheSampler) {
  StepExecutor ex(&backend_, nullptr);
  ASSERT_TRUE(
      ex.Execute(NewStep(1, 0, "a", {1, 2, 3}, {.repetition_penalty = 1.2f})).error.empty());
  ASSERT_TRUE(ex.Execute(DecodeStep(2, 0, "a", 3, 1)).error.empty());
  ASSERT_TRUE(ex.Execute(DecodeStep(3, 0, "a", 4, 2)).error.empty());
  ASSERT_TRUE(ex.Execute(NewStep(4, 3, "b", {7, 8})).error.empty());
  using History = std::pair<std::vector<int32_t>, std::vector<int32_t>>;
  ASSERT_EQ(backend_.histories.size(), 4u);
  EXPECT_EQ(backend_.histories[0], (History{{1, 2, 3}, {}}));
  EXPECT_EQ(backend_.histories[1], (History{{1, 2, 3}, {103}}));
  EXPECT_EQ(backend_.histories[2], (History{{1, 2, 3}, {103, 104}}));
  EXPECT_EQ(backend_.histories[3], (History{{}, {}}));
}

TEST_F(StepExecutorTest, AFailedStepReportsItsLoadsAndTheStepsBuiltOnItDoNotRun) {
  StepExecutor ex(&backend_, &connector_, {.debug_fail_steps = {2}});
  ASSERT_TRUE(ex.Execute(NewStep(1, 0, "a", {1, 2, 3})).error.empty());
  SchedulerOutput step2 = NewStep(2, 0, "b", {5, 6});
  step2.kv_connector_metadata.loads.push_back({.request_id = "b", .block_ids = {7}});
  step2.kv_connector_metadata.stores.push_back({.request_id = "b", .block_ids = {7}});
  calls_.clear();
  ModelRunnerOutput o2 = ex.Execute(std::move(step2));
  EXPECT_NE(o2.error.find("TEST-ONLY"), std::string::npos) << o2.error;
  EXPECT_EQ(o2.step_id, 2u);
  EXPECT_TRUE(o2.sampled.empty());
  EXPECT_EQ(o2.kv_connector_report.finished_recving, std::vector<std::string>{"b"});
  EXPECT_EQ(o2.kv_connector_report.invalid_block_ids, std::vector<int32_t>{7});
  EXPECT_EQ(o2.kv_connector_report.num_load_failed_rpc, 1);
  EXPECT_EQ(calls_, std::vector<std::string>{"load"}) << "no forward pass, no store snapshot";
  // Its store never ran: the connector reports it with a later step
  // (kvconnector_test: AFailedStepsStoreIsReportedOnce), not the step.
  EXPECT_TRUE(o2.kv_connector_report.finished_sending.empty());
  EXPECT_TRUE(o2.kv_connector_report.failed_sending.empty());
  // Step 3 was built before the scheduler saw step 2 fail: it must not run.
  ModelRunnerOutput o3 = ex.Execute(DecodeStep(3, 1, "a", 3, 0));
  EXPECT_NE(o3.error.find("was built on step 2, which failed"), std::string::npos) << o3.error;
  // Once the scheduler has processed the failure, steps run again.
  ModelRunnerOutput o4 = ex.Execute(NewStep(4, 3, "c", {9}));
  EXPECT_TRUE(o4.error.empty()) << o4.error;
  EXPECT_EQ(o4.sampled[0].token_ids, std::vector<int32_t>{101});
}

TEST_F(StepExecutorTest, AForwardErrorFailsTheStepAndItsStoresAreNotSnapshotted) {
  StepExecutor ex(&backend_, &connector_);
  backend_.fail_with = absl::InternalError("device lost");
  SchedulerOutput step = NewStep(1, 0, "a", {1, 2});
  step.kv_connector_metadata.stores.push_back({.request_id = "a", .block_ids = {0}});
  ModelRunnerOutput o = ex.Execute(std::move(step));
  EXPECT_EQ(o.error, "device lost");
  EXPECT_EQ(calls_, (std::vector<std::string>{"load", "forward"}));
  backend_.fail_with = absl::OkStatus();
  // A later, independent step runs; stores come after the forward pass.
  SchedulerOutput next = NewStep(2, 1, "b", {3});
  next.kv_connector_metadata.stores.push_back({.request_id = "b", .block_ids = {1}});
  calls_.clear();
  ModelRunnerOutput o2 = ex.Execute(std::move(next));
  EXPECT_TRUE(o2.error.empty()) << o2.error;
  EXPECT_EQ(calls_, (std::vector<std::string>{"load", "forward", "snapshot"}));
  EXPECT_EQ(o2.kv_connector_report.finished_sending, std::vector<std::string>{"b"});
}

// Loads arrive beside the steps (issue 32): after its forward pass a step
// reports the loads that arrived meanwhile, without waiting when it computed
// something, and waiting up to empty_step_load_wait when it had nothing to
// compute; the end of the scheduler's stream forgets the loads in flight.
TEST_F(StepExecutorTest, AStepWithNothingToComputeWaitsForLoadsAndResetForgetsThem) {
  StepExecutor ex(&backend_, &connector_, {.empty_step_load_wait = std::chrono::milliseconds(7)});
  connector_.arrived = {"x"};
  ModelRunnerOutput o1 = ex.Execute(NewStep(1, 0, "a", {1, 2, 3}));
  ASSERT_TRUE(o1.error.empty()) << o1.error;
  EXPECT_EQ(o1.kv_connector_report.finished_recving, std::vector<std::string>{"x"});
  SchedulerOutput empty{.step_id = 2, .last_processed_step_id = 1};
  empty.kv_connector_metadata.loads.push_back({.request_id = "b", .block_ids = {7}});
  ASSERT_TRUE(ex.Execute(std::move(empty)).error.empty());
  EXPECT_EQ(connector_.waits, (std::vector<std::chrono::microseconds>{
                                  std::chrono::microseconds(0), std::chrono::milliseconds(7)}));
  EXPECT_EQ(connector_.forgotten, 0);
  ex.Reset("scheduler-detached");
  EXPECT_EQ(connector_.forgotten, 1);
}

TEST_F(StepExecutorTest, BadStepsFailWithAPreciseErrorAndResetForgetsEverything) {
  StepExecutor ex(&backend_, nullptr);
  ModelRunnerOutput unknown = ex.Execute(DecodeStep(1, 0, "nobody", 0, 0));
  EXPECT_NE(unknown.error.find("cached request nobody is unknown to this worker"),
            std::string::npos)
      << unknown.error;
  ASSERT_TRUE(ex.Execute(NewStep(2, 1, "a", {1, 2, 3})).error.empty());
  // Schedules more tokens than the worker knows.
  SchedulerOutput too_far = DecodeStep(3, 2, "a", 3, 0);
  too_far.num_scheduled_tokens = {5};
  EXPECT_NE(ex.Execute(std::move(too_far)).error.find("schedules 5 tokens from position 3"),
            std::string::npos);
  EXPECT_EQ(ex.num_requests(), 1);
  // A step built in process (no FromProto to check it) whose token counts
  // are not parallel to its requests: refused before anything is indexed.
  SchedulerOutput unparallel = DecodeStep(4, 3, "a", 3, 0);
  unparallel.num_scheduled_tokens.clear();
  EXPECT_NE(ex.Execute(std::move(unparallel)).error.find("schedules 1 requests but has 0"),
            std::string::npos);
  ex.Reset("scheduler-detached");
  EXPECT_EQ(ex.num_requests(), 0);
  EXPECT_NE(ex.Execute(DecodeStep(1, 0, "a", 4, 0)).error.find("unknown"), std::string::npos);
  // A step the adapter could not read (here one built on the failed step 1)
  // is rejected: nothing of it applied, and every step built before the
  // scheduler saw that fails, naming it, whatever its diff says.
  ModelRunnerOutput rejected = ex.Reject(2, absl::InvalidArgumentError("bad hash"));
  EXPECT_EQ(rejected.error, "bad hash");
  EXPECT_TRUE(rejected.rejected);
  EXPECT_EQ(rejected.step_id, 2u);
  EXPECT_NE(ex.Execute(NewStep(3, 1, "b", {1})).error.find("was built on step 2, which failed"),
            std::string::npos);
  EXPECT_EQ(ex.num_requests(), 1) << "a new request of a step that does not run is still known";
  // Its placeholder count is wrong too: the message names the rejected step.
  const std::string built_on = ex.Execute(DecodeStep(4, 1, "b", 1, 3)).error;
  EXPECT_NE(built_on.find("was built on step 2, which failed"), std::string::npos) << built_on;
  EXPECT_TRUE(ex.Execute(NewStep(5, 4, "c", {2})).error.empty());
}

// Step 2 is prepared while step 1 runs, before step 1's token is known: its
// input and its penalty history point at the slot step 1's Finish fills,
// so the backend is fed the token step 1 sampled, as without the overlap.
TEST_F(StepExecutorTest, AStepPreparedWhileTheOneBeforeRunsIsFedThatStepsToken) {
  LaterBackend later(backend_);
  StepExecutor ex(&later, &connector_);
  bool done1 = false;
  std::unique_ptr<StepExecutor::Step> s1 =
      ex.Prepare(NewStep(1, 0, "a", {1, 2, 3}, {.repetition_penalty = 1.2f}));
  ex.Launch(*s1, [&] { done1 = true; });
  EXPECT_FALSE(done1) << "the step runs until Finish";
  std::unique_ptr<StepExecutor::Step> s2 = ex.Prepare(DecodeStep(2, 0, "a", 3, 1));
  // A request that arrives while step 1 runs.
  SchedulerOutput step3 = NewStep(3, 1, "b", {7, 8});
  ModelRunnerOutput o1 = ex.Finish(std::move(s1));
  EXPECT_TRUE(done1);
  ASSERT_TRUE(o1.error.empty()) << o1.error;
  EXPECT_EQ(o1.sampled[0].token_ids, std::vector<int32_t>{103});
  ex.Launch(*s2, [] {});
  std::unique_ptr<StepExecutor::Step> s3 = ex.Prepare(std::move(step3));
  ModelRunnerOutput o2 = ex.Finish(std::move(s2));
  ASSERT_TRUE(o2.error.empty()) << o2.error;
  EXPECT_EQ(o2.sampled[0].token_ids, std::vector<int32_t>{104});
  ex.Launch(*s3, [] {});
  ASSERT_TRUE(ex.Finish(std::move(s3)).error.empty());
  ASSERT_EQ(backend_.fed.size(), 3u);
  EXPECT_EQ(backend_.fed[1][0], std::vector<int32_t>{103});
  using History = std::pair<std::vector<int32_t>, std::vector<int32_t>>;
  EXPECT_EQ(backend_.histories[1], (History{{1, 2, 3}, {103}}));
  EXPECT_EQ(calls_, (std::vector<std::string>{"load", "forward", "snapshot", "load", "forward",
                                              "snapshot", "load", "forward", "snapshot"}))
      << "a step's loads come after the step before has ended and stored";
}

// A request the scheduler finished while a step that holds it runs (async
// scheduling: it stopped at the step before), and a new request under the
// same id in the next step: the running step's token goes to the state it
// was launched with (kept until it is finished; ASan sees a use after
// free otherwise), not into the new request's.
TEST_F(StepExecutorTest, ARequestFinishedWhileItsStepRunsIsKeptUntilTheStepIsFinished) {
  LaterBackend later(backend_);
  StepExecutor ex(&later, nullptr);
  std::unique_ptr<StepExecutor::Step> s1 = ex.Prepare(NewStep(1, 0, "a", {1, 2, 3}));
  ex.Launch(*s1, [] {});
  SchedulerOutput step2 = NewStep(2, 0, "a", {4, 5});
  step2.finished_req_ids = {"a"};
  std::unique_ptr<StepExecutor::Step> s2 = ex.Prepare(std::move(step2));
  ASSERT_TRUE(ex.Finish(std::move(s1)).error.empty());
  ex.Launch(*s2, [] {});
  ModelRunnerOutput o2 = ex.Finish(std::move(s2));
  ASSERT_TRUE(o2.error.empty()) << o2.error;
  EXPECT_EQ(backend_.fed[1][0], (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(o2.sampled[0].token_ids, std::vector<int32_t>{102});
  // Its next decode feeds its own sample, not step 1's.
  ASSERT_TRUE(ex.Execute(DecodeStep(3, 2, "a", 2, 0)).error.empty());
  EXPECT_EQ(backend_.fed[2][0], std::vector<int32_t>{102});
  EXPECT_EQ(ex.num_requests(), 1);
}

// Step 2 was prepared on step 1 before step 1 failed at its end: it does
// not run, as a step built on a failed one never does, and step 1 stores
// nothing.
TEST_F(StepExecutorTest, AStepPreparedOnOneThatFailsAtItsEndDoesNotRun) {
  LaterBackend later(backend_);
  StepExecutor ex(&later, &connector_);
  SchedulerOutput step1 = NewStep(1, 0, "a", {1, 2, 3});
  step1.kv_connector_metadata.stores.push_back({.request_id = "a", .block_ids = {0}});
  std::unique_ptr<StepExecutor::Step> s1 = ex.Prepare(std::move(step1));
  ex.Launch(*s1, [] {});
  std::unique_ptr<StepExecutor::Step> s2 = ex.Prepare(DecodeStep(2, 0, "a", 3, 1));
  later.fail_at_finish = absl::InternalError("device lost");
  ModelRunnerOutput o1 = ex.Finish(std::move(s1));
  EXPECT_EQ(o1.error, "lost at the end");
  EXPECT_TRUE(o1.kv_connector_report.failed_sending.empty()) << "the connector reports it";
  ex.Launch(*s2, [] {});
  EXPECT_FALSE(later.launched);
  ModelRunnerOutput o2 = ex.Finish(std::move(s2));
  EXPECT_NE(o2.error.find("was built on step 1, which failed"), std::string::npos) << o2.error;
  EXPECT_EQ(backend_.fed.size(), 1u);
  EXPECT_EQ(std::count(calls_.begin(), calls_.end(), "snapshot"), 0);
}

// Whether a prepared step's Launch returns before the step is done: so the
// worker knows whether to send the step before's output first (a launch
// that runs the step would hold it for a whole step).
TEST_F(StepExecutorTest, ALaunchReturnsAtOnceOnlyWhereTheBackendsDoes) {
  StepExecutor runs_it(&backend_, nullptr);
  EXPECT_FALSE(runs_it.LaunchReturnsAtOnce(*runs_it.Prepare(NewStep(1, 0, "a", {1, 2}))));
  SimBackend sim(/*vocab_size=*/16, {2}, /*step_us=*/0, /*token_us=*/0);
  StepExecutor sim_ex(&sim, nullptr);
  EXPECT_TRUE(sim_ex.LaunchReturnsAtOnce(*sim_ex.Prepare(NewStep(1, 0, "a", {1, 2}))));
  // Nothing to compute, or a step that already failed: nothing is launched.
  EXPECT_FALSE(sim_ex.LaunchReturnsAtOnce(*sim_ex.Prepare(SchedulerOutput{.step_id = 2})));
  EXPECT_FALSE(sim_ex.LaunchReturnsAtOnce(*sim_ex.Prepare(DecodeStep(3, 2, "nobody", 0, 0))));
}

// The sim backend's Launch returns at once; the step is done (on_done,
// Finish) after its delay, with ForwardSample's tokens, and the modelled
// device is busy for the delay of each step. on_done runs at most once a
// step, and not for a step that Finish has ended.
TEST(SimBackendTest, LaunchReturnsAndTheStepEndsAfterItsDelay) {
  SimBackend sim(/*vocab_size=*/16, {2}, /*step_us=*/20'000, /*token_us=*/0);
  SamplingParams greedy;
  const std::vector<int32_t> ids = {3, 4, 5};
  const std::vector<model::SequenceInput> batch = {{.token_ids = ids, .start_pos = 0}};
  const std::vector<model::SampleRequest> sample = {{.params = &greedy}};
  std::vector<int32_t> want;
  ASSERT_TRUE(sim.ForwardSample(batch, sample, &want, nullptr).ok());
  std::atomic<int> done{0};
  ASSERT_TRUE(sim.Launch(batch, sample, false, [&] { done.fetch_add(1); }).ok());
  for (int i = 0; i < 10'000 && done.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(done.load(), 1) << "a step nobody finishes says when it is done";
  std::vector<int32_t> got;
  std::vector<model::SampleLogprobs> logprobs;
  ASSERT_TRUE(sim.Finish(&got, &logprobs).ok());
  EXPECT_EQ(got, want);
  ASSERT_TRUE(sim.Launch(batch, sample, false, [&] { done.fetch_add(1); }).ok());
  ASSERT_TRUE(sim.Finish(&got, &logprobs).ok());
  EXPECT_EQ(got, want);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_LE(done.load(), 2);
  const model::DeviceTime t = sim.device_time();
  EXPECT_EQ(t.steps, 3);
  // Each step is (start + delay) - start on the clock's doubles, which may
  // round a nanosecond short of the delay.
  EXPECT_GE(t.busy_s, 0.060 - 1e-9);
}

TEST(SimBackendTest, DeterministicAndNeverAnyEos) {
  const std::vector<int32_t> eos = {2, 5, 6};  // three, as Llama 3's
  SimBackend sim(/*vocab_size=*/8, eos, 0, 0);
  SamplingParams greedy;
  // One-token sequences: last token x at position p for every x and p < 8.
  std::vector<std::vector<int32_t>> tokens;
  std::vector<model::SequenceInput> batch;
  int num_raw_on_extra_eos = 0;  // the hash alone would give 5 or 6
  for (int32_t x = 0; x < 8; ++x) tokens.push_back({x});
  for (int32_t x = 0; x < 8; ++x) {
    for (int32_t p = 0; p < 8; ++p) {
      batch.push_back({.token_ids = tokens[x], .start_pos = p});
      const uint64_t raw =
          (static_cast<uint64_t>(x) * 2654435761ull + static_cast<uint64_t>(p + 1) * 40503ull) % 8;
      num_raw_on_extra_eos += raw == 5 || raw == 6;
    }
  }
  ASSERT_GT(num_raw_on_extra_eos, 0) << "the inputs must reach the extra EOS ids";
  std::vector<model::SampleRequest> sample(batch.size(), {.params = &greedy});
  std::vector<int32_t> t1, t2;
  ASSERT_TRUE(sim.ForwardSample(batch, sample, &t1, nullptr).ok());
  ASSERT_TRUE(sim.ForwardSample(batch, sample, &t2, nullptr).ok());
  EXPECT_EQ(t1, t2);
  ASSERT_EQ(t1.size(), batch.size());
  for (int32_t t : t1) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 8);
    EXPECT_EQ(std::count(eos.begin(), eos.end(), t), 0) << t;
  }
  // Every id an EOS: it samples one anyway instead of looping.
  SimBackend all_eos(/*vocab_size=*/2, {0, 1}, 0, 0);
  ASSERT_TRUE(all_eos.ForwardSample(batch, sample, &t1, nullptr).ok());
}

}  // namespace
}  // namespace tandem::worker
