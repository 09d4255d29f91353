// Differential test: the same 64 concurrent requests (shared prefixes, varied
// lengths, greedy and seeded sampling) give identical tokens per request
// under every combination of {sync, async} x {prefix caching on, off} x
// {token budget 32, 2048} x {ample KV blocks, so few that requests are
// preempted}; some requests have penalties, which read their history. The stats prove preemption
// and prefix hits really happened, that async runs really had two steps in flight (sync runs one),
// and the usage of each response reports local prefix-cache hits only with caching.
// The same again on a model whose attention slides (a window shorter than the
// prompts).
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "harness.h"

namespace tandem::testing {
namespace {

// The token a request with logit_bias is pushed to (MakeWorkload).
int32_t BiasedToken(int i) { return 300 + i; }
// The token of a request with bad_words (MakeWorkload), and the one after it.
int32_t BadWordsToken(int i) { return 100 + 2 * i; }
// The only tokens a request with allowed_token_ids draws (MakeWorkload).
std::vector<int32_t> AllowedTokens(int i) { return {30 + i, 200 + i, 301 + 2 * i}; }

std::vector<v1::GenerateRequest> MakeWorkload() {
  std::mt19937 rng(1234);
  auto token = [&] { return static_cast<int32_t>(2 + rng() % 510); };
  std::vector<std::vector<int32_t>> prefixes;
  for (int f = 0; f < 4; ++f) {
    std::vector<int32_t> p{1};
    const int len = 17 + f * 8;  // 17, 25, 33, 41: one to two full blocks
    while (static_cast<int>(p.size()) < len) p.push_back(token());
    prefixes.push_back(p);
  }
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 64; ++i) {
    std::vector<int32_t> prompt = prefixes[i % 4];
    if (i >= 60) {
      // Exact duplicates of earlier prompts (same blocks in the same step).
      prompt = std::vector<int32_t>(requests[i - 60].prompt_token_ids().begin(),
                                    requests[i - 60].prompt_token_ids().end());
    } else {
      const int suffix = 1 + static_cast<int>(rng() % 30);
      for (int j = 0; j < suffix; ++j) prompt.push_back(token());
    }
    const int32_t max_tokens = 8 + (i * 7) % 41;
    const bool greedy = i % 2 == 0;
    v1::GenerateRequest r = MakeRequest(prompt, max_tokens, greedy ? 0.0f : 0.9f,
                                        /*seed=*/1000 + i, /*ignore_eos=*/i % 3 == 0);
    if (!greedy && i % 3 == 1) r.mutable_sampling()->set_top_k(20);
    if (!greedy && i % 5 == 1) r.mutable_sampling()->set_top_p(0.9f);
    if (i % 7 == 3) {  // the penalties read the whole history, resumed or not
      r.mutable_sampling()->set_repetition_penalty(1.3f);
      r.mutable_sampling()->set_frequency_penalty(0.4f);
      r.mutable_sampling()->set_presence_penalty(-0.2f);
    }
    if (i % 11 == 5) {  // logit_bias: +100 makes one token every draw, -100 bans another
      (*r.mutable_sampling()->mutable_logit_bias())[BiasedToken(i)] = 100.0f;
      (*r.mutable_sampling()->mutable_logit_bias())[BiasedToken(i) + 1] = -100.0f;
    }
    if (i % 13 == 6 && i % 7 != 3) {
      // bad_words [[X, X]] with X pushed far above Y, and Y above the rest:
      // X, then Y (X is banned after X), then X again, and so on. The ban
      // reads the last output token, which async steps write late.
      const int32_t x = BadWordsToken(i), y = x + 1;
      (*r.mutable_sampling()->mutable_logit_bias())[x] = 90.0f;
      (*r.mutable_sampling()->mutable_logit_bias())[y] = 45.0f;
      v1::TokenIdSequence* word = r.mutable_sampling()->add_bad_words();
      word->add_ids(x);
      word->add_ids(x);
    }
    if (i % 17 == 8) {  // allowed_token_ids: greedy or sampled, none of them EOS
      for (int32_t id : AllowedTokens(i)) r.mutable_sampling()->add_allowed_token_ids(id);
    }
    r.set_request_id("r" + std::to_string(i));
    requests.push_back(r);
  }
  return requests;
}

std::vector<GenerateResult> RunAll(const std::string& address,
                                   const std::vector<v1::GenerateRequest>& requests) {
  auto stub = GenerationStub(address);
  std::vector<GenerateResult> results(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = RunGenerate(stub.get(), requests[i]); });
  }
  for (auto& t : threads) t.join();
  return results;
}

