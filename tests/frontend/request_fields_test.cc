// vLLM's request fields tandem-frontend builds (issue 30), each through the
// real frontend binary and an in-process fake scheduler that answers
// chosen ids and records what it is asked: include_stop_str_in_output,
// truncate_prompt_tokens, priority, chat_template_kwargs, documents, min_tokens with
// stop strings, the usage of a choice a stop string ends, and
// stream_options.continuous_usage_stats.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

const std::string kTokenizer = std::string(TANDEM_SHARED_DIR) + "/models/tokenizer.bin";

struct Result {
  int status = -1;
  Json body;
  std::string text, finish_reason;  // choice 0's (streams: joined)
  Json stop_reason;
};

class FrontendRequestFieldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::LoadTokenizer(kTokenizer);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    const std::string dir = MakeTempDir("frontend-fields");
    // A template that shows whether chat_template_kwargs and documents
    // reached it, and whether tools and documents are none without them.
    const std::string tmpl = dir + "/template.jinja";
    std::ofstream(tmpl) << "{% for m in messages %}{{ m['content'] }}{% endfor %}"
                           "{% if enable_thinking %} THINK{% endif %}{{ suffix }}"
                           "{% if documents is not none %} DOCS{% for d in documents %}"
                           "[{{ d['title'] }}|{{ d['text'] }}]{% endfor %}{% endif %}"
                           "{% if tools is not none %} TOOLS{% endif %}";
    scheduler_ = std::make_unique<FakeScheduler>(FakeModelInfo("fields"));  // 256 tokens
    frontend_ = StartFrontend(dir, "frontend", {scheduler_->address()},
                              {"--tokenizer", kTokenizer, "--chat-template", tmpl});
  }

  // `body` with the prompt "Once": as completions' prompt, or as chat's one
  // user message.
  static Json WithOnce(const std::string& path, Json body) {
    if (path == "/v1/completions") {
      body["prompt"] = "Once";
    } else {
      body["messages"] = {{{"role", "user"}, {"content", "Once"}}};
    }
    return body;
  }

  Result Post(const std::string& path, const Json& body) {
    httplib::Client client("http://" + frontend_.address());
    client.set_read_timeout(30, 0);
    auto res = client.Post(path, body.dump(), "application/json");
    Result out;
    if (!res) return out;
    out.status = res->status;
    if (!body.value("stream", false)) {
      out.body = Json::parse(res->body, nullptr, false);
      if (out.status == 200) {
        const Json& c = out.body["choices"][0];
        out.text = c.contains("text") ? c["text"] : c["message"]["content"];
        out.finish_reason = c["finish_reason"];
        out.stop_reason = c["stop_reason"];
      }
      return out;
    }
    std::istringstream in(res->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("data: {", 0) != 0) continue;
      const Json chunk = Json::parse(line.substr(6));
      for (const Json& c : chunk["choices"]) {
        out.text += c.value("text", "");
        if (!c["finish_reason"].is_null()) {
          out.finish_reason = c["finish_reason"];
          out.stop_reason = c["stop_reason"];
        }
      }
    }
    return out;
  }

  // A stream's chunks, parsed.
  std::vector<Json> Chunks(const std::string& path, const Json& body) {
    httplib::Client client("http://" + frontend_.address());
    client.set_read_timeout(30, 0);
    auto res = client.Post(path, body.dump(), "application/json");
    std::vector<Json> out;
    if (!res || res->status != 200) {
      ADD_FAILURE() << (res ? res->body : "no response");
      return out;
    }
    std::istringstream in(res->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("data: {", 0) == 0) out.push_back(Json::parse(line.substr(6)));
    }
    return out;
  }

  // The text of the prompt the scheduler was last sent.
  std::string LastPrompt() {
    const v1::GenerateRequest got = scheduler_->requests().back();
    return *tok_->Decode(
        std::vector<int32_t>(got.prompt_token_ids().begin(), got.prompt_token_ids().end()),
        {.skip_special_tokens = true});
  }
  // The prompt of a chat request whose one user message says "Hello", with
  // `extra` merged into its body.
  std::string RenderedHello(const Json& extra) {
    Json body = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}};
    body.update(extra);
    const Result r = Post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 200) << r.body.dump();
    return LastPrompt();
  }

  std::vector<int32_t> Ids(const std::string& text) { return *tok_->Encode(text); }
  // Decode(prompt + output) minus Decode(prompt): the text of `output`.
  std::string Continuation(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), output.begin(), output.end());
    const std::string whole = *tok_->Decode(all, {.skip_special_tokens = true});
    return whole.substr(tok_->Decode(prompt, {.skip_special_tokens = true})->size());
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<FakeScheduler> scheduler_;
  Service frontend_;
};

