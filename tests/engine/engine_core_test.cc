// EngineCore in process: the scheduler's engine and the worker's
// StepExecutor, joined by a loopback transport instead of gRPC, running the
// real stories260K model. Greedy tokens are checked against llama2.c's
// (../shared/models/stories260K.reference.json), so a step lost, run twice,
// run out of order or fed the wrong placeholders shows up as a wrong token.
// Runs under ASan and TSan in CI (tools/test.sh), which the multi-process
// tests cannot do cheaply.
// Sampling, logprobs and EOS ids are in engine_core_sampling_test.cc.
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine_core_fixture.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

// A cache that cannot hold one request of max_model_len is refused when the
// worker connects, naming both numbers (vLLM refuses to start); a
// --max-model-len that fits makes the same worker usable.
TEST_P(EngineCoreTest, RefusesAMaxModelLenTheKvCacheCannotHold) {
  LoopbackWorker worker(model_.get(), 30);  // 29 usable blocks: 464 tokens
  EngineCore core(Options());
  const absl::Status s = core.ConnectWorker(worker.description, &worker);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("max_model_len (512) is larger than the maximum number of tokens "
                             "the worker's KV cache can hold (464"),
            std::string::npos)
      << s;
  EXPECT_FALSE(core.model_info().ready);
  EngineCoreOptions fits = Options();
  fits.max_model_len = 464;
  EngineCore core2(fits);
  ASSERT_TRUE(core2.ConnectWorker(worker.description, &worker).ok());
  EXPECT_EQ(core2.model_info().max_model_len, 464);
}

// A --max-model-len past the model's own context is refused naming both
// numbers (vLLM refuses to start), not lowered to the model's without a word.
TEST_P(EngineCoreTest, RefusesAMaxModelLenPastTheModelsContext) {
  LoopbackWorker worker(model_.get(), 256);
  EngineCoreOptions options = Options();
  options.max_model_len = worker.description.max_model_len + 1;
  EngineCore core(options);
  const absl::Status s = core.ConnectWorker(worker.description, &worker);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(absl::StrCat("--max-model-len (", options.max_model_len,
                                          ") is larger than the model's context (",
                                          worker.description.max_model_len)),
            std::string::npos)
      << s;
  EXPECT_FALSE(core.model_info().ready);
  options.max_model_len = worker.description.max_model_len;
  EngineCore at_the_limit(options);
  ASSERT_TRUE(at_the_limit.ConnectWorker(worker.description, &worker).ok());
  EXPECT_EQ(at_the_limit.model_info().max_model_len, worker.description.max_model_len);
}

TEST_P(EngineCoreTest, GreedyTokensMatchLlama2cWithLargeAndTinyKvCaches) {
  // 30 blocks of 16 tokens (the longest case needs 29 on its own): requests
  // wait for blocks or are preempted and recomputed; 256: they all run at
  // once.
  for (int32_t num_blocks : {256, 30}) {
    SCOPED_TRACE("num_blocks " + std::to_string(num_blocks));
    EngineCoreOptions options = Options();
    // 29 usable blocks hold 464 tokens, less than the model's 512: a
    // max_model_len that fits (vLLM's start-up rule, the next test).
    if (num_blocks == 30) options.max_model_len = 29 * 16;
    EngineCore core(options);
    LoopbackWorker worker(model_.get(), num_blocks);
    ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
    // Every case twice: 10 requests at once.
    auto sinks = SubmitAll(core);
    auto again = SubmitAll(core, "again-");
    Run(core, worker);
    ExpectReference(sinks);
    ExpectReference(again);
    const EngineStats stats = core.stats();
    EXPECT_EQ(stats.max_steps_in_flight, async() ? 2 : 1);
    if (num_blocks == 30) {  // the pool held requests back (or preempted them)
      EXPECT_GT(
          stats.scheduler.num_preemptions_total +
              stats.scheduler
                  .num_admission_blocked_steps[static_cast<int>(sched::AdmissionLimit::kKvBlocks)],
          0u);
    }
    EXPECT_EQ(stats.num_requests, 0);
  }
}

