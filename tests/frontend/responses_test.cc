// /v1/responses in-process: the request as the chat request it runs as, the
// Responses fields refused by name, the response object and the stream's
// events. The npm `openai` SDK reads them in frontend_test.cc.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tandem/frontend/openai_responses.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::ordered_json;

TEST(ResponsesParseTest, InputAndInstructionsBecomeTheChatMessages) {
  CompletionRequest r;
  ASSERT_FALSE(ParseResponsesRequest(
      R"({"model":"m","input":"Hi","instructions":"Be brief","max_output_tokens":5,
          "temperature":0,"top_p":0.5,"top_k":3,"seed":7,"stream":true,"store":true,
          "metadata":{"k":"v"},"user":"u","tool_choice":"none","parallel_tool_calls":false,
          "text":{"format":{"type":"text"}},"reasoning":{"effort":null},"include":[],
          "truncation":"disabled","top_logprobs":2,"service_tier":"default","n":3,
          "chat_template_kwargs":{"enable_thinking":false}})",
      &r));
  EXPECT_EQ(r.endpoint, Endpoint::kResponses);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.messages,
            Json::parse(R"([{"role":"system","content":[{"type":"text","text":"Be brief"}]},
                                        {"role":"user","content":[{"type":"text","text":"Hi"}]}])"));
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(r.seed, 7);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.n, 1) << "n is not a Responses field";
  EXPECT_EQ(r.chat_template_kwargs, Json::parse(R"({"enable_thinking":false})"));
  ASSERT_TRUE(r.responses);
  EXPECT_EQ(r.responses->instructions, "Be brief");
  EXPECT_EQ(r.responses->metadata, Json::parse(R"({"k":"v"})"));
  EXPECT_EQ(r.responses->tool_choice, "none");
  EXPECT_FALSE(r.responses->parallel_tool_calls);
  EXPECT_EQ(r.responses->top_logprobs, 2);
  EXPECT_EQ(r.responses->service_tier, "default");

  // A list of messages, content as a string or as text parts (an assistant
  // turn's output_text too), "type": "message" optional.
  ASSERT_FALSE(ParseResponsesRequest(
      R"({"input":[{"type":"message","role":"developer","content":"Rules"},
                   {"role":"user","content":[{"type":"input_text","text":"a"},
                                             {"type":"input_text","text":"b"}]},
                   {"role":"assistant","content":[{"type":"output_text","text":"c"}]}]})",
      &r));
  EXPECT_EQ(r.messages,
            Json::parse(R"([{"role":"developer","content":[{"type":"text","text":"Rules"}]},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":[{"type":"text","text":"c"}]}])"));
  EXPECT_FALSE(r.max_tokens) << "unset: the rest of the context, as chat";
  EXPECT_FALSE(r.temperature) << "unset: the model's default";
}

