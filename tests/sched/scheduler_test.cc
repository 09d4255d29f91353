// Scheduler core behaviour (issue 3, "What must hold" 1, 2, 5, 6 and 9). Each
// test drives steps and compares against a table of expected states.
// Preemption (3) is in scheduler_preemption_test.cc, stop conditions (4) in
// scheduler_stop_test.cc.
#include "tandem/sched/scheduler.h"

#include <algorithm>
#include <sstream>

#include "gtest/gtest.h"
#include "scheduler_test_common.h"

namespace tandem::sched {
namespace {

using testing::ExpectMatchesReference;
using testing::FakeStore;
using testing::Greedy;
using testing::Harness;
using testing::ModeTest;
using testing::NumScheduled;
using testing::RunAlone;
using testing::TestConfig;
using testing::Tokens;

// ---- 1. token budget and chunked prefill ----

TEST(SchedulerTest, ChunkedPrefillSplitsPromptsUnderTheTokenBudget) {
  SchedulerConfig c = TestConfig(64);
  c.max_num_batched_tokens = 32;
  FakeStore store;
  Harness h(c, nullptr, &store);
  h.Add("A", Tokens(80, 1), Greedy(2));
  h.Add("B", Tokens(8, 2), Greedy(2));
  struct Row {
    int32_t a, b, a_computed;
  };
  const std::vector<Row> expected = {{32, 0, 32}, {32, 0, 64}, {16, 8, 80}, {1, 1, 81}};
  for (size_t s = 0; s < expected.size(); ++s) {
    const SchedulerOutput& so = h.Step();
    EXPECT_EQ(NumScheduled(so, "A"), expected[s].a) << "step " << s + 1;
    EXPECT_EQ(NumScheduled(so, "B"), expected[s].b) << "step " << s + 1;
    EXPECT_LE(so.total_num_scheduled_tokens, 32);
    if (const Request* a = h.sched.FindRequest("A")) {
      EXPECT_EQ(a->num_computed_tokens, expected[s].a_computed) << "step " << s + 1;
    }
  }
  h.RunToCompletion();
  ExpectMatchesReference(h, "A", Tokens(80, 1), Greedy(2));
  ExpectMatchesReference(h, "B", Tokens(8, 2), Greedy(2));
}

TEST(SchedulerTest, WithoutChunkingAPromptOverTheBudgetBlocksTheQueue) {
  SchedulerConfig c = TestConfig(64);
  c.max_num_batched_tokens = 32;
  c.max_model_len = 32;
  c.enable_chunked_prefill = false;
  FakeStore store;
  Harness h(c, nullptr, &store);
  h.Add("R1", Tokens(8, 1), Greedy(3));
  h.Add("R2", Tokens(8, 5), Greedy(3));
  EXPECT_EQ(h.Step().total_num_scheduled_tokens, 16);
  h.Add("A", Tokens(31, 2), Greedy(1));  // 31 > 30 left after the two decodes
  h.Add("B", Tokens(4, 3), Greedy(2));   // would fit, but A is ahead
  struct Row {
    int32_t r1, r2, a, b;
  };
  const std::vector<Row> expected = {{1, 1, 0, 0}, {1, 1, 0, 0}, {0, 0, 31, 0}, {0, 0, 0, 4}};
  for (size_t s = 0; s < expected.size(); ++s) {
    const SchedulerOutput& so = h.Step();
    EXPECT_EQ(NumScheduled(so, "R1"), expected[s].r1) << "step " << s + 2;
    EXPECT_EQ(NumScheduled(so, "R2"), expected[s].r2) << "step " << s + 2;
    EXPECT_EQ(NumScheduled(so, "A"), expected[s].a) << "step " << s + 2;
    EXPECT_EQ(NumScheduled(so, "B"), expected[s].b) << "step " << s + 2;
  }
  h.RunToCompletion();
  ExpectMatchesReference(h, "A", Tokens(31, 2), Greedy(1));
  ExpectMatchesReference(h, "B", Tokens(4, 3), Greedy(2));
}

TEST(SchedulerTest, WithoutChunkingTheBudgetMustHoldTheLongestRequest) {
  SchedulerConfig c = TestConfig(64);
  c.max_num_batched_tokens = 32;
  c.max_model_len = 33;
  c.enable_chunked_prefill = false;
  EXPECT_EQ(c.Validate().message(),
            "SchedulerConfig.max_num_batched_tokens (32) must be >= max_model_len (33) when "
            "enable_chunked_prefill is off: a longer request could never be scheduled");
  c.enable_chunked_prefill = true;
  EXPECT_TRUE(c.Validate().ok());
}

TEST(SchedulerTest, LongPrefillThresholdCapsEveryChunk) {
  SchedulerConfig c = TestConfig(64);
  c.long_prefill_token_threshold = 5;
  FakeStore store;
  Harness h(c, nullptr, &store);
  h.Add("A", Tokens(12, 1), Greedy(2));
  h.Add("B", Tokens(3, 2), Greedy(2));
  struct Row {
    int32_t a, b;
  };
  const std::vector<Row> expected = {{5, 3}, {5, 1}, {2, 0}, {1, 0}};
  for (size_t s = 0; s < expected.size(); ++s) {
    const SchedulerOutput& so = h.Step();
    EXPECT_EQ(NumScheduled(so, "A"), expected[s].a) << "step " << s + 1;
    EXPECT_EQ(NumScheduled(so, "B"), expected[s].b) << "step " << s + 1;
  }
  h.RunToCompletion();
  ExpectMatchesReference(h, "A", Tokens(12, 1), Greedy(2));
}

// ---- 2. a running request with nothing to do does not block others ----

TEST(SchedulerTest, RunningRequestWithNothingToScheduleDoesNotBlockTheOnesAfterIt) {
  FakeStore store;
  Harness h(TestConfig(64, /*async=*/true), nullptr, &store);
  h.Add("A", Tokens(4, 1), Greedy(1));  // after its prefill, its one token is in flight
  h.Add("B", Tokens(4, 2), Greedy(5));
  const SchedulerOutput s1 = h.Step();
  EXPECT_EQ(NumScheduled(s1, "A"), 4);
  EXPECT_EQ(NumScheduled(s1, "B"), 4);
  const SchedulerOutput s2 = h.Step();  // step 1's output not processed yet
  EXPECT_EQ(NumScheduled(s2, "A"), 0);
  EXPECT_EQ(NumScheduled(s2, "B"), 1);
  EXPECT_EQ(h.sched.FindRequest("B")->num_output_placeholders, 1) << "step 1's output is in";
  h.RunToCompletion();
  ExpectMatchesReference(h, "A", Tokens(4, 1), Greedy(1));
  ExpectMatchesReference(h, "B", Tokens(4, 2), Greedy(5));
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, ModeTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

TEST(SchedulerTest, AddRequestRejectsBadInputWithPreciseStatus) {
  SchedulerConfig c = TestConfig(8);
  c.max_model_len = 32;
  c.max_waiting_requests = 2;
  Scheduler s(c, nullptr);
  auto add = [&](std::string id, std::vector<int32_t> prompt, int32_t max_tokens) {
    return s.AddRequest(
        {.request_id = id, .prompt_token_ids = prompt, .sampling = Greedy(max_tokens)}, 0);
  };
  EXPECT_EQ(add("e", {}, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(add("v", {3, 64}, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(add("n", {3, -1}, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(add("l", Tokens(30, 1), 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(add("m", Tokens(3, 1), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(add("big", Tokens(20, 1), 10).code(), absl::StatusCode::kInvalidArgument)
      << "29 tokens need 8 blocks, the pool has 7";
  EXPECT_TRUE(add("a", Tokens(3, 1), 4).ok());
  EXPECT_EQ(add("a", Tokens(3, 1), 4).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(add("b", Tokens(3, 1), 4).ok());
  EXPECT_EQ(add("c", Tokens(3, 1), 4).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(s.AbortRequest("a").has_value());
  EXPECT_FALSE(s.AbortRequest("a").has_value());
  EXPECT_FALSE(s.AbortRequest("nope").has_value());
  EXPECT_TRUE(add("a", Tokens(3, 1), 4).ok()) << "an id is free again once finished";
}

// ---- 5. prefix cache ----

TEST(SchedulerTest, SharedPrefixesHitTheCache) {
  FakeStore store;
  Harness h(TestConfig(64), nullptr, &store);
  std::vector<int32_t> a = Tokens(16, 1);
  std::vector<int32_t> b(a.begin(), a.begin() + 12);
  for (int32_t t : Tokens(6, 9)) b.push_back(t);
  h.Add("A", a, Greedy(3));
  h.RunToCompletion();
  h.keep_history = true;
  h.Add("B", b, Greedy(3));
  const SchedulerOutput s = h.Step();
  ASSERT_EQ(s.scheduled_new_reqs.size(), 1u);
  EXPECT_EQ(s.scheduled_new_reqs[0].num_computed_tokens, 12);
  EXPECT_EQ(NumScheduled(s, "B"), 6);
  EXPECT_EQ(h.sched.stats().prefix_cache_hits_tokens, 12u);
  EXPECT_EQ(h.sched.stats().prefix_cache_queries_tokens, 16u + 18u);
  h.RunToCompletion();
  ExpectMatchesReference(h, "B", b, Greedy(3));
}

TEST(SchedulerTest, AtMostNumTokensMinusOneTokensHit) {
  FakeStore store;
  Harness h(TestConfig(64), nullptr, &store);
  h.Add("A", Tokens(16, 1), Greedy(2));
  h.RunToCompletion();
  h.Add("B", Tokens(16, 1), Greedy(2));  // all 4 blocks cached; 3 may hit
  const SchedulerOutput s = h.Step();
  EXPECT_EQ(s.scheduled_new_reqs.at(0).num_computed_tokens, 12);
  EXPECT_EQ(NumScheduled(s, "B"), 4);
  h.RunToCompletion();
  ExpectMatchesReference(h, "B", Tokens(16, 1), Greedy(2));
}

TEST(SchedulerTest, FreedBlocksAreEvictedInTheSpecifiedOrder) {
  FakeStore store;
  Harness h(TestConfig(9), nullptr, &store);  // blocks 1..8
  h.Add("A", Tokens(10, 1), Greedy(1));       // blocks 1 2 (full, hashed) 3 (partial)
  h.RunToCompletion();
  // Tail first: 3 (no hash) to the head; 2 then 1 to the tail.
  EXPECT_EQ(h.sched.block_pool().FreeQueueForTest(),
            (std::vector<int32_t>{3, 4, 5, 6, 7, 8, 2, 1}));
  h.Add("B", Tokens(27, 2), Greedy(1));  // 7 blocks: pops 3..8 and evicts 2
  const SchedulerOutput s = h.Step();
  EXPECT_EQ(s.scheduled_new_reqs.at(0).block_ids, (std::vector<int32_t>{3, 4, 5, 6, 7, 8, 2}));
  h.RunToCompletion();
  h.Add("C", Tokens(10, 1), Greedy(1));  // A's prompt: only block 1 survived
  const SchedulerOutput s2 = h.Step();
  EXPECT_EQ(s2.scheduled_new_reqs.at(0).num_computed_tokens, 4);
  EXPECT_EQ(s2.scheduled_new_reqs.at(0).block_ids.at(0), 1);
  h.RunToCompletion();
  ExpectMatchesReference(h, "C", Tokens(10, 1), Greedy(1));
}

TEST(SchedulerTest, TwoIdenticalPromptsInOneStepShareBlocks) {
  FakeStore store;
  Harness h(TestConfig(64), nullptr, &store);
  h.Add("A", Tokens(12, 1), Greedy(4));
  h.Add("B", Tokens(12, 1), Greedy(4));
  const SchedulerOutput s = h.Step();
  ASSERT_EQ(s.scheduled_new_reqs.size(), 2u);
  const NewRequestData& a = s.scheduled_new_reqs[0];
  const NewRequestData& b = s.scheduled_new_reqs[1];
  EXPECT_EQ(NumScheduled(s, "A"), 12);
  EXPECT_EQ(b.num_computed_tokens, 8);
  EXPECT_EQ(NumScheduled(s, "B"), 4);
  EXPECT_EQ(std::vector<int32_t>(a.block_ids.begin(), a.block_ids.begin() + 2),
            std::vector<int32_t>(b.block_ids.begin(), b.block_ids.begin() + 2));
  h.RunToCompletion();
  ExpectMatchesReference(h, "A", Tokens(12, 1), Greedy(4));
  ExpectMatchesReference(h, "B", Tokens(12, 1), Greedy(4));
}

// Async mode: two identical requests decode in lockstep, so each output
// block becomes known for both in the same update. The first publishes it;
// the second's copy is left out (a duplicate, never hashed), so the prefix
// cache keeps one block per hash (CheckInvariants checks the map both
// ways). A later request on prompt + output hits those blocks and still
// gives the reference tokens.
TEST(SchedulerTest, AsyncIdenticalRequestsPublishEachOutputBlockOnce) {
  const SchedulerConfig c = TestConfig(64, /*async=*/true);
  Harness h(c, nullptr, nullptr);
  const std::vector<int32_t> prompt = Tokens(6, 3);
  h.Add("A", prompt, Greedy(12));
  h.Add("B", prompt, Greedy(12));
  h.RunToCompletion();
  ASSERT_EQ(h.outputs["A"], h.outputs["B"]);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), h.outputs["A"].begin(), h.outputs["A"].end());
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(ComputeRootHash(c.hash_root), all, c.block_size, &hashes);
  ASSERT_EQ(hashes.size(), 4u);
  for (const BlockHash& hash : hashes) EXPECT_TRUE(h.sched.block_pool().Lookup(hash).has_value());
  EXPECT_EQ(h.sched.block_pool().num_cached_blocks(), 4);
  std::vector<int32_t> longer(all.begin(), all.begin() + 17);
  h.Add("C", longer, Greedy(4));
  h.RunToCompletion();
  EXPECT_EQ(h.usage.at("C").num_cached_tokens_local, 16);
  ExpectMatchesReference(h, "C", longer, Greedy(4));
}

TEST(SchedulerTest, SameCacheSaltReusesBlocksAndADifferentSaltDoesNot) {
  FakeStore store;
  Harness h(TestConfig(64), nullptr, &store);
  h.Add("A", Tokens(16, 1), Greedy(2), 0, "tenant-1");
  h.RunToCompletion();
  h.Add("same", Tokens(16, 1), Greedy(2), 0, "tenant-1");
  EXPECT_EQ(h.Step().scheduled_new_reqs.at(0).num_computed_tokens, 12);
  h.RunToCompletion();
  h.Add("other", Tokens(16, 1), Greedy(2), 0, "tenant-2");
  EXPECT_EQ(h.Step().scheduled_new_reqs.at(0).num_computed_tokens, 0);
  h.RunToCompletion();
  h.Add("none", Tokens(16, 1), Greedy(2));
  EXPECT_EQ(h.Step().scheduled_new_reqs.at(0).num_computed_tokens, 0);
  h.RunToCompletion();
}

TEST(SchedulerTest, ADifferentModelFingerprintNeverSharesBlocks) {
  // Two schedulers share one store; only the same fingerprint hits.
  FakeStore store;
  auto run = [&](const std::string& fingerprint) {
    SchedulerConfig c = TestConfig(64);
    c.hash_root.model_fingerprint = fingerprint;
    testing::ScriptedKvConnector conn(c.block_size, &store);
    Harness h(c, &conn, &store);
    h.Add("p", Tokens(20, 1), Greedy(2));
    h.RunToCompletion();
    ExpectMatchesReference(h, "p", Tokens(20, 1), Greedy(2));
    return h.sched.stats().external_cache_hits_tokens;
  };
  EXPECT_EQ(run("model-a"), 0u);
  EXPECT_GT(run("model-a"), 0u);
  EXPECT_EQ(run("model-b"), 0u);
}

// ---- 6. async scheduling ----

TEST(SchedulerTest, PlaceholdersNeverGoNegativeAndStayWithinTwoSteps) {
  FakeStore store;
  Harness h(TestConfig(16, /*async=*/true), nullptr, &store);
  for (int i = 0; i < 6; ++i) {
    SamplingParams sp = Greedy(5 + 3 * i, /*ignore_eos=*/i % 2 == 0);
    h.Add("r" + std::to_string(i), Tokens(3 + 5 * i, i), sp);
  }
  int32_t max_seen = 0;
  auto check = [&] {
    for (int i = 0; i < 6; ++i) {
      if (const Request* r = h.sched.FindRequest("r" + std::to_string(i))) {
        ASSERT_GE(r->num_output_placeholders, 0);
        ASSERT_LE(r->num_output_placeholders, 2);
        max_seen = std::max(max_seen, r->num_output_placeholders);
      }
    }
  };
  h.after_schedule = [&](const SchedulerOutput&) { check(); };
  for (int step = 0; step < 400 && h.sched.HasUnfinishedRequests(); ++step) {
    h.Step();
    check();
  }
  EXPECT_EQ(max_seen, 2);
  h.RunToCompletion();
}

TEST_P(ModeTest, MaxTokensRequestIsScheduledForPromptPlusMaxTokensMinusOneTokens) {
  FakeStore store;
  Harness h(TestConfig(64, GetParam()), nullptr, &store);
  const std::vector<std::pair<int32_t, int32_t>> shapes = {{1, 1}, {5, 1}, {3, 2}, {7, 9}, {40, 5}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    h.Add("r" + std::to_string(i), Tokens(shapes[i].first, static_cast<int32_t>(i)),
          Greedy(shapes[i].second));
  }
  h.RunToCompletion();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_EQ(h.scheduled_tokens[id], shapes[i].first + shapes[i].second - 1) << id;
    EXPECT_EQ(h.outputs[id].size(), static_cast<size_t>(shapes[i].second)) << id;
  }
}

TEST(SchedulerTest, AbortWithOutputsInFlightLeavesConsistentCountersAndNoLeakedBlocks) {
  FakeStore store;
  Harness h(TestConfig(32, /*async=*/true), nullptr, &store);
  for (int i = 0; i < 4; ++i) h.Add("r" + std::to_string(i), Tokens(6, i), Greedy(12));
  h.Step();
  h.Step();
  h.Step();
  ASSERT_EQ(h.in_flight(), 1u);
  const Request* r1 = h.sched.FindRequest("r1");
  ASSERT_GT(r1->num_in_flight_tokens, 0);
  h.Abort("r1");  // with a step in flight
  EXPECT_EQ(h.sched.FindRequest("r1"), nullptr);
  EXPECT_EQ(h.reasons["r1"], RequestState::kFinishedAborted);
  const size_t emitted = h.outputs["r1"].size();
  const SchedulerOutput s = h.Step();  // tells the worker
  EXPECT_NE(std::find(s.finished_req_ids.begin(), s.finished_req_ids.end(), "r1"),
            s.finished_req_ids.end());
  h.RunToCompletion();
  EXPECT_EQ(h.outputs["r1"].size(), emitted) << "no output after the abort";
  const auto ref = RunAlone(Tokens(6, 1), Greedy(12), h.config).output;
  EXPECT_EQ(h.outputs["r1"], std::vector<int32_t>(ref.begin(), ref.begin() + emitted));
  for (int i : {0, 2, 3})
    ExpectMatchesReference(h, "r" + std::to_string(i), Tokens(6, i), Greedy(12));
}

TEST(SchedulerTest, AsyncBlocksAreHashedOnlyOnceTheirTokenIdsAreKnown) {
  FakeStore store;
  Harness h(TestConfig(32, /*async=*/true), nullptr, &store);
  h.Add("r", Tokens(6, 1), Greedy(14));
  int32_t max_cached = 0;
  while (h.sched.HasUnfinishedRequests()) {
    h.Step();
    const Request* r = h.sched.FindRequest("r");
    if (r == nullptr) break;
    for (size_t b = 0; b < r->block_ids.size(); ++b) {
      if (h.sched.block_pool().is_cached(r->block_ids[b])) {
        EXPECT_LE(static_cast<int32_t>(b + 1) * 4, r->num_tokens())
            << "block " << b << " cached before its ids are known";
        max_cached = std::max(max_cached, static_cast<int32_t>(b + 1));
      }
    }
  }
  EXPECT_GE(max_cached, 4) << "output blocks get cached once known";
  h.RunToCompletion();
}

TEST(SchedulerTest, StatsSnapshotCountsWaitingByReasonPreemptionsAndUsage) {
  SchedulerConfig c = TestConfig(13);  // 12 usable blocks
  c.max_num_seqs = 3;
  FakeStore store;
  const std::vector<int32_t> prefix = Tokens(16, 4);
  {
    testing::ScriptedKvConnector warm(c.block_size, &store);
    Harness w(c, &warm, &store);
    w.Add("warm", prefix, Greedy(1));
    w.RunToCompletion();
  }
  testing::ScriptedKvConnector conn(c.block_size, &store);
  conn.defer_count["deferred"] = 3;
  Harness h(c, &conn, &store);
  h.worker.load_delay_steps = 5;
  h.Add("deferred", Tokens(5, 1), Greedy(4));
  std::vector<int32_t> loading = prefix;
  loading.push_back(9);
  h.Add("loading", loading, Greedy(4));
  h.Add("run1", Tokens(5, 2), Greedy(20));
  h.Add("run2", Tokens(5, 3), Greedy(20));
  h.Add("capacity", Tokens(5, 5), Greedy(4));
  h.Step();
  const SchedulerStats& st = h.sched.stats();
  EXPECT_EQ(st.num_steps, 1u);
  EXPECT_EQ(st.num_running, 2);
  EXPECT_EQ(st.num_waiting, 3);
  EXPECT_EQ(st.num_waiting_for_lookup, 1);
  EXPECT_EQ(st.num_waiting_for_load, 1);
  EXPECT_EQ(st.num_waiting_for_capacity, 1);  // max_num_seqs: 2 running + 1 loading
  EXPECT_EQ(st.num_scheduled_tokens, 10);
  EXPECT_EQ(st.external_cache_hits_tokens, 16u);
  EXPECT_EQ(st.num_free_blocks, h.sched.num_free_blocks());
  EXPECT_DOUBLE_EQ(st.kv_cache_usage, 1.0 - static_cast<double>(h.sched.num_free_blocks()) /
                                                h.sched.num_total_blocks());
  h.RunToCompletion();
  EXPECT_EQ(
      h.sched.stats().num_preemptions_total,
      h.sched.stats().num_preemptions_by_reason[static_cast<int>(PreemptionReason::kKvCacheFull)]);
  EXPECT_EQ(h.sched.stats().num_requests_finished, 5u);
  EXPECT_GE(h.sched.stats().external_loaded_tokens, 16u);  // more if "loading" was preempted
  EXPECT_GT(h.sched.stats().num_steps, 1u);
}

TEST(SchedulerTest, StatsCountALookupAsDeferredOnlyInTheStepThatDeferredIt) {
  SchedulerConfig c = TestConfig(64);
  c.max_num_seqs = 2;
  FakeStore store;
  testing::ScriptedKvConnector conn(c.block_size, &store);
  conn.defer_count["D"] = 1;
  Harness h(c, &conn, &store);
  h.Add("A", Tokens(5, 1), Greedy(6));
  h.Add("D", Tokens(5, 2), Greedy(2));
  h.Add("B", Tokens(5, 3), Greedy(6));
  h.Step();  // A and B admitted; D's lookup deferred
  EXPECT_EQ(h.sched.stats().num_waiting, 1);
  EXPECT_EQ(h.sched.stats().num_waiting_for_lookup, 1);
  EXPECT_EQ(h.sched.stats().num_waiting_for_capacity, 0);
  h.Step();  // no seat: D is not asked again, it waits for capacity
  EXPECT_EQ(h.sched.stats().num_waiting, 1);
  EXPECT_EQ(h.sched.stats().num_waiting_for_lookup, 0);
  EXPECT_EQ(h.sched.stats().num_waiting_for_capacity, 1);
  h.RunToCompletion();
  EXPECT_EQ(h.sched.stats().num_waiting_for_lookup, 0);
}

TEST(SchedulerTest, StatsCountExternalCacheQueriesOncePerAdmissionBeyondTheLocalHit) {
  const SchedulerConfig c = TestConfig(64);
  FakeStore store;
  const std::vector<int32_t> prefix = Tokens(16, 7);
  {
    testing::ScriptedKvConnector warm(c.block_size, &store);
    Harness w(c, &warm, &store);
    w.Add("warm", prefix, Greedy(1));
    w.RunToCompletion();
  }
  testing::ScriptedKvConnector conn(c.block_size, &store);
  conn.enable_stores = false;
  conn.defer_count["P"] = 2;  // deferred lookups are not queries
  Harness h(c, &conn, &store);
  std::vector<int32_t> p = prefix;
  for (int32_t t : Tokens(4, 8)) p.push_back(t);
  h.Add("A", Tokens(10, 9), Greedy(2));  // 10 tokens asked, none hit
  h.Add("P", p, Greedy(2));              // 20 asked, 16 hit and loaded
  h.RunToCompletion();
  EXPECT_EQ(h.sched.stats().external_cache_queries_tokens, 30u);
  EXPECT_EQ(h.sched.stats().external_cache_hits_tokens, 16u);
  EXPECT_EQ(h.sched.stats().external_loaded_tokens, 16u);
  h.Add("Q", p, Greedy(2));  // P's loaded blocks hit locally: 4 tokens asked
  h.RunToCompletion();
  EXPECT_EQ(h.sched.stats().prefix_cache_hits_tokens, 16u);
  EXPECT_EQ(h.sched.stats().external_cache_queries_tokens, 34u);
  EXPECT_EQ(h.sched.stats().external_cache_hits_tokens, 16u);
}

// ---- 9. determinism ----

std::string Serialize(const SchedulerOutput& so) {
  std::ostringstream os;
  os << so.step_id << "|";
  for (const auto& d : so.scheduled_new_reqs) {
    os << "N" << d.request_id << ":" << d.num_computed_tokens << ":";
    for (int32_t b : d.block_ids) os << b << ",";
  }
  for (const auto& d : so.scheduled_cached_reqs) {
    os << "C" << d.request_id << ":" << d.resumed_from_preemption << ":" << d.num_computed_tokens
       << ":" << d.num_output_placeholders << ":";
    for (int32_t b : d.new_block_ids) os << b << ",";
  }
  for (int32_t n : so.num_scheduled_tokens) os << n << ",";
  for (const auto& id : so.finished_req_ids) os << "F" << id;
  for (const auto& id : so.preempted_req_ids) os << "P" << id;
  for (const auto& l : so.kv_connector_metadata.loads)
    os << "L" << l.request_id << l.block_ids.size();
  for (const auto& s : so.kv_connector_metadata.stores)
    os << "S" << s.request_id << s.block_ids.size();
  return os.str();
}

TEST(SchedulerTest, SameInputsGiveTheSameSequenceOfOutputs) {
  auto run = [] {
    FakeStore store;
    SchedulerConfig c = TestConfig(14, /*async=*/true);
    testing::ScriptedKvConnector conn(c.block_size, &store);
    std::mt19937_64 rng(42);
    conn.rng = &rng;
    Harness h(c, &conn, &store);
    h.keep_history = true;
    for (int i = 0; i < 10; ++i) {
      SamplingParams sp = Greedy(4 + i % 7, i % 3 == 0);
      h.Add("r" + std::to_string(i), Tokens(4 + (i * 5) % 17, i % 3), sp, 0, "", i);
      h.Step();
      if (i == 6) h.Abort("r2");
    }
    h.RunToCompletion();
    std::string all;
    for (const auto& so : h.history) all += Serialize(so) + "\n";
    for (const auto& [id, out] : h.outputs) {
      all += id;
      for (int32_t t : out) all += "," + std::to_string(t);
      all += "\n";
    }
    return all;
  };
  const std::string first = run();
  EXPECT_EQ(first, run());
  EXPECT_GT(first.size(), 100u);
}

}  // namespace
}  // namespace tandem::sched

namespace tandem::sched {
namespace {

// The admission counters say which limit held a waiting request back, once
// per step, and count each admission to running.
TEST(SchedulerTest, AdmissionStatsNameTheLimitThatBlocked) {
  auto blocked = [](const Harness& h, AdmissionLimit l) {
    return h.sched.stats().num_admission_blocked_steps[static_cast<int>(l)];
  };
  {  // max_num_seqs
    SchedulerConfig c = TestConfig(64);
    c.max_num_seqs = 1;
    FakeStore store;
    Harness h(c, nullptr, &store);
    h.Add("A", Tokens(8, 1), Greedy(3));
    h.Add("B", Tokens(8, 2), Greedy(3));
    h.Step();
    EXPECT_EQ(blocked(h, AdmissionLimit::kMaxNumSeqs), 1u);
    EXPECT_EQ(blocked(h, AdmissionLimit::kTokenBudget), 0u);
    EXPECT_EQ(h.sched.stats().num_requests_admitted, 1u);
    h.RunToCompletion();
    EXPECT_EQ(blocked(h, AdmissionLimit::kMaxNumSeqs), 3u);  // A's three steps
    EXPECT_EQ(h.sched.stats().num_requests_admitted, 2u);
  }
  {  // token budget: A's prefill takes all of it
    SchedulerConfig c = TestConfig(64);
    c.max_num_batched_tokens = 8;
    FakeStore store;
    Harness h(c, nullptr, &store);
    h.Add("A", Tokens(8, 1), Greedy(2));
    h.Add("B", Tokens(4, 2), Greedy(2));
    h.Step();
    EXPECT_EQ(blocked(h, AdmissionLimit::kTokenBudget), 1u);
    EXPECT_EQ(blocked(h, AdmissionLimit::kKvBlocks), 0u);
    h.Step();  // A decodes one token; B fits in the rest
    EXPECT_EQ(blocked(h, AdmissionLimit::kTokenBudget), 1u);
    EXPECT_EQ(h.sched.stats().num_requests_admitted, 2u);
  }
  {  // KV blocks: B's prompt needs more blocks than A leaves
    SchedulerConfig c = TestConfig(6);
    FakeStore store;
    Harness h(c, nullptr, &store);
    h.Add("A", Tokens(12, 1), Greedy(2));
    h.Add("B", Tokens(12, 2), Greedy(2));
    h.Step();
    EXPECT_EQ(blocked(h, AdmissionLimit::kKvBlocks), 1u);
    EXPECT_EQ(blocked(h, AdmissionLimit::kMaxNumSeqs) + blocked(h, AdmissionLimit::kTokenBudget) +
                  blocked(h, AdmissionLimit::kAsyncLoadGate),
              0u);
    h.RunToCompletion();
    EXPECT_EQ(h.sched.stats().num_requests_admitted, 2u);
  }
  {  // nothing waits: nothing is blocked
    FakeStore store;
    Harness h(TestConfig(64), nullptr, &store);
    h.Add("A", Tokens(8, 1), Greedy(4));
    h.RunToCompletion();
    for (int l = 0; l < kNumAdmissionLimits; ++l) {
      EXPECT_EQ(h.sched.stats().num_admission_blocked_steps[l], 0u) << l;
    }
  }
}

}  // namespace
}  // namespace tandem::sched
