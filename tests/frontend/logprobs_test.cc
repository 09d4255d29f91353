// OpenAI's logprobs (issue 30) through the real frontend binary, driven by
// the npm `openai` SDK (node/logprobs_cases.mjs), against an in-process fake
// scheduler that answers chosen ids with FakeTokenLogprobs: what the SDK gets
// is what the fake sent, in OpenAI's (and vLLM's) shapes, streamed or not.
#include <fstream>
#include <string>
#include <vector>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "frontend_test_util.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/frontend/openai.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {


const std::string kTokenizer = std::string(TANDEM_SHARED_DIR) + "/models/tokenizer.bin";

double Clamped(float x) { return std::max(static_cast<double>(x), -9999.0); }

class FrontendLogprobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::LoadTokenizer(kTokenizer);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    dir_ = MakeTempDir("frontend-logprobs");
    const std::string tmpl = dir_ + "/template.jinja";
    std::ofstream(tmpl) << "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    scheduler_ = std::make_unique<FakeScheduler>(FakeModelInfo("logprobs"));
    frontend_ = StartFrontend(dir_, "frontend", {scheduler_->address()},
                              {"--tokenizer", kTokenizer, "--chat-template", tmpl});
  }

  std::vector<int32_t> Ids(const std::string& text, bool bos = true) {
    return *tok_->Encode(text, {.add_special_tokens = bos});
  }
  std::string Bytes(int32_t id) {
    return tokenizer::PieceBytes(*tok_->IdToPiece(id), /*byte_level=*/false);
  }

  // Runs the SDK's cases; the fake answers `output` to every request.
  Json RunCases() {
    const std::string npm = std::string(TANDEM_BINARY_DIR) + "/frontend_npm";
    const std::string out = dir_ + "/logprobs_cases.json";
    std::string log;
    const int rc =
        RunCommand({"/usr/bin/env", "NODE_PATH=" + npm + "/node_modules", "node",
                    npm + "/logprobs_cases.mjs", "http://" + frontend_.address() + "/v1", out},
                   &log, std::chrono::seconds(120));
    EXPECT_EQ(rc, 0) << log << "\nfrontend log: " << frontend_.log_path;
    std::ifstream f(out);
    return Json::parse(f, nullptr, false);
  }

  // Checks completions' logprobs of `ids` (positions `first`.. of the fake's
  // numbering) against FakeTokenLogprobs with `n` alternatives.
  void ExpectCompletionLogprobs(const Json& lp, const std::vector<int32_t>& ids, int32_t n,
                                size_t skip = 0, int64_t offset0 = 0) {
    ASSERT_EQ(lp["tokens"].size(), ids.size() + skip) << lp.dump();
    int64_t offset = offset0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t at = skip + i;
      SCOPED_TRACE("output position " + std::to_string(i));
      const v1::TokenLogprobs want = FakeTokenLogprobs(ids[i], static_cast<int32_t>(i), n);
      const std::string text = tokenizer::ReplaceInvalidUtf8(Bytes(ids[i]));
      EXPECT_EQ(lp["tokens"][at], text);
      EXPECT_EQ(lp["token_logprobs"][at].get<double>(), Clamped(want.logprob()));
      // The top n, plus the sampled token when it is not among them.
      const Json& top = lp["top_logprobs"][at];
      EXPECT_EQ(top.size(), static_cast<size_t>(want.rank() == 1 ? n : n + 1)) << top.dump();
      EXPECT_EQ(top[text].get<double>(), Clamped(want.logprob()));
      for (int k = 0; k < want.top_token_ids_size(); ++k) {
        const std::string alt = tokenizer::ReplaceInvalidUtf8(Bytes(want.top_token_ids(k)));
        EXPECT_EQ(top[alt].get<double>(), Clamped(want.top_logprobs(k))) << alt;
      }
      // text_offset: the previous plus the previous token's code points.
      EXPECT_EQ(lp["text_offset"][at].get<int64_t>(), offset) << lp["text_offset"].dump();
      for (char ch : text) offset += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
    }
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::string dir_;
  std::unique_ptr<FakeScheduler> scheduler_;
  Service frontend_;
};

// The lists of a stream's chunks, joined.
Json JoinCompletionChunks(const Json& chunks) {
  Json joined = {{"tokens", Json::array()},
                 {"token_logprobs", Json::array()},
                 {"top_logprobs", Json::array()},
                 {"text_offset", Json::array()}};
  for (const Json& c : chunks) {
    if (c["logprobs"].is_null()) continue;
    for (auto& [key, list] : joined.items()) {
      for (const Json& v : c["logprobs"][key]) list.push_back(v);
    }
  }
  return joined;
}