// Function tools as chat's; a call sent back joins the assistant turn
// before it, its output is a tool message.
TEST(ResponsesParseTest, ToolsAndFunctionCallItemsBecomeChatsToolsAndMessages) {
  CompletionRequest r;
  ASSERT_FALSE(ParseResponsesRequest(
      R"({"tools":[{"type":"function","name":"f","description":"d","parameters":{},"strict":true}],
          "input":[{"role":"user","content":"Hi"},
                   {"role":"assistant","content":"Looking."},
                   {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\": 1}"},
                   {"type":"function_call","call_id":"c2","name":"f","arguments":"{}"},
                   {"type":"function_call_output","call_id":"c1","output":"one"},
                   {"type":"function_call_output","call_id":"c2",
                    "output":[{"type":"input_text","text":"two"}]},
                   {"type":"function_call","call_id":"c3","name":"f","arguments":"{}"}]})",
      &r));
  EXPECT_EQ(r.tool_choice, "auto");
  EXPECT_EQ(r.tools, Json::parse(R"([{"type":"function","function":{"name":"f","description":"d",
      "parameters":{},"strict":true}}])"));
  EXPECT_EQ(r.responses->tools[0]["name"], "f") << "echoed as given";
  ASSERT_EQ(r.messages.size(), 5u) << r.messages.dump();
  EXPECT_EQ(r.messages[1]["role"], "assistant");
  EXPECT_EQ(r.messages[1]["content"][0]["text"], "Looking.");
  ASSERT_EQ(r.messages[1]["tool_calls"].size(), 2u);
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(r.messages[2], Json::parse(R"({"role":"tool","tool_call_id":"c1",
      "content":[{"type":"text","text":"one"}]})"));
  EXPECT_EQ(r.messages[3]["content"][0]["text"], "two");
  EXPECT_EQ(r.messages[4]["role"], "assistant") << "after a tool message: a turn of its own";
  EXPECT_EQ(r.messages[4]["tool_calls"][0]["id"], "c3");

  // A reasoning item sent back goes with the assistant turn after it (as
  // reasoning_content, which templates read); with no turn after it, it is
  // dropped; a summary alone adds nothing.
  ASSERT_FALSE(ParseResponsesRequest(
      R"({"input":[{"role":"user","content":"Hi"},
                   {"type":"reasoning","id":"rs_1","summary":[],
                    "content":[{"type":"reasoning_text","text":"Think."}]},
                   {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
                   {"type":"function_call_output","call_id":"c1","output":"one"},
                   {"type":"reasoning","summary":[{"type":"summary_text","text":"S"}]},
                   {"role":"assistant","content":"Done."},
                   {"type":"reasoning","content":[{"type":"reasoning_text","text":"Lost."}]},
                   {"role":"user","content":"More?"}]})",
      &r));
  ASSERT_EQ(r.messages.size(), 5u) << r.messages.dump();
  EXPECT_EQ(r.messages[1]["reasoning_content"], "Think.");
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["id"], "c1");
  EXPECT_FALSE(r.messages[3].contains("reasoning_content")) << r.messages.dump();

  // Logprobs only where include asks for them; include entries for items
  // never produced here add nothing.
  ASSERT_FALSE(ParseResponsesRequest(
      R"({"input":"x","top_logprobs":2,"include":["reasoning.encrypted_content"]})", &r));
  EXPECT_FALSE(r.logprobs);
  ASSERT_FALSE(ParseResponsesRequest(
      R"({"input":"x","top_logprobs":2,"include":["message.output_text.logprobs"]})", &r));
  EXPECT_EQ(r.logprobs, 2);

  // Without tools, Responses' default tool_choice changes nothing.
  ASSERT_FALSE(ParseResponsesRequest(R"({"input":"x","tool_choice":"auto","tools":[]})", &r));
  EXPECT_EQ(r.tool_choice, "");
}

struct Refused {
  std::string body;
  int status;
  std::string param;
};

// Responses' forced tool choices: "required", and a tool named flat
// ({"type": "function", "name": ...}) as chat's nested one; the response
// repeats it as given.
TEST(ResponsesParseTest, ForcedToolChoicesAreChats) {
  const std::string tools =
      R"("tools":[{"type":"function","name":"f"},{"type":"function","name":"g"}])";
  CompletionRequest r;
  ASSERT_FALSE(ParseResponsesRequest(
      R"({"input":"x",)" + tools + R"(,"tool_choice":{"type":"function","name":"g"}})", &r));
  ASSERT_TRUE(r.forced_tool);
  EXPECT_EQ(r.forced_tool->name, "g");
  EXPECT_FALSE(r.json_schema.empty());
  EXPECT_EQ(r.responses->tool_choice, Json::parse(R"({"type":"function","name":"g"})"));
  ASSERT_FALSE(
      ParseResponsesRequest(R"({"input":"x",)" + tools + R"(,"tool_choice":"required"})", &r));
  ASSERT_TRUE(r.forced_tool);
  EXPECT_FALSE(r.forced_tool->name);
}

