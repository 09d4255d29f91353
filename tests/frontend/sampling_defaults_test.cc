// tandem-frontend applies the served model's sampling defaults (its
// generation_config.json, as the scheduler's GetModelInfo reports them) to
// the OpenAI requests that leave a field unset, as vLLM's
// --generation-config auto does; a field the request sends is its own.
// The real frontend binary talks to an in-process fake scheduler that
// describes a model with (or without) defaults and records the sampling
// parameters of every Generate call it gets.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

const std::string kTokenizer = std::string(TANDEM_SHARED_DIR) + "/models/tokenizer.bin";

v1::GetModelInfoResponse ModelInfo(const std::string& fingerprint) {
  return FakeModelInfo(fingerprint);
}

struct Sampling {
  float temperature = 0, top_p = 0;
  int32_t top_k = 0;
  float min_p = 0;
  bool operator==(const Sampling&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Sampling& s) {
  return os << "{temperature " << s.temperature << ", top_p " << s.top_p << ", top_k " << s.top_k
            << ", min_p " << s.min_p << "}";
}

// Posts `body` to the frontend; the sampling the fake scheduler got for it.
Sampling Send(const Service& frontend, FakeScheduler& scheduler, const std::string& path,
              const Json& body) {
  const size_t before = scheduler.sampled().size();
  httplib::Client client("http://" + frontend.address());
  client.set_read_timeout(30, 0);
  auto res = client.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(res) << body.dump();
  if (!res) return {};
  EXPECT_EQ(res->status, 200) << body.dump() << ": " << res->body;
  const std::vector<v1::SamplingParams> got = scheduler.sampled();
  EXPECT_EQ(got.size(), before + 1) << body.dump();
  if (got.size() != before + 1) return {};
  return {got.back().temperature(), got.back().top_p(), got.back().top_k(), got.back().min_p()};
}

TEST(FrontendSamplingDefaultsTest, TheModelsDefaultsApplyOnlyToFieldsTheRequestLeavesUnset) {
  const std::string dir = MakeTempDir("frontend-sampling");
  // Llama 3's generation_config.json (temperature 0.6, top_p 0.9), plus a
  // top_k and a min_p.
  v1::GetModelInfoResponse with = ModelInfo("with-defaults");
  with.add_extra_eos_token_ids(5);
  v1::GenerationDefaults* g = with.mutable_generation();
  g->set_temperature(0.6f);
  g->set_has_temperature(true);
  g->set_top_p(0.9f);
  g->set_has_top_p(true);
  g->set_top_k(40);
  g->set_has_top_k(true);
  g->set_min_p(0.05f);
  g->set_has_min_p(true);
  FakeScheduler scheduler(with);
  Service frontend = StartFrontend(dir, "frontend", {scheduler.address()},
                                   {"--tokenizer", kTokenizer, "--chat-template", "llama-2"});

  const Json prompt = Json::array({1, 450, 4996});
  struct Case {
    Json fields;
    Sampling expected;
  };
  const std::vector<Case> cases = {
      {Json::object(), {0.6f, 0.9f, 40, 0.05f}},
      {{{"temperature", nullptr}, {"top_p", nullptr}, {"top_k", nullptr}, {"min_p", nullptr}},
       {0.6f, 0.9f, 40, 0.05f}},
      {{{"temperature", 1.2}}, {1.2f, 0.9f, 40, 0.05f}},
      {{{"top_p", 0.5}}, {0.6f, 0.5f, 40, 0.05f}},
      {{{"top_k", 3}}, {0.6f, 0.9f, 3, 0.05f}},
      {{{"min_p", 0.2}}, {0.6f, 0.9f, 40, 0.2f}},
      // Values equal to OpenAI's defaults, "off" and proto3's zero are the
      // request's own too.
      {{{"temperature", 1}, {"top_p", 1}, {"top_k", -1}, {"min_p", 0}}, {1.0f, 1.0f, 0, 0.0f}},
      {{{"temperature", 0}, {"top_k", 0}}, {0.0f, 0.9f, 0, 0.05f}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fields.dump());
    Json body = {{"prompt", prompt}, {"max_tokens", 4}};
    body.update(c.fields);
    EXPECT_EQ(Send(frontend, scheduler, "/v1/completions", body), c.expected);
    Json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
    chat.update(c.fields);
    EXPECT_EQ(Send(frontend, scheduler, "/v1/chat/completions", chat), c.expected);
  }
  // n = 3: every choice samples with the defaults.
  const size_t before = scheduler.sampled().size();
  httplib::Client client("http://" + frontend.address());
  auto res =
      client.Post("/v1/completions", Json({{"prompt", prompt}, {"max_tokens", 4}, {"n", 3}}).dump(),
                  "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::vector<v1::SamplingParams> got = scheduler.sampled();
  ASSERT_EQ(got.size(), before + 3);
  for (size_t i = before; i < got.size(); ++i) {
    EXPECT_EQ((Sampling{got[i].temperature(), got[i].top_p(), got[i].top_k(), got[i].min_p()}),
              (Sampling{0.6f, 0.9f, 40, 0.05f}));
  }
  const std::string log = ReadFile(frontend.log_path);
  EXPECT_NE(log.find("temperature=0.6 top_p=0.9 top_k=40 min_p=0.05"), std::string::npos)
      << "frontend log: " << frontend.log_path;
  EXPECT_EQ(log.find("does not implement"), std::string::npos) << "frontend log: " << frontend.log_path;
}

TEST(FrontendSamplingDefaultsTest, WithoutDefaultsRequestsGetOpenAisDefaults) {
  const std::string dir = MakeTempDir("frontend-sampling");
  FakeScheduler scheduler(ModelInfo("no-defaults"));
  Service frontend =
      StartFrontend(dir, "frontend", {scheduler.address()}, {"--tokenizer", kTokenizer});
  const Json prompt = Json::array({1, 450, 4996});
  EXPECT_EQ(Send(frontend, scheduler, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}}),
            (Sampling{1.0f, 1.0f, 0}));
  EXPECT_EQ(Send(frontend, scheduler, "/v1/completions",
                 {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"top_k", 5}}),
            (Sampling{0.0f, 1.0f, 5}));
}

