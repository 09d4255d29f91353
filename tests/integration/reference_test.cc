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
    const std::vector<int32_t> want = cases[i].Streamed();
    const size_t decisive = std::min(cases[i].decisive_prefix_len, want.size());
    ASSERT_GE(got.size(), decisive);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + decisive),
              std::vector<int32_t>(want.begin(), want.begin() + decisive))
        << "decisive prefix differs";
    // The CPU backend follows the reference's order of operations: every
    // token is expected, including the stop on token 1, which is streamed
    // and marked as the token that stopped the request.
    EXPECT_EQ(got, want);
    EXPECT_EQ(results[i].finish_reason,
              cases[i].stopped_on_token_1 ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(results[i].last_token_stops, cases[i].stopped_on_token_1);
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

// Each Hugging Face fixture of ../shared/models/hf through a worker and a
// scheduler: transformers' greedy tokens (reference.json, EOS ignored as the
// reference ran) within each case's decisive prefix, all cases of a fixture
// sent concurrently, so they share steps.
TEST(ReferenceTest, HuggingFaceFixturesMatchTransformersThroughTheServices) {
  const std::string root = std::string(TANDEM_SHARED_DIR) + "/models/hf";
  for (const char* fixture : {"llama2-bf16", "llama3.2", "llama3.2-tf5", "llama-linear-sharded",
                              "mistral", "qwen2.5", "qwen3", "phi3", "gemma"}) {
    SCOPED_TRACE(fixture);
    const std::vector<ReferenceCase> cases =
        LoadReferenceCases(root + "/" + fixture + "/reference.json");
    ASSERT_EQ(cases.size(), 6u);
    const std::string dir = MakeTempDir("tandem-hf-reference");
    Service worker =
        StartWorker(dir, "worker", {"--model", root + "/" + fixture, "--num-blocks", "64"});
    // 63 usable blocks of 16 hold 1008 tokens: the scheduler refuses the
    // models' own context lengths (up to 131072) on that cache.
    Service scheduler =
        StartScheduler(dir, "scheduler", worker.address(), {"--max-model-len", "1008"});
    auto stub = GenerationStub(scheduler.address());
    std::vector<v1::GenerateRequest> requests;
    for (const ReferenceCase& c : cases) {
      requests.push_back(MakeRequest(c.prompt, c.max_tokens, 0.0f, std::nullopt,
                                     /*ignore_eos=*/true));
    }
    if (std::string(fixture) == "llama3.2") {
      // Its eos_token_id is a list: the worker describes all of them.
      grpc::ClientContext context;
      v1::GetModelInfoResponse info;
      ASSERT_TRUE(stub->GetModelInfo(&context, {}, &info).ok());
      EXPECT_EQ(info.eos_token_id(), 2);
      EXPECT_EQ(std::vector<int32_t>(info.extra_eos_token_ids().begin(),
                                     info.extra_eos_token_ids().end()),
                (std::vector<int32_t>{5, 7}));
    }
    const std::vector<GenerateResult> results = RunConcurrently(stub.get(), requests);
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("case " + std::to_string(i));
      ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
      const auto& got = results[i].tokens;
      const auto& want = cases[i].expected;
      const size_t decisive = cases[i].decisive_prefix_len;
      ASSERT_GE(got.size(), decisive);
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + decisive),
                std::vector<int32_t>(want.begin(), want.begin() + decisive));
    }
  }
}

}  // namespace
}  // namespace tandem::testing