TEST_F(FrontendRequestFieldsTest, IncludeStopStrInOutputKeepsTheStopStringAndStopToken) {
  // <s> ▁The | ▁quick ▁brown ...
  const std::vector<int32_t> all = Ids("The quick brown fox jumps");
  ASSERT_GE(all.size(), 6u);
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 2);
  const std::vector<int32_t> output(all.begin() + 2, all.end());
  ASSERT_EQ(Continuation(prompt, output), " quick brown fox jumps");
  // The last output token as a stop token from stop_token_ids.
  const int32_t stop_token = output.back();
  const std::string before_stop_token =
      Continuation(prompt, std::vector<int32_t>(output.begin(), output.end() - 1));
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    scheduler_->SetOutput(output, v1::FINISH_REASON_LENGTH);
    Json body = {{"prompt", prompt}, {"stop", "brown"}, {"stream", stream}};
    Result r = Post("/v1/completions", body);
    EXPECT_EQ(r.text, " quick ");
    EXPECT_EQ(r.stop_reason, "brown");
    body["include_stop_str_in_output"] = true;
    r = Post("/v1/completions", body);
    EXPECT_EQ(r.text, " quick brown");
    EXPECT_EQ(r.finish_reason, "stop");
    EXPECT_EQ(r.stop_reason, "brown");
    scheduler_->SetOutput(output, v1::FINISH_REASON_STOP);
    body = {{"prompt", prompt}, {"stop_token_ids", {stop_token}}, {"stream", stream}};
    r = Post("/v1/completions", body);
    EXPECT_EQ(r.text, before_stop_token);
    EXPECT_EQ(r.stop_reason, stop_token);
    body["include_stop_str_in_output"] = true;
    r = Post("/v1/completions", body);
    EXPECT_EQ(r.text, " quick brown fox jumps");
    EXPECT_EQ(r.stop_reason, stop_token);
  }
}

// The EOS that ends a request (the scheduler streams it and marks it
// last_token_stops) is an output token, as in vLLM: counted in
// completion_tokens, in token_ids and logprobs, its text left out unless
// include_stop_str_in_output. The fake's "EOS" is a word, so that text
// shows where it leaks.
TEST_F(FrontendRequestFieldsTest, TheEosThatEndsARequestIsCountedButHasNoText) {
  const std::vector<int32_t> all = Ids("The quick brown fox");
  ASSERT_GE(all.size(), 4u);
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 2);
  const std::vector<int32_t> output(all.begin() + 2, all.end());  // ▁quick ▁brown ▁fox
  const std::string without_eos =
      Continuation(prompt, std::vector<int32_t>(output.begin(), output.end() - 1));
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    scheduler_->SetOutput(output, v1::FINISH_REASON_STOP, /*last_token_stops=*/true);
    Json body = {{"prompt", prompt},
                 {"stream", stream},
                 {"logprobs", 0},
                 {"return_token_ids", true},
                 {"stream_options", nullptr}};
    if (stream)
      body["stream_options"] = {{"include_usage", true}};
    else
      body.erase("stream_options");
    const std::vector<Json> parts = stream ? Chunks("/v1/completions", body)
                                           : std::vector<Json>{Post("/v1/completions", body).body};
    std::string text;
    std::vector<int32_t> ids;
    size_t logprobs = 0;
    Json usage;
    for (const Json& p : parts) {
      for (const Json& c : p["choices"]) {
        text += c.value("text", "");
        if (c.contains("token_ids") && c["token_ids"].is_array()) {
          for (const Json& t : c["token_ids"]) ids.push_back(t.get<int32_t>());
        }
        if (c["logprobs"].is_object()) logprobs += c["logprobs"]["tokens"].size();
        if (!c["finish_reason"].is_null()) {
          EXPECT_EQ(c["finish_reason"], "stop");
          EXPECT_TRUE(c["stop_reason"].is_null()) << "EOS has no stop_reason";
        }
      }
      if (p["usage"].is_object()) usage = p["usage"];
    }
    EXPECT_EQ(text, without_eos);
    EXPECT_EQ(ids, output);
    EXPECT_EQ(logprobs, output.size());
    EXPECT_EQ(usage["completion_tokens"], output.size());
    body["include_stop_str_in_output"] = true;
    EXPECT_EQ(Post("/v1/completions", body).text, Continuation(prompt, output));
  }
  // Unmarked (a scheduler before last_token_stops), the last token is text.
  scheduler_->SetOutput(output, v1::FINISH_REASON_STOP);
  EXPECT_EQ(Post("/v1/completions", {{"prompt", prompt}}).text, Continuation(prompt, output));
}

