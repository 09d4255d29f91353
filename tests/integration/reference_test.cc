// Every case of stories260K.reference.json (llama2.c's own greedy outputs),
// sent concurrently through tandem-scheduler and tandem-worker.
#include <fstream>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "harness.h"
#include "tandem/model/json.h"

namespace tandem::testing {
namespace {

struct Case {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  std::vector<int32_t> expected;
  size_t decisive_prefix_len = 0;
};

std::vector<Case> LoadCases() {
  std::ifstream f(std::string(TANDEM_SHARED_DIR) + "/models/stories260K.reference.json");
  std::stringstream ss;
  ss << f.rdbuf();
  auto json = model::JsonValue::Parse(ss.str());
  EXPECT_TRUE(json.ok()) << json.status();
  std::vector<Case> cases;
  if (!json.ok()) return cases;
  auto ids = [](const model::JsonValue* v) {
    std::vector<int32_t> out;
    for (const auto& x : v->array()) out.push_back(static_cast<int32_t>(x.number()));
    return out;
  };
  for (const model::JsonValue& c : json->array()) {
    cases.push_back(
        {.prompt = ids(c.Find("prompt_token_ids")),
         .max_tokens = static_cast<int32_t>(c.Find("max_tokens")->number()),
         .expected = ids(c.Find("expected_output_token_ids")),
         .decisive_prefix_len = static_cast<size_t>(c.Find("decisive_prefix_len")->number())});
  }
  return cases;
}

void RunReferenceCases(bool async) {
  std::vector<Case> cases = LoadCases();
  ASSERT_FALSE(cases.empty());
  const std::string dir = MakeTempDir("tandem-reference");
  Service worker = StartWorker(dir, "worker", {});
  Service scheduler =
      StartScheduler(dir, "scheduler", worker.address(),
                     {async ? "--async-scheduling=true" : "--async-scheduling=false"});
  auto stub = GenerationStub(scheduler.address());

  std::vector<GenerateResult> results(cases.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cases.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = RunGenerate(stub.get(), MakeRequest(cases[i].prompt, cases[i].max_tokens));
    });
  }
  for (auto& t : threads) t.join();
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
