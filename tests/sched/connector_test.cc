// Scheduler-role KV connector semantics (issue 3, "What must hold" 7).
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "gtest/gtest.h"
#include "sched_test_util.h"
#include "scheduler_test_common.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched {
namespace {

using testing::ExpectMatchesReference;
using testing::FakeStore;
using testing::Greedy;
using testing::Harness;
using testing::RunAlone;
using testing::ScriptedKvConnector;
using testing::TestConfig;
using testing::Tokens;

// Computes `prompt` once with stores on, so `store` holds its full blocks.
void FillStore(FakeStore* store, SchedulerConfig c, const std::vector<int32_t>& prompt) {
  c.async_scheduling = false;
  ScriptedKvConnector conn(c.block_size, store);
  Harness h(c, &conn, store);
  h.Add("warm", prompt, Greedy(1));
  h.RunToCompletion();
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The request's entry in a step: (num_computed_tokens sent, tokens
// scheduled), or nullopt when it is not in the step.
std::optional<std::pair<int32_t, int32_t>> Scheduled(const SchedulerOutput& so,
                                                     const std::string& id) {
  for (size_t i = 0; i < so.scheduled_new_reqs.size(); ++i) {
    if (so.scheduled_new_reqs[i].request_id == id) {
      return std::pair{so.scheduled_new_reqs[i].num_computed_tokens, so.num_scheduled_tokens[i]};
    }
  }
  for (size_t i = 0; i < so.scheduled_cached_reqs.size(); ++i) {
    if (so.scheduled_cached_reqs[i].request_id == id) {
      return std::pair{so.scheduled_cached_reqs[i].num_computed_tokens,
                       so.num_scheduled_tokens[so.scheduled_new_reqs.size() + i]};
    }
  }
  return std::nullopt;
}

class ConnectorModeTest : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(SyncAndAsync, ConnectorModeTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

TEST(ConnectorTest, DeferredLookupsKeepTheirPlaceInFcfsOrder) {
  SchedulerConfig c = TestConfig(64);
  c.max_num_seqs = 2;
  FakeStore store;
  ScriptedKvConnector conn(c.block_size, &store);
  conn.defer_count["A"] = 1;
  Harness h(c, &conn, &store);
  h.Add("A", Tokens(6, 1), Greedy(3));
  h.Add("B", Tokens(6, 2), Greedy(2));
  h.Add("C", Tokens(6, 3), Greedy(8));
  h.Step();  // A deferred: B and C go ahead, A keeps the head
  EXPECT_EQ(conn.admitted, (std::vector<std::string>{"B", "C"}));
  EXPECT_EQ(h.sched.stats().num_waiting_for_lookup, 1);
  h.Add("D", Tokens(6, 4), Greedy(2));
  h.Step();  // B finishes in this step's update
  EXPECT_EQ(conn.admitted, (std::vector<std::string>{"B", "C"}));
  h.Step();  // a seat frees: A (ahead of D) gets it
  EXPECT_EQ(conn.admitted, (std::vector<std::string>{"B", "C", "A"}));
  h.RunToCompletion();
  EXPECT_EQ(conn.admitted, (std::vector<std::string>{"B", "C", "A", "D"}));
  ExpectMatchesReference(h, "A", Tokens(6, 1), Greedy(3));
}

// A deferred request keeps its place by priority too. Its lookup is polled
// when it is considered (a seat is free): the first poll defers it and B,
// behind it, takes the seat; at the next free seat A's answer is known and
// A goes before C, which arrived before that seat freed.
TEST(ConnectorTest, ADeferredRequestKeepsItsPlaceUnderPriority) {
  SchedulerConfig c = TestConfig(64);
  c.max_num_seqs = 1;
  c.policy = SchedulingPolicy::kPriority;
  FakeStore store;
  ScriptedKvConnector conn(c.block_size, &store);
  conn.defer_count["A"] = 1;
  Harness h(c, &conn, &store);
  h.Add("R", Tokens(6, 9), Greedy(6), /*priority=*/0, "", /*t=*/0);
  h.Add("A", Tokens(6, 1), Greedy(2), /*priority=*/1, "", /*t=*/1);
  h.Step();  // R runs; A is deferred
  h.Add("B", Tokens(6, 2), Greedy(2), /*priority=*/1, "", /*t=*/2);
  h.Add("C", Tokens(6, 3), Greedy(2), /*priority=*/2, "", /*t=*/3);
  h.RunToCompletion();
  EXPECT_EQ(conn.admitted, (std::vector<std::string>{"R", "B", "A", "C"}));
  ExpectMatchesReference(h, "A", Tokens(6, 1), Greedy(2));
}

// FCFS, one seat: the head A is deferred and B takes the seat; once A's
// answer is known A gets the next seat, before C and D, which were behind it
// (a deferred request that lost its place would go after them).
TEST(ConnectorTest, ADeferredHeadGetsTheNextSeatBeforeTheRequestsBehindIt) {
  SchedulerConfig c = TestConfig(64);
  c.max_num_seqs = 1;
  FakeStore store;
  ScriptedKvConnector conn(c.block_size, &store);
  conn.defer_count["A"] = 1;
  Harness h(c, &conn, &store);
  h.Add("A", Tokens(6, 1), Greedy(2));
  h.Add("B", Tokens(6, 2), Greedy(5));
  h.Add("C", Tokens(6, 3), Greedy(2));
  h.Add("D", Tokens(6, 4), Greedy(2));
  h.RunToCompletion();
  EXPECT_EQ(conn.admitted, (std::vector<std::string>{"B", "A", "C", "D"}));
  ExpectMatchesReference(h, "A", Tokens(6, 1), Greedy(2));
}

TEST(ConnectorTest, LoadIsNotScheduledBeforeFinishedRecvingThenStartsFromTheLoadedTokens) {
  const SchedulerConfig c = TestConfig(64);
  FakeStore store;
  const std::vector<int32_t> prefix = Tokens(20, 1);
  FillStore(&store, c, prefix);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  h.worker.load_delay_steps = 2;
  const std::vector<int32_t> prompt = Concat(prefix, Tokens(2, 7));
  h.Add("P", prompt, Greedy(3));
  struct Row {
    RequestState state;
    int32_t computed, pending, scheduled, loads;
  };
  using S = RequestState;
  const std::vector<Row> expected = {
      {S::kWaitingForRemoteKv, 0, 20, 0, 1},
      {S::kWaitingForRemoteKv, 0, 20, 0, 0},
      {S::kWaiting, 20, 0, 0, 0},  // finished_recving processed at the end of the step
      {S::kRunning, 22, 0, 2, 0},  // starts from the 20 loaded tokens
  };
  for (size_t s = 0; s < expected.size(); ++s) {
    const SchedulerOutput so = h.Step();
    const Request* p = h.sched.FindRequest("P");
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->state, expected[s].state) << "step " << s + 1;
    EXPECT_EQ(p->num_computed_tokens, expected[s].computed) << "step " << s + 1;
    EXPECT_EQ(p->num_pending_external_tokens, expected[s].pending) << "step " << s + 1;
    EXPECT_EQ(so.total_num_scheduled_tokens, expected[s].scheduled) << "step " << s + 1;
    EXPECT_EQ(static_cast<int>(so.kv_connector_metadata.loads.size()), expected[s].loads);
    if (expected[s].scheduled > 0) {
      EXPECT_EQ(so.scheduled_new_reqs.at(0).num_computed_tokens, 20);
    }
  }
  h.RunToCompletion();
  ExpectMatchesReference(h, "P", prompt, Greedy(3));
  EXPECT_EQ(h.sched.stats().external_cache_hits_tokens, 20u);
  EXPECT_EQ(h.sched.stats().external_loaded_tokens, 20u);
}

TEST_P(ConnectorModeTest, ALoadIsScheduledOnlyAfterItsFinishedRecvingFromTheLoadedTokens) {
  const SchedulerConfig c = TestConfig(64, GetParam());
  FakeStore store;
  const std::vector<int32_t> prefix = Tokens(20, 1);
  FillStore(&store, c, prefix);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  h.worker.load_delay_steps = 2;  // issued in step 1, reported in step 3's output
  const std::vector<int32_t> prompt = Concat(prefix, Tokens(2, 7));
  h.Add("P", prompt, Greedy(3));
  uint64_t first_step = 0;
  h.after_schedule = [&](const SchedulerOutput& so) {
    const auto p = Scheduled(so, "P");
    if (!p || first_step != 0) return;
    first_step = so.step_id;
    EXPECT_EQ(conn.loads_finished, std::vector<std::string>{"P"})
        << "scheduled before its finished_recving was processed";
    EXPECT_EQ(*p, (std::pair<int32_t, int32_t>{20, 2})) << "starts from the loaded tokens";
  };
  h.RunToCompletion();
  // Sync: step 3's output is processed before step 4 is scheduled; async:
  // before step 5.
  EXPECT_EQ(first_step, GetParam() ? 5u : 4u);
  ExpectMatchesReference(h, "P", prompt, Greedy(3));
  EXPECT_EQ(h.sched.stats().external_loaded_tokens, 20u);
}

TEST_P(ConnectorModeTest, AFullPromptHitRecomputesTheLastToken) {
  const SchedulerConfig c = TestConfig(64, GetParam());
  FakeStore store;
  const std::vector<int32_t> prompt = Tokens(16, 3);
  FillStore(&store, c, prompt);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  h.keep_history = true;
  h.Add("P", prompt, Greedy(4));
  h.RunToCompletion();
  bool seen = false;
  for (const SchedulerOutput& so : h.history) {
    for (size_t i = 0; i < so.scheduled_new_reqs.size(); ++i) {
      EXPECT_EQ(so.scheduled_new_reqs[i].num_computed_tokens, 15);
      EXPECT_EQ(so.num_scheduled_tokens[i], 1);
      seen = true;
    }
  }
  EXPECT_TRUE(seen);
  ExpectMatchesReference(h, "P", prompt, Greedy(4));
  EXPECT_EQ(h.sched.stats().external_loaded_tokens, 16u);
}

TEST_P(ConnectorModeTest, InvalidBlocksAreRecomputedAndNeverCached) {
  const SchedulerConfig c = TestConfig(64, GetParam());
  FakeStore store;
  const std::vector<int32_t> prompt = Tokens(24, 5);
  FillStore(&store, c, prompt);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  h.Add("P", prompt, Greedy(4));
  const std::vector<BlockHash> hashes = h.sched.FindRequest("P")->block_hashes;
  h.worker.fail_hashes.insert(hashes[2]);  // the third of six loaded blocks fails
  while (conn.loads_finished.empty()) {    // reported in the output of the load's step
    ASSERT_EQ(h.Step().total_num_scheduled_tokens, 0);
    ASSERT_LT(h.sched.stats().num_steps, 5u);
  }
  const Request* p = h.sched.FindRequest("P");
  ASSERT_EQ(p->state, RequestState::kWaiting);
  EXPECT_EQ(p->num_computed_tokens, 8) << "truncated at the first invalid block";
  EXPECT_EQ(p->num_cached_tokens_external, 8);
  EXPECT_TRUE(h.sched.block_pool().Lookup(hashes[0]).has_value());
  EXPECT_TRUE(h.sched.block_pool().Lookup(hashes[1]).has_value());
  for (int b = 2; b < 6; ++b) {
    EXPECT_FALSE(h.sched.block_pool().Lookup(hashes[b]).has_value()) << "block " << b;
  }
  // Another request in the same step shares what P computes in it (P
  // publishes its blocks when it is scheduled), so it needs no store lookup.
  h.Add("Q", prompt, Greedy(4));
  conn.defer_count["Q"] = 1000;
  const SchedulerOutput s2 = h.Step();
  ASSERT_EQ(s2.scheduled_new_reqs.size(), 2u);
  EXPECT_EQ(s2.scheduled_new_reqs[0].request_id, "P");
  EXPECT_EQ(s2.scheduled_new_reqs[0].num_computed_tokens, 8);
  EXPECT_EQ(s2.num_scheduled_tokens[0], 16) << "blocks from the invalid one on are recomputed";
  EXPECT_EQ(s2.scheduled_new_reqs[1].request_id, "Q");
  EXPECT_EQ(s2.scheduled_new_reqs[1].num_computed_tokens, 20);
  EXPECT_EQ(s2.num_scheduled_tokens[1], 4);
  conn.defer_count["Q"] = 0;
  h.RunToCompletion();
  ExpectMatchesReference(h, "P", prompt, Greedy(4));
  ExpectMatchesReference(h, "Q", prompt, Greedy(4));
  EXPECT_EQ(h.worker.num_failed_blocks, 1);
}

TEST(ConnectorTest, AbortDuringALoadKeepsTheBlocksUntilTheLoadReportsFinished) {
  const SchedulerConfig c = TestConfig(64);
  FakeStore store;
  const std::vector<int32_t> prompt = Tokens(20, 2);
  FillStore(&store, c, prompt);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  h.worker.load_delay_steps = 3;
  h.Add("P", prompt, Greedy(2));
  h.Step();
  ASSERT_EQ(h.sched.FindRequest("P")->state, RequestState::kWaitingForRemoteKv);
  const std::vector<BlockHash> hashes = h.sched.FindRequest("P")->block_hashes;
  h.Abort("P");
  EXPECT_EQ(h.reasons["P"], RequestState::kFinishedAborted);
  EXPECT_EQ(h.sched.num_free_blocks(), h.sched.num_total_blocks() - 5) << "blocks held";
  EXPECT_TRUE(h.sched.HasUnfinishedRequests());
  const SchedulerOutput s2 = h.Step();
  EXPECT_EQ(s2.finished_req_ids, std::vector<std::string>{"P"});
  EXPECT_EQ(h.sched.num_free_blocks(), h.sched.num_total_blocks() - 5);
  h.Step();
  EXPECT_EQ(h.sched.num_free_blocks(), h.sched.num_total_blocks() - 5);
  h.Step();  // the load reports finished
  EXPECT_EQ(h.sched.num_free_blocks(), h.sched.num_total_blocks());
  EXPECT_FALSE(h.sched.HasUnfinishedRequests());
  for (const BlockHash& hash : hashes) EXPECT_FALSE(h.sched.block_pool().Lookup(hash).has_value());
  h.RunToCompletion();
}

TEST(ConnectorTest, AnIdHeldForAKvTransferIsRejectedUntilTheWorkerReportsIt) {
  const SchedulerConfig c = TestConfig(64);
  FakeStore store;
  const std::vector<int32_t> prompt = Tokens(20, 2);
  FillStore(&store, c, prompt);
  ScriptedKvConnector conn(c.block_size, &store);
  conn.delay_free = true;
  Harness h(c, &conn, &store);
  h.worker.load_delay_steps = 2;
  h.worker.store_delay_steps = 2;
  auto add = [&](const std::string& id, const std::vector<int32_t>& p) {
    return h.sched.AddRequest({.request_id = id, .prompt_token_ids = p, .sampling = Greedy(2)}, 0);
  };
  // Aborted during its load: the old load's finished_recving must never
  // reach a new request with the same id.
  ASSERT_TRUE(add("P", prompt).ok());
  h.Step();
  ASSERT_EQ(h.sched.FindRequest("P")->state, RequestState::kWaitingForRemoteKv);
  h.Abort("P");
  const absl::Status s = add("P", prompt);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(s.message(),
            "request id \"P\" is still in use: the worker has not yet reported the KV load of the "
            "finished request with that id");
  h.Step();
  h.Step();
  EXPECT_EQ(h.sched.FindRequest("P"), nullptr) << "the load reported: the blocks are free";
  ASSERT_TRUE(add("P", prompt).ok()) << "an id is free again once the worker reported";
  h.RunToCompletion();
  ExpectMatchesReference(h, "P", prompt, Greedy(2));

  // Finished with its stores still running (the connector delays the free).
  const std::vector<int32_t> other = Tokens(12, 8);
  ASSERT_TRUE(add("S", other).ok());
  while (h.sched.FindRequest("S") != nullptr && !h.reasons.count("S")) h.Step();
  ASSERT_NE(h.sched.FindRequest("S"), nullptr) << "held while its stores run";
  const absl::Status s2 = add("S", other);
  EXPECT_EQ(s2.code(), absl::StatusCode::kAlreadyExists) << s2;
  EXPECT_EQ(s2.message(),
            "request id \"S\" is still in use: the worker has not yet reported the KV store of the "
            "finished request with that id");
  h.RunToCompletion();
  EXPECT_TRUE(add("S", other).ok());
  h.RunToCompletion();
}

// 10 usable blocks of 4 tokens. A (4-token prompt, 36 output tokens: 10
// blocks at most) runs alone; L's 16-token prefix (4 blocks) loads slowly.
// A fills the rest of the pool while L's load runs. A comes first (rule 1 of
// "Preemption and progress" in scheduler.h): it must never preempt itself
// for L's load (before, it did, and then waited at the head of the queue
// behind L's loaded blocks). It waits for the load, then preempts the loaded
// L once, finishes, and L runs after it.
TEST_P(ConnectorModeTest, ARunningRequestWaitsForALaterLoadThenPreemptsTheLoadedRequest) {
  const SchedulerConfig c = TestConfig(11, GetParam());
  FakeStore store;
  const std::vector<int32_t> prefix = Tokens(16, 6);
  FillStore(&store, c, prefix);
  ScriptedKvConnector conn(c.block_size, &store);
  conn.enable_stores = false;  // A's own blocks are never loaded back
  Harness h(c, &conn, &store);
  h.worker.load_delay_steps = 30;
  std::vector<PreemptionEvent> preemptions;
  int32_t steps_a_waited = 0;
  h.after_schedule = [&](const SchedulerOutput& so) {
    const auto& p = h.sched.last_preemptions();
    preemptions.insert(preemptions.end(), p.begin(), p.end());
    const Request* a = h.sched.FindRequest("A");
    const Request* l = h.sched.FindRequest("L");
    if (a != nullptr && l != nullptr && l->state == RequestState::kWaitingForRemoteKv &&
        a->state == RequestState::kRunning && so.total_num_scheduled_tokens == 0) {
      ++steps_a_waited;
    }
  };
  const std::vector<int32_t> l_prompt = Concat(prefix, {5});
  h.Add("A", Tokens(4, 1), Greedy(36));
  h.Add("L", l_prompt, Greedy(3));
  h.Step();
  ASSERT_EQ(h.sched.FindRequest("L")->state, RequestState::kWaitingForRemoteKv);
  h.RunToCompletion(/*max_steps=*/400);
  ASSERT_EQ(preemptions.size(), 1u);
  EXPECT_EQ(preemptions[0].victim_id, "L");
  EXPECT_EQ(preemptions[0].preemptor_id, "A");
  EXPECT_EQ(preemptions[0].num_computed_tokens, 16) << "L held its loaded prefix";
  EXPECT_GT(steps_a_waited, 0) << "A waited for the load instead of preempting itself";
  EXPECT_EQ(conn.loads_finished.front(), "L");
  ExpectMatchesReference(h, "A", Tokens(4, 1), Greedy(36));
  ExpectMatchesReference(h, "L", l_prompt, Greedy(3));
}

// Usage's cached-token counts (RequestOutput): both describe the admission
// whose prefill produced the first output token. A full-prompt load counts
// every prompt token but the last (always computed) as external; a local
// hit and a load add up; and a preemption after the first token changes
// neither (a re-admission then hits the request's own blocks).
TEST_P(ConnectorModeTest, CachedTokenCountsDescribeTheAdmissionOfTheFirstToken) {
  SchedulerConfig c = TestConfig(64, GetParam());
  FakeStore store;
  const std::vector<int32_t> prompt = Tokens(12, 8);
  FillStore(&store, c, prompt);
  {
    ScriptedKvConnector conn(c.block_size, &store);
    Harness h(c, &conn, &store);
    h.Add("full", prompt, Greedy(3));
    h.RunToCompletion();
    EXPECT_EQ(h.usage.at("full").num_cached_tokens_local, 0);
    EXPECT_EQ(h.usage.at("full").num_cached_tokens_external, 11);
  }
  {
    // A local hit on the first two blocks (a request loaded them), the
    // store has the third.
    ScriptedKvConnector conn(c.block_size, &store);
    Harness h(c, &conn, &store);
    std::vector<int32_t> two_blocks(prompt.begin(), prompt.begin() + 8);
    two_blocks.push_back(3);
    h.Add("pre", two_blocks, Greedy(1));
    h.RunToCompletion();
    std::vector<int32_t> longer = prompt;
    longer.push_back(3);
    h.Add("mixed", longer, Greedy(3));
    h.RunToCompletion();
    EXPECT_EQ(h.usage.at("mixed").num_cached_tokens_local, 8);
    EXPECT_EQ(h.usage.at("mixed").num_cached_tokens_external, 4);
    ExpectMatchesReference(h, "mixed", longer, Greedy(3));
  }
  // A (priority 1), admitted with nothing cached, preempts itself after its
  // first tokens when B (priority 0) runs beside it and the pool is full; it
  // is re-admitted on a hit of its own blocks: its counts stay those of its
  // first admission.
  c = TestConfig(9, GetParam());
  c.policy = SchedulingPolicy::kPriority;
  Harness h(c, nullptr, nullptr);
  h.Add("A", Tokens(9, 1), Greedy(12), /*priority=*/1);
  for (int i = 0; i < 3; ++i) h.Step();
  h.Add("B", Tokens(8, 2), Greedy(8), /*priority=*/0);
  h.RunToCompletion();
  bool a_preempted = false;
  for (const PreemptionEvent& e : h.preemptions) a_preempted |= e.victim_id == "A";
  ASSERT_TRUE(a_preempted);
  EXPECT_EQ(h.usage.at("A").num_cached_tokens_local, 0);
  EXPECT_EQ(h.usage.at("A").num_cached_tokens_external, 0);
  ExpectMatchesReference(h, "A", Tokens(9, 1), Greedy(12));
}

// A prompt whose every full block the local cache holds, the last one
// included (the hit stops one block short: the last token's logits are
// needed), is not looked up in the store: the last block is recomputed
// instead of loaded (an async preemption on a block boundary leaves
// requests in this state).
TEST_P(ConnectorModeTest, AWholePromptInTheLocalCacheIsNotLoadedFromTheStore) {
  const SchedulerConfig c = TestConfig(64, GetParam());
  FakeStore store;
  const std::vector<int32_t> prompt = Tokens(8, 4);
  FillStore(&store, c, prompt);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  h.Add("X", prompt, Greedy(1));
  h.RunToCompletion();
  ASSERT_EQ(conn.loads_finished, std::vector<std::string>{"X"}) << "X loads its first block";
  h.Add("Y", prompt, Greedy(3));
  const SchedulerOutput& so = h.Step();
  EXPECT_TRUE(so.kv_connector_metadata.loads.empty());
  EXPECT_EQ(std::count(conn.answered.begin(), conn.answered.end(), "Y"), 0)
      << "the store was asked for blocks the cache holds";
  ASSERT_EQ(so.num_scheduled_tokens, std::vector<int32_t>{4}) << "Y recomputes its last block";
  h.RunToCompletion();
  ExpectMatchesReference(h, "Y", prompt, Greedy(3));
}

// The livelock found in review: 13 usable blocks of 4 tokens, max_num_seqs
// 2, no chunked prefill, a 27-token prompt with max_tokens 26 (it needs the
// whole pool) and an 18-token prompt with max_tokens 7, every full block of
// both in the store (another replica ran them). Async, it never drained
// (5000 steps, 2497 preemptions, the two preempting each other in turn),
// with limit_async_load_admission on or off.
TEST_P(ConnectorModeTest, TwoRequestsOfAWarmStoreOnASmallPoolDoNotPreemptEachOtherForEver) {
  for (const bool limit : {false, true}) {
    SchedulerConfig c = TestConfig(14, GetParam());
    c.max_model_len = 64;
    c.max_num_seqs = 2;
    c.enable_chunked_prefill = false;
    c.limit_async_load_admission = limit;
    const std::vector<int32_t> a = Tokens(27, 1);
    const std::vector<int32_t> b = Tokens(18, 2);
    FakeStore store;
    {
      SchedulerConfig other = c;
      other.async_scheduling = false;
      ScriptedKvConnector conn(c.block_size, &store);
      Harness h(other, &conn, &store);
      h.Add("A", a, Greedy(26));
      h.RunToCompletion();
      h.Add("B", b, Greedy(7));
      h.RunToCompletion();
    }
    ASSERT_EQ(store.size(), 19u);
    ScriptedKvConnector conn(c.block_size, &store);
    Harness h(c, &conn, &store);
    h.Add("A", a, Greedy(26));
    h.Add("B", b, Greedy(7));
    h.RunToCompletion(/*max_steps=*/200);
    ASSERT_FALSE(HasFailure()) << "limit " << limit;
    EXPECT_LE(h.sched.stats().num_preemptions_total, 2u) << "limit " << limit;
    EXPECT_LE(h.max_preemptions_by_same_request(), 1) << "limit " << limit;
    ExpectMatchesReference(h, "A", a, Greedy(26));
    ExpectMatchesReference(h, "B", b, Greedy(7));
  }
}

// Six requests whose `prefix_len`-token prefix is in the store, followed by
// `tail_len` tokens of their own; returns the number of loads admitted in the
// first step.
int32_t LoadsAdmittedInFirstStep(bool limit, int32_t max_num_seqs, int32_t budget,
                                 int32_t num_blocks, int32_t prefix_len = 16,
                                 int32_t tail_len = 4) {
  SchedulerConfig c = TestConfig(num_blocks);
  c.limit_async_load_admission = limit;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = budget;
  FakeStore store;
  const std::vector<int32_t> prefix = Tokens(prefix_len, 9);
  FillStore(&store, c, prefix);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  h.worker.load_delay_steps = 1;
  for (int i = 0; i < 6; ++i) {
    h.Add("r" + std::to_string(i), Concat(prefix, Tokens(tail_len, 20 + i)), Greedy(2));
  }
  const SchedulerOutput s = h.Step();
  const int32_t loads = static_cast<int32_t>(s.kv_connector_metadata.loads.size());
  EXPECT_EQ(h.sched.stats().num_waiting_for_load, loads);
  h.RunToCompletion();
  for (int i = 0; i < 6; ++i) {
    ExpectMatchesReference(h, "r" + std::to_string(i), Concat(prefix, Tokens(tail_len, 20 + i)),
                           Greedy(2));
  }
  return loads;
}

TEST(ConnectorTest, AsyncLoadsCountAgainstMaxNumSeqsAndTheTokenBudgetWhenLimited) {
  EXPECT_EQ(LoadsAdmittedInFirstStep(true, 2, 2048, 128), 2) << "max_num_seqs";
  EXPECT_EQ(LoadsAdmittedInFirstStep(true, 8, 40, 128), 3) << "budget 40 = 16 + 16 + 8";
  EXPECT_EQ(LoadsAdmittedInFirstStep(false, 2, 40, 128), 6) << "unlimited without the switch";
}

// The block gate: a load is admitted only when the free blocks, less the
// rest of every prompt already admitted (prefills in progress, loads running
// or finished), hold its whole prompt. A gate that only compares the free
// blocks with the prompt admits more in each of these tests.
TEST(ConnectorTest, TheBlockGateReservesTheRestOfThePromptsOfOtherLoads) {
  for (bool limit : {false, true}) {
    // 12 usable blocks; each 20-token prompt needs 5 and loads 2. Load 1:
    // 12 free; load 2: 10 free - 3 reserved >= 5; load 3: 8 free - 6 < 5
    // (free blocks alone would admit four: 12, 10, 8, 6 >= 5).
    EXPECT_EQ(LoadsAdmittedInFirstStep(limit, 8, 2048, 13, /*prefix_len=*/8, /*tail_len=*/12), 2)
        << limit;
    // Loads of 4 of 5 blocks: 12; 8 - 1 >= 5; 4 - 2 < 5.
    EXPECT_EQ(LoadsAdmittedInFirstStep(limit, 8, 2048, 13), 2) << limit;
  }
}

TEST(ConnectorTest, TheBlockGateReservesTheRestOfAPrefillInProgress) {
  // 12 usable blocks. R's 40-token prompt (10 blocks) is prefilled 8 tokens
  // a step; L's 12-token prompt (3 blocks) has 8 tokens in the store. While R
  // prefills, free - R's rest stays 2 < 3; free alone would be 10, 8, 6, 4.
  SchedulerConfig c = TestConfig(13);
  c.max_num_batched_tokens = 10;
  c.long_prefill_token_threshold = 8;
  FakeStore store;
  const std::vector<int32_t> prefix = Tokens(8, 12);
  FillStore(&store, c, prefix);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  const std::vector<int32_t> l_prompt = Concat(prefix, Tokens(4, 13));
  h.Add("R", Tokens(40, 11), Greedy(1));
  h.Add("L", l_prompt, Greedy(2));
  for (int step = 1; step <= 5; ++step) {
    const SchedulerOutput so = h.Step();
    EXPECT_TRUE(so.kv_connector_metadata.loads.empty()) << "step " << step;
    EXPECT_EQ(h.sched.FindRequest("L")->state, RequestState::kWaiting) << "step " << step;
  }
  EXPECT_EQ(h.reasons["R"], RequestState::kFinishedLength) << "R's prefill is done";
  EXPECT_EQ(h.Step().kv_connector_metadata.loads.size(), 1u) << "now L's load goes";
  h.RunToCompletion();
  ExpectMatchesReference(h, "R", Tokens(40, 11), Greedy(1));
  ExpectMatchesReference(h, "L", l_prompt, Greedy(2));
}

TEST(ConnectorTest, TheBlockGateReservesTheRestOfALoadedRequestNotYetAdmitted) {
  // 12 usable blocks. L1 loads 2 of its 8 blocks, then R takes 6. L1's load
  // finishes but its other 6 blocks do not fit beside R, so it waits holding
  // 2. L2 (3 blocks, 2 in the store) arrives: 3 free - L1's 6 reserved < 3
  // (free alone: 3 >= 3).
  const SchedulerConfig c = TestConfig(13);
  FakeStore store;
  const std::vector<int32_t> prefix1 = Tokens(8, 31);
  const std::vector<int32_t> prefix2 = Tokens(8, 33);
  FillStore(&store, c, prefix1);
  FillStore(&store, c, prefix2);
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  const std::vector<int32_t> l1_prompt = Concat(prefix1, Tokens(24, 32));
  const std::vector<int32_t> l2_prompt = Concat(prefix2, Tokens(4, 34));
  h.Add("L1", l1_prompt, Greedy(2));
  h.Add("R", Tokens(24, 35), Greedy(8));
  EXPECT_EQ(h.Step().kv_connector_metadata.loads.size(), 1u);
  ASSERT_EQ(conn.loads_finished, std::vector<std::string>{"L1"});
  h.Add("L2", l2_prompt, Greedy(2));
  int32_t steps_l1_waited = 0;
  for (;;) {
    const SchedulerOutput so = h.Step();
    if (h.sched.FindRequest("L1")->state != RequestState::kWaiting) break;
    EXPECT_TRUE(so.kv_connector_metadata.loads.empty()) << "step " << so.step_id;
    ASSERT_LT(++steps_l1_waited, 20);
  }
  EXPECT_GE(steps_l1_waited, 7) << "L1 waited for R";
  h.RunToCompletion();
  EXPECT_EQ(conn.loads_finished, (std::vector<std::string>{"L1", "L2"}));
  ExpectMatchesReference(h, "L1", l1_prompt, Greedy(2));
  ExpectMatchesReference(h, "L2", l2_prompt, Greedy(2));
  ExpectMatchesReference(h, "R", Tokens(24, 35), Greedy(8));
}

// Remembers what BuildConnectorMeta saw: each request's counters before the
// step advances them and the store bound it was given.
class CounterRecordingConnector : public ScriptedKvConnector {
 public:
  using ScriptedKvConnector::ScriptedKvConnector;
  struct Seen {
    std::string id;
    int32_t num_computed_tokens, num_output_placeholders, num_scheduled_tokens;
    bool adds_placeholder;
    int32_t num_storable_tokens;
  };
  std::vector<Seen> seen;

  KvConnectorMetadata BuildConnectorMeta(const SchedulerOutput& out,
                                         std::span<const ScheduledRequestView> views) override {
    seen.clear();
    for (const ScheduledRequestView& v : views) {
      seen.push_back({v.request->request_id, v.request->num_computed_tokens,
                      v.request->num_output_placeholders, v.num_scheduled_tokens,
                      v.adds_placeholder, v.num_storable_tokens()});
    }
    return ScriptedKvConnector::BuildConnectorMeta(out, views);
  }
};

// The store bound built from the counters before the step's increments (in
// BuildConnectorMeta) equals the known computed tokens after them
// (min(num_computed_tokens, num_tokens)), no full block under it holds a
// placeholder (a position at or past num_tokens, whose id is not known), and
// every block stored lies under it.
TEST(ConnectorTest, StoresBuiltInAsyncModeNeverIncludeAPlaceholderBlock) {
  const SchedulerConfig c = TestConfig(64, /*async=*/true);
  const int32_t bs = c.block_size;
  FakeStore store;
  CounterRecordingConnector conn(bs, &store);
  Harness h(c, &conn, &store);
  int32_t num_checked = 0;
  int32_t stores_past_prompt = 0;
  int32_t steps_with_placeholder_blocks = 0;
  int32_t num_final_stores = 0;
  h.after_schedule = [&](const SchedulerOutput& so) {
    std::map<std::string, int32_t> bound;
    for (const CounterRecordingConnector::Seen& s : conn.seen) {
      const Request* r = h.sched.FindRequest(s.id);
      ASSERT_NE(r, nullptr);
      const int32_t increment = s.adds_placeholder ? 1 : 0;
      ASSERT_EQ(r->num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens);
      ASSERT_EQ(r->num_output_placeholders, s.num_output_placeholders + increment);
      const int32_t before =
          std::min(s.num_computed_tokens + s.num_scheduled_tokens, r->num_tokens());
      const int32_t after = r->num_known_computed_tokens();
      EXPECT_EQ(before, after) << s.id;
      // The newest placeholder is never computed: the bound is exact, the
      // old C - P was one short.
      if (r->num_output_placeholders > 0) {
        EXPECT_LE(r->num_computed_tokens, r->num_tokens() + r->num_output_placeholders - 1);
        if (r->num_computed_tokens >= r->num_tokens()) {
          EXPECT_EQ(after, r->num_tokens()) << s.id;
          EXPECT_EQ(r->num_computed_tokens - r->num_output_placeholders, r->num_tokens() - 1);
        }
      }
      EXPECT_EQ(s.num_storable_tokens, after) << s.id;
      EXPECT_LE(after / bs * bs, r->num_tokens()) << s.id << ": a stored block holds a placeholder";
      // Counting num_computed_tokens alone would store a placeholder block.
      if (r->num_computed_tokens / bs * bs > r->num_tokens()) ++steps_with_placeholder_blocks;
      bound[s.id] = after;
    }
    for (const KvStoreOp& st : so.kv_connector_metadata.stores) {
      if (st.before_forward) {  // a finished request's: checked by the store's content
        ++num_final_stores;
        continue;
      }
      const Request* r = h.sched.FindRequest(st.request_id);
      ASSERT_NE(r, nullptr);
      for (int32_t block : st.block_ids) {
        const auto it = std::find(r->block_ids.begin(), r->block_ids.end(), block);
        ASSERT_NE(it, r->block_ids.end());
        const int32_t end = static_cast<int32_t>(it - r->block_ids.begin() + 1) * bs;
        EXPECT_LE(end, bound.at(st.request_id)) << st.request_id;
        EXPECT_LE(end, r->num_tokens()) << st.request_id;
        if (end > r->num_prompt_tokens) ++stores_past_prompt;
        ++num_checked;
      }
    }
  };
  for (int i = 0; i < 4; ++i) h.Add("r" + std::to_string(i), Tokens(5 + 3 * i, i), Greedy(20));
  h.RunToCompletion();
  EXPECT_EQ(conn.num_store_violations, 0);
  EXPECT_GT(num_checked, 10);
  EXPECT_GT(stores_past_prompt, 0) << "output blocks are stored too";
  EXPECT_GT(steps_with_placeholder_blocks, 0) << "the test never met a block with a placeholder";
  EXPECT_GT(num_final_stores, 0) << "no request ended with a block no step had stored";
  // Everything stored is what the tokens say (the worker copied real KV).
  for (int i = 0; i < 4; ++i) {
    ExpectMatchesReference(h, "r" + std::to_string(i), Tokens(5 + 3 * i, i), Greedy(20));
  }
}

// What one run of `specs` stores: block hash -> the slot values read.
struct StoreRun {
  std::map<BlockHash, std::vector<int64_t>> blocks;
  std::map<std::string, std::vector<int32_t>> outputs;
  int32_t num_store_violations = 0;
};

struct WorkloadSpec {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams sp;
};

StoreRun RunAndCollectStores(SchedulerConfig c, bool async,
                             const std::vector<WorkloadSpec>& specs) {
  c.async_scheduling = async;
  FakeStore store;
  ScriptedKvConnector conn(c.block_size, &store);
  Harness h(c, &conn, &store);
  for (const WorkloadSpec& w : specs) h.Add(w.id, w.prompt, w.sp);
  h.RunToCompletion();
  StoreRun run;
  for (const auto& [hash, values] : h.worker.stored) {
    auto [it, inserted] = run.blocks.emplace(hash, values);
    EXPECT_EQ(it->second, values) << "one hash stored with two contents";
  }
  run.outputs = h.outputs;
  run.num_store_violations = conn.num_store_violations;
  return run;
}

// The content a stored block must have: the slot values of the known tokens
// it covers, found by hashing every request's prompt + output.
std::map<BlockHash, std::vector<int64_t>> ExpectedBlocks(const SchedulerConfig& c,
                                                         const std::vector<WorkloadSpec>& specs,
                                                         const StoreRun& run) {
  std::map<BlockHash, std::vector<int64_t>> expected;
  const BlockHash root = ComputeRootHash(c.hash_root);
  for (const WorkloadSpec& w : specs) {
    const std::vector<int32_t> all = Concat(w.prompt, run.outputs.at(w.id));
    std::vector<BlockHash> hashes;
    ExtendBlockHashes(root, all, c.block_size, &hashes);
    for (size_t b = 0; b < hashes.size(); ++b) {
      std::vector<int64_t>& v = expected[hashes[b]];
      v.clear();
      for (int32_t p = static_cast<int32_t>(b) * c.block_size;
           p < static_cast<int32_t>(b + 1) * c.block_size; ++p) {
        v.push_back(testing::SlotValue(all[p], p));
      }
    }
  }
  return expected;
}

// Part of the exact store bound (DESIGN §3 "known computed tokens"): the
// same workload stores exactly the same blocks in sync and async mode, and
// every stored block holds the KV of its known tokens (no placeholder, no
// garbage). Async mode learns a request's last tokens only from the outputs
// that end it, after its last scheduled step: RequestFinished's final store
// covers those blocks.
TEST(ConnectorTest, SyncAndAsyncStoreExactlyTheSameBlocks) {
  // The case the review measured: block size 4, an 8-token prompt and
  // max_tokens 1 or 2: sync stored 2 blocks, async 1.
  for (int32_t max_tokens : {1, 2}) {
    const SchedulerConfig c = TestConfig(64);
    const std::vector<WorkloadSpec> specs = {{"a", Tokens(8, 3), Greedy(max_tokens)}};
    const StoreRun sync = RunAndCollectStores(c, false, specs);
    const StoreRun async = RunAndCollectStores(c, true, specs);
    EXPECT_EQ(sync.blocks.size(), 2u) << max_tokens;
    EXPECT_EQ(async.blocks.size(), 2u) << max_tokens;
  }
  // Seeded workloads: prompts across block boundaries, short and long
  // outputs, stop tokens, EOS, shared prefixes, small pools (preemption).
  std::mt19937_64 rng(12);
  auto uniform = [&](int lo, int hi) {
    return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  int32_t num_compared = 0;
  for (int seed = 0; seed < 300; ++seed) {
    SchedulerConfig c = TestConfig(uniform(0, 1) ? 64 : uniform(14, 20));
    c.max_model_len = 64;
    c.max_num_seqs = uniform(1, 4);
    std::vector<WorkloadSpec> specs;
    const std::vector<int32_t> base = Tokens(20, seed);
    for (int i = 0, n = uniform(1, 4); i < n; ++i) {
      WorkloadSpec w{.id = "r" + std::to_string(i)};
      w.prompt.assign(base.begin(), base.begin() + uniform(1, 16));
      for (int t = uniform(0, 3); t > 0; --t) w.prompt.push_back(uniform(2, 63));
      w.sp = Greedy(uniform(1, 9), /*ignore_eos=*/uniform(0, 1) != 0);
      if (uniform(0, 2) == 0) w.sp.stop_token_ids = {uniform(2, 63), uniform(2, 63)};
      specs.push_back(std::move(w));
    }
    const StoreRun sync = RunAndCollectStores(c, false, specs);
    const StoreRun async = RunAndCollectStores(c, true, specs);
    if (HasFailure()) return;
    ASSERT_EQ(sync.outputs, async.outputs) << "seed " << seed;
    std::set<BlockHash> sync_hashes, async_hashes;
    for (const auto& [h, v] : sync.blocks) sync_hashes.insert(h);
    for (const auto& [h, v] : async.blocks) async_hashes.insert(h);
    ASSERT_EQ(sync_hashes, async_hashes) << "seed " << seed;
    const auto expected = ExpectedBlocks(c, specs, sync);
    for (const StoreRun* run : {&sync, &async}) {
      EXPECT_EQ(run->num_store_violations, 0) << "seed " << seed;
      for (const auto& [h, v] : run->blocks) {
        ASSERT_TRUE(expected.count(h)) << "seed " << seed << ": a stored hash of no known block";
        ASSERT_EQ(v, expected.at(h)) << "seed " << seed << ": a stored block's KV is wrong";
      }
    }
    num_compared += static_cast<int32_t>(sync_hashes.size());
  }
  EXPECT_GT(num_compared, 1000);
}

TEST(ConnectorTest, DelayedFreeHoldsBlocksUntilFinishedSending) {
  const SchedulerConfig c = TestConfig(64);
  FakeStore store;
  ScriptedKvConnector conn(c.block_size, &store);
  conn.delay_free = true;
  Harness h(c, &conn, &store);
  h.worker.store_delay_steps = 2;
  h.Add("P", Tokens(12, 1), Greedy(1));
  h.Step();  // prefill stores 3 blocks and finishes
  EXPECT_EQ(h.reasons["P"], RequestState::kFinishedLength);
  EXPECT_LT(h.sched.num_free_blocks(), h.sched.num_total_blocks());
  EXPECT_TRUE(h.sched.HasUnfinishedRequests());
  h.RunToCompletion();
  EXPECT_EQ(h.sched.num_free_blocks(), h.sched.num_total_blocks());
}

}  // namespace
}  // namespace tandem::sched
