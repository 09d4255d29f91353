#include "tandem/frontend/openai.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "openai_parse.h"
#include "openai_test_util.h"
#include "tandem/frontend/openai_responses.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::json;

TEST(OpenAiParseTest, CompletionFieldsAndDefaults) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"model":"m","prompt":"Once upon"})", Endpoint::kCompletions, &r));
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Once upon");
  EXPECT_FALSE(r.max_tokens);
  // Sampling fields left unset: the model's defaults or OpenAI's apply later.
  EXPECT_FALSE(r.temperature);
  EXPECT_FALSE(r.top_p);
  EXPECT_FALSE(r.top_k);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);

  ASSERT_FALSE(Parse(R"({"prompt":[1,2,3],"max_tokens":7,"temperature":0,"top_p":0.5,"top_k":-1,
      "min_tokens":2,"seed":-5,"n":3,"stop":"\n","stop_token_ids":[13],"ignore_eos":true,
      "stream":true,"stream_options":{"include_usage":true},"user":"u","echo":true,
      "return_token_ids":true,"logprobs":null,"presence_penalty":0})",
                     Endpoint::kCompletions, &r));
  EXPECT_EQ(r.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 0);  // vLLM's -1 = off, and set
  EXPECT_EQ(r.min_tokens, 2);
  EXPECT_EQ(r.seed, -5);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n"}));
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{13}));
  EXPECT_TRUE(r.ignore_eos && r.stream && r.include_usage && r.echo && r.return_token_ids);
}