TEST_P(EngineCoreTest, AFailedStepIsRecomputedAndEveryRequestStillMatches) {
  EngineCore core(Options());
  // Step 3 fails on the worker (after its loads, before its forward pass);
  // in async mode step 4, built on it, fails with it.
  LoopbackWorker worker(model_.get(), 256, {.debug_fail_steps = {3}});
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sinks = SubmitAll(core);
  Run(core, worker);
  ExpectReference(sinks);
  EXPECT_GT(core.stats().scheduler.num_preemptions_total, 0u);
  EXPECT_TRUE(lost_reasons_.empty()) << "a failed step is not a lost worker";
}

TEST_P(EngineCoreTest, WrongPlaceholderCountsFailTheStepAndAreRecomputed) {
  if (!async()) GTEST_SKIP() << "placeholders exist only with async scheduling";
  EngineCore core(Options());
  LoopbackWorker worker(model_.get(), 256);
  // One step claims a placeholder more than the worker sampled: the worker
  // must refuse it rather than feed a token the scheduler never saw.
  int corrupted = 0;
  worker.on_send = [&](sched::SchedulerOutput& step) {
    if (corrupted == 0 && step.step_id >= 4) {
      for (sched::CachedRequestData& c : step.scheduled_cached_reqs) {
        ++c.num_output_placeholders;
        ++corrupted;
        break;
      }
    }
  };
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sinks = SubmitAll(core);
  Run(core, worker);
  ASSERT_EQ(corrupted, 1);
  ExpectReference(sinks);
  EXPECT_GT(core.stats().scheduler.num_preemptions_by_reason[static_cast<int>(
                sched::PreemptionReason::kStepFailed)],
            0u);
}

TEST_P(EngineCoreTest, AnOutputForTheWrongStepDropsTheWorker) {
  EngineCore core(Options());
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sinks = SubmitAll(core);
  core.Step();
  sched::ModelRunnerOutput out = worker.RunOldest();
  out.step_id += 7;
  core.ProcessOutput(out);
  EXPECT_FALSE(core.has_worker());
  ASSERT_EQ(lost_reasons_.size(), 1u);
  EXPECT_NE(lost_reasons_[0].find("but step 1 was expected"), std::string::npos)
      << lost_reasons_[0];
  for (const auto& s : sinks) {
    EXPECT_TRUE(s->ended);
    EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable) << s->status;
  }
  EXPECT_EQ(core.num_requests(), 0u);
}

TEST_P(EngineCoreTest, AWorkerLostWithTwoStepsInFlightFailsEveryRequestOnceWithoutGrace) {
  EngineCore core(Options(/*grace_s=*/0));
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sinks = SubmitAll(core);
  // Run a few steps so requests have streamed tokens, then stop with the
  // window full.
  Run(core, worker, 6);
  core.Step();
  ASSERT_EQ(worker.sent.size(), async() ? 2u : 1u);
  core.DropWorker("the test pulled the plug");
  EXPECT_FALSE(core.has_worker());
  EXPECT_FALSE(core.model_info().ready);
  for (const auto& s : sinks) {
    EXPECT_TRUE(s->ended);
    EXPECT_EQ(s->reason, FinishReason::kError);
    EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable) << s->status;
    EXPECT_NE(s->status.message().find("the test pulled the plug"), std::string::npos);
  }
  // Outputs of the lost worker's steps arrive late: ignored.
  core.ProcessOutput(worker.RunOldest());
  EXPECT_EQ(core.num_requests(), 0u);
  // A new request without a worker is refused at once.
  auto late = std::make_shared<Recorder>();
  core.AddRequest(Greedy("late", cases_[0]), late, MonotonicNanos());
  EXPECT_TRUE(late->rejected);
  EXPECT_EQ(late->status.code(), absl::StatusCode::kUnavailable);
}