TEST_F(FrontendRequestFieldsTest, TruncatePromptTokensKeepsTheLastTokens) {
  const std::vector<int32_t> output = {Ids("fox").back()};
  scheduler_->SetOutput(output, v1::FINISH_REASON_LENGTH);
  const std::vector<int32_t> prompt = {1, 450, 4996, 17354, 1701, 29916};
  auto sent = [&](const Json& body, const std::string& path = "/v1/completions") {
    const Result r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body.dump();
    const v1::GenerateRequest got = scheduler_->requests().back();
    return std::vector<int32_t>(got.prompt_token_ids().begin(), got.prompt_token_ids().end());
  };
  EXPECT_EQ(sent({{"prompt", prompt}, {"truncate_prompt_tokens", 3}}),
            (std::vector<int32_t>{17354, 1701, 29916}));
  EXPECT_EQ(sent({{"prompt", prompt}, {"truncate_prompt_tokens", 6}}), prompt);
  EXPECT_EQ(sent({{"prompt", prompt}, {"truncate_prompt_tokens", 100}}), prompt);
  EXPECT_EQ(sent({{"prompt", prompt}, {"truncate_prompt_tokens", -1}}), prompt) << "max_model_len";
  // A text prompt and a chat: the last tokens of the encoded prompt.
  const std::vector<int32_t> text_ids = Ids("Once upon a time there was");
  EXPECT_EQ(sent({{"prompt", "Once upon a time there was"}, {"truncate_prompt_tokens", 2}}),
            std::vector<int32_t>(text_ids.end() - 2, text_ids.end()));
  EXPECT_EQ(sent({{"messages", {{{"role", "user"}, {"content", "Once upon a time there was"}}}},
                  {"truncate_prompt_tokens", 2}},
                 "/v1/chat/completions")
                .size(),
            2u);
  // echo shows the prompt the model saw.
  const Result echo = Post(
      "/v1/completions", {{"prompt", prompt}, {"truncate_prompt_tokens", 2}, {"echo", true}});
  EXPECT_EQ(echo.text, *tok_->Decode({1701, 29916}, {.skip_special_tokens = true}) +
                           Continuation({1701, 29916}, output));
  // More than the context: refused, as vLLM refuses it.
  const Result too_long =
      Post("/v1/completions", {{"prompt", prompt}, {"truncate_prompt_tokens", 257}});
  EXPECT_EQ(too_long.status, 400);
  EXPECT_EQ(too_long.body["error"]["param"], "truncate_prompt_tokens");
}

TEST_F(FrontendRequestFieldsTest, PriorityIsForwardedToTheScheduler) {
  for (const int priority : {-3, 0, 7}) {
    for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
      ASSERT_EQ(Post(path, WithOnce(path, {{"priority", priority}})).status, 200);
      EXPECT_EQ(scheduler_->requests().back().priority(), priority) << path;
    }
  }
  ASSERT_EQ(Post("/v1/completions", {{"prompt", "Once"}}).status, 200);
  EXPECT_EQ(scheduler_->requests().back().priority(), 0) << "default";
}

TEST_F(FrontendRequestFieldsTest, LogitBiasIsForwardedToTheScheduler) {
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    ASSERT_EQ(Post(path, WithOnce(path, {{"logit_bias", {{"13", 5}, {"7", -250}}}})).status, 200);
    const auto bias = scheduler_->requests().back().sampling().logit_bias();  // a copy
    EXPECT_EQ(bias.size(), 2u) << path;
    EXPECT_EQ(bias.at(13), 5.0f) << path;
    EXPECT_EQ(bias.at(7), -100.0f) << path << ": clamped as vLLM clamps";
  }
  ASSERT_EQ(Post("/v1/completions", {{"prompt", "Once"}}).status, 200);
  EXPECT_TRUE(scheduler_->requests().back().sampling().logit_bias().empty());
}