// vLLM's --generation-config auto: the model's generation_config.json gives
// the default of each sampling field a request leaves unset (absent or
// null); a value the request sends wins, even one equal to OpenAI's default
// or to proto3's zero.
TEST(OpenAiParseTest, ModelSamplingDefaultsApplyOnlyToFieldsTheRequestLeavesUnset) {
  const GenerationDefaults llama3{.temperature = 0.6f, .top_p = 0.9f, .top_k = 40};
  auto effective = [](const std::string& body, const GenerationDefaults& d,
                      Endpoint e = Endpoint::kCompletions) {
    CompletionRequest r;
    EXPECT_FALSE(Parse(body, e, &r)) << body;
    return EffectiveSampling(r, d);
  };
  struct Case {
    std::string body;
    float temperature, top_p;
    int32_t top_k;
  };
  const std::vector<Case> cases = {
      {R"({"prompt":"x"})", 0.6f, 0.9f, 40},
      {R"({"prompt":"x","temperature":null,"top_p":null,"top_k":null})", 0.6f, 0.9f, 40},
      {R"({"prompt":"x","temperature":1.5})", 1.5f, 0.9f, 40},
      {R"({"prompt":"x","top_p":0.5})", 0.6f, 0.5f, 40},
      {R"({"prompt":"x","top_k":3})", 0.6f, 0.9f, 3},
      // Explicit values that equal OpenAI's defaults or "off".
      {R"({"prompt":"x","temperature":1,"top_p":1,"top_k":-1})", 1.0f, 1.0f, 0},
      {R"({"prompt":"x","temperature":0,"top_k":0})", 0.0f, 0.9f, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const RequestSampling s = effective(c.body, llama3);
    EXPECT_EQ(s.temperature, c.temperature);
    EXPECT_EQ(s.top_p, c.top_p);
    EXPECT_EQ(s.top_k, c.top_k);
  }
  // Chat requests too.
  const RequestSampling chat = effective(
      R"({"messages":[{"role":"user","content":"hi"}],"top_p":0.3})", llama3, Endpoint::kChat);
  EXPECT_EQ(chat.temperature, 0.6f);
  EXPECT_EQ(chat.top_p, 0.3f);
  EXPECT_EQ(chat.top_k, 40);
  // min_p: the model's unless the request sends one (0 included); bounds
  // named.
  const GenerationDefaults with_min_p{.min_p = 0.05f};
  EXPECT_EQ(effective(R"({"prompt":"x"})", with_min_p).min_p, 0.05f);
  EXPECT_EQ(effective(R"({"prompt":"x","min_p":0.3})", with_min_p).min_p, 0.3f);
  EXPECT_EQ(effective(R"({"prompt":"x","min_p":0})", with_min_p).min_p, 0.0f);
  EXPECT_EQ(effective(R"({"prompt":"x"})", {}).min_p, 0.0f);
  for (const char* bad : {R"({"prompt":"x","min_p":1.5})", R"({"prompt":"x","min_p":-0.1})",
                          R"({"prompt":"x","min_p":"0.1"})"}) {
    CompletionRequest r;
    const std::optional<ApiError> e = Parse(bad, Endpoint::kCompletions, &r);
    ASSERT_TRUE(e) << bad;
    EXPECT_EQ(e->param, "min_p") << bad;
  }
  // A model without defaults: today's (OpenAI's) temperature 1, top_p 1, top_k off.
  const RequestSampling none = effective(R"({"prompt":"x"})", {});
  EXPECT_EQ(none.temperature, 1.0f);
  EXPECT_EQ(none.top_p, 1.0f);
  EXPECT_EQ(none.top_k, 0);
  // Only some defaults; Hugging Face's top_k 0 and vLLM's -1 mean off.
  const RequestSampling partial =
      effective(R"({"prompt":"x"})", {.temperature = 0.0f, .top_k = -1});
  EXPECT_EQ(partial.temperature, 0.0f);
  EXPECT_EQ(partial.top_p, 1.0f);
  EXPECT_EQ(partial.top_k, 0);
}

TEST(OpenAiParseTest, EveryPromptShape) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"prompt":["a","b"]})", Endpoint::kCompletions, &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].text, "b");
  ASSERT_FALSE(Parse(R"({"prompt":[[1,2],[3]]})", Endpoint::kCompletions, &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(ErrorParam(R"({"prompt":[]})"), "prompt");
  EXPECT_EQ(ErrorParam(R"({"prompt":["a",[1]]})"), "");  // mixed lists are fine
  EXPECT_EQ(ErrorParam(R"({"prompt":[[]]})"), "prompt");
  EXPECT_EQ(ErrorParam(R"({"prompt":[1,"a"]})"), "prompt");
  EXPECT_EQ(ErrorParam(R"({"prompt":[-1]})"), "prompt");
  EXPECT_EQ(ErrorParam(R"({"prompt":[4294967296]})"), "prompt");
  EXPECT_EQ(ErrorParam(R"({"prompt":5})"), "prompt");
  EXPECT_EQ(ErrorParam(R"({"max_tokens":5})"), "prompt");  // missing
}

TEST(OpenAiParseTest, BadParametersNameTheField) {
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","max_tokens":0})"), "max_tokens");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","max_tokens":"5"})"), "max_tokens");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","max_completion_tokens":-2})"), "max_completion_tokens");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","temperature":-0.1})"), "temperature");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","top_p":0})"), "top_p");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","top_p":1.5})"), "top_p");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","top_k":-2})"), "top_k");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","n":0})"), "n");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","n":17})"), "n");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","seed":1.5})"), "seed");
  {
    // vLLM reads seed -1 as no seed (a fresh random draw), not as a seed.
    CompletionRequest r;
    ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":"x","seed":-1})", Endpoint::kCompletions, &r));
    EXPECT_FALSE(r.seed.has_value());
    ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":"x","seed":-2})", Endpoint::kCompletions, &r));
    EXPECT_EQ(r.seed, -2);
  }
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","min_tokens":5,"max_tokens":4})"), "min_tokens");
  // Completions check min_tokens against the default max_tokens (16), as
  // vLLM does; chat's default is the context.
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","min_tokens":17})"), "min_tokens");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","min_tokens":16})"), "");
  EXPECT_EQ(ErrorParam(R"({"messages":[{"role":"user","content":"x"}],"min_tokens":17})",
                       Endpoint::kChat),
            "");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","stop":[""]})"), "stop");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","stop":[1]})"), "stop");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","stop_token_ids":[-1]})"), "stop_token_ids");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","stream":"yes"})"), "stream");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","stream_options":{"include_usage":true}})"),
            "stream_options");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","model":3})"), "model");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","user":3})"), "user");
  EXPECT_EQ(ErrorParam(R"(not json)"), "<none>");
  EXPECT_EQ(ErrorParam(R"([1,2])"), "<none>");
}

