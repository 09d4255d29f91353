// EngineCore in process: the scheduler's engine and the worker's
// StepExecutor, joined by a loopback transport instead of gRPC, running the
// real stories260K model. Greedy tokens are checked against llama2.c's
// (../shared/models/stories260K.reference.json), so a step lost, run twice,
// run out of order or fed the wrong placeholders shows up as a wrong token.
// Runs under ASan and TSan in CI (tools/test.sh), which the multi-process
// tests cannot do cheaply.
#include "tandem/engine/engine_core.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../model/test_util.h"
#include "gtest/gtest.h"
#include "tandem/common/clock.h"
#include "tandem/model/sampler.h"
#include "tandem/worker/step_executor.h"

namespace tandem::engine {
namespace {

using model::testing::LoadCases;
using model::testing::ReferenceCase;

// One worker in process: steps queue here when the engine sends them and run
// through a StepExecutor when the test says so.
class LoopbackWorker final : public StepTransport {
 public:
  LoopbackWorker(const model::Model* model, int32_t num_blocks,
                 worker::StepExecutorOptions options = {}) {
    auto runner =
        model::ModelRunner::Create(model, {.block_size = kBlockSize, .num_blocks = num_blocks});
    EXPECT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(runner).value();
    backend_ = std::make_unique<worker::RunnerBackend>(runner_.get());
    if (options.eos_token_ids.empty()) options.eos_token_ids = model->config().EosTokenIds();
    executor_ = std::make_unique<worker::StepExecutor>(backend_.get(), nullptr, options);
    const model::ModelConfig& c = model->config();
    description = WorkerDescription{
        .model_name = "stories260K",
        .model_fingerprint = model->fingerprint(),
        .kv_layout = model::KvLayoutString(c, kBlockSize, model::DType::kFloat32),
        .block_size = kBlockSize,
        .num_kv_blocks = num_blocks,
        .vocab_size = c.vocab_size,
        .eos_token_id = c.eos_token_id,
        .max_model_len = c.max_seq_len,
        .block_bytes = model::KvBlockBytes(c, kBlockSize, model::DType::kFloat32),
    };
  }

  bool Send(const sched::SchedulerOutput& step) override {
    if (broken) return false;
    sent.push_back(step);
    if (on_send) on_send(sent.back());
    ++num_sent;
    return true;
  }

  // Runs the oldest step sent; its output, with `finished_sending` added.
  sched::ModelRunnerOutput RunOldest() {
    sched::ModelRunnerOutput out = executor_->Execute(std::move(sent.front()));
    sent.pop_front();
    for (const std::string& id : finished_sending) {
      out.kv_connector_report.finished_sending.push_back(id);
    }
    finished_sending.clear();
    return out;
  }

  static constexpr int32_t kBlockSize = 16;
  WorkerDescription description;
  std::deque<sched::SchedulerOutput> sent;
  int num_sent = 0;
  bool broken = false;                                   // Send() fails
  std::function<void(sched::SchedulerOutput&)> on_send;  // may alter a step
  std::vector<std::string> finished_sending;             // reported with the next output