TEST(ResponsesParseTest, WhatItCannotHonourIsRefusedByName) {
  const std::vector<Refused> cases = {
      {R"({})", 400, "input"},
      {R"({"input":[]})", 400, "input"},
      {R"({"input":5})", 400, "input"},
      {R"({"input":"x","instructions":3})", 400, "instructions"},
      {R"({"input":[{"role":"tool","content":"x"}]})", 400, "input"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]})", 400,
       "input"},
      {R"({"input":[{"role":"user","content":[{"type":"input_text"}]}]})", 400, "input"},
      {R"({"input":"x","previous_response_id":"resp_1"})", 404, "previous_response_id"},
      {R"({"input":"x","background":true})", 400, "background"},
      {R"({"input":"x","tools":[{"type":"web_search"}]})", 400, "tools"},
      {R"({"input":"x","tool_choice":"required"})", 400, "tool_choice"},
      {R"({"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":"sometimes"})", 400,
       "tool_choice"},
      {R"({"input":"x","tools":[{"type":"function","name":"f"}],)"
       R"("tool_choice":{"type":"function","name":"g"}})",
       400, "tool_choice"},
      {R"({"input":"x","tools":[{"type":"function","name":"f"}],"parallel_tool_calls":1})", 400,
       "parallel_tool_calls"},
      {R"({"input":[{"type":"function_call","call_id":"c","name":"f"}]})", 400, "input"},
      {R"({"input":[{"type":"function_call_output","call_id":"c"}]})", 400, "input"},
      {R"({"input":[{"type":"reasoning","content":[{"type":"summary_text","text":"x"}]}]})", 400,
       "input"},
      {R"({"input":[{"type":"item_reference","id":"msg_1"}]})", 400, "input"},
      {R"({"input":"x","text":{"format":{"type":"json_object"}}})", 400, "text.format"},
      {R"({"input":"x","text":{"verbosity":"low"}})", 400, "text.verbosity"},
      {R"({"input":"x","reasoning":{"effort":"high"}})", 400, "reasoning"},
      {R"({"input":"x","include":["message.output_text.text"]})", 400, "include"},
      {R"({"input":"x","include":"reasoning.encrypted_content"})", 400, "include"},
      {R"({"input":"x","truncation":"auto"})", 400, "truncation"},
      {R"({"input":"x","prompt":{"id":"p"}})", 400, "prompt"},
      {R"({"input":"x","conversation":"c"})", 400, "conversation"},
      {R"({"input":"x","top_logprobs":21})", 400, "top_logprobs"},
      {R"({"input":"x","metadata":[]})", 400, "metadata"},
      // Chat's checks, named as Responses names the fields.
      {R"({"input":"x","max_output_tokens":0})", 400, "max_output_tokens"},
      {R"({"input":"x","temperature":-1})", 400, "temperature"},
      {R"({"input":"x","stream":true,"stream_options":{"include_obfuscation":true}})", 400,
       "stream_options.include_obfuscation"},
  };
  for (const Refused& c : cases) {
    SCOPED_TRACE(c.body);
    CompletionRequest r;
    std::optional<ApiError> e = ParseResponsesRequest(c.body, &r);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, c.status);
    EXPECT_EQ(e->param, c.param) << e->message;
    if (c.param == "max_output_tokens") {
      EXPECT_NE(e->message.find("'max_output_tokens'"), std::string::npos) << e->message;
    }
  }
}

CompletionRequest Parsed(const std::string& body) {
  CompletionRequest r;
  EXPECT_FALSE(ParseResponsesRequest(body, &r));
  return r;
}

TEST(ResponsesRenderTest, TheResponseObjectSaysHowItRanAndWhyItEnded) {
  const CompletionRequest request = Parsed(R"({"input":"x","instructions":"Be brief"})");
  const ResponseHead head{.id = "resp_1", .created = 42, .model = "tiny"};
  const ResponsesRun run{
      .message_id = "msg_1", .temperature = 0.5f, .top_p = 1.0f, .max_output_tokens = 9};
  const ResponsesOutput done{
      .text = "Hello",
      .finish = FinishReason::kStop,
      .usage = {.prompt_tokens = 4, .completion_tokens = 2, .cached_tokens = 1}};
  const Json r = ResponsesObject(request, head, run, &done);
  EXPECT_EQ(r["id"], "resp_1");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["created_at"], 42);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_TRUE(r["incomplete_details"].is_null());
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["instructions"], "Be brief");
  EXPECT_EQ(r["temperature"], 0.5);
  EXPECT_EQ(r["max_output_tokens"], 9);
  EXPECT_EQ(r["store"], false);
  EXPECT_EQ(r["output"], Json::parse(R"([{"id":"msg_1","type":"message","status":"completed",
      "role":"assistant","content":[{"type":"output_text","annotations":[],"logprobs":[],
      "text":"Hello"}]}])"));
  EXPECT_EQ(r["usage"], Json::parse(R"({"input_tokens":4,"input_tokens_details":{"cached_tokens":1},
      "output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":6})"));

  const ResponsesOutput cut{.text = "Hel", .finish = FinishReason::kLength};
  const Json incomplete = ResponsesObject(request, head, run, &cut);
  EXPECT_EQ(incomplete["status"], "incomplete");
  EXPECT_EQ(incomplete["incomplete_details"], Json::parse(R"({"reason":"max_output_tokens"})"));
  EXPECT_EQ(incomplete["output"][0]["status"], "incomplete");

  const Json in_progress = ResponsesObject(request, head, run, nullptr);
  EXPECT_EQ(in_progress["status"], "in_progress");
  EXPECT_EQ(in_progress["output"], Json::array());
  EXPECT_TRUE(in_progress["usage"].is_null());
}