// vLLM's penalties: presence and frequency in [-2, 2], repetition > 0; the
// model's generation_config.json gives repetition_penalty's default (Qwen2.5
// Instruct's is 1.05), as vLLM's --generation-config auto does.
TEST(OpenAiParseTest, PenaltiesParseAndTheModelsRepetitionPenaltyIsTheDefault) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"prompt":"x","presence_penalty":-1.5,"frequency_penalty":2,
      "repetition_penalty":1.2})",
                     Endpoint::kCompletions, &r));
  const RequestSampling s = EffectiveSampling(r, {.repetition_penalty = 1.05f});
  EXPECT_EQ(s.presence_penalty, -1.5f);
  EXPECT_EQ(s.frequency_penalty, 2.0f);
  EXPECT_EQ(s.repetition_penalty, 1.2f);
  CompletionRequest unset;
  ASSERT_FALSE(
      Parse(R"({"prompt":"x","repetition_penalty":null})", Endpoint::kCompletions, &unset));
  EXPECT_EQ(EffectiveSampling(unset, {.repetition_penalty = 1.05f}).repetition_penalty, 1.05f);
  EXPECT_EQ(EffectiveSampling(unset, {}).repetition_penalty, 1.0f);
  EXPECT_EQ(EffectiveSampling(unset, {}).presence_penalty, 0.0f);
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","presence_penalty":2.5})"), "presence_penalty");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","frequency_penalty":-3})"), "frequency_penalty");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","repetition_penalty":0})"), "repetition_penalty");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","repetition_penalty":"1"})"), "repetition_penalty");
}

// logit_bias as vLLM's to_sampling_params reads it: integer keys written as
// strings, biases clamped to [-100, 100], sorted by id; anything else a 400
// naming the field.
TEST(OpenAiParseTest, LogitBiasParsesAsVllmReadsIt) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"prompt":"x","logit_bias":{"50256":-100,"7":2.5,"13":250,"9":-1e9}})",
                     Endpoint::kCompletions, &r));
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{
                              {7, 2.5f}, {9, -100.0f}, {13, 100.0f}, {50256, -100.0f}}));
  CompletionRequest none;
  ASSERT_FALSE(Parse(R"({"prompt":"x","logit_bias":null})", Endpoint::kCompletions, &none));
  EXPECT_TRUE(none.logit_bias.empty());
  ASSERT_FALSE(Parse(R"({"prompt":"x","logit_bias":{}})", Endpoint::kCompletions, &none));
  EXPECT_TRUE(none.logit_bias.empty());
  for (const char* bad :
       {R"({"prompt":"x","logit_bias":[1, 2]})", R"({"prompt":"x","logit_bias":{"abc":1}})",
        R"({"prompt":"x","logit_bias":{"-1":1}})", R"({"prompt":"x","logit_bias":{"1.5":1}})",
        R"({"prompt":"x","logit_bias":{"99999999999":1}})",
        R"({"prompt":"x","logit_bias":{"5":"1"}})"}) {
    EXPECT_EQ(ErrorParam(bad), "logit_bias") << bad;
  }
}

// vLLM's allowed_token_ids: a list of ids as sent (null: none); an empty
// list is refused as vLLM refuses it, and so is anything but ids.
TEST(OpenAiParseTest, AllowedTokenIdsParseAsVllmReadsThem) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"prompt":"x","allowed_token_ids":[7,3,7]})", Endpoint::kCompletions, &r));
  EXPECT_EQ(r.allowed_token_ids, (std::vector<int32_t>{7, 3, 7}));
  CompletionRequest chat;
  ASSERT_FALSE(Parse(R"({"messages":[{"role":"user","content":"x"}],"allowed_token_ids":[5]})",
                     Endpoint::kChat, &chat));
  EXPECT_EQ(chat.allowed_token_ids, (std::vector<int32_t>{5}));
  CompletionRequest none;
  ASSERT_FALSE(Parse(R"({"prompt":"x","allowed_token_ids":null})", Endpoint::kCompletions, &none));
  EXPECT_TRUE(none.allowed_token_ids.empty());
  for (const char* bad :
       {R"({"prompt":"x","allowed_token_ids":[]})", R"({"prompt":"x","allowed_token_ids":5})",
        R"({"prompt":"x","allowed_token_ids":[-1]})", R"({"prompt":"x","allowed_token_ids":[1.5]})",
        R"({"prompt":"x","allowed_token_ids":["1"]})",
        R"({"prompt":"x","allowed_token_ids":[99999999999]})"}) {
    EXPECT_EQ(ErrorParam(bad), "allowed_token_ids") << bad;
  }
}