TEST_P(EngineCoreTest, AWorkerLostWithTwoStepsInFlightResumesOnTheNextWithTheSameTokens) {
  EngineCore core(Options(/*grace_s=*/60));
  auto first = std::make_unique<LoopbackWorker>(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(first->description, first.get()).ok());
  // One with logprobs first: its prompt's go out once, before the loss.
  auto scored = std::make_shared<Recorder>();
  sched::RequestSpec scored_spec = Greedy("scored", cases_[2]);
  scored_spec.sampling.logprobs = 1;
  scored_spec.sampling.prompt_logprobs = 1;
  core.AddRequest(scored_spec, scored, MonotonicNanos());
  auto sinks = SubmitAll(core);
  Run(core, *first, 6);
  ASSERT_FALSE(scored->tokens.empty());
  core.Step();
  ASSERT_EQ(first->sent.size(), async() ? 2u : 1u);
  // The stream breaks with the window full; one step even ran, but its
  // output never comes back.
  first->RunOldest();
  core.DropWorker("stream broke");
  EXPECT_FALSE(core.has_worker());
  ASSERT_EQ(lost_reasons_.size(), 1u);
  EXPECT_TRUE(core.model_info().ready) << "requests still validate against its model";
  for (const auto& s : sinks) EXPECT_FALSE(s->ended);
  // A request that arrives meanwhile waits too; an invalid one is refused now.
  auto waiting = std::make_shared<Recorder>();
  core.AddRequest(Greedy("arrived-during-loss", cases_[1]), waiting, MonotonicNanos());
  EXPECT_FALSE(waiting->ended);
  auto invalid = std::make_shared<Recorder>();
  sched::RequestSpec bad = Greedy("bad", cases_[0]);
  bad.prompt_token_ids.push_back(1 << 20);
  core.AddRequest(bad, invalid, MonotonicNanos());
  EXPECT_TRUE(invalid->rejected);
  EXPECT_EQ(invalid->status.code(), absl::StatusCode::kInvalidArgument) << invalid->status;
  // With no worker, the loop's next deadline is the grace's end.
  const std::optional<EngineCore::Clock::time_point> grace_end = core.NextDeadline();
  ASSERT_TRUE(grace_end.has_value());
  EXPECT_GT(*grace_end, EngineCore::Clock::now() + std::chrono::seconds(20));

  LoopbackWorker second(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(second.description, &second).ok());
  // The grace ended with the new worker: a Tick past its end fails nothing.
  core.Tick(*grace_end + std::chrono::seconds(1));
  for (const auto& s : sinks) EXPECT_FALSE(s->ended);
  EXPECT_FALSE(waiting->ended);
  Run(core, second);
  ExpectReference(sinks);
  EXPECT_TRUE(waiting->ended);
  EXPECT_EQ(waiting->tokens, cases_[1].Streamed());
  EXPECT_EQ(core.stats().num_worker_lost_preemptions, cases_.size() + 1);
  // The resumed request did not score its prompt again (Recorder checks
  // that prompt logprobs come once) and has a logprob for every token.
  EXPECT_EQ(scored->tokens, cases_[2].Streamed());
  EXPECT_EQ(scored->prompt_logprobs.size(), cases_[2].prompt.size() - 1);
  EXPECT_EQ(scored->logprobs.size(), scored->tokens.size());
}