// max_tokens a request leaves unset: 16 on /v1/completions (vLLM's
// CompletionRequest default), the rest of the context on chat; the
// completions default never asks for more than the context leaves.
TEST(FrontendSamplingDefaultsTest, MaxTokensDefaultsTo16OnCompletionsAndToTheContextOnChat) {
  const std::string dir = MakeTempDir("frontend-sampling");
  FakeScheduler scheduler(ModelInfo("max-tokens"));  // max_model_len 256
  Service frontend = StartFrontend(dir, "frontend", {scheduler.address()},
                                   {"--tokenizer", kTokenizer, "--chat-template", "llama-2"});
  httplib::Client client("http://" + frontend.address());
  client.set_read_timeout(30, 0);
  // The max_tokens and prompt length the scheduler got for `body`.
  auto sent = [&](const std::string& path, const Json& body) -> std::pair<int32_t, int32_t> {
    auto res = client.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << body.dump() << ": " << (res ? res->body : "");
    const std::vector<v1::GenerateRequest> got = scheduler.requests();
    if (got.empty()) return {-1, -1};
    return {static_cast<int32_t>(got.back().sampling().max_tokens()),
            got.back().prompt_token_ids_size()};
  };
  const Json prompt = Json::array({1, 450, 4996});
  EXPECT_EQ(sent("/v1/completions", {{"prompt", prompt}}).first, 16);
  EXPECT_EQ(sent("/v1/completions", {{"prompt", prompt}, {"max_tokens", nullptr}}).first, 16);
  EXPECT_EQ(sent("/v1/completions", {{"prompt", prompt}, {"max_tokens", 100}}).first, 100);
  EXPECT_EQ(sent("/v1/completions", {{"prompt", prompt}, {"max_completion_tokens", 40}}).first,
            40);
  Json long_prompt = Json::array();
  for (int i = 0; i < 250; ++i) long_prompt.push_back(450);
  EXPECT_EQ(sent("/v1/completions", {{"prompt", long_prompt}}).first, 6) << "256 - 250";
  const auto [chat_max, chat_prompt] =
      sent("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  EXPECT_EQ(chat_max, 256 - chat_prompt);
}

// generation_config.json's max_new_tokens is the max_tokens of a request
// that gives none (vLLM's default max_tokens), never more than the context
// leaves; a request's own max_tokens is its own.
TEST(FrontendSamplingDefaultsTest, TheModelsMaxNewTokensIsTheDefaultMaxTokens) {
  const std::string dir = MakeTempDir("frontend-sampling");
  v1::GetModelInfoResponse info = ModelInfo("max-new-tokens");  // max_model_len 256
  info.mutable_generation()->set_max_new_tokens(8);
  info.mutable_generation()->set_has_max_new_tokens(true);
  FakeScheduler scheduler(info);
  Service frontend = StartFrontend(dir, "frontend", {scheduler.address()},
                                   {"--tokenizer", kTokenizer, "--chat-template", "llama-2"});
  httplib::Client client("http://" + frontend.address());
  client.set_read_timeout(30, 0);
  auto max_tokens = [&](const std::string& path, const Json& body) -> int32_t {
    auto res = client.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << body.dump() << ": " << (res ? res->body : "");
    const std::vector<v1::GenerateRequest> got = scheduler.requests();
    return got.empty() ? -1 : static_cast<int32_t>(got.back().sampling().max_tokens());
  };
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  EXPECT_EQ(max_tokens("/v1/chat/completions", chat), 8);
  Json asked = chat;
  asked["max_tokens"] = 100;
  EXPECT_EQ(max_tokens("/v1/chat/completions", asked), 100);
  EXPECT_EQ(max_tokens("/v1/completions", {{"prompt", Json::array({1, 450})}}), 8) << "not 16";
  Json long_prompt = Json::array();
  for (int i = 0; i < 250; ++i) long_prompt.push_back(450);
  EXPECT_EQ(max_tokens("/v1/completions", {{"prompt", long_prompt}}), 6) << "256 - 250";
  // min_tokens above it is refused, naming both limits.
  Json too_many = chat;
  too_many["min_tokens"] = 9;
  auto res = client.Post("/v1/chat/completions", too_many.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("max_new_tokens 8"), std::string::npos) << res->body;
}

}  // namespace
}  // namespace tandem::testing
