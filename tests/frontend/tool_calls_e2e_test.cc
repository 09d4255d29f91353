// tool_choice "auto" under --enable-auto-tool-choice --tool-call-parser
// (issue 30): through the real frontend binary and a fake scheduler that
// answers chosen ids, an answer's calls come back as message.tool_calls
// (and /v1/responses' function_call items), whole and streamed, read by the
// npm openai SDK too; every parser on an answer in its model's shape.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"
#include "tools_test_util.h"

namespace tandem::testing {
namespace {

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

// tool_choice "required" and named: the scheduler is sent the calls' schema
// (the grammar holds the output to it), and the answer is its calls, whole
// and streamed: content "", finish_reason "tool_calls" for "required" and
// "stop" for a named tool (vLLM's, after OpenAI's); Responses' function_call
// items too. A "required" answer cut by max_tokens has no calls: its text
// is the content, finish "length".
TEST_F(FrontendToolCallsTest, AForcedToolChoiceAnswersWithItsCalls) {
  const Json parameters = {
      {"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}};
  Json body = Request(false);
  body["tools"][0]["function"]["parameters"] = parameters;
  body["tools"].push_back({{"type", "function"}, {"function", {{"name", "get_time"}}}});
  // Each way: the finish reason, the content and the calls' names and
  // arguments, whole or streamed.
  auto run = [&](const Json& request) {
    std::vector<std::tuple<std::string, Json, Json>> out;
    auto [status, whole] = Post(request);
    EXPECT_EQ(status, 200) << whole.dump();
    const Json& c = whole["choices"][0];
    Json calls = Json::array();
    for (const Json& t : c["message"].value("tool_calls", Json::array())) {
      EXPECT_EQ(t["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
      calls.push_back(t["function"]);
    }
    out.emplace_back(c["finish_reason"], c["message"]["content"], calls);
    Json streamed = request;
    streamed["stream"] = true;
    std::vector<Json> chunks;
    EXPECT_EQ(Post(streamed, &chunks).first, 200);
    std::string content, finish;
    calls = Json::array();
    for (const Json& chunk : chunks) {
      for (const Json& d : chunk["choices"]) {
        content += d["delta"].value("content", "");
        for (const Json& t : d["delta"].value("tool_calls", Json::array())) {
          calls.push_back(t["function"]);
        }
        if (!d["finish_reason"].is_null()) finish = d["finish_reason"];
      }
    }
    out.emplace_back(finish, content, calls);
    return out;
  };

  Answer("{\"city\": \"Paris\"}");
  Json named = body;
  named["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  for (const auto& [finish, content, calls] : run(named)) {
    EXPECT_EQ(finish, "stop");
    EXPECT_EQ(content, "");
    EXPECT_EQ(calls,
              Json::parse(R"([{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}])"));
  }
  EXPECT_EQ(Json::parse(scheduler_->sampled().back().json_schema()), parameters);

  Answer(
      "[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\"}},"
      "{\"name\":\"get_time\",\"parameters\":{}}]");
  Json required = body;
  required["tool_choice"] = "required";
  for (const auto& [finish, content, calls] : run(required)) {
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_EQ(content, "");
    EXPECT_EQ(calls, Json::parse(R"([{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"},)"
                                 R"({"name":"get_time","arguments":"{}"}])"));
  }
  const Json schema = Json::parse(scheduler_->sampled().back().json_schema());
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["items"]["anyOf"][0]["properties"]["parameters"], parameters);
  required["parallel_tool_calls"] = false;
  for (const auto& [finish, content, calls] : run(required)) {
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0]["name"], "get_weather");
  }
  required.erase("parallel_tool_calls");

  // Responses: the calls as function_call items.
  const Json responses = Post({{"input", "Weather in Paris?"},
                               {"tools",
                                {{{"type", "function"}, {"name", "get_weather"}},
                                 {{"type", "function"}, {"name", "get_time"}}}},
                               {"tool_choice", "required"}},
                              nullptr, "/v1/responses")
                             .second;
  ASSERT_EQ(responses["output"].size(), 2u) << responses.dump();
  EXPECT_EQ(responses["output"][1]["type"], "function_call");
  EXPECT_EQ(responses["output"][1]["name"], "get_time");

  const std::string cut = "[{\"name\":\"get_weather\",\"parameters\":{\"ci";
  auto ids = tok_->Encode(cut, {.add_special_tokens = false});
  ASSERT_TRUE(ids.ok());
  scheduler_->SetOutput(*ids, v1::FINISH_REASON_LENGTH);
  for (const auto& [finish, content, calls] : run(required)) {
    EXPECT_EQ(finish, "length");
    EXPECT_EQ(content, cut);
    EXPECT_TRUE(calls.empty()) << calls.dump();
  }
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


}  // namespace
}  // namespace tandem::testing