// --max-waiting is for new work: requests accepted before a worker loss all
// resume on the next worker (they went back through the waiting limit, and
// all but one failed RESOURCE_EXHAUSTED), while the requests that arrive
// during the grace count against it.
TEST_P(EngineCoreTest, RequestsResumedAfterAWorkerLossAreNotHeldToTheWaitingLimit) {
  EngineCoreOptions options = Options(/*grace_s=*/60);
  options.scheduler.max_waiting_requests = 1;
  EngineCore core(options);
  auto first = std::make_unique<LoopbackWorker>(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(first->description, first.get()).ok());
  std::vector<std::shared_ptr<Recorder>> sinks;
  for (size_t i = 0; i < cases_.size(); ++i) {
    sinks.push_back(std::make_shared<Recorder>());
    core.AddRequest(Greedy("case-" + std::to_string(i), cases_[i]), sinks.back(), MonotonicNanos());
    ASSERT_FALSE(sinks.back()->rejected) << sinks.back()->status;
    Run(core, *first, 1);  // each one admitted before the next arrives
  }
  ASSERT_GE(cases_.size(), 3u);
  const sched::SchedulerStats before = core.stats().scheduler;
  ASSERT_GT(before.num_requests_admitted, 0u);
  core.DropWorker("stream broke");
  for (const auto& s : sinks) EXPECT_FALSE(s->ended);
  // Within the grace the kept requests count as waiting (not 0), and the
  // lost scheduler's counters stay counted (Prometheus counters never go
  // down).
  EXPECT_EQ(core.stats().num_waiting, static_cast<int32_t>(cases_.size()));
  EXPECT_EQ(core.stats().scheduler.num_requests_admitted, before.num_requests_admitted);
  EXPECT_EQ(core.stats().scheduler.num_steps, before.num_steps);
  auto arrived = std::make_shared<Recorder>();
  core.AddRequest(Greedy("arrived", cases_[0]), arrived, MonotonicNanos());
  EXPECT_FALSE(arrived->rejected) << arrived->status;
  auto over = std::make_shared<Recorder>();
  core.AddRequest(Greedy("over", cases_[1]), over, MonotonicNanos());
  EXPECT_TRUE(over->rejected);
  EXPECT_EQ(over->status.code(), absl::StatusCode::kResourceExhausted) << over->status;
  LoopbackWorker second(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(second.description, &second).ok());
  Run(core, second);
  ExpectReference(sinks);
  EXPECT_EQ(arrived->tokens, cases_[0].Streamed());
  EXPECT_GT(core.stats().scheduler.num_requests_admitted,
            before.num_requests_admitted + cases_.size())
      << "the first scheduler's admissions plus the second's";
}

TEST_P(EngineCoreTest, AFailedSendDropsTheWorker) {
  EngineCore core(Options(/*grace_s=*/0));
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sinks = SubmitAll(core);
  Run(core, worker, 3);
  worker.broken = true;
  Run(core, worker, 3);
  EXPECT_FALSE(core.has_worker());
  ASSERT_EQ(lost_reasons_.size(), 1u);
  EXPECT_NE(lost_reasons_[0].find("Execute stream failed"), std::string::npos);
  for (const auto& s : sinks) EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable);
}

// A worker whose process and connection live on but whose steps never come
// back (a hung kernel, a deadlocked loop) is wedged: after step_timeout_s
// without an answer it is dropped like a broken stream, instead of holding
// its requests for good. Each answer pushes the deadline on.
TEST_P(EngineCoreTest, AWorkerThatAnswersNoStepForTheStepTimeoutIsDropped) {
  EngineCoreOptions o = Options(/*grace_s=*/0);
  o.step_timeout_s = 300;
  EngineCore core(o);
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sinks = SubmitAll(core);
  core.Step();
  ASSERT_FALSE(worker.sent.empty());
  const auto first = core.NextDeadline();  // the window is full: the step deadline
  ASSERT_TRUE(first.has_value());
  EXPECT_GT(*first, EngineCore::Clock::now() + std::chrono::seconds(290));
  core.ProcessOutput(worker.RunOldest());
  core.Step();
  const auto second = core.NextDeadline();
  ASSERT_TRUE(second.has_value());
  EXPECT_GT(*second, *first);  // the answer pushed it on
  core.Tick(*second - std::chrono::seconds(1));
  EXPECT_TRUE(core.has_worker());
  core.Tick(*second);
  EXPECT_FALSE(core.has_worker());
  ASSERT_EQ(lost_reasons_.size(), 1u);
  EXPECT_NE(lost_reasons_[0].find("--step-timeout-s"), std::string::npos) << lost_reasons_[0];
  for (const auto& s : sinks) {
    EXPECT_TRUE(s->ended);
    EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable) << s->status;
  }

  // 0: no step deadline.
  o.step_timeout_s = 0;
  EngineCore patient(o);
  LoopbackWorker other(model_.get(), 256);
  ASSERT_TRUE(patient.ConnectWorker(other.description, &other).ok());
  auto more = SubmitAll(patient);
  patient.Step();
  EXPECT_FALSE(patient.NextDeadline().has_value());
  Run(patient, other);
  ExpectReference(more);
}