// vLLM's allowed_token_ids reach the scheduler as sent, on both endpoints;
// the sampler's mask is SamplingProgramTest's and DifferentialTest's.
TEST_F(FrontendRequestFieldsTest, AllowedTokenIdsAreForwardedToTheScheduler) {
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    ASSERT_EQ(Post(path, WithOnce(path, {{"allowed_token_ids", {13, 7, 13}}})).status, 200);
    const v1::SamplingParams sampling = scheduler_->requests().back().sampling();
    EXPECT_EQ(std::vector<int32_t>(sampling.allowed_token_ids().begin(),
                                   sampling.allowed_token_ids().end()),
              (std::vector<int32_t>{13, 7, 13}))
        << path;
  }
  ASSERT_EQ(Post("/v1/completions", {{"prompt", "Once"}}).status, 200);
  EXPECT_EQ(scheduler_->requests().back().sampling().allowed_token_ids_size(), 0);
  const size_t asked = scheduler_->requests().size();
  const Result empty =
      Post("/v1/completions", {{"prompt", "Once"}, {"allowed_token_ids", Json::array()}});
  EXPECT_EQ(empty.status, 400);
  EXPECT_EQ(empty.body["error"]["param"], "allowed_token_ids");
  EXPECT_EQ(scheduler_->requests().size(), asked) << "a refused request reaches no scheduler";
}

// vLLM's bad_words reach the scheduler as token sequences, tokenized as
// vLLM's update_from_tokenizer does: the word lstripped (str.lstrip), without special
// tokens; then with a space before it, kept only where that gives a new first
// token in as many tokens. Llama 2's sentencepiece writes " time" as "▁" +
// "▁time", so here every word keeps one sequence. The worker's ban is
// integration_differential_test's.
TEST_F(FrontendRequestFieldsTest, BadWordsAreTokenizedAsVllmTokenizesThem) {
  const std::vector<int32_t> time = *tok_->Encode("time", {.add_special_tokens = false});
  const std::vector<int32_t> once_upon = *tok_->Encode("Once upon", {.add_special_tokens = false});
  ASSERT_EQ(time.size(), 1u);
  ASSERT_EQ(tok_->Encode(" time", {.add_special_tokens = false})->size(), 2u);
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    // Python's lstrip takes Unicode whitespace too: here an ideographic
    // space and a no-break space.
    ASSERT_EQ(
        Post(path, WithOnce(path, {{"bad_words", {"time", "\u3000\u00a0 Once upon"}}})).status,
        200);
    const v1::SamplingParams sampling = scheduler_->requests().back().sampling();
    ASSERT_EQ(sampling.bad_words_size(), 2) << path << ": " << sampling.DebugString();
    EXPECT_EQ(std::vector<int32_t>(sampling.bad_words(0).ids().begin(),
                                   sampling.bad_words(0).ids().end()),
              time);
    EXPECT_EQ(std::vector<int32_t>(sampling.bad_words(1).ids().begin(),
                                   sampling.bad_words(1).ids().end()),
              once_upon);
  }
  for (const Json& bad : {Json("time"), Json({1}), Json({""})}) {
    const Result r = Post("/v1/completions", {{"prompt", "Once"}, {"bad_words", bad}});
    EXPECT_EQ(r.status, 400) << bad.dump();
    EXPECT_EQ(r.body["error"]["param"], "bad_words") << bad.dump();
  }
}