 private:
  std::unique_ptr<model::ModelRunner> runner_;
  std::unique_ptr<worker::RunnerBackend> backend_;
  std::unique_ptr<worker::StepExecutor> executor_;
};

// Records what one request heard; checks it hears exactly one ending.
struct Recorder final : RequestSink {
  void OnTokens(const sched::RequestOutput& out) override {
    const std::vector<int32_t>& ids = out.new_token_ids;
    EXPECT_FALSE(ended) << "tokens after the end";
    EXPECT_FALSE(ids.empty());
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    Keep(out);
  }
  // Logprobs of an output (tokens or the end).
  void Keep(const sched::RequestOutput& out) {
    logprobs.insert(logprobs.end(), out.new_logprobs.begin(), out.new_logprobs.end());
    if (!out.prompt_logprobs.empty()) {
      EXPECT_TRUE(prompt_logprobs.empty()) << "prompt logprobs twice";
      prompt_logprobs = out.prompt_logprobs;
    }
  }
  void OnFinished(FinishReason r, const sched::RequestOutput* out, const absl::Status& s) override {
    EXPECT_FALSE(ended) << "ended twice";
    ended = true;
    reason = r;
    status = s;
    if (out != nullptr) {
      tokens.insert(tokens.end(), out->new_token_ids.begin(), out->new_token_ids.end());
      num_output_tokens = out->num_output_tokens;
      num_cached_tokens = out->num_cached_tokens_local + out->num_cached_tokens_external;
      Keep(*out);
    }
  }
  void OnRejected(const absl::Status& s) override {
    EXPECT_FALSE(ended) << "ended twice";
    ended = true;
    rejected = true;
    status = s;
  }
  std::vector<int32_t> tokens;
  bool ended = false;
  bool rejected = false;
  FinishReason reason = FinishReason::kError;
  absl::Status status;
  int32_t num_output_tokens = -1;
  int32_t num_cached_tokens = -1;
  std::vector<TokenLogprobs> logprobs, prompt_logprobs;
};

sched::RequestSpec Greedy(const std::string& id, const ReferenceCase& c) {
  sched::RequestSpec spec{.request_id = id, .prompt_token_ids = c.prompt};
  spec.sampling.temperature = 0;
  spec.sampling.max_tokens = c.max_tokens;
  return spec;
}

class EngineCoreTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!model::testing::HaveStories()) {
      if (std::getenv("CI") != nullptr) FAIL() << "CI is set but the model is missing";
      GTEST_SKIP() << "no " << model::testing::StoriesPath();
    }
    auto m = model::Model::Load(model::testing::StoriesPath());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(m).value();
    cases_ = LoadCases();
    ASSERT_FALSE(cases_.empty());
  }

  bool async() const { return GetParam(); }

  EngineCoreOptions Options(double grace_s = 0) {
    EngineCoreOptions o;
    o.scheduler.async_scheduling = async();
    o.scheduler.max_num_batched_tokens = 64;  // chunked prefills
    o.scheduler.max_num_seqs = 8;
    o.worker_loss_grace_s = grace_s;
    o.worker_address = "loopback";
    o.on_worker_lost = [this](const std::string& reason) { lost_reasons_.push_back(reason); };
    return o;
  }

  // Submits every reference case.
  std::vector<std::shared_ptr<Recorder>> SubmitAll(EngineCore& core,
                                                   const std::string& prefix = "case-") {
    std::vector<std::shared_ptr<Recorder>> sinks;
    for (size_t i = 0; i < cases_.size(); ++i) {
      sinks.push_back(std::make_shared<Recorder>());
      core.AddRequest(Greedy(prefix + std::to_string(i), cases_[i]), sinks.back(),
                      MonotonicNanos());
    }
    return sinks;
  }

  // The loop would go round now without an event.
  static bool Due(const EngineCore& core) {
    const auto deadline = core.NextDeadline();
    return deadline.has_value() && *deadline <= EngineCore::Clock::now();
  }

  // The loop of tandem-scheduler without threads: schedule and send, run
  // the oldest step, hand its output back, until every request ended (or
  // `max_turns`, or `stop` says so).
  void Run(EngineCore& core, LoopbackWorker& worker, int max_turns = 100000,
           const std::function<bool()>& stop = {}) {
    for (int turn = 0; turn < max_turns && core.num_requests() > 0; ++turn) {
      if (stop && stop()) return;
      core.Wake();  // no pacing in a test: the worker is never busy
      core.Step();
      if (!core.has_worker() || worker.sent.empty()) return;
      core.ProcessOutput(worker.RunOldest());
    }
  }

  void ExpectReference(const std::vector<std::shared_ptr<Recorder>>& sinks) {
    ASSERT_EQ(sinks.size(), cases_.size());
    for (size_t i = 0; i < cases_.size(); ++i) {
      SCOPED_TRACE("case " + std::to_string(i));
      EXPECT_TRUE(sinks[i]->ended);
      EXPECT_TRUE(sinks[i]->status.ok()) << sinks[i]->status;
      EXPECT_EQ(sinks[i]->tokens, cases_[i].expected);
      EXPECT_EQ(sinks[i]->reason,
                cases_[i].stopped_on_token_1 ? FinishReason::kStop : FinishReason::kLength);
    }
  }

  std::unique_ptr<model::Model> model_;
  std::vector<ReferenceCase> cases_;
  std::vector<std::string> lost_reasons_;
};

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