// JSON nested deeper than Python's json reads (about 1,000) is a 400: the
// parsed body's copies and comparisons recurse, and a body of 100,000
// brackets would run the frontend out of stack.
TEST(OpenAiParseTest, BodiesNestedTooDeepAreRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const auto& [body, endpoint] : std::vector<std::pair<std::string, Endpoint>>{
           {R"({"prompt":"x","user":)" + deep + "}", Endpoint::kCompletions},
           {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"a":)" + deep +
                "}}",
            Endpoint::kChat},
           {R"({"input":"x","metadata":{"a":)" + deep + "}}", Endpoint::kResponses}}) {
    CompletionRequest r;
    const std::optional<ApiError> e = endpoint == Endpoint::kResponses
                                          ? ParseResponsesRequest(body, &r)
                                          : Parse(body, endpoint, &r);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, 400);
    EXPECT_NE(e->message.find("more than 1000 deep"), std::string::npos) << e->message;
  }
  // A tool call's arguments are JSON in a string.
  const std::string args = std::string(2000, '[') + std::string(2000, ']');
  EXPECT_EQ(
      ErrorParam(R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function",)"
                 R"("function":{"name":"f","arguments":")" +
                     args + R"("}}]},{"role":"user","content":"x"}]})",
                 Endpoint::kChat),
      "messages[0].tool_calls[0].function.arguments");
  // Deep within the limit, and brackets inside strings, are fine.
  CompletionRequest r;
  EXPECT_FALSE(Parse(R"({"prompt":"x","user":")" + deep + R"("})", Endpoint::kCompletions, &r));
  const std::string fine = std::string(500, '[') + std::string(500, ']');
  EXPECT_FALSE(Parse(
      R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"a":)" + fine + "}}",
      Endpoint::kChat, &r));
}

TEST(OpenAiParseTest, UnsupportedFeaturesAreRefusedNotIgnored) {
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","best_of":2})"), "best_of");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","suffix":"y"})"), "suffix");
  EXPECT_EQ(ErrorParam(R"({"messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function"}]})",
                       Endpoint::kChat),
            "tools[0]");
  EXPECT_EQ(ErrorParam(R"({"messages":[{"role":"user","content":"x"}],
      "response_format":{"type":"json_schema","json_schema":{"name":"n",
      "schema":{"type":"string","format":"email"}}}})",
                       Endpoint::kChat),
            "response_format.json_schema.schema");
  // Neutral values and unknown fields pass.
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","presence_penalty":0,"best_of":1,"logprobs":null,
      "some_future_field":{"a":1}})"),
            "");
}

TEST(OpenAiParseTest, ChatMessages) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_completion_tokens":9})",
                     Endpoint::kChat, &r));
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(
      r.messages[1]["content"],
      nlohmann::ordered_json::parse(R"([{"type":"text","text":"a"},{"type":"text","text":"b"}])"));
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_TRUE(r.add_generation_prompt);
  // An assistant turn's thinking sent back: the template sees it under both
  // names (vLLM's "reasoning" and the "reasoning_content" templates read).
  ASSERT_FALSE(Parse(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":"a","reasoning":"r1"},
      {"role":"assistant","content":"b","reasoning_content":"r2"},
      {"role":"user","content":"c","reasoning":"not an assistant's"}]})",
                     Endpoint::kChat, &r));
  EXPECT_EQ(r.messages[1]["reasoning_content"], "r1");
  EXPECT_EQ(r.messages[1]["reasoning"], "r1");
  EXPECT_EQ(r.messages[2]["reasoning"], "r2");
  EXPECT_FALSE(r.messages[3].contains("reasoning_content"));
  EXPECT_EQ(ErrorParam(R"({"messages":[]})", Endpoint::kChat), "messages");
  EXPECT_EQ(ErrorParam(R"({"messages":[{"content":"x"}]})", Endpoint::kChat), "messages");
  EXPECT_EQ(ErrorParam(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                       Endpoint::kChat),
            "messages[0].content");
}

