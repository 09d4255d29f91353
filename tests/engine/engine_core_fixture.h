// The fixture of EngineCore's in-process tests (engine_core_test.cc,
// engine_core_sampling_test.cc): a worker in process behind a loopback
// transport, a sink that records what a request got, and the test class,
// run sync and async, over the real stories260K model.
#pragma once

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
#include "tandem/engine/engine_core.h"
#include "tandem/model/sampler.h"
#include "tandem/worker/step_executor.h"

namespace tandem::engine {

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

inline sched::RequestSpec Greedy(const std::string& id, const ReferenceCase& c) {
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
      EXPECT_EQ(sinks[i]->tokens, cases_[i].Streamed());
      EXPECT_EQ(sinks[i]->reason,
                cases_[i].stopped_on_token_1 ? FinishReason::kStop : FinishReason::kLength);
    }
  }

  std::unique_ptr<model::Model> model_;
  std::vector<ReferenceCase> cases_;
  std::vector<std::string> lost_reasons_;
};

}  // namespace tandem::engine