// vLLM's return_tokens_as_token_ids: the logprobs' tokens read
// "token_id:<id>" (completions and chat), the text stays text; the server's
// --return-tokens-as-token-ids does it for requests that do not say, and a
// request's false overrides it.
TEST_F(FrontendRequestFieldsTest, ReturnTokensAsTokenIdsNamesTheLogprobsTokensByTheirIds) {
  const std::vector<int32_t> all = Ids("The quick brown");
  const std::vector<int32_t> output(all.begin() + 1, all.end());  // no BOS
  scheduler_->SetOutput(output, v1::FINISH_REASON_LENGTH);
  std::vector<std::string> as_ids;
  for (int32_t id : output) as_ids.push_back("token_id:" + std::to_string(id));
  auto tokens = [](const Json& body) {
    std::vector<std::string> out;
    const Json& lp = body["choices"][0]["logprobs"];
    if (lp.contains("tokens")) return lp["tokens"].get<std::vector<std::string>>();
    for (const Json& c : lp["content"]) out.push_back(c["token"]);
    return out;
  };
  auto post = [&](const std::string& address, const std::string& path, const Json& body) {
    httplib::Client client("http://" + address);
    client.set_read_timeout(30, 0);
    auto res = client.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
    return res ? Json::parse(res->body, nullptr, false) : Json();
  };
  const Json completion = {{"prompt", "Once"}, {"logprobs", 1}, {"max_tokens", 8}};
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "Once"}}}},
                     {"logprobs", true},
                     {"top_logprobs", 1}};
  for (const auto& [path, plain] :
       {std::pair{"/v1/completions", completion}, std::pair{"/v1/chat/completions", chat}}) {
    SCOPED_TRACE(path);
    Json body = plain;
    body["return_tokens_as_token_ids"] = true;
    const Json by_id = post(frontend_.address(), path, body);
    EXPECT_EQ(tokens(by_id), as_ids);
    const Json& lp = by_id["choices"][0]["logprobs"];
    if (lp.contains("top_logprobs")) {
      EXPECT_TRUE(lp["top_logprobs"][0].contains(as_ids[0])) << lp.dump();
    } else {
      EXPECT_EQ(
          lp["content"][0]["top_logprobs"][0]["token"].get<std::string>().rfind("token_id:", 0),
          0u);
    }
    const Json by_text = post(frontend_.address(), path, plain);
    EXPECT_NE(tokens(by_text), as_ids);
    EXPECT_EQ(tokens(by_text).size(), as_ids.size());
  }
  // The server's flag.
  const std::string dir = MakeTempDir("frontend-token-ids");
  Service flagged = StartFrontend(dir, "frontend-ids", {scheduler_->address()},
                                  {"--tokenizer", kTokenizer, "--return-tokens-as-token-ids"});
  EXPECT_EQ(tokens(post(flagged.address(), "/v1/completions", completion)), as_ids);
  Json off = completion;
  off["return_tokens_as_token_ids"] = false;
  EXPECT_NE(tokens(post(flagged.address(), "/v1/completions", off)), as_ids);
}

