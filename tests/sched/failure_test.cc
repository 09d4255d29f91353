// Failed worker steps (issue 12, part 2; DESIGN §9): the blocks a failed
// step was to write lose their hashes, so no later request "hits" KV that
// was never written, and the step's requests recompute (or end with an
// error after config.max_step_failures failed steps).
#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "sched_test_util.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched {
namespace {

using testing::FakeStore;
using testing::Greedy;
using testing::Harness;
using testing::RunAlone;
using testing::ScriptedKvConnector;
using testing::TestConfig;
using testing::Tokens;

class FailureTest : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(SyncAndAsync, FailureTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

void ExpectReference(const Harness& h, const std::string& id, const std::vector<int32_t>& prompt,
                     const SamplingParams& sp) {
  const testing::Reference ref = RunAlone(prompt, sp, h.config);
  ASSERT_TRUE(h.outputs.count(id)) << id;
  EXPECT_EQ(h.outputs.at(id), ref.output) << id;
  EXPECT_EQ(h.reasons.at(id), ref.reason) << id;
}

std::vector<BlockHash> HashesOf(const SchedulerConfig& c, const std::vector<int32_t>& tokens) {
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(ComputeRootHash(c.hash_root), tokens, c.block_size, &hashes);
  return hashes;
}

// The reviewed bug: the engine failed a request whose step failed, but the
// blocks its prefill published kept their hashes; the same prompt then hit
// KV that was never written (wrong tokens). With max_step_failures 1 the
// failed request ends with an error (the old behaviour), and what follows
// must not see its blocks.
TEST_P(FailureTest, AFailedPrefillPublishesNothingAndTheSamePromptRecomputes) {
  SchedulerConfig c = TestConfig(64, GetParam());
  c.max_step_failures = 1;
  Harness h(c, nullptr, nullptr);
  const std::vector<int32_t> prompt = Tokens(13, 7);
  h.worker.fail_steps = {1};
  h.Add("P", prompt, Greedy(3));
  h.Step();
  if (h.in_flight() > 0) h.Update();
  ASSERT_EQ(h.reasons.at("P"), RequestState::kFinishedError);
  EXPECT_NE(h.usage.at("P").error.find("injected failure of step 1"), std::string::npos)
      << h.usage.at("P").error;
  for (const BlockHash& hash : HashesOf(c, prompt)) {
    EXPECT_FALSE(h.sched.block_pool().Lookup(hash).has_value())
        << "a never written block is cached";
  }
  h.Add("Q", prompt, Greedy(3));
  h.RunToCompletion();
  ExpectReference(h, "Q", prompt, Greedy(3));
  EXPECT_EQ(h.usage.at("Q").num_cached_tokens_local, 0);
}

// With the default max_step_failures the failed request recomputes: same
// tokens as a run without the failure, and a later request with the same
// prompt hits only blocks that were really written.
TEST_P(FailureTest, ARequestInAFailedStepRecomputesAndGivesTheSameTokens) {
  const SchedulerConfig c = TestConfig(64, GetParam());
  Harness h(c, nullptr, nullptr);
  const std::vector<int32_t> prompt = Tokens(13, 7);
  h.worker.fail_steps = {1, 4};  // the prefill and a decode
  h.Add("P", prompt, Greedy(6));
  h.RunToCompletion();
  ExpectReference(h, "P", prompt, Greedy(6));
  EXPECT_GE(
      h.sched.stats().num_preemptions_by_reason[static_cast<int>(PreemptionReason::kStepFailed)],
      2u);
  EXPECT_EQ(h.usage.at("P").num_cached_tokens_local, 0);
  h.Add("Q", prompt, Greedy(6));
  h.RunToCompletion();
  ExpectReference(h, "Q", prompt, Greedy(6));
  EXPECT_EQ(h.usage.at("Q").num_cached_tokens_local, 12) << "P's recomputed blocks are valid";
}

// Async: step 2 is built before step 1's failure is known. Q, admitted in
// step 2, hits the blocks P publishes in step 1; when step 1 fails, Q holds
// KV that was never written and must recompute it (and step 2, built on
// step 1, counts as failed).
TEST(FailureTest, AsyncARequestThatHitTheFailedStepsBlocksRecomputes) {
  const SchedulerConfig c = TestConfig(64, /*async=*/true);
  Harness h(c, nullptr, nullptr);
  const std::vector<int32_t> prompt = Tokens(13, 7);
  const std::vector<int32_t> q_prompt = [&] {
    std::vector<int32_t> q(prompt.begin(), prompt.begin() + 12);
    q.push_back(5);
    q.push_back(6);
    return q;
  }();
  h.worker.fail_steps = {1};
  h.Add("P", prompt, Greedy(4));
  h.Step();  // step 1 in flight
  h.Add("Q", q_prompt, Greedy(4));
  const SchedulerOutput& s2 = h.Step();  // step 2 built; then step 1's failure is processed
  ASSERT_EQ(s2.scheduled_new_reqs.size(), 1u);
  EXPECT_EQ(s2.scheduled_new_reqs[0].request_id, "Q");
  EXPECT_EQ(s2.scheduled_new_reqs[0].num_computed_tokens, 12) << "Q hit P's published blocks";
  bool q_preempted = false;
  for (const PreemptionEvent& e : h.preemptions) {
    q_preempted |= e.victim_id == "Q" && e.reason == PreemptionReason::kStepFailed;
  }
  EXPECT_TRUE(q_preempted);
  h.RunToCompletion();
  ExpectReference(h, "P", prompt, Greedy(4));
  ExpectReference(h, "Q", q_prompt, Greedy(4));
  EXPECT_EQ(h.worker.num_failed_steps, 2) << "step 2 was built on step 1 and failed with it";
}

// A load admitted with a prefix hit on blocks a step in flight writes: the
// step fails while the load runs. The request must not be admitted on that
// prefix once its load is reported: it is preempted then and recomputes.
TEST(FailureTest, ALoadHoldingBlocksOfAFailedStepIsPreemptedWhenItsLoadIsReported) {
  const SchedulerConfig c = TestConfig(64, /*async=*/true);
  FakeStore store;
  const std::vector<int32_t> prefix = Tokens(16, 3);
  // The store holds blocks 2 and 3 of the prefix only (another replica's
  // partial stores): Q loads them after hitting blocks 0-1 locally.
  {
    const std::vector<BlockHash> hashes = HashesOf(c, prefix);
    for (int b = 2; b < 4; ++b) {
      std::vector<int64_t>& kv = store[hashes[static_cast<size_t>(b)]];
      for (int p = b * 4; p < b * 4 + 4; ++p) kv.push_back(testing::SlotValue(prefix[p], p));
    }
  }
  ScriptedKvConnector conn(c.block_size, &store);
  conn.enable_stores = false;
  Harness h(c, &conn, &store);
  h.worker.load_delay_steps = 3;
  h.worker.fail_steps = {1};
  const std::vector<int32_t> p_prompt(prefix.begin(), prefix.begin() + 9);
  std::vector<int32_t> q_prompt = prefix;
  q_prompt.push_back(9);
  h.Add("P", p_prompt, Greedy(2));
  h.Step();  // step 1: P computes (and publishes) blocks 0-1
  h.Add("Q", q_prompt, Greedy(2));
  h.Step();  // step 2: Q hits blocks 0-1 and loads 2-3; step 1 fails
  const Request* q = h.sched.FindRequest("Q");
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(q->state, RequestState::kWaitingForRemoteKv) << RequestStateName(q->state);
  EXPECT_EQ(q->num_computed_tokens, 8) << "Q's hit";
  EXPECT_TRUE(q->preempt_when_loaded);
  h.RunToCompletion();
  ExpectReference(h, "P", p_prompt, Greedy(2));
  ExpectReference(h, "Q", q_prompt, Greedy(2));
}

// One request's failures never end another's: a request ends with an error
// only after max_step_failures failed steps it was in.
TEST_P(FailureTest, ARequestEndsWithAnErrorAfterMaxStepFailures) {
  SchedulerConfig c = TestConfig(64, GetParam());
  c.max_step_failures = 3;
  Harness h(c, nullptr, nullptr);
  h.worker.fail_steps = {1, 3, 5, 7, 9, 11};
  h.Add("P", Tokens(9, 2), Greedy(4));
  h.RunToCompletion();
  ASSERT_EQ(h.reasons.at("P"), RequestState::kFinishedError);
  EXPECT_NE(h.usage.at("P").error.find("failed 3 steps"), std::string::npos)
      << h.usage.at("P").error;
  // A request arriving afterwards is not affected.
  h.worker.fail_steps.clear();
  h.Add("R", Tokens(9, 2), Greedy(4));
  h.RunToCompletion();
  ExpectReference(h, "R", Tokens(9, 2), Greedy(4));
}

// A step the worker could not read (issue 29): nothing of it was applied.
// Its load must not leave the request waiting for a report that never
// comes, and its new requests are sent as new again (not as requests the
// worker knows, which failed every later step carrying them).
TEST_P(FailureTest, ARejectedStepsLoadsRecomputeAndItsNewRequestsAreSentAgain) {
  const SchedulerConfig c = TestConfig(64, GetParam());
  FakeStore store;
  const std::vector<int32_t> prompt = Tokens(13, 5);
  {
    const std::vector<BlockHash> hashes = HashesOf(c, prompt);
    for (int b = 0; b < 3; ++b) {
      std::vector<int64_t>& kv = store[hashes[static_cast<size_t>(b)]];
      for (int p = b * 4; p < b * 4 + 4; ++p) kv.push_back(testing::SlotValue(prompt[p], p));
    }
  }
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  h.keep_history = true;
  h.Add("P", Tokens(9, 2), Greedy(5));
  h.Add("Q", prompt, Greedy(5));
  h.worker.reject_steps = {1, 2};
  h.RunToCompletion(/*max_steps=*/200);
  ASSERT_FALSE(HasFailure());
  ExpectReference(h, "P", Tokens(9, 2), Greedy(5));
  ExpectReference(h, "Q", prompt, Greedy(5));
  EXPECT_EQ(h.worker.num_rejected_steps, 2);
  ASSERT_GE(h.history.size(), 3u);
  ASSERT_EQ(h.history[0].kv_connector_metadata.loads.size(), 1u) << "Q's load is in step 1";
  int sent_new = 0;
  for (const SchedulerOutput& so : h.history) {
    for (const NewRequestData& d : so.scheduled_new_reqs) sent_new += d.request_id == "P";
  }
  EXPECT_GE(sent_new, 2) << "P was sent as new again after its step was rejected";
}

// After a failed step its requests come back in the order they arrived.
TEST(FailureTest, RequestsOfAFailedStepComeBackInArrivalOrder) {
  SchedulerConfig c = TestConfig(64, /*async=*/false);
  Harness h(c, nullptr, nullptr);
  h.worker.fail_steps = {3};
  for (const char* id : {"A", "B", "C"}) h.Add(id, Tokens(5, id[0]), Greedy(8));
  h.keep_history = true;
  for (int i = 0; i < 4; ++i) h.Step();
  const SchedulerOutput& after = h.history[3];
  std::vector<std::string> order;
  for (const NewRequestData& d : after.scheduled_new_reqs) order.push_back(d.request_id);
  for (const CachedRequestData& d : after.scheduled_cached_reqs) order.push_back(d.request_id);
  EXPECT_EQ(order, (std::vector<std::string>{"A", "B", "C"}));
  h.RunToCompletion();
  for (const char* id : {"A", "B", "C"}) ExpectReference(h, id, Tokens(5, id[0]), Greedy(8));
}

// A request resumed after a worker loss that hits its prefix reports the
// cached tokens it did not compute (they were counted as 0).
TEST_P(FailureTest, AResumedRequestReportsTheCachedTokensOfItsPrefix) {
  const SchedulerConfig c = TestConfig(64, GetParam());
  const std::vector<int32_t> prompt = Tokens(13, 3);
  const testing::Reference ref = RunAlone(prompt, Greedy(10), c);
  Harness h(c, nullptr, nullptr);
  h.Add("warm", prompt, Greedy(1));
  h.RunToCompletion();
  ASSERT_TRUE(h.sched
                  .AddRequest(RequestSpec{.request_id = "R",
                                          .prompt_token_ids = prompt,
                                          .sampling = Greedy(10),
                                          .resumed_output_token_ids = {ref.output[0]}},
                              0)
                  .ok());
  h.RunToCompletion();
  EXPECT_EQ(h.outputs.at("R"), std::vector<int32_t>(ref.output.begin() + 1, ref.output.end()));
  EXPECT_EQ(h.usage.at("R").num_cached_tokens_local, 12);
}

// Randomized: steps fail at random (one in 6) and are rejected unread (one
// in 9) among loads, stores, warm stores, preemption and prefix hits; every request that does not
// end with an error produces exactly what it produces alone, and nothing leaks.
TEST_P(FailureTest, RandomStepFailuresNeverChangeTokensOrLeakBlocks) {
  std::mt19937_64 rng(GetParam() ? 77 : 78);
  auto uniform = [&](int lo, int hi) {
    return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  int32_t num_failed_steps = 0, num_rejected_steps = 0, num_errors = 0, num_checked = 0;
  for (int seed = 0; seed < 400; ++seed) {
    SchedulerConfig c = TestConfig(uniform(12, 40), GetParam());
    c.max_model_len = 64;
    c.max_num_seqs = uniform(1, 6);
    c.max_num_batched_tokens = std::vector<int>{8, 16, 64}[uniform(0, 2)];
    c.max_step_failures = uniform(2, 4);
    FakeStore store;
    ScriptedKvConnector conn(c.block_size, &store);
    std::mt19937_64 worker_rng(static_cast<uint64_t>(seed) * 31 + 1);
    const bool with_store = uniform(0, 1) != 0;
    Harness h(c, with_store ? &conn : nullptr, &store);
    h.worker.rng = &worker_rng;
    h.worker.fail_one_step_in = 6;
    h.worker.reject_one_step_in = 9;
    h.worker.load_delay_steps = uniform(0, 3);
    struct Spec {
      std::string id;
      std::vector<int32_t> prompt;
      SamplingParams sp;
    };
    std::vector<Spec> specs;
    const std::vector<int32_t> base = Tokens(24, seed);
    for (int i = 0, n = uniform(1, 6); i < n; ++i) {
      Spec s{.id = "r" + std::to_string(i)};
      s.prompt.assign(base.begin(), base.begin() + uniform(1, 20));
      s.sp = Greedy(uniform(1, 10), uniform(0, 1) != 0);
      h.Add(s.id, s.prompt, s.sp);
      specs.push_back(std::move(s));
    }
    h.RunToCompletion(/*max_steps=*/5000);
    ASSERT_FALSE(HasFailure()) << "seed " << seed;
    for (const Spec& s : specs) {
      if (h.reasons.at(s.id) == RequestState::kFinishedError) {
        ++num_errors;
        continue;
      }
      const testing::Reference ref = RunAlone(s.prompt, s.sp, c);
      ASSERT_EQ(h.outputs.at(s.id), ref.output) << "seed " << seed << " " << s.id;
      ++num_checked;
    }
    num_failed_steps += h.worker.num_failed_steps;
    num_rejected_steps += h.worker.num_rejected_steps;
  }
  std::printf(
      "%d failed and %d rejected steps, %d requests ended with an error, %d matched running "
      "alone\n",
      num_failed_steps, num_rejected_steps, num_errors, num_checked);
  EXPECT_GT(num_failed_steps, 500);
  EXPECT_GT(num_rejected_steps, 300);
  EXPECT_GT(num_checked, 800);
}

}  // namespace
}  // namespace tandem::sched

namespace tandem::sched {
namespace {

// A request resumed on a new scheduler after its worker was lost (issue 16):
// added with the output tokens already streamed, it streams exactly the rest
// of a run without the loss, and its usage counts every output token.
TEST_P(FailureTest, AResumedRequestStreamsTheRestOfTheUninterruptedRun) {
  const SchedulerConfig c = TestConfig(64, GetParam());
  const std::vector<int32_t> prompt = Tokens(13, 3);
  const testing::Reference ref = RunAlone(prompt, Greedy(10), c);
  ASSERT_EQ(ref.output.size(), 10u);
  for (size_t streamed : {1u, 4u, 9u}) {
    SCOPED_TRACE(streamed);
    Harness h(c, nullptr, nullptr);
    const std::vector<int32_t> done(ref.output.begin(), ref.output.begin() + streamed);
    ASSERT_TRUE(h.sched
                    .AddRequest(RequestSpec{.request_id = "R",
                                            .prompt_token_ids = prompt,
                                            .sampling = Greedy(10),
                                            .resumed_output_token_ids = done},
                                0)
                    .ok());
    h.RunToCompletion();
    EXPECT_EQ(h.outputs.at("R"),
              std::vector<int32_t>(ref.output.begin() + static_cast<std::ptrdiff_t>(streamed),
                                   ref.output.end()));
    EXPECT_EQ(h.reasons.at("R"), ref.reason);
    EXPECT_EQ(h.usage.at("R").num_prompt_tokens, 13);
    EXPECT_EQ(h.usage.at("R").num_output_tokens, 10);
  }
  // Nothing left to generate, or a token outside the vocabulary: refused.
  Scheduler s(c, nullptr);
  EXPECT_EQ(s.AddRequest({.request_id = "full",
                          .prompt_token_ids = prompt,
                          .sampling = Greedy(2),
                          .resumed_output_token_ids = {5, 6}},
                         0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.AddRequest({.request_id = "bad",
                          .prompt_token_ids = prompt,
                          .sampling = Greedy(4),
                          .resumed_output_token_ids = {c.vocab_size}},
                         0)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::sched