TEST(ResponsesRenderTest, CallsFollowTheMessageAsFunctionCallItems) {
  const CompletionRequest request = Parsed(R"({"input":"x"})");
  const ResponseHead head{.id = "resp_1", .created = 42, .model = "tiny"};
  const ResponsesRun run{.message_id = "msg_1"};
  const ToolCall call{.id = "chatcmpl-tool-abc", .name = "f", .arguments = "{}"};
  ResponsesOutput out{.text = "Looking.", .calls = {call}, .finish = FinishReason::kStop};
  Json r = ResponsesObject(request, head, run, &out);
  ASSERT_EQ(r["output"].size(), 2u);
  EXPECT_EQ(r["output"][1], Json::parse(R"({"id":"fc_abc","type":"function_call",
      "status":"completed","arguments":"{}","call_id":"chatcmpl-tool-abc","name":"f"})"));
  out.text = "";
  r = ResponsesObject(request, head, run, &out);
  ASSERT_EQ(r["output"].size(), 1u) << "a call alone: no empty message";
  EXPECT_EQ(r["output"][0]["type"], "function_call");
}

// "event: T\ndata: {...}\n\n" events, split into their data objects; each
// event line names its data's type.
std::vector<Json> Events(const std::string& sse) {
  std::vector<Json> out;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    const std::string event = sse.substr(at, end - at);
    const size_t nl = event.find('\n');
    EXPECT_EQ(event.rfind("event: ", 0), 0u) << event;
    EXPECT_EQ(event.compare(nl + 1, 6, "data: "), 0) << event;
    out.push_back(Json::parse(event.substr(nl + 7)));
    EXPECT_EQ(out.back()["type"], event.substr(7, nl - 7));
    at = end + 2;
  }
  return out;
}

TEST(ResponsesRenderTest, AStreamIsOpenAisEventsInOrderWithOneMessageId) {
  const CompletionRequest request = Parsed(R"({"input":"x","stream":true})");
  const ResponseHead head{.id = "resp_1", .created = 42, .model = "tiny"};
  ResponsesEvents events(
      request, head, {.message_id = "msg_1", .temperature = 1, .top_p = 1, .max_output_tokens = 2});
  std::string sse = events.Start();
  sse += events.Delta("He");
  EXPECT_EQ(events.Delta(""), "");
  sse += events.Delta("llo");
  sse += events.Finish(FinishReason::kLength, {.prompt_tokens = 3, .completion_tokens = 2});
  const std::vector<Json> got = Events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < got.size(); ++i) {
    types.push_back(got[i]["type"]);
    EXPECT_EQ(got[i]["sequence_number"], i);
    if (got[i].contains("item_id")) {
      EXPECT_EQ(got[i]["item_id"], "msg_1");
    }
  }
  EXPECT_EQ(types,
            (std::vector<std::string>{"response.created", "response.in_progress",
                                      "response.output_item.added", "response.content_part.added",
                                      "response.output_text.delta", "response.output_text.delta",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.incomplete"}));
  EXPECT_EQ(got[0]["response"]["status"], "in_progress");
  EXPECT_EQ(got[2]["item"]["id"], "msg_1");
  EXPECT_EQ(got[4]["delta"], "He");
  EXPECT_EQ(got[6]["text"], "Hello");
  EXPECT_EQ(got[7]["part"]["text"], "Hello");
  EXPECT_EQ(got[8]["item"]["content"][0]["text"], "Hello");
  EXPECT_EQ(got[9]["response"]["status"], "incomplete");
  EXPECT_EQ(got[9]["response"]["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(got[9]["response"]["usage"]["total_tokens"], 5);

  // An answer that only called a tool: no message item, the call at index 0.
  ResponsesEvents calling(request, head, {.message_id = "msg_3"});
  std::string called = calling.Start();
  called += calling.Finish(FinishReason::kStop, {},
                           {ToolCall{.id = "chatcmpl-tool-abc", .name = "f", .arguments = "{}"}});
  types.clear();
  for (const Json& e : Events(called)) types.push_back(e["type"]);
  EXPECT_EQ(types,
            (std::vector<std::string>{
                "response.created", "response.in_progress", "response.output_item.added",
                "response.function_call_arguments.delta", "response.function_call_arguments.done",
                "response.output_item.done", "response.completed"}));
  EXPECT_EQ(Events(called)[2]["item"]["id"], "fc_abc");
  EXPECT_EQ(Events(called)[2]["output_index"], 0);

  ResponsesEvents failing(request, head, {.message_id = "msg_2"});
  std::string failed = failing.Start();
  failed += failing.Error(ApiError{.http_status = 503, .message = "gone"});
  const std::vector<Json> error = Events(failed);
  EXPECT_EQ(error.back()["type"], "error");
  EXPECT_EQ(error.back()["message"], "gone");
  EXPECT_EQ(error.back()["sequence_number"], 2);
}

}  // namespace
}  // namespace tandem::frontend