TEST_P(EngineCoreTest, TheGraceRunsOutAndTheKeptRequestsEndUnavailable) {
  EngineCore core(Options(/*grace_s=*/30));
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sinks = SubmitAll(core);
  core.Step();
  core.DropWorker("gone");
  const auto deadline = core.NextDeadline();  // no worker: the grace's end
  ASSERT_TRUE(deadline.has_value());
  core.Tick(*deadline - std::chrono::seconds(1));
  for (const auto& s : sinks) EXPECT_FALSE(s->ended);
  core.Tick(*deadline);
  for (const auto& s : sinks) {
    EXPECT_TRUE(s->ended);
    EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable) << s->status;
    EXPECT_NE(s->status.message().find("--worker-loss-grace-s"), std::string::npos);
  }
  EXPECT_FALSE(core.model_info().ready);
}

TEST_P(EngineCoreTest, AbortAndCancelEndOnlyTheirRequest) {
  EngineCore core(Options());
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sinks = SubmitAll(core);
  Run(core, worker, 4);
  // A cancel from a sink that is not the request's changes nothing.
  Recorder stranger;
  EXPECT_FALSE(core.Abort("case-0", &stranger, absl::CancelledError("stale")));
  EXPECT_TRUE(core.Abort("case-0", sinks[0].get(), absl::CancelledError("cancelled")));
  EXPECT_TRUE(core.Abort("case-1", nullptr, absl::OkStatus()));
  EXPECT_FALSE(core.Abort("case-1", nullptr, absl::OkStatus()));
  EXPECT_EQ(sinks[0]->status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sinks[1]->reason, FinishReason::kAbort);
  EXPECT_TRUE(sinks[1]->status.ok());
  // A duplicate id of a live request is refused; the live one is unaffected.
  auto dup = std::make_shared<Recorder>();
  core.AddRequest(Greedy("case-2", cases_[2]), dup, MonotonicNanos());
  EXPECT_TRUE(dup->rejected);
  EXPECT_EQ(dup->status.code(), absl::StatusCode::kAlreadyExists);
  Run(core, worker);
  for (size_t i = 2; i < cases_.size(); ++i) EXPECT_EQ(sinks[i]->tokens, cases_[i].Streamed());
  // The streamed part of an aborted request is a prefix of its reference.
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<int32_t> want = cases_[i].Streamed();
    ASSERT_LE(sinks[i]->tokens.size(), want.size());
    EXPECT_TRUE(std::equal(sinks[i]->tokens.begin(), sinks[i]->tokens.end(), want.begin()));
  }
}

TEST_P(EngineCoreTest, BadRequestsAreRefusedWithThePreciseError) {
  EngineCore core(Options());
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  const int32_t vocab = worker.description.vocab_size;
  struct Bad {
    sched::RequestSpec spec;
    std::string message;
  };
  std::vector<Bad> bad;
  bad.push_back({Greedy("empty", cases_[0]), "prompt_token_ids is empty"});
  bad.back().spec.prompt_token_ids.clear();
  bad.push_back({Greedy("oov", cases_[0]), "prompt_token_ids[1] = " + std::to_string(vocab) +
                                               " is outside the vocabulary [0, " +
                                               std::to_string(vocab) + ")"});
  bad.back().spec.prompt_token_ids = {1, vocab};
  bad.push_back({Greedy("long", cases_[0]),
                 "exceeds max_model_len " + std::to_string(worker.description.max_model_len)});
  bad.back().spec.sampling.max_tokens = worker.description.max_model_len;
  bad.push_back({Greedy("topk", cases_[0]), "sampling: "});
  bad.back().spec.sampling.top_k = -5;
  for (Bad& b : bad) {
    auto sink = std::make_shared<Recorder>();
    core.AddRequest(b.spec, sink, MonotonicNanos());
    ASSERT_TRUE(sink->rejected) << b.spec.request_id;
    EXPECT_EQ(sink->status.code(), absl::StatusCode::kInvalidArgument) << sink->status;
    EXPECT_NE(sink->status.message().find(b.message), std::string::npos)
        << sink->status << " lacks " << b.message;
  }
  EXPECT_EQ(core.num_requests(), 0u);
  EXPECT_FALSE(core.NextDeadline().has_value()) << "nothing to do until an event";
}