// Messages as a template reads them (vLLM's _parse_chat_message_content and
// content formats): "string" joins each message's non-empty texts with
// "\n", null and missing content included (""); "openai" keeps the parts
// (a string is one, null none), but joins a tool result's texts.
TEST(OpenAiParseTest, MessagesTakeTheShapeTheTemplateReads) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"messages":[
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},
                                {"type":"text","text":"b"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
          "function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]},
      {"role":"assistant","content":[{"type":"refusal","refusal":"no"}]},
      {"role":"user","content":"plain"},
      {"role":"system","name":"no content at all"}]})",
                     Endpoint::kChat, &r));
  using Json = nlohmann::ordered_json;
  const Json as_string =
      internal::MessagesForTemplate(r.messages, tokenizer::ContentFormat::kString);
  EXPECT_EQ(as_string[0]["content"], "a\nb");
  EXPECT_EQ(as_string[1]["content"], "");
  EXPECT_EQ(as_string[2]["content"], "x\ny");
  EXPECT_EQ(as_string[3]["content"], "no");
  EXPECT_EQ(as_string[4]["content"], "plain");
  EXPECT_EQ(as_string[5]["content"], "");  // missing: none, as null
  EXPECT_EQ(as_string[5]["role"], "system");
  EXPECT_TRUE(as_string[1].contains("tool_calls"));
  const Json as_parts =
      internal::MessagesForTemplate(r.messages, tokenizer::ContentFormat::kOpenAi);
  EXPECT_EQ(as_parts[0]["content"], r.messages[0]["content"]);
  EXPECT_EQ(as_parts[0]["content"].size(), 3u) << "empty texts stay parts";
  EXPECT_EQ(as_parts[1]["content"], Json::array());
  EXPECT_EQ(as_parts[2]["content"], "x\ny");
  EXPECT_EQ(as_parts[3]["content"], Json::parse(R"([{"type":"text","text":"no"}])"));
  EXPECT_EQ(as_parts[4]["content"], Json::parse(R"([{"type":"text","text":"plain"}])"));
}

TEST(OpenAiErrorTest, StatusMappingAndBody) {
  EXPECT_EQ(FromStatus(3, "bad").http_status, 400);
  EXPECT_EQ(FromStatus(8, "full").http_status, 429);
  EXPECT_EQ(FromStatus(14, "down").http_status, 503);
  EXPECT_EQ(FromStatus(13, "bug").http_status, 500);
  const Json body = Json::parse(BadRequest("'n' must be >= 1", "n").ToJson());
  EXPECT_EQ(body["error"]["message"], "'n' must be >= 1");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "n");
  EXPECT_TRUE(body["error"]["code"].is_null());
}

