// EngineCore in process (engine_core_fixture.h), what a request samples and
// reports: logprobs of output and prompt tokens as the model's own, the
// server's logprobs maximum, min_tokens holding EOS and stop tokens back, and
// the worker's extra EOS ids and sampling defaults. The suite is instantiated
// sync and async in engine_core_test.cc.
#include <memory>
#include <string>
#include <vector>

#include "engine_core_fixture.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

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
    // ignore_eos too: vLLM still bans EOS below min_tokens (its
    // all_stop_token_ids hold EOS whatever ignore_eos says).
    sched::RequestSpec ignoring = Greedy("min-ignore-eos-" + std::to_string(i), c);
    ignoring.sampling.ignore_eos = true;
    ignoring.sampling.min_tokens = n + 2;
    ignoring.sampling.max_tokens = n + 4;
    auto ignored = std::make_shared<Recorder>();
    core.AddRequest(ignoring, ignored, MonotonicNanos());
    Run(core, worker);
    ASSERT_EQ(ignored->tokens.size(), static_cast<size_t>(n + 4));
    for (int32_t k = 0; k < n + 2; ++k) {
      EXPECT_EQ(std::count(eos.begin(), eos.end(), ignored->tokens[k]), 0) << "EOS at " << k;
    }
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
  // The extra EOS id ends the request and is its last output token.
  EXPECT_EQ(stops->tokens,
            std::vector<int32_t>(ref->expected.begin(), ref->expected.begin() + stop_at + 1));
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

}  // namespace
}  // namespace tandem::engine