TEST_F(FrontendLogprobsTest, OpenAiSdkGetsTheSchedulersLogprobsStreamedOrNot) {
  // " Hello", the four byte tokens of U+1F600 (held back by the detokenizer
  // until the last), " there", ".", " End".
  std::vector<int32_t> output = Ids("Hello", false);
  for (int b : {0xF0, 0x9F, 0x98, 0x80}) output.push_back(3 + b);  // <0xNN> is id 3 + NN
  for (int32_t id : Ids(" there. End", false)) output.push_back(id);
  ASSERT_EQ(*tok_->IdToPiece(output[1]), "<0xF0>");
  scheduler_->SetOutput(output, v1::FINISH_REASON_LENGTH);
  const std::vector<int32_t> prompt = Ids("Once upon a time");
  const Json got = RunCases();
  ASSERT_TRUE(got.is_object());

  // /v1/completions, logprobs 2: one position per output token.
  const Json& full = got["completion"]["nonstream"]["choices"][0];
  ExpectCompletionLogprobs(full["logprobs"], output, 2);
  // Streamed: the same lists, and each chunk holds the tokens whose text it
  // carries: the emoji's four byte tokens come with the emoji.
  const Json& chunks = got["completion"]["stream"];
  EXPECT_EQ(JoinCompletionChunks(chunks), full["logprobs"]);
  size_t position = 0;
  for (const Json& c : chunks) {
    std::string bytes;
    for (size_t k = 0; k < c["logprobs"]["tokens"].size(); ++k) bytes += Bytes(output[position++]);
    EXPECT_EQ(c["text"], bytes) << c.dump();
  }
  EXPECT_EQ(position, output.size());

  // echo + logprobs 1 (lm-evaluation-harness): the prompt's tokens first,
  // the first unscored, then the output's.
  const Json& echo = got["echo"]["nonstream"]["choices"][0]["logprobs"];
  ASSERT_EQ(echo["tokens"].size(), prompt.size() + output.size()) << echo.dump();
  EXPECT_TRUE(echo["token_logprobs"][0].is_null());
  EXPECT_TRUE(echo["top_logprobs"][0].is_null());
  EXPECT_EQ(echo["text_offset"][0], 0);
  for (size_t p = 1; p < prompt.size(); ++p) {
    const v1::TokenLogprobs want = FakeTokenLogprobs(prompt[p], static_cast<int32_t>(p), 1);
    EXPECT_EQ(echo["tokens"][p], tokenizer::ReplaceInvalidUtf8(Bytes(prompt[p])));
    EXPECT_EQ(echo["token_logprobs"][p].get<double>(), Clamped(want.logprob())) << p;
  }
  Json output_part = echo;
  for (auto& [key, list] : output_part.items())
    list.erase(list.begin(), list.begin() + prompt.size());
  ExpectCompletionLogprobs(output_part, output, 1, 0,
                           echo["text_offset"][prompt.size()].get<int64_t>());
  EXPECT_EQ(JoinCompletionChunks(got["echo"]["stream"]), echo);
  EXPECT_EQ(got["echo"]["stream"][0]["logprobs"]["tokens"].size() >= prompt.size(), true);

  // A stop string: the tokens from the cut on are not reported, streamed or not.
  size_t dot = 0;
  while (dot < output.size() && Bytes(output[dot]) != ".") ++dot;
  ASSERT_LT(dot, output.size()) << "\".\" is not a token of the output";
  const Json& stopped = got["stop"]["nonstream"]["choices"][0];
  EXPECT_EQ(stopped["finish_reason"], "stop");
  ExpectCompletionLogprobs(stopped["logprobs"],
                           std::vector<int32_t>(output.begin(), output.begin() + dot), 2);
  EXPECT_EQ(JoinCompletionChunks(got["stop"]["stream"]), stopped["logprobs"]);

  // vLLM's prompt_logprobs: per prompt position null or {id: {logprob, rank,
  // decoded_token}}; logprobs not asked for.
  const Json& pl = got["prompt_logprobs"]["nonstream"]["choices"][0];
  EXPECT_TRUE(pl["logprobs"].is_null());
  ASSERT_EQ(pl["prompt_logprobs"].size(), prompt.size());
  EXPECT_TRUE(pl["prompt_logprobs"][0].is_null());
  for (size_t p = 1; p < prompt.size(); ++p) {
    const v1::TokenLogprobs want = FakeTokenLogprobs(prompt[p], static_cast<int32_t>(p), 2);
    const Json& d = pl["prompt_logprobs"][p];
    const Json& own = d[std::to_string(prompt[p])];
    EXPECT_EQ(own["logprob"].get<double>(), Clamped(want.logprob()));
    EXPECT_EQ(own["rank"], want.rank());
    EXPECT_EQ(own["decoded_token"], tokenizer::ReplaceInvalidUtf8(Bytes(prompt[p])));
    EXPECT_EQ(d.size(), want.rank() == 1 ? 2u : 3u) << d.dump();
  }

  // Chat, logprobs + top_logprobs 2: OpenAI's content list with bytes.
  const Json& chat = got["chat"]["nonstream"]["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(chat.size(), output.size()) << chat.dump();
  for (size_t i = 0; i < output.size(); ++i) {
    const v1::TokenLogprobs want = FakeTokenLogprobs(output[i], static_cast<int32_t>(i), 2);
    const std::string bytes = Bytes(output[i]);
    EXPECT_EQ(chat[i]["token"], tokenizer::ReplaceInvalidUtf8(bytes));
    EXPECT_EQ(chat[i]["bytes"], Json(std::vector<uint8_t>(bytes.begin(), bytes.end())));
    EXPECT_EQ(chat[i]["logprob"].get<double>(), Clamped(want.logprob()));
    ASSERT_EQ(chat[i]["top_logprobs"].size(), 2u);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(chat[i]["top_logprobs"][k]["token"],
                tokenizer::ReplaceInvalidUtf8(Bytes(want.top_token_ids(k))));
      EXPECT_EQ(chat[i]["top_logprobs"][k]["logprob"].get<double>(), Clamped(want.top_logprobs(k)));
    }
  }
  EXPECT_EQ(chat[1]["bytes"], Json({0xF0}));
  Json streamed = Json::array();
  for (const Json& c : got["chat"]["stream"]) {
    if (c["logprobs"].is_null()) continue;
    for (const Json& v : c["logprobs"]["content"]) streamed.push_back(v);
  }
  EXPECT_EQ(streamed, chat);
  // Chat's prompt_logprobs: one list on the response, as vLLM's.
  const Json& chat_pl = got["chat_prompt_logprobs"]["nonstream"];
  EXPECT_TRUE(chat_pl["choices"][0]["logprobs"].is_null());
  ASSERT_TRUE(chat_pl["prompt_logprobs"].is_array()) << chat_pl.dump();
  EXPECT_TRUE(chat_pl["prompt_logprobs"][0].is_null());
  EXPECT_EQ(chat_pl["prompt_logprobs"].size(), chat_pl["prompt_token_ids"].size());

  // What the scheduler was asked: logprobs, and with echo prompt_logprobs.
  bool saw_echo = false;
  for (const v1::SamplingParams& s : scheduler_->sampled()) {
    if (s.has_prompt_logprobs() && s.has_logprobs() && s.logprobs() == 1) {
      saw_echo = true;
      EXPECT_EQ(s.prompt_logprobs(), 1);
    }
  }
  EXPECT_TRUE(saw_echo);
}

