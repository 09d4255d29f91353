// A frontend with tenants sends every tenant request with its cache_salt; a
// scheduler that would refuse the salt from it (no --allow-request-cache-salt,
// and the frontend has no certificate with the frontend role) says so in
// GetModelInfo, and the frontend routes nothing there and logs the fix at
// start (issue 29), instead of each tenant request coming back a 400 that
// blames the client. vLLM's cache_salt in a body salts within the tenant.
// The real frontend binary against in-process fake schedulers.
#include <fstream>
#include <string>
#include <vector>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "frontend_test_util.h"
#include "gtest/gtest.h"

namespace tandem::testing {
namespace {

v1::GetModelInfoResponse Info(bool accepts_cache_salt) {
  v1::GetModelInfoResponse info = FakeModelInfo("salted");
  info.set_accepts_cache_salt(accepts_cache_salt);
  return info;
}

TEST(FrontendCacheSaltTest, ReplicasThatWouldRefuseTheSaltGetNoTenantRequests) {
  const std::string dir = MakeTempDir("frontend-salt");
  const std::string keys = dir + "/keys";
  std::ofstream(keys) << "k-acme acme\n";
  FakeScheduler refuses(Info(false)), accepts(Info(true));
  Service frontend = StartFrontend(dir, "frontend", {refuses.address(), accepts.address()},
                                   {"--tokenizer", kLlama2Tokenizer, "--api-keys-file", keys,
                                    "--routing", "round-robin"});
  const httplib::Headers auth = {{"Authorization", "Bearer k-acme"}};
  for (int i = 0; i < 6; ++i) {
    const HttpResult res = Post(frontend.address(), "/v1/completions",
                                {{"prompt", {1, 450, 4996}}, {"max_tokens", 2}}, auth);
    EXPECT_EQ(res.status, 200) << res.raw;
  }
  // vLLM's cache_salt in the body salts within the tenant, never as one.
  for (const char* salt : {"x", "tenant:acme"}) {
    const HttpResult res =
        Post(frontend.address(), "/v1/completions",
             {{"prompt", {1, 450, 4996}}, {"max_tokens", 2}, {"cache_salt", salt}}, auth);
    EXPECT_EQ(res.status, 200) << res.raw;
  }
  EXPECT_TRUE(refuses.requests().empty());
  ASSERT_EQ(accepts.requests().size(), 8u);
  EXPECT_EQ(accepts.requests()[0].cache_salt(), "tenant:acme");
  EXPECT_EQ(accepts.requests()[6].cache_salt(), "tenant:acme salt:x");
  EXPECT_EQ(accepts.requests()[7].cache_salt(), "tenant:acme salt:tenant:acme");
  const std::string log = ReadFile(frontend.log_path);
  EXPECT_NE(log.find("does not accept cache_salt from this frontend"), std::string::npos) << log;
  EXPECT_NE(log.find("--allow-request-cache-salt"), std::string::npos) << log;
}

TEST(FrontendCacheSaltTest, WithOnlyARefusingReplicaTenantsGet503NotA400) {
  const std::string dir = MakeTempDir("frontend-salt");
  const std::string keys = dir + "/keys";
  std::ofstream(keys) << "k-acme acme\n";
  FakeScheduler refuses(Info(false));
  Service frontend = StartFrontend(dir, "frontend", {refuses.address()},
                                   {"--tokenizer", kLlama2Tokenizer, "--api-keys-file", keys},
                                   /*wait_for_serving=*/false);
  ASSERT_TRUE(WaitFor([&] {
    return ReadFile(frontend.log_path).find("does not accept cache_salt") != std::string::npos;
  })) << ReadFile(frontend.log_path);
  // Not ready, so a load balancer sends nothing; a request that comes anyway
  // is a 503 (no replica), not a 400.
  EXPECT_EQ(HttpGetStatus(frontend.address(), "/health"), 503);
  const HttpResult res =
      Post(frontend.address(), "/v1/completions", {{"prompt", {1, 450, 4996}}, {"max_tokens", 2}},
           {{"Authorization", "Bearer k-acme"}});
  EXPECT_EQ(res.status, 503) << res.raw;
  EXPECT_TRUE(refuses.requests().empty());
}

// Without tenants no salt is sent, so the same replica serves; a body's
// cache_salt goes as "salt:<it>" (FrontendTest.CacheSaltShares... has a
// real scheduler refuse or take it).
TEST(FrontendCacheSaltTest, WithoutTenantsTheReplicaServes) {
  const std::string dir = MakeTempDir("frontend-salt");
  FakeScheduler refuses(Info(false));
  Service frontend =
      StartFrontend(dir, "frontend", {refuses.address()}, {"--tokenizer", kLlama2Tokenizer});
  const HttpResult res = Post(frontend.address(), "/v1/completions",
                              {{"prompt", {1, 450, 4996}}, {"max_tokens", 2}});
  EXPECT_EQ(res.status, 200) << res.raw;
  ASSERT_EQ(refuses.requests().size(), 1u);
  EXPECT_EQ(refuses.requests()[0].cache_salt(), "");
  const HttpResult salted =
      Post(frontend.address(), "/v1/completions",
           {{"prompt", {1, 450, 4996}}, {"max_tokens", 2}, {"cache_salt", "tenant:acme"}});
  EXPECT_EQ(salted.status, 200) << salted.raw;
  ASSERT_EQ(refuses.requests().size(), 2u);
  EXPECT_EQ(refuses.requests()[1].cache_salt(), "salt:tenant:acme");
}

}  // namespace
}  // namespace tandem::testing