// Runs `requests` through a scheduler in front of `ample` (enough KV blocks)
// or `small` (24 blocks: requests are preempted) under every combination of
// sync/async, prefix caching and the token budgets given, and expects the
// same tokens from all, and stats that prove each configuration did what it
// names.
void ExpectIdenticalTokensInEveryConfiguration(const std::string& dir, const Service& ample,
                                               const Service& small,
                                               const std::vector<int>& budgets,
                                               const std::vector<v1::GenerateRequest>& requests) {
  std::vector<GenerateResult> baseline;
  std::string baseline_name;
  int run = 0;
  for (bool small_cache : {false, true}) {
    for (bool async : {false, true}) {
      for (bool caching : {false, true}) {
        for (int budget : budgets) {
          const std::string name =
              std::string(async ? "async" : "sync") + (caching ? "/caching" : "/no-caching") +
              "/budget" + std::to_string(budget) + (small_cache ? "/few-blocks" : "/ample");
          SCOPED_TRACE(name);
          Service scheduler =
              StartScheduler(dir, "scheduler-" + std::to_string(run++),
                             small_cache ? small.address() : ample.address(),
                             {"--async-scheduling=" + std::string(async ? "true" : "false"),
                              "--enable-prefix-caching=" + std::string(caching ? "true" : "false"),
                              "--max-num-batched-tokens=" + std::to_string(budget),
                              // A budget of 32 runs at most 32 requests.
                              "--max-num-seqs=" + std::to_string(std::min(budget, 128)),
                              // What 23 usable blocks hold (the scheduler
                              // refuses a max_model_len that does not fit).
                              "--max-model-len=" + std::string(small_cache ? "368" : "0")});
          std::vector<GenerateResult> results = RunAll(scheduler.address(), requests);
          auto stub = GenerationStub(scheduler.address());
          // Stats are published after each engine iteration: wait for the
          // one that freed the last blocks.
          EXPECT_TRUE(WaitFor([&] {
            v1::GetStatsResponse s = GetStats(stub.get());
            return s.num_free_blocks() == s.num_total_blocks() && s.num_running() == 0;
          })) << GetStats(stub.get()).DebugString();
          const v1::GetStatsResponse stats = GetStats(stub.get());
          for (size_t i = 0; i < results.size(); ++i) {
            ASSERT_TRUE(results[i].status.ok())
                << "request " << i << ": " << results[i].status.error_message();
          }
          if (baseline.empty()) {
            baseline = results;
            baseline_name = name;
          } else {
            for (size_t i = 0; i < results.size(); ++i) {
              EXPECT_EQ(results[i].tokens, baseline[i].tokens)
                  << "request " << i << " differs from " << baseline_name;
              EXPECT_EQ(results[i].finish_reason, baseline[i].finish_reason) << "request " << i;
            }
          }
          if (small_cache) {
            EXPECT_GT(stats.num_preemptions(), 0u) << "the small cache never preempted";
          } else {
            EXPECT_EQ(stats.num_preemptions(), 0u);
          }
          if (caching) {
            EXPECT_GT(stats.prefix_cache_hits(), 0u) << "no prefix-cache hits with caching on";
          } else {
            EXPECT_EQ(stats.prefix_cache_hits(), 0u);
          }
          EXPECT_EQ(stats.max_steps_in_flight(), async ? 2 : 1)
              << "async scheduling must keep two steps in flight, sync one";
          int64_t cached_local = 0;
          for (size_t i = 0; i < results.size(); ++i) {
            const v1::Usage& u = results[i].usage;
            EXPECT_EQ(u.prompt_tokens(), requests[i].prompt_token_ids_size()) << "request " << i;
            EXPECT_EQ(u.output_tokens(), static_cast<int32_t>(results[i].tokens.size()))
                << "request " << i;
            // The last prompt token is always computed.
            EXPECT_LT(u.cached_tokens_local(), u.prompt_tokens()) << "request " << i;
            EXPECT_EQ(u.cached_tokens_external(), 0) << "request " << i;
            cached_local += u.cached_tokens_local();
            // Every message carries the counts so far; the cached ones are
            // those of the end from the first token on (the frontend keeps
            // them when a stop string ends the request early).
            EXPECT_EQ(results[i].messages_without_usage, 0) << "request " << i;
            for (const auto& [so_far, tokens] : results[i].usage_so_far) {
              EXPECT_EQ(so_far.output_tokens(), tokens) << "request " << i;
              EXPECT_EQ(so_far.prompt_tokens(), u.prompt_tokens()) << "request " << i;
              EXPECT_EQ(so_far.cached_tokens_local(), u.cached_tokens_local()) << "request " << i;
            }
          }
          if (caching) {
            EXPECT_GT(cached_local, 0) << "no response reports usage.cached_tokens_local";
          } else {
            EXPECT_EQ(cached_local, 0);
          }
          scheduler.process.Signal(SIGTERM);
          EXPECT_TRUE(scheduler.process.Wait(std::chrono::seconds(30)).has_value());
        }
      }
    }
  }
  // Sanity: the workload really produced tokens of every kind.
  int total = 0;
  for (const auto& r : baseline) total += static_cast<int>(r.tokens.size());
  EXPECT_GT(total, 64 * 8);
  // logit_bias reached the worker's sampler: +100 on one token makes it
  // every draw, greedy or sampled, first step or resumed.
  for (size_t i = 0; i < requests.size(); ++i) {
    for (const auto& [id, bias] : requests[i].sampling().logit_bias()) {
      if (bias != 100.0f) continue;
      EXPECT_EQ(baseline[i].tokens, std::vector<int32_t>(baseline[i].tokens.size(), id))
          << "request " << i;
      EXPECT_FALSE(baseline[i].tokens.empty());
    }
    // bad_words reached it too, with the output's last token.
    if (requests[i].sampling().bad_words_size() > 0) {
      const int32_t x = BadWordsToken(static_cast<int>(i));
      std::vector<int32_t> alternating;
      for (size_t k = 0; k < baseline[i].tokens.size(); ++k) {
        alternating.push_back(k % 2 == 0 ? x : x + 1);
      }
      EXPECT_EQ(baseline[i].tokens, alternating) << "request " << i;
      EXPECT_GT(baseline[i].tokens.size(), 2u) << "request " << i;
    }
    // allowed_token_ids: every token on the list, and without EOS on it no
    // request stops before max_tokens.
    if (requests[i].sampling().allowed_token_ids_size() > 0) {
      const std::vector<int32_t> allowed = AllowedTokens(static_cast<int>(i));
      for (int32_t t : baseline[i].tokens) {
        EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end())
            << "request " << i << " drew " << t;
      }
      EXPECT_EQ(std::ssize(baseline[i].tokens), requests[i].sampling().max_tokens())
          << "request " << i;
    }
  }
}