TEST_F(FrontendLogprobsTest, CountsAboveMaxLogprobsAre400sNamingTheFieldBeforeTokenizing) {
  struct Case {
    std::string path;
    Json body;
    std::string param;
  };
  const Json messages = {{{"role", "user"}, {"content", "x"}}};
  const std::vector<Case> cases = {
      {"/v1/completions", {{"prompt", "x"}, {"logprobs", 21}}, "logprobs"},
      {"/v1/completions", {{"prompt", "x"}, {"prompt_logprobs", 21}}, "prompt_logprobs"},
      {"/v1/completions", {{"prompt", "x"}, {"logprobs", -1}}, "logprobs"},
      {"/v1/chat/completions",
       {{"messages", messages}, {"logprobs", true}, {"top_logprobs", 21}},
       "top_logprobs"},
      {"/v1/chat/completions", {{"messages", messages}, {"top_logprobs", 1}}, "top_logprobs"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.dump());
    const HttpResult r = Post(frontend_.address(), c.path, c.body);
    EXPECT_EQ(r.status, 400) << r.raw;
    EXPECT_EQ(r.body["error"]["param"], c.param) << r.raw;
  }
  EXPECT_NE(Post(frontend_.address(), "/v1/completions", {{"prompt", "x"}, {"logprobs", 21}})
                .raw.find("at most 20"),
            std::string::npos);
  EXPECT_TRUE(scheduler_->requests().empty());
  // 20 is the limit, and it is what the scheduler is asked for.
  const HttpResult ok =
      Post(frontend_.address(), "/v1/completions", {{"prompt", "x"}, {"logprobs", 20}});
  EXPECT_EQ(ok.status, 200) << ok.raw;
  ASSERT_EQ(scheduler_->sampled().size(), 1u);
  EXPECT_TRUE(scheduler_->sampled()[0].has_logprobs());
  EXPECT_EQ(scheduler_->sampled()[0].logprobs(), 20);
  EXPECT_FALSE(scheduler_->sampled()[0].has_prompt_logprobs());
}

}  // namespace
}  // namespace tandem::testing