TEST_F(FrontendRequestFieldsTest, ChatTemplateKwargsAreTheTemplatesVariables) {
  auto rendered = [&](const Json& kwargs) {
    return RenderedHello(kwargs.is_null() ? Json::object()
                                          : Json{{"chat_template_kwargs", kwargs}});
  };
  const std::string plain = rendered(nullptr);
  EXPECT_EQ(plain.find("THINK"), std::string::npos) << plain;
  EXPECT_EQ(rendered({{"enable_thinking", false}}), plain);
  EXPECT_EQ(rendered({{"enable_thinking", true}}), plain + " THINK");
  EXPECT_EQ(rendered({{"enable_thinking", true}, {"suffix", "!"}}), plain + " THINK!");
  const Result reserved = Post("/v1/chat/completions",
                               {{"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                                {"chat_template_kwargs", {{"add_generation_prompt", false}}}});
  EXPECT_EQ(reserved.status, 400);
  EXPECT_EQ(reserved.body["error"]["param"], "chat_template_kwargs");
}

// vLLM's documents reach the template as `documents`, and chat_template_kwargs
// over them, as vLLM merges them; without them (or tools) the template sees
// none, as transformers renders (tools=None, documents=None), not undefined.
TEST_F(FrontendRequestFieldsTest, DocumentsAreTheTemplatesDocumentsAndNoneWithout) {
  const std::string plain = RenderedHello(Json::object());
  EXPECT_EQ(plain.find("DOCS"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("TOOLS"), std::string::npos) << plain;
  const Json docs = {{{"title", "A"}, {"text", "x"}}, {{"title", "B"}, {"text", "y"}}};
  EXPECT_EQ(RenderedHello({{"documents", docs}}), plain + " DOCS[A|x][B|y]");
  EXPECT_EQ(
      RenderedHello({{"documents", docs},
                     {"chat_template_kwargs", {{"documents", {{{"title", "C"}, {"text", "z"}}}}}}}),
      plain + " DOCS[C|z]");
  EXPECT_EQ(RenderedHello({{"documents", nullptr}}), plain);
  for (const Json& bad : {Json("x"), Json::array({"x"}), Json::array({{{"title", 5}}})}) {
    const Result r =
        Post("/v1/chat/completions",
             {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"documents", bad}});
    EXPECT_EQ(r.status, 400) << bad.dump();
    EXPECT_EQ(r.body["error"]["param"], "documents") << r.body.dump();
  }
}

// vLLM's per-request chat_template: refused as vLLM refuses it unless the
// server runs with --trust-request-chat-template; then it renders the
// prompt (chat_template_kwargs' over the body's), a broken one is a 400
// naming it, and one that would loop for hours ends at the step budget.
TEST_F(FrontendRequestFieldsTest, ARequestsChatTemplateNeedsTheServersTrust) {
  const Json hello = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}};
  Json own = hello;
  own["chat_template"] = "T:{% for m in messages %}{{ m['content'] | upper }}{% endfor %}";
  const Result refused = Post("/v1/chat/completions", own);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.body["error"]["param"], "chat_template") << refused.body.dump();
  EXPECT_NE(
      refused.body["error"]["message"].get<std::string>().find("--trust-request-chat-template"),
      std::string::npos);

  Service trusting =
      StartFrontend(MakeTempDir("frontend-fields-trust"), "trusting", {scheduler_->address()},
                    {"--tokenizer", kTokenizer, "--trust-request-chat-template"});
  auto post = [&](const Json& body) {
    httplib::Client client("http://" + trusting.address());
    client.set_read_timeout(30, 0);
    auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
    return res ? std::make_pair(res->status, Json::parse(res->body, nullptr, false))
               : std::make_pair(-1, Json());
  };
  EXPECT_EQ(post(own).first, 200);
  EXPECT_EQ(LastPrompt(), " T:HELLO");
  Json both = own;
  both["chat_template_kwargs"] = {{"chat_template", "K:{{ messages | length }}"}};
  EXPECT_EQ(post(both).first, 200);
  EXPECT_EQ(LastPrompt(), " K:1");
  // Without one the server has none here (no --chat-template): a 400.
  EXPECT_EQ(post(hello).first, 400);
  for (const char* broken : {"{% if %}", "{{ messages[0].nothing.deeper }}",
                             "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor "
                             "%}{% endfor %}"}) {
    Json bad = hello;
    bad["chat_template"] = broken;
    const auto [status, body] = post(bad);
    EXPECT_EQ(status, 400) << broken;
    EXPECT_EQ(body["error"]["param"], "chat_template") << body.dump();
  }
}