TEST(DifferentialTest, EveryConfigurationGivesIdenticalTokens) {
  const std::string dir = MakeTempDir("tandem-differential");
  Service ample = StartWorker(dir, "worker-ample", {});
  // 23 usable blocks of 16 tokens: room for about three of these requests.
  Service small = StartWorker(dir, "worker-small", {"--num-blocks", "24"});
  ExpectIdenticalTokensInEveryConfiguration(dir, ample, small, {2048, 32}, MakeWorkload());
}

// A model whose attention slides: the mistral fixture with a window of 16,
// shorter than every prompt. Whole prefills and chunks of a 32-token budget
// that cut the window, prefix-cache hits, preemptions (which recompute
// outputs as a prefill) and async steps give the same tokens as one another.
// A worker whose decode steps ignored the window fails it (checked).
TEST(DifferentialTest, ASlidingWindowGivesIdenticalTokensInEveryConfiguration) {
  const std::string dir = MakeTempDir("tandem-differential-window");
  const std::string model = dir + "/mistral-window-16";
  std::filesystem::copy(std::string(TANDEM_SHARED_DIR) + "/models/hf/mistral", model);
  std::ifstream in(model + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = "\"sliding_window\": null";
  ASSERT_NE(config.find(from), std::string::npos);
  config.replace(config.find(from), from.size(), "\"sliding_window\": 16");
  std::filesystem::permissions(model + "/config.json", std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  std::ofstream(model + "/config.json", std::ios::trunc) << config;
  Service ample = StartWorker(dir, "worker-ample", {"--model", model});
  Service small = StartWorker(dir, "worker-small", {"--model", model, "--num-blocks", "24"});
  ExpectIdenticalTokensInEveryConfiguration(dir, ample, small, {2048, 32}, MakeWorkload());
}

}  // namespace
}  // namespace tandem::testing