TEST(OpenAiRenderTest, ResponsesAndChunksHaveOpenAiShapes) {
  CompletionRequest chat;
  chat.endpoint = Endpoint::kChat;
  chat.return_token_ids = true;
  const ResponseHead head{.id = "chatcmpl-1", .created = 10, .model = "m"};
  Usage usage{.prompt_tokens = 5, .completion_tokens = 2, .cached_tokens = 4};
  const auto full = CompletionResponse(
      chat, head,
      {Choice{.text = "hi", .finish_reason = FinishReason::kLength, .token_ids = {7, 8}}}, usage,
      {{1, 2, 3, 4, 5}});
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(full["choices"][0]["token_ids"], nlohmann::ordered_json({7, 8}));
  EXPECT_EQ(full["usage"]["total_tokens"], 7);
  EXPECT_EQ(full["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(full["prompt_token_ids"], nlohmann::ordered_json({1, 2, 3, 4, 5}));
  EXPECT_FALSE(full["choices"][0].contains("prompt_token_ids"));

  const std::vector<int32_t> prompt{1, 2, 3, 4, 5};
  const std::string first =
      StreamChunk(chat, head, {.text = "", .first = true, .prompt_token_ids = &prompt});
  ASSERT_EQ(first.substr(0, 6), "data: ");
  ASSERT_EQ(first.substr(first.size() - 2), "\n\n");
  const Json c = Json::parse(first.substr(6));
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(c["prompt_token_ids"], Json(prompt));  // chat: beside the choices

  // Completions, as vLLM: the prompt's ids in each choice (of its prompt).
  CompletionRequest two;
  two.return_token_ids = true;
  two.n = 2;
  const auto both = CompletionResponse(
      two, head, {Choice{.index = 0}, Choice{.index = 1}, Choice{.index = 2}, Choice{.index = 3}},
      usage, {{1, 2}, {3}});
  EXPECT_FALSE(both.contains("prompt_token_ids"));
  EXPECT_EQ(both["choices"][1]["prompt_token_ids"], nlohmann::ordered_json({1, 2}));
  EXPECT_EQ(both["choices"][2]["prompt_token_ids"], nlohmann::ordered_json({3}));
  const Json streamed =
      Json::parse(StreamChunk(two, head, {.first = true, .prompt_token_ids = &prompt}).substr(6));
  EXPECT_EQ(streamed["choices"][0]["prompt_token_ids"], Json(prompt));
  EXPECT_FALSE(streamed.contains("prompt_token_ids"));

  CompletionRequest text;
  text.include_usage = true;
  const Json last = Json::parse(
      StreamChunk(
          text, head,
          {.index = 2, .text = "x", .finish_reason = FinishReason::kStop, .stop_reason = "\n"})
          .substr(6));
  EXPECT_EQ(last["object"], "text_completion");
  EXPECT_EQ(last["choices"][0]["index"], 2);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["choices"][0]["stop_reason"], "\n");
  EXPECT_TRUE(last["usage"].is_null());
  const Json u = Json::parse(StreamUsageChunk(text, head, usage).substr(6));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 2);
}

// What StreamChunk wrote when it built a tree: the chunk as an ordered JSON
// object dumped by nlohmann (invalid UTF-8 replaced), framed as an event.
std::string TreeChunk(const CompletionRequest& request, const ResponseHead& head,
                      const ChunkDelta& delta) {
  using OrderedJson = nlohmann::ordered_json;
  const bool chat = request.endpoint == Endpoint::kChat;
  OrderedJson j;
  j["id"] = head.id;
  j["object"] = chat ? "chat.completion.chunk" : "text_completion";
  j["created"] = head.created;
  j["model"] = head.model;
  OrderedJson choice;
  choice["index"] = delta.index;
  if (chat) {
    OrderedJson d = OrderedJson::object();
    if (delta.first) d["role"] = "assistant";
    if (delta.first || !delta.text.empty()) d["content"] = delta.text;
    choice["delta"] = std::move(d);
  } else {
    choice["text"] = delta.text;
  }
  choice["logprobs"] = delta.logprobs;
  choice["finish_reason"] = delta.finish_reason == FinishReason::kNone
                                ? OrderedJson()
                                : OrderedJson(FinishReasonName(delta.finish_reason));
  if (!delta.stop_reason.empty()) {
    choice["stop_reason"] = delta.stop_reason;
  } else if (delta.stop_token) {
    choice["stop_reason"] = *delta.stop_token;
  } else {
    choice["stop_reason"] = nullptr;
  }
  if (!chat && delta.prompt_token_ids) choice["prompt_token_ids"] = *delta.prompt_token_ids;
  if (request.return_token_ids) choice["token_ids"] = delta.token_ids;
  j["choices"] = OrderedJson::array({std::move(choice)});
  if (request.include_usage) j["usage"] = nullptr;
  if (chat && delta.prompt_token_ids) j["prompt_token_ids"] = *delta.prompt_token_ids;
  return "data: " + j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace) + "\n\n";
}