// Logprobs through the scheduler and the worker: for every output token and
// every prompt token after the first, exactly what ComputeLogprobs gives on
// the logits of the model fed one token at a time (the CPU backend's logits
// do not depend on batching or chunking), delivered once, in order, with
// chunked prefills, async steps, and a tiny cache that preempts. A request
// scoring its prompt skips the prefix cache that a twin warmed.
TEST_P(EngineCoreTest, LogprobsOfOutputAndPromptTokensAreTheModelsOwn) {
  const int32_t vocab = model_->config().vocab_size;
  auto reference_runner =
      model::ModelRunner::Create(model_.get(), {.block_size = 16, .num_blocks = 40});
  ASSERT_TRUE(reference_runner.ok());
  // Logits after each token of prompt + expected output, one per step.
  auto reference_rows = [&](const ReferenceCase& c) {
    std::vector<int32_t> all = c.prompt;
    all.insert(all.end(), c.expected.begin(), c.expected.end());
    std::vector<int32_t> table(40);
    for (int32_t b = 0; b < 40; ++b) table[static_cast<size_t>(b)] = b;
    std::vector<std::vector<float>> rows;
    std::vector<float> logits;
    for (size_t p = 0; p < all.size(); ++p) {
      model::SequenceInput in{.token_ids = std::span(all).subspan(p, 1),
                              .start_pos = static_cast<int32_t>(p),
                              .block_table = table};
      EXPECT_TRUE((*reference_runner)->Forward({&in, 1}, &logits).ok());
      rows.push_back(logits);
    }
    return rows;
  };
  std::vector<std::vector<std::vector<float>>> refs;
  for (const ReferenceCase& c : cases_) refs.push_back(reference_rows(c));
  ASSERT_GT(vocab, 0);
  // A large cache, a tiny one (preemptions), and failed steps (recomputed).
  for (auto [num_blocks, fail] : {std::pair{256, false}, {30, false}, {256, true}}) {
    SCOPED_TRACE("num_blocks " + std::to_string(num_blocks) + (fail ? ", failed steps" : ""));
    EngineCoreOptions options = Options();
    if (num_blocks == 30) options.max_model_len = 29 * 16;
    EngineCore core(options);
    LoopbackWorker worker(model_.get(), num_blocks);
    ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
    // Twins without logprobs warm the prefix cache first.
    auto warm = SubmitAll(core, "warm-");
    Run(core, worker);
    // The worker fails the 2nd and 5th steps from here, in the long
    // prefills (a step it cannot run: one token count too many).
    uint64_t first_step = 0;
    if (fail) {
      worker.on_send = [&first_step](sched::SchedulerOutput& step) {
        if (first_step == 0) first_step = step.step_id;
        if (step.step_id == first_step + 1 || step.step_id == first_step + 4) {
          step.num_scheduled_tokens.push_back(1);
        }
      };
    }
    // Long prompts, so that prefills are chunked (and preempted): each
    // case's prompt with all but the last 8 of its greedy tokens, which
    // must come out next.
    std::vector<ReferenceCase> long_cases;
    for (const ReferenceCase& c : cases_) {
      ReferenceCase& l = long_cases.emplace_back(c);
      const size_t m = c.expected.size() > 8 ? c.expected.size() - 8 : 0;
      l.prompt.insert(l.prompt.end(), c.expected.begin(), c.expected.begin() + m);
      l.expected.erase(l.expected.begin(), l.expected.begin() + m);
      l.max_tokens = static_cast<int32_t>(l.expected.size());
    }
    std::vector<std::shared_ptr<Recorder>> sinks;
    for (size_t i = 0; i < cases_.size(); ++i) {
      sched::RequestSpec spec = Greedy("lp-" + std::to_string(i), long_cases[i]);
      spec.sampling.logprobs = 3;
      spec.sampling.prompt_logprobs = static_cast<int32_t>(i % 3);
      sinks.push_back(std::make_shared<Recorder>());
      core.AddRequest(std::move(spec), sinks.back(), MonotonicNanos());
    }
    Run(core, worker);
    for (size_t i = 0; i < cases_.size(); ++i) {
      SCOPED_TRACE("case " + std::to_string(i));
      const ReferenceCase& c = long_cases[i];
      const Recorder& r = *sinks[i];
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.tokens, c.expected);
      EXPECT_EQ(r.num_cached_tokens, 0) << "a request scoring its prompt used the prefix cache";
      ASSERT_EQ(r.logprobs.size(), r.tokens.size());
      const size_t P = c.prompt.size();
      for (size_t k = 0; k < r.tokens.size(); ++k) {
        const TokenLogprobs want = model::ComputeLogprobs(refs[i][P - 1 + k], r.tokens[k], 3);
        EXPECT_EQ(r.logprobs[k], want) << "output " << k;
        EXPECT_EQ(r.logprobs[k].rank, 1);  // greedy
      }
      ASSERT_EQ(r.prompt_logprobs.size(), P - 1);
      for (size_t p = 1; p < P; ++p) {
        const TokenLogprobs want =
            model::ComputeLogprobs(refs[i][p - 1], c.prompt[p], static_cast<int32_t>(i % 3));
        EXPECT_EQ(r.prompt_logprobs[p - 1], want) << "prompt position " << p;
      }
    }
    for (const auto& w : warm) EXPECT_TRUE(w->logprobs.empty() && w->prompt_logprobs.empty());
  }
}

