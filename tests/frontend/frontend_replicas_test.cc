// tandem-frontend end to end over three replicas: prefix affinity hits the
// local prefix cache at least twice as often as round-robin, and a replica
// killed with SIGKILL loses no request that had not started streaming.
#include <signal.h>

#include <iostream>
#include <thread>

#include "frontend_test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {
namespace {

// Three replicas of stories260K (scheduler + worker each) behind frontends.
class ReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("frontend_replicas");
    for (int i = 0; i < 3; ++i) {
      const std::string n = std::to_string(i);
      workers_.push_back(
          StartWorker(dir_, "worker" + n, {"--model", kModels + "/stories260K.bin"}));
      schedulers_.push_back(StartScheduler(dir_, "scheduler" + n, workers_.back().address(), {}));
      targets_.push_back(schedulers_.back().address());
    }
  }

  uint64_t PrefixCacheHits() {
    uint64_t hits = 0;
    for (Service& s : schedulers_) {
      if (!s.process.running()) continue;
      hits += GetStats(GenerationStub(s.address()).get()).prefix_cache_hits();
    }
    return hits;
  }

  // `groups` prompts of a 64-token prefix (4 blocks) each sent 4 times in a
  // row with different 8-token suffixes; returns the prefix-cache hit tokens
  // this added over every replica.
  uint64_t SharedPrefixWorkload(const std::string& frontend, int32_t first_token, int groups) {
    const uint64_t before = PrefixCacheHits();
    for (int g = 0; g < groups; ++g) {
      for (int r = 0; r < 4; ++r) {
        // The second token tells the workloads apart (block hashes chain).
        std::vector<int32_t> prompt = {1, first_token};
        for (int i = 2; i < 64; ++i) prompt.push_back(2 + (g * 64 + i) % 500);
        for (int i = 0; i < 8; ++i) prompt.push_back(2 + (r * 8 + i) % 500);
        const HttpResult res = Post(frontend, "/v1/completions",
                                    {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}});
        EXPECT_EQ(res.status, 200) << res.raw;
      }
    }
    return PrefixCacheHits() - before;
  }

  std::string dir_;
  std::vector<Service> workers_, schedulers_;
  std::vector<std::string> targets_;
};

TEST_F(ReplicasTest, AffinityHitsThePrefixCacheAtLeastTwiceAsOftenAsRoundRobin) {
  const std::vector<std::string> common = {"--tokenizer", kModels + "/tokenizer.bin"};
  std::vector<std::string> affinity_args = common, rr_args = common;
  affinity_args.insert(affinity_args.end(), {"--routing", "affinity"});
  rr_args.insert(rr_args.end(), {"--routing", "round-robin"});
  Service affinity = StartFrontend(dir_, "affinity", targets_, affinity_args);
  Service rr = StartFrontend(dir_, "rr", targets_, rr_args);
  // Different prefixes for each, so that neither finds the other's blocks.
  const uint64_t with_affinity = SharedPrefixWorkload(affinity.address(), 3, 8);
  const uint64_t with_rr = SharedPrefixWorkload(rr.address(), 4, 8);
  std::cout << "prefix-cache hit tokens: affinity " << with_affinity << ", round-robin " << with_rr
            << "\n";
  EXPECT_GT(with_rr, 0u);  // the workload does share prefixes
  EXPECT_GE(with_affinity, 2 * with_rr);
  const std::string metrics = Get(affinity.address(), "/metrics");
  EXPECT_NE(metrics.find("tandem_frontend_route_decisions_total{reason=\"affinity\""),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("tandem_frontend_replica_outstanding_requests{replica=\""),
            std::string::npos);
}

TEST_F(ReplicasTest, AKilledReplicaLosesNoRequestThatHadNotStartedStreaming) {
  // Health checks far apart: the frontend learns of the death only from the
  // calls that fail, which must then go to another replica.
  Service frontend =
      StartFrontend(dir_, "frontend", targets_,
                    {"--tokenizer", kModels + "/tokenizer.bin", "--health-interval-s", "60"});
  schedulers_[1].process.Signal(SIGKILL);
  ASSERT_TRUE(schedulers_[1].process.Wait(std::chrono::seconds(10)).has_value());
  std::vector<HttpResult> results(24);
  std::vector<std::thread> threads;
  for (int i = 0; i < 24; ++i) {
    threads.emplace_back([&, i] {
      std::vector<int32_t> prompt = {1};
      for (int k = 1; k < 40; ++k) prompt.push_back(2 + (i * 131 + k * 7) % 500);
      results[i] = Post(frontend.address(), "/v1/completions",
                        {{"prompt", prompt},
                         {"max_tokens", 4},
                         {"temperature", 0},
                         {"ignore_eos", true},
                         {"stream", i % 2 == 0}});
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(results[i].status, 200) << "request " << i << ": " << results[i].raw;
    if (i % 2 == 0) {
      const Streamed s = ParseSse(results[i].raw);
      EXPECT_TRUE(s.done);
      EXPECT_EQ(s.finish_reason, "length");
    } else {
      EXPECT_EQ(results[i].body["usage"]["completion_tokens"], 4) << results[i].raw;
    }
  }
  const double retries =
      Metric(Get(frontend.address(), "/metrics"), "tandem_frontend_retries_total");
  std::cout << "retries after the kill: " << retries << "\n";
  EXPECT_GE(retries, 1);  // some requests did go to the dead replica first
}

}  // namespace
}  // namespace tandem::testing