// vLLM's continue_final_message: the prompt ends inside the last message
// (the template's " END" after it is cut), add_generation_prompt left out is
// false and sent true is a 400; the answer's role is then the last
// message's (vLLM's get_chat_request_role); chat echo puts that message's
// content before the answer's, whole or streamed, and nothing when its role
// is not the answer's.
TEST_F(FrontendRequestFieldsTest, ContinueFinalMessageEndsThePromptInItAndEchoPutsItFirst) {
  const Json prefill = {{{"role", "user"}, {"content", "Hello"}},
                        {{"role", "assistant"}, {"content", "Once upon"}}};
  auto prompt_of = [&](Json body) {
    body["messages"] = prefill;
    body["chat_template_kwargs"] = {{"suffix", " END"}};
    const Result r = Post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 200) << r.body.dump();
    const v1::GenerateRequest got = scheduler_->requests().back();
    return std::vector<int32_t>(got.prompt_token_ids().begin(), got.prompt_token_ids().end());
  };
  auto text_of = [&](const std::vector<int32_t>& ids) {
    return *tok_->Decode(ids, {.skip_special_tokens = true});
  };
  // (The decode of a sentencepiece prompt starts with its dummy space.)
  EXPECT_EQ(text_of(prompt_of(Json::object())), " HelloOnce upon END");
  const std::vector<int32_t> continued = prompt_of({{"continue_final_message", true}});
  EXPECT_EQ(text_of(continued), " HelloOnce upon");
  EXPECT_EQ(prompt_of({{"continue_final_message", true}, {"add_generation_prompt", false}}),
            continued);
  const Result both = Post(
      "/v1/chat/completions",
      {{"messages", prefill}, {"continue_final_message", true}, {"add_generation_prompt", true}});
  EXPECT_EQ(both.status, 400);
  EXPECT_EQ(both.body["error"]["param"], "continue_final_message");
  EXPECT_EQ(both.body["error"]["message"],
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");

  const std::vector<int32_t> output = Ids("a time there was");
  const std::vector<int32_t> answer_ids(output.begin() + 1, output.end());  // no BOS
  scheduler_->SetOutput(answer_ids, v1::FINISH_REASON_LENGTH);
  const std::string answer = Continuation(continued, answer_ids);
  ASSERT_FALSE(answer.empty());
  const Json body = {{"messages", prefill},
                     {"chat_template_kwargs", {{"suffix", " END"}}},
                     {"continue_final_message", true},
                     {"echo", true}};
  Result whole = Post("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body.dump();
  EXPECT_EQ(whole.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole.text, "Once upon" + answer);
  Json streamed_body = body;
  streamed_body["stream"] = true;
  const std::vector<Json> chunks = Chunks("/v1/chat/completions", streamed_body);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  for (const Json& chunk : chunks) {
    for (const Json& c : chunk["choices"]) streamed += c["delta"].value("content", "");
  }
  EXPECT_EQ(streamed, "Once upon" + answer);
  // Without continue_final_message the answer is a new assistant turn: the
  // user's message is not its own, so echo adds nothing.
  const Json user_last = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"echo", true}};
  whole = Post("/v1/chat/completions", user_last);
  ASSERT_EQ(whole.status, 200) << whole.body.dump();
  EXPECT_EQ(whole.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole.text.find("Hello"), std::string::npos) << whole.text;
  // add_generation_prompt false after a user message: the answer continues
  // the user's turn, and echo repeats it.
  Json user_turn = user_last;
  user_turn["add_generation_prompt"] = false;
  whole = Post("/v1/chat/completions", user_turn);
  ASSERT_EQ(whole.status, 200) << whole.body.dump();
  EXPECT_EQ(whole.body["choices"][0]["message"]["role"], "user");
  EXPECT_EQ(whole.text.rfind("Hello", 0), 0u) << whole.text;
}

// vLLM's min_tokens holds off stop strings too (its detokenizer checks them
// only once a request has more than min_tokens tokens), not only EOS and
// stop tokens, which the worker never samples before it. A min_tokens the
// context cannot hold is refused, as vLLM refuses it, where it was cut to
// fit.
TEST_F(FrontendRequestFieldsTest, MinTokensHoldsOffStopStringsAndMustFitTheContext) {
  const std::vector<int32_t> all = Ids("The quick brown fox jumps");
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 2);
  // ▁quick ▁brown ▁fo x ▁j umps
  const std::vector<int32_t> output(all.begin() + 2, all.end());
  ASSERT_EQ(output.size(), 6u);
  scheduler_->SetOutput(output, v1::FINISH_REASON_LENGTH);
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    Json body = {{"prompt", prompt}, {"stop", "brown"}, {"stream", stream}, {"min_tokens", 2}};
    Result r = Post("/v1/completions", body);
    EXPECT_EQ(r.text, " quick brown fox jumps") << "'brown' ends token 2, one of the first 2";
    EXPECT_EQ(r.finish_reason, "length");
    body["min_tokens"] = 1;
    r = Post("/v1/completions", body);
    EXPECT_EQ(r.text, " quick ");
    EXPECT_EQ(r.stop_reason, "brown");
    // A stop string that begins within the first min_tokens and ends after.
    body["stop"] = "brown fox";
    body["min_tokens"] = 2;
    r = Post("/v1/completions", body);
    EXPECT_EQ(r.text, " quick ");
    EXPECT_EQ(r.stop_reason, "brown fox");
  }
  // No max_tokens: chat's is what the context (256) leaves after the prompt.
  const size_t asked = scheduler_->requests().size();
  const Result chat =
      Post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"min_tokens", 256}});
  EXPECT_EQ(chat.status, 400) << chat.body.dump();
  EXPECT_EQ(chat.body["error"]["param"], "min_tokens");
  EXPECT_NE(chat.body["error"]["message"].get<std::string>().find("the context leaves"),
            std::string::npos)
      << chat.body.dump();
  // Completions: the default 16, less where the context leaves less.
  const std::vector<int32_t> long_prompt(246, 450);
  const Result completions = Post("/v1/completions", {{"prompt", long_prompt}, {"min_tokens", 11}});
  EXPECT_EQ(completions.status, 400) << completions.body.dump();
  EXPECT_EQ(completions.body["error"]["param"], "min_tokens");
  EXPECT_EQ(scheduler_->requests().size(), asked) << "a refused request reached the scheduler";
  ASSERT_EQ(Post("/v1/completions", {{"prompt", long_prompt}, {"min_tokens", 10}}).status, 200);
  EXPECT_EQ(scheduler_->requests().back().sampling().min_tokens(), 10);
}

