// Every case of stories260K.reference.json (llama2.c's own greedy outputs),
// sent concurrently through tandem-scheduler and tandem-worker.
#include <thread>

#include "gtest/gtest.h"
#include "harness.h"
#include "reference_cases.h"

namespace tandem::testing {
namespace {

void RunReferenceCases(bool async) {
  std::vector<ReferenceCase> cases = LoadReferenceCases();
  ASSERT_FALSE(cases.empty());
  const std::string dir = MakeTempDir("tandem-reference");
  Service worker = StartWorker(dir, "worker", {});
  Service scheduler =
      StartScheduler(dir, "scheduler", worker.address(),
                     {async ? "--async-scheduling=true" : "--async-scheduling=false"});
  auto stub = GenerationStub(scheduler.address());

  const std::vector<GenerateResult> results = RunConcurrently(stub.get(), ReferenceRequests(cases));
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    const auto& got = results[i].tokens;
    const auto& want = cases[i].expected;
    const size_t decisive = std::min(cases[i].decisive_prefix_len, want.size());
    ASSERT_GE(got.size(), decisive);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + decisive),
              std::vector<int32_t>(want.begin(), want.begin() + decisive))
        << "decisive prefix differs";
    // The CPU backend follows the reference's order of operations: every
    // token is expected, including the stop on token 1.
    EXPECT_EQ(got, want);
    EXPECT_EQ(results[i].finish_reason, want.size() < static_cast<size_t>(cases[i].max_tokens)
                                            ? v1::FINISH_REASON_STOP
                                            : v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(results[i].usage.prompt_tokens(), static_cast<int32_t>(cases[i].prompt.size()));
    EXPECT_EQ(results[i].usage.output_tokens(), static_cast<int32_t>(got.size()));
  }
  const v1::GetStatsResponse stats = GetStats(stub.get());
  EXPECT_EQ(stats.async_scheduling(), async);
  EXPECT_EQ(stats.max_steps_in_flight(), async ? 2 : 1);
}

TEST(ReferenceTest, AllCasesMatchConcurrentlyWithAsyncScheduling) {
  RunReferenceCases(/*async=*/true);
}

TEST(ReferenceTest, AllCasesMatchConcurrentlyWithSyncScheduling) {
  RunReferenceCases(/*async=*/false);
}

}  // namespace
}  // namespace tandem::testing