// A scheduler-role connector that answers every lookup with no hit and
// does nothing else; the connectors below change what their test needs.
class QuietConnector : public sched::KvConnectorScheduler {
 public:
  std::optional<sched::ExternalMatch> GetNumNewMatchedTokens(const sched::Request&,
                                                             int32_t) override {
    return sched::ExternalMatch{};
  }
  void UpdateStateAfterAlloc(const sched::Request&, std::span<const int32_t>, int32_t) override {}
  sched::KvConnectorMetadata BuildConnectorMeta(
      const sched::SchedulerOutput&, std::span<const sched::ScheduledRequestView>) override {
    return {};
  }
  bool RequestFinished(const sched::Request&, std::span<const int32_t>, int32_t) override {
    return false;
  }
};

// A scheduler-role connector that only counts store entries: each finished
// request leaves one until the worker reports it in finished_sending.
class CountingStoreConnector final : public QuietConnector {
 public:
  bool RequestFinished(const sched::Request& r, std::span<const int32_t>, int32_t) override {
    storing->insert(r.request_id);
    return false;
  }
  void OnConnectorReport(const sched::KvConnectorReport& report) override {
    for (const std::string& id : report.finished_sending) storing->erase(id);
  }
  sched::KvConnectorSchedulerStats stats() const override {
    return {.stores_in_flight = static_cast<int32_t>(storing->size())};
  }
  std::set<std::string>* storing = nullptr;
};

// A connector whose end waits (as the KV-store client's does for the calls
// a stalled store has not answered) until the test lets it go.
class SlowToEndConnector final : public QuietConnector {
 public:
  explicit SlowToEndConnector(std::shared_future<void> may_end) : may_end_(std::move(may_end)) {}
  ~SlowToEndConnector() override { may_end_.wait(); }

 private:
  std::shared_future<void> may_end_;
};

// The connector of a dropped worker ends off the engine's loop: a KV-store
// that stalls (its client waits up to 5 s for the calls in flight) used to
// hold the loop, and every request and cancel behind it, on a worker loss.
TEST_P(EngineCoreTest, ADroppedWorkersConnectorEndsOffTheLoop) {
  std::promise<void> end;
  std::shared_future<void> may_end = end.get_future().share();
  EngineCoreOptions options = Options();
  options.make_kv_connector = [may_end](const WorkerDescription&) {
    return std::make_unique<SlowToEndConnector>(may_end);
  };
  {
    EngineCore core(options);
    LoopbackWorker worker(model_.get(), 256);
    ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
    std::future<void> dropped =
        std::async(std::launch::async, [&core] { core.DropWorker("gone"); });
    const bool returned = dropped.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    end.set_value();  // before any assertion can leave with `dropped` blocked
    EXPECT_TRUE(returned) << "DropWorker waited for the connector's end";
    EXPECT_FALSE(core.has_worker());
  }  // the engine waits for the connector's end
}