// Random text from pieces that stress escaping: plain ASCII, JSON's escapes,
// other control bytes, DEL, 2-4 byte UTF-8, and invalid or cut sequences.
std::string RandomText(std::mt19937& rng) {
  static const char* const kPieces[] = {"Once",
                                        " upon",
                                        "a time",
                                        "\"",
                                        "\\",
                                        "/",
                                        "\n",
                                        "\r",
                                        "\t",
                                        "\b",
                                        "\f",
                                        "\x01",
                                        "\x1f",
                                        "\x7f",
                                        "\xc3\xa9",
                                        "\xe4\xb8\xad",
                                        "\xf0\x9f\x98\x80",
                                        "\xcc\x81",
                                        "\xe2\x96\x81",
                                        "\xff",
                                        "\xc3",
                                        "\xe4\xb8",
                                        "\xf0\x9f\x98",
                                        "\x80",
                                        "<s>",
                                        "</s>",
                                        "{\"x\":1}",
                                        " "};
  std::string out;
  const int n = std::uniform_int_distribution<int>(0, 6)(rng);
  for (int i = 0; i < n; ++i) {
    out += kPieces[std::uniform_int_distribution<size_t>(0, std::size(kPieces) - 1)(rng)];
  }
  return out;
}

TEST(OpenAiRenderTest, ChunksAreTheBytesATreeWouldDump) {
  std::mt19937 rng(17);
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  const FinishReason kReasons[] = {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength,
                                   FinishReason::kAbort, FinishReason::kError};
  for (int i = 0; i < 5000; ++i) {
    CompletionRequest request;
    request.endpoint = coin() ? Endpoint::kChat : Endpoint::kCompletions;
    request.return_token_ids = coin();
    request.include_usage = coin();
    const ResponseHead head{.id = coin() ? "cmpl-0123456789abcdef" : RandomText(rng),
                            .created = std::uniform_int_distribution<int64_t>(0, 1LL << 40)(rng),
                            .model = coin() ? "stories260K" : RandomText(rng)};
    ChunkDelta delta{.index = std::uniform_int_distribution<int32_t>(0, 1000)(rng),
                     .text = RandomText(rng),
                     .first = coin(),
                     .finish_reason = kReasons[std::uniform_int_distribution<int>(0, 4)(rng)]};
    switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
      case 0:
        delta.stop_reason = RandomText(rng);
        break;
      case 1:
        delta.stop_token = std::uniform_int_distribution<int32_t>(-5, 40000)(rng);
        break;
      default:
        break;
    }
    const int ids = std::uniform_int_distribution<int>(0, 3)(rng);
    for (int k = 0; k < ids; ++k) {
      delta.token_ids.push_back(std::uniform_int_distribution<int32_t>(0, 32000)(rng));
    }
    std::vector<int32_t> prompt;
    if (request.return_token_ids && delta.first) {
      prompt.resize(std::uniform_int_distribution<size_t>(0, 4)(rng), 9);
      delta.prompt_token_ids = &prompt;
    }
    if (coin()) {
      // Logprobs with texts that need escaping (and a -inf).
      std::vector<PositionLogprobs> positions(2);
      positions[0].token = {.token_id = 5, .bytes = RandomText(rng), .logprob = -0.5f};
      positions[1].token = {.token_id = 6, .bytes = RandomText(rng), .logprob = -INFINITY};
      positions[1].top = {{.token_id = 7, .bytes = RandomText(rng), .logprob = -0.25f}};
      int64_t offset = 3;
      delta.logprobs = request.endpoint == Endpoint::kChat
                           ? ChatLogprobs(positions, 1)
                           : CompletionLogprobs(positions, 1, &offset);
    }
    const std::string chunk = StreamChunk(request, head, delta);
    ASSERT_EQ(chunk, TreeChunk(request, head, delta)) << "case " << i;
    ASSERT_TRUE(Json::accept(chunk.substr(6))) << chunk;
  }
}

}  // namespace
}  // namespace tandem::frontend