// usage.prompt_tokens_details.cached_tokens holds however the choice ends:
// the scheduler's counts come with every message, so a stop string that
// cuts the choice (and its call) short keeps them.
TEST_F(FrontendRequestFieldsTest, CachedTokensAreReportedWhenAStopStringEndsTheChoice) {
  const std::vector<int32_t> all = Ids("The quick brown fox jumps");
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 2);
  scheduler_->SetOutput(std::vector<int32_t>(all.begin() + 2, all.end()), v1::FINISH_REASON_LENGTH);
  scheduler_->SetCached(1, 0);
  for (const char* stop : {"brown", "jumps", "never"}) {
    SCOPED_TRACE(stop);
    const Result r = Post("/v1/completions", {{"prompt", prompt}, {"stop", stop}});
    ASSERT_EQ(r.status, 200) << r.body.dump();
    EXPECT_EQ(r.body["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    const std::vector<Json> chunks =
        Chunks("/v1/completions", {{"prompt", prompt},
                                   {"stop", stop},
                                   {"stream", true},
                                   {"stream_options", {{"include_usage", true}}}});
    ASSERT_FALSE(chunks.empty());
    EXPECT_EQ(chunks.back()["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
  }
}

// vLLM's stream_options.continuous_usage_stats: every chunk carries its
// choice's usage so far, and the usage chunk ends the stream (include_usage
// defaults to true with it, as in vLLM's stream_options); with
// include_usage false neither comes.
TEST_F(FrontendRequestFieldsTest, ContinuousUsageStatsPutTheUsageSoFarInEveryChunk) {
  const std::vector<int32_t> all = Ids("The quick brown fox jumps");
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 2);
  scheduler_->SetOutput(std::vector<int32_t>(all.begin() + 2, all.end()), v1::FINISH_REASON_LENGTH);
  scheduler_->SetCached(1, 0);
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    SCOPED_TRACE(path);
    Json body = {{"stream", true}, {"stream_options", {{"continuous_usage_stats", true}}}};
    if (path == "/v1/completions") {
      body["prompt"] = prompt;
    } else {
      body["messages"] = {{{"role", "user"}, {"content", "Hello"}}};
    }
    std::vector<Json> chunks = Chunks(path, body);
    ASSERT_GE(chunks.size(), 7u);
    ASSERT_TRUE(chunks.back()["choices"].empty()) << "no usage chunk";
    EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], 6);
    const int64_t prompt_tokens = chunks.back()["usage"]["prompt_tokens"];
    std::vector<int64_t> seen;
    for (size_t i = 0; i + 1 < chunks.size(); ++i) {
      const Json& usage = chunks[i]["usage"];
      ASSERT_TRUE(usage.is_object()) << chunks[i].dump();
      EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
      EXPECT_EQ(usage["total_tokens"], prompt_tokens + usage["completion_tokens"].get<int64_t>());
      EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 1);
      seen.push_back(usage["completion_tokens"]);
    }
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
    EXPECT_EQ(seen.front(), 1);
    EXPECT_EQ(seen.back(), 6);
    body["stream_options"]["include_usage"] = false;
    chunks = Chunks(path, body);
    ASSERT_FALSE(chunks.empty());
    for (const Json& chunk : chunks) EXPECT_FALSE(chunk.contains("usage")) << chunk.dump();
  }
}

}  // namespace
}  // namespace tandem::testing