// Below min_tokens the worker never samples EOS or a stop token (vLLM's
// min-tokens processor): a case that ends on EOS goes on past it with the
// next most likely token, its first tokens unchanged.
TEST_P(EngineCoreTest, MinTokensKeepsEosAndStopTokensFromBeingSampled) {
  EngineCore core(Options());
  LoopbackWorker worker(model_.get(), 256);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  const std::vector<int32_t> eos = model_->config().EosTokenIds();
  int checked = 0;
  for (size_t i = 0; i < cases_.size(); ++i) {
    const ReferenceCase& c = cases_[i];
    if (!c.stopped_on_token_1 || c.expected.size() < 4) continue;
    // EOS at index n is banned; so is the case's own third token (a stop
    // token), which must come out no more before min_tokens.
    const int32_t n = static_cast<int32_t>(c.expected.size());
    sched::RequestSpec spec = Greedy("min-" + std::to_string(i), c);
    spec.sampling.min_tokens = n + 4;
    spec.sampling.max_tokens = n + 4;
    auto sink = std::make_shared<Recorder>();
    core.AddRequest(spec, sink, MonotonicNanos());
    spec.request_id = "min-stop-" + std::to_string(i);
    spec.sampling.stop_token_ids = {c.expected[2]};
    spec.sampling.logprobs = 1;
    auto stopped = std::make_shared<Recorder>();
    core.AddRequest(spec, stopped, MonotonicNanos());
    Run(core, worker);
    ASSERT_TRUE(sink->status.ok()) << sink->status;
    ASSERT_EQ(sink->tokens.size(), static_cast<size_t>(n + 4));
    EXPECT_TRUE(std::equal(c.expected.begin(), c.expected.end(), sink->tokens.begin()));
    for (int32_t t : sink->tokens) EXPECT_EQ(std::count(eos.begin(), eos.end(), t), 0) << t;
    EXPECT_EQ(sink->reason, FinishReason::kLength);
    ASSERT_EQ(stopped->tokens.size(), static_cast<size_t>(n + 4));
    EXPECT_EQ(std::count(stopped->tokens.begin(), stopped->tokens.end(), c.expected[2]), 0);
    EXPECT_EQ(stopped->tokens[0], c.expected[0]);
    // Logprobs stay the raw model's: the banned token was the most likely.
    ASSERT_EQ(stopped->logprobs.size(), stopped->tokens.size());
    EXPECT_EQ(stopped->logprobs[2].rank, 2);
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no reference case ends on EOS";
}

// Above the server's max_logprobs: refused, naming the field.
TEST_P(EngineCoreTest, LogprobsAboveTheServersMaximumAreRefused) {
  EngineCoreOptions options = Options();
  options.scheduler.max_logprobs = 5;
  EngineCore core(options);
  LoopbackWorker worker(model_.get(), 64);
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  EXPECT_EQ(core.model_info().max_logprobs, 5);
  for (bool prompt : {false, true}) {
    sched::RequestSpec spec = Greedy(prompt ? "p" : "o", cases_[0]);
    (prompt ? spec.sampling.prompt_logprobs : spec.sampling.logprobs) = 6;
    auto sink = std::make_shared<Recorder>();
    core.AddRequest(std::move(spec), sink, MonotonicNanos());
    EXPECT_TRUE(sink->rejected);
    EXPECT_EQ(sink->status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(sink->status.message().find(prompt ? "prompt_logprobs = 6 exceeds"
                                                 : "logprobs = 6 exceeds"),
              std::string::npos)
        << sink->status;
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
  EXPECT_EQ(waiting->tokens, cases_[1].expected);
  EXPECT_EQ(core.stats().num_worker_lost_preemptions, cases_.size() + 1);
  // The resumed request did not score its prompt again (Recorder checks
  // that prompt logprobs come once) and has a logprob for every token.
  EXPECT_EQ(scored->tokens, cases_[2].expected);
  EXPECT_EQ(scored->prompt_logprobs.size(), cases_[2].prompt.size() - 1);
  EXPECT_EQ(scored->logprobs.size(), scored->tokens.size());
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
  for (size_t i = 2; i < cases_.size(); ++i) EXPECT_EQ(sinks[i]->tokens, cases_[i].expected);
  // The streamed part of an aborted request is a prefix of its reference.
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_LE(sinks[i]->tokens.size(), cases_[i].expected.size());
    EXPECT_TRUE(
        std::equal(sinks[i]->tokens.begin(), sinks[i]->tokens.end(), cases_[i].expected.begin()));
  }
}

// The worker's description: each of its extra EOS ids ends a request (and
// is not streamed) unless ignore_eos, and ModelInfo carries them and the
// model's sampling defaults; a description with a bad one is refused.
TEST_P(EngineCoreTest, ExtraEosIdsOfTheWorkerEndRequestsAndReachModelInfoWithTheDefaults) {
  // The first reference token, at index >= 2, that is new in its sequence
  // becomes the model's third EOS id (the second one is never sampled).
  const ReferenceCase* ref = nullptr;
  size_t stop_at = 0;
  for (const ReferenceCase& c : cases_) {
    for (size_t k = 2; k < c.expected.size() && ref == nullptr; ++k) {
      if (std::find(c.expected.begin(), c.expected.begin() + k, c.expected[k]) ==
          c.expected.begin() + k) {
        ref = &c;
        stop_at = k;
      }
    }
  }
  ASSERT_NE(ref, nullptr);
  const int32_t extra_eos = ref->expected[stop_at];
  const int32_t unused_eos = [&] {
    int32_t id = 2;
    while (std::count(ref->expected.begin(), ref->expected.end(), id) > 0) ++id;
    return id;
  }();

  EngineCore core(Options());
  LoopbackWorker worker(model_.get(), 256);
  worker.description.extra_eos_token_ids = {unused_eos, extra_eos};
  worker.description.generation = {.temperature = 0.6f, .top_p = 0.9f, .top_k = 40};
  ASSERT_TRUE(core.ConnectWorker(worker.description, &worker).ok());
  EXPECT_EQ(core.model_info().eos_token_id, worker.description.eos_token_id);
  EXPECT_EQ(core.model_info().extra_eos_token_ids, (std::vector<int32_t>{unused_eos, extra_eos}));
  EXPECT_EQ(core.model_info().generation.temperature, 0.6f);
  EXPECT_EQ(core.model_info().generation.top_p, 0.9f);
  EXPECT_EQ(core.model_info().generation.top_k, 40);
  EXPECT_FALSE(core.model_info().generation.min_p);

  auto stops = std::make_shared<Recorder>();
  auto ignores = std::make_shared<Recorder>();
  sched::RequestSpec ignoring = Greedy("ignores", *ref);
  ignoring.sampling.ignore_eos = true;
  ignoring.sampling.max_tokens = static_cast<int32_t>(stop_at) + 1;
  core.AddRequest(Greedy("stops", *ref), stops, MonotonicNanos());
  core.AddRequest(ignoring, ignores, MonotonicNanos());
  Run(core, worker);
  EXPECT_EQ(stops->tokens,
            std::vector<int32_t>(ref->expected.begin(), ref->expected.begin() + stop_at));
  EXPECT_EQ(stops->reason, FinishReason::kStop);
  EXPECT_EQ(ignores->tokens,
            std::vector<int32_t>(ref->expected.begin(), ref->expected.begin() + stop_at + 1));
  EXPECT_EQ(ignores->reason, FinishReason::kLength);

  // Unusable descriptions: nothing changes.
  const int32_t vocab = worker.description.vocab_size;
  WorkerDescription bad_eos = worker.description;
  bad_eos.extra_eos_token_ids = {vocab};
  EngineCore refused(Options());
  absl::Status s = refused.ConnectWorker(bad_eos, &worker);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("extra_eos_token_ids holds " + std::to_string(vocab)),
            std::string::npos)
      << s;
  WorkerDescription bad_default = worker.description;
  bad_default.generation.top_p = 1.5f;
  s = refused.ConnectWorker(bad_default, &worker);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("top_p"), std::string::npos) << s;
  EXPECT_FALSE(refused.has_worker());
  EXPECT_FALSE(refused.model_info().ready);
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

// A scheduler-role connector that only counts store entries: each finished
// request leaves one until the worker reports it in finished_sending.
class CountingStoreConnector final : public sched::KvConnectorScheduler {
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
  EXPECT_EQ(sink->tokens, cases_[0].expected);
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

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, EngineCoreTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Async" : "Sync";
                         });

}  // namespace
}  // namespace tandem::engine
