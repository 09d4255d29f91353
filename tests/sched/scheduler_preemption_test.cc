// Scheduler preemption (issue 3, "What must hold" 3): who is preempted under
// FCFS and priority, what a preempted request resumes with, and how
// preemptions are counted.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler_test_common.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched {
namespace {

using testing::ExpectMatchesReference;
using testing::FakeStore;
using testing::Greedy;
using testing::Harness;
using testing::ModeTest;
using testing::NumScheduled;
using testing::TestConfig;
using testing::Tokens;

TEST(SchedulerTest, PreemptsTheMostRecentlyAdmittedRequestUnderFcfs) {
  // 6 usable blocks of 4 tokens; three prompts of 7 tokens take 2 blocks each.
  FakeStore store;
  Harness h(TestConfig(7), nullptr, &store);
  for (const char* id : {"A", "B", "C"}) h.Add(id, Tokens(7, id[0]), Greedy(8));
  struct Row {
    std::vector<std::string> preempted;
    int32_t a, b, c;
  };
  const std::vector<Row> expected = {
      {{}, 7, 7, 7},     // all admitted, pool full
      {{}, 1, 1, 1},     // position 7 fits the second block
      {{"C"}, 1, 1, 0},  // A needs a block: C (admitted last) goes
  };
  for (size_t s = 0; s < expected.size(); ++s) {
    const SchedulerOutput& so = h.Step();
    EXPECT_EQ(so.preempted_req_ids, expected[s].preempted) << "step " << s + 1;
    EXPECT_EQ(NumScheduled(so, "A"), expected[s].a) << "step " << s + 1;
    EXPECT_EQ(NumScheduled(so, "B"), expected[s].b) << "step " << s + 1;
    EXPECT_EQ(NumScheduled(so, "C"), expected[s].c) << "step " << s + 1;
  }
  const Request* c = h.sched.FindRequest("C");
  EXPECT_EQ(c->state, RequestState::kPreempted);
  EXPECT_EQ(c->num_computed_tokens, 0);
  EXPECT_TRUE(c->block_ids.empty());
  EXPECT_EQ(h.sched.stats().num_preemptions_total, 1u);
  h.RunToCompletion();
  for (const char* id : {"A", "B", "C"}) ExpectMatchesReference(h, id, Tokens(7, id[0]), Greedy(8));
}

TEST(SchedulerTest, PreemptsTheLowestPriorityLatestArrivalUnderPriority) {
  struct Case {
    std::vector<int32_t> priorities;
    std::vector<int64_t> arrivals;
    std::string victim;
  };
  const std::vector<Case> cases = {
      {{5, 9, 1}, {1, 2, 3}, "B"},  // largest priority value
      {{5, 5, 1}, {1, 2, 3}, "B"},  // equal priority: latest arrival
      {{5, 5, 1}, {2, 1, 3}, "A"},
      {{1, 1, 1}, {1, 2, 3}, "C"},
  };
  for (const Case& cs : cases) {
    SchedulerConfig c = TestConfig(7);
    c.policy = SchedulingPolicy::kPriority;
    FakeStore store;
    Harness h(c, nullptr, &store);
    const char* ids[] = {"A", "B", "C"};
    for (int i = 0; i < 3; ++i) {
      h.Add(ids[i], Tokens(7, i), Greedy(8), cs.priorities[i], "", cs.arrivals[i]);
    }
    h.Step();
    h.Step();
    const SchedulerOutput s3 = h.Step();
    EXPECT_EQ(s3.preempted_req_ids, std::vector<std::string>{cs.victim}) << cs.victim;
    h.RunToCompletion();
    for (int i = 0; i < 3; ++i) ExpectMatchesReference(h, ids[i], Tokens(7, i), Greedy(8));
  }
}

TEST(SchedulerTest, NoWaitingRequestIsAdmittedInAStepThatPreempted) {
  SchedulerConfig c = TestConfig(8);  // 7 usable blocks
  c.policy = SchedulingPolicy::kPriority;
  FakeStore store;
  Harness h(c, nullptr, &store);
  h.Add("A", Tokens(7, 1), Greedy(8));
  h.Add("B", Tokens(7, 2), Greedy(8));
  h.Add("C", Tokens(11, 3), Greedy(8));  // 3 blocks: freeing it leaves one spare block
  h.Step();
  h.Step();
  h.Add("D", Tokens(3, 4), Greedy(2), /*priority=*/-1);  // most important, needs 1 block
  const SchedulerOutput s3 = h.Step();
  EXPECT_EQ(s3.preempted_req_ids, std::vector<std::string>{"C"});
  EXPECT_TRUE(s3.scheduled_new_reqs.empty());
  EXPECT_EQ(h.sched.num_free_blocks(), 1);  // D would have fit
  const SchedulerOutput s4 = h.Step();
  ASSERT_EQ(s4.scheduled_new_reqs.size(), 1u);
  EXPECT_EQ(s4.scheduled_new_reqs[0].request_id, "D");
  h.RunToCompletion();
  ExpectMatchesReference(h, "C", Tokens(11, 3), Greedy(8));
  ExpectMatchesReference(h, "D", Tokens(3, 4), Greedy(2));
}

TEST_P(ModeTest, PreemptedRequestResumesAndContinuesWithTheSameTokens) {
  FakeStore store;
  Harness h(TestConfig(12, GetParam()), nullptr, &store);
  h.keep_history = true;
  for (int i = 0; i < 5; ++i) h.Add("r" + std::to_string(i), Tokens(9 + i, i), Greedy(14));
  h.RunToCompletion();
  EXPECT_GT(h.sched.stats().num_preemptions_total, 0u);
  bool saw_resume = false;
  for (const SchedulerOutput& so : h.history) {
    for (const CachedRequestData& d : so.scheduled_cached_reqs) {
      if (!d.resumed_from_preemption) continue;
      saw_resume = true;
      EXPECT_FALSE(d.all_token_ids.empty());
      EXPECT_FALSE(d.new_block_ids.empty());
    }
  }
  EXPECT_TRUE(saw_resume);
  for (int i = 0; i < 5; ++i) {
    ExpectMatchesReference(h, "r" + std::to_string(i), Tokens(9 + i, i), Greedy(14));
  }
}

TEST(SchedulerTest, PreemptionWithOutputsInFlightLeavesConsistentCounters) {
  FakeStore store;
  Harness h(TestConfig(9, /*async=*/true), nullptr, &store);
  for (int i = 0; i < 4; ++i) h.Add("r" + std::to_string(i), Tokens(5 + i, i), Greedy(16));
  h.RunToCompletion();
  EXPECT_GT(h.sched.stats().num_preemptions_total, 0u);
  for (int i = 0; i < 4; ++i) {
    ExpectMatchesReference(h, "r" + std::to_string(i), Tokens(5 + i, i), Greedy(16));
  }
}

TEST(SchedulerTest, StatsCountPreemptionsPerStepAndInTotal) {
  // 6 usable blocks. R prefills 8 tokens (2 blocks) a step; X and Y hold one
  // block each. In step 3 R needs 2 blocks with none free: Y, then X go.
  SchedulerConfig c = TestConfig(7);
  c.max_num_batched_tokens = 12;
  c.long_prefill_token_threshold = 8;
  FakeStore store;
  Harness h(c, nullptr, &store);
  h.Add("R", Tokens(24, 1), Greedy(1));
  h.Add("X", Tokens(2, 2), Greedy(6));
  h.Add("Y", Tokens(2, 3), Greedy(6));
  struct Row {
    std::vector<std::string> preempted;
    int32_t step_preemptions;
    uint64_t total;
  };
  const std::vector<Row> expected = {{{}, 0, 0}, {{}, 0, 0}, {{"Y", "X"}, 2, 2}, {{}, 0, 2}};
  for (size_t s = 0; s < expected.size(); ++s) {
    const SchedulerOutput so = h.Step();
    EXPECT_EQ(so.preempted_req_ids, expected[s].preempted) << "step " << s + 1;
    EXPECT_EQ(h.sched.stats().num_preemptions_step, expected[s].step_preemptions)
        << "step " << s + 1;
    EXPECT_EQ(h.sched.stats().num_preemptions_total, expected[s].total) << "step " << s + 1;
  }
  h.RunToCompletion();
  EXPECT_EQ(h.sched.stats().num_preemptions_total, 2u);
  EXPECT_EQ(
      h.sched.stats().num_preemptions_by_reason[static_cast<int>(PreemptionReason::kKvCacheFull)],
      2u);
  ExpectMatchesReference(h, "X", Tokens(2, 2), Greedy(6));
  ExpectMatchesReference(h, "Y", Tokens(2, 3), Greedy(6));
}
}  // namespace
}  // namespace tandem::sched