TEST_P(EngineCoreTest, AnIdleStepCollectsTheStoresThatFinishedAfterTheLastRequest) {
  std::set<std::string> storing;
  EngineCoreOptions options = Options();
  options.make_kv_connector = [&storing](const WorkerDescription&) {
    auto c = std::make_unique<CountingStoreConnector>();
    c->storing = &storing;
    return c;
  };
  EngineCore core(options);
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  auto sink = std::make_shared<Recorder>();
  core.AddRequest(Greedy("only", cases_[0]), sink, MonotonicNanos());
  Run(core, worker);
  // The finished id still goes to the worker with one more step.
  while (Due(core) || !worker.sent.empty()) {
    core.Wake();
    core.Step();
    if (!worker.sent.empty()) core.ProcessOutput(worker.RunOldest());
  }
  ASSERT_TRUE(sink->ended);
  EXPECT_EQ(sink->tokens, cases_[0].Streamed());
  ASSERT_EQ(storing, std::set<std::string>{"only"});
  // Idle: nothing to schedule, so Step() sends nothing...
  EXPECT_FALSE(core.NextDeadline().has_value());
  const int sent_before = worker.num_sent;
  core.Wake();
  core.Step();
  EXPECT_EQ(worker.num_sent, sent_before);
  // ...but the store is still out: a Tick arms a collection a period later.
  const EngineCore::Clock::time_point now = EngineCore::Clock::now();
  core.Tick(now);
  ASSERT_EQ(core.NextDeadline(), now + EngineCore::kIdleStoreCollectPeriod);
  worker.finished_sending = {"only"};  // the worker finished it meanwhile
  core.Tick(now + EngineCore::kIdleStoreCollectPeriod / 2);
  EXPECT_EQ(worker.num_sent, sent_before) << "collected before the period ran out";
  core.Tick(now + EngineCore::kIdleStoreCollectPeriod);
  ASSERT_EQ(worker.num_sent, sent_before + 1);
  EXPECT_EQ(worker.sent.front().total_num_scheduled_tokens, 0);
  EXPECT_TRUE(worker.sent.front().num_scheduled_tokens.empty());
  core.ProcessOutput(worker.RunOldest());
  EXPECT_TRUE(storing.empty());
  core.Tick(now + EngineCore::kIdleStoreCollectPeriod * 3);  // nothing left: no step
  EXPECT_EQ(worker.num_sent, sent_before + 1);
  EXPECT_FALSE(core.NextDeadline().has_value());
}

// A scheduler-role connector whose lookups are pending until `answered`.
class PendingLookupConnector final : public QuietConnector {
 public:
  std::optional<sched::ExternalMatch> GetNumNewMatchedTokens(const sched::Request&,
                                                             int32_t) override {
    if (!answered) return std::nullopt;
    return sched::ExternalMatch{};
  }
  bool answered = false;
};

// A lookup that answers while the empty step sent during it is still in
// flight: with async scheduling the request's prefill goes out at once
// (Wake), not after that step's output, which a worker holding it for KV-
// store loads can delay (--kvstore-empty-step-wait-ms); sync scheduling
// has room for one step, so it waits for that output.
TEST_P(EngineCoreTest, ALookupAnsweredWhileAnEmptyStepRunsIsScheduledAtOnce) {
  PendingLookupConnector* connector = nullptr;
  EngineCoreOptions options = Options();
  options.make_kv_connector = [&connector](const WorkerDescription&) {
    auto c = std::make_unique<PendingLookupConnector>();
    connector = c.get();
    return c;
  };
  EngineCore core(options);
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  ASSERT_NE(connector, nullptr);
  auto sink = std::make_shared<Recorder>();
  core.AddRequest(Greedy("looked-up", cases_[0]), sink, MonotonicNanos());
  core.Step();
  ASSERT_EQ(worker.num_sent, 1);
  EXPECT_EQ(worker.sent.front().total_num_scheduled_tokens, 0) << "the lookup is pending";
  connector->answered = true;
  core.Wake();
  core.Step();
  if (async()) {
    ASSERT_EQ(worker.num_sent, 2) << "the prefill waited for the empty step's output";
    EXPECT_GT(worker.sent.back().total_num_scheduled_tokens, 0);
  } else {
    EXPECT_EQ(worker.num_sent, 1);
  }
  Run(core, worker);
  ASSERT_TRUE(sink->ended);
  EXPECT_EQ(sink->tokens, cases_[0].Streamed());
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, EngineCoreTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Async" : "Sync";
                         });

}  // namespace
}  // namespace tandem::engine
