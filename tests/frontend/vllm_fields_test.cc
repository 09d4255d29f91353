// Every field of vLLM's CompletionRequest and ChatCompletionRequest
// (vllm/entrypoints/openai/protocol.py) either works in Tandem, with a test
// of its behaviour named here, or is refused with a 400 that names it; none
// is accepted and ignored (issue 30). A field of vLLM's lists that the
// table below does not classify fails the test, so a field added to the
// lists must be decided on.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tandem/frontend/openai.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::json;

// vLLM's fields, from protocol.py (commit 0052bed3), plus those later
// versions added (structured_outputs, return_token_ids, media_io_kwargs).
const std::vector<std::string> kVllmCompletionFields = {
    "model", "prompt", "prompt_embeds", "best_of", "echo", "frequency_penalty", "logit_bias",
    "logprobs", "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options",
    "suffix", "temperature", "top_p", "user", "use_beam_search", "top_k", "min_p",
    "repetition_penalty", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "allowed_token_ids", "prompt_logprobs", "add_special_tokens",
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern", "priority", "request_id",
    "logits_processors", "return_tokens_as_token_ids", "cache_salt", "kv_transfer_params",
    "vllm_xargs", "structured_outputs", "return_token_ids"};
const std::vector<std::string> kVllmChatFields = {
    "messages", "model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
    "max_tokens", "max_completion_tokens", "n", "presence_penalty", "response_format", "seed",
    "stop", "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice",
    "reasoning_effort", "include_reasoning", "parallel_tool_calls", "user", "best_of",
    "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty",
    "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "prompt_logprobs", "allowed_token_ids", "bad_words", "echo", "add_generation_prompt",
    "continue_final_message", "add_special_tokens", "documents", "chat_template",
    "chat_template_kwargs", "mm_processor_kwargs", "guided_json", "guided_regex",
    "guided_choice", "guided_grammar", "structural_tag", "guided_decoding_backend",
    "guided_whitespace_pattern", "priority", "request_id", "logits_processors",
    "return_tokens_as_token_ids", "cache_salt", "kv_transfer_params", "vllm_xargs",
    "structured_outputs", "return_token_ids", "media_io_kwargs"};

// OpenAI's chat fields that vLLM's lists lack, from the `openai` npm
// package's ChatCompletionCreateParamsBase (5.23.2, the version the
// frontend tests pin); its CompletionCreateParamsBase adds none.
const std::vector<std::string> kOpenAiOnlyChatFields = {
    "audio",        "function_call", "functions",        "metadata",
    "modalities",   "prediction",    "prompt_cache_key", "safety_identifier",
    "service_tier", "store",         "verbosity",        "web_search_options"};
// Of those, the ones that do not change the answer, accepted and ignored.
const std::map<std::string, Json> kIgnoredOpenAiFields = {
    {"metadata", {{"k", "v"}}},
    {"prediction", {{"type", "content"}, {"content", "x"}}},  // latency only
    {"prompt_cache_key", "k"},
    {"safety_identifier", "u"},
    {"service_tier", "auto"},
    {"store", true}};

// How Tandem treats a field: built (`value` parses; `test` pins what it
// does) or refused (`value` gets a 400 naming `param`, the field itself
// unless it is refused through another).
struct Treatment {
  bool built = false;
  Json value;       // merged into a valid body
  std::string test; // built: the test of its behaviour
  std::string param;
};
Treatment Built(Json value, std::string test) {
  return {.built = true, .value = std::move(value), .test = std::move(test)};
}
Treatment Refused(Json value, std::string param = "") {
  return {.built = false, .value = std::move(value), .param = std::move(param)};
}

// One table for both endpoints; `value` holds the field (and what it needs).
std::map<std::string, Treatment> Table(Endpoint e) {
  const bool chat = e == Endpoint::kChat;
  const std::string parse = "OpenAiParseTest.CompletionFieldsAndDefaults";
  const std::string text = "FrontendTextTest.EveryPathReturnsThePromptPrimedDecode";
  const std::string fields = "FrontendRequestFieldsTest";
  const std::string kContinue =
      "FrontendRequestFieldsTest.ContinueFinalMessageEndsThePromptInItAndEchoPutsItFirst";
  const std::string logprobs = "FrontendLogprobsTest";
  const std::string kStructured =
      "OpenAiParseTest.StructuredOutputsParseIntoTheSchemasText, FrontendStructuredOutputsTest";
  const std::string penalties =
      "OpenAiParseTest.PenaltiesParseAndTheModelsRepetitionPenaltyIsTheDefault";
  const Json tools = Json::array({{{"type", "function"},
                                   {"function", {{"name", "f"}, {"parameters", Json::object()}}}}});
  std::map<std::string, Treatment> t = {
      {"model", Built({{"model", "m"}}, parse)},
      {"prompt", Built({{"prompt", "x"}}, text)},
      {"messages", Built({{"messages", {{{"role", "user"}, {"content", "x"}}}}}, text)},
      {"max_tokens",
       Built(
           {{"max_tokens", 5}},
           "FrontendSamplingDefaultsTest.MaxTokensDefaultsTo16OnCompletionsAndToTheContextOnChat")},
      {"max_completion_tokens",
       Built(
           {{"max_completion_tokens", 5}},
           "FrontendSamplingDefaultsTest.MaxTokensDefaultsTo16OnCompletionsAndToTheContextOnChat")},
      {"n", Built({{"n", 2}}, "FrontendTest (n choices)")},
      {"seed", Built({{"seed", 3}}, parse)},
      {"stop", Built({{"stop", "x"}}, text)},
      {"stream", Built({{"stream", true}}, text)},
      {"stream_options", Built({{"stream", true}, {"stream_options", {{"include_usage", true}}}},
                               "FrontendTest (usage chunk)")},
      {"temperature",
       Built(
           {{"temperature", 0.5}},
           "FrontendSamplingDefaultsTest.TheModelsDefaultsApplyOnlyToFieldsTheRequestLeavesUnset")},
      {"top_p",
       Built(
           {{"top_p", 0.5}},
           "FrontendSamplingDefaultsTest.TheModelsDefaultsApplyOnlyToFieldsTheRequestLeavesUnset")},
      {"top_k",
       Built(
           {{"top_k", 5}},
           "FrontendSamplingDefaultsTest.TheModelsDefaultsApplyOnlyToFieldsTheRequestLeavesUnset")},
      {"min_p",
       Built(
           {{"min_p", 0.1}},
           "FrontendSamplingDefaultsTest.TheModelsDefaultsApplyOnlyToFieldsTheRequestLeavesUnset")},
      {"user", Built({{"user", "u"}}, parse)},
      {"stop_token_ids", Built({{"stop_token_ids", {5}}}, fields)},
      {"include_stop_str_in_output", Built({{"include_stop_str_in_output", true}}, fields)},
      {"ignore_eos", Built({{"ignore_eos", true}}, parse)},
      {"min_tokens", Built({{"min_tokens", 2}}, parse)},
      {"skip_special_tokens", Built({{"skip_special_tokens", false}}, parse)},
      {"truncate_prompt_tokens", Built({{"truncate_prompt_tokens", 4}}, fields)},
      {"add_special_tokens", Built({{"add_special_tokens", false}}, "FrontendTest (chat BOS)")},
      {"priority", Built({{"priority", -3}}, fields)},
      {"return_token_ids", Built({{"return_token_ids", true}}, text)},
      {"echo", chat ? Built({{"echo", true}}, kContinue) : Built({{"echo", true}}, text)},
      {"add_generation_prompt", Built({{"add_generation_prompt", false}}, parse)},
      {"chat_template_kwargs",
       Built({{"chat_template_kwargs", {{"enable_thinking", true}}}}, fields)},
      {"response_format",
       Built({{"response_format",
               {{"type", "json_schema"},
                {"json_schema", {{"name", "n"}, {"schema", {{"type", "integer"}}}}}}}},
             kStructured)},
      // tools with tool_choice "none" only (rendering them is another part of
      // issue 30); any other tool_choice is refused.
      {"tools", Built({{"tools", tools}, {"tool_choice", "none"}}, parse)},
      // Refused.
      {"logprobs", Built({{"logprobs", chat ? Json(true) : Json(1)}}, logprobs)},
      {"top_logprobs", Built({{"logprobs", true}, {"top_logprobs", 2}}, logprobs)},
      {"prompt_logprobs", Built({{"prompt_logprobs", 1}}, logprobs)},
      {"return_tokens_as_token_ids",
       Built({{"return_tokens_as_token_ids", true}},
             "LogprobsRenderTest.AsTokenIdsEveryTokenReadsItsId, "
             "FrontendRequestFieldsTest.ReturnTokensAsTokenIdsNamesTheLogprobsTokensByTheirIds")},
      {"best_of", Refused({{"best_of", 2}})},
      {"use_beam_search", Refused({{"use_beam_search", true}})},
      {"length_penalty", Refused({{"length_penalty", 0.5}})},
      {"presence_penalty", Built({{"presence_penalty", 0.5}}, penalties)},
      {"frequency_penalty", Built({{"frequency_penalty", 0.5}}, penalties)},
      {"repetition_penalty", Built({{"repetition_penalty", 1.1}}, penalties)},
      {"logit_bias", Built({{"logit_bias", {{"5", 1.0}}}},
                           "OpenAiParseTest.LogitBiasParsesAsVllmReadsIt, "
                           "FrontendRequestFieldsTest.LogitBiasIsForwardedToTheScheduler, "
                           "SamplingProgramTest.LogitBiasIsAddedBeforeThePenalties")},
      {"allowed_token_ids",
       Built({{"allowed_token_ids", {5}}},
             "OpenAiParseTest.AllowedTokenIdsParseAsVllmReadsThem, "
             "FrontendRequestFieldsTest.AllowedTokenIdsAreForwardedToTheScheduler, "
             "SamplingProgramTest.AllowedTokenIdsAreTheOnlyOnesDrawn, DifferentialTest")},
      {"bad_words", Built({{"bad_words", {"x"}}},
                          "FrontendRequestFieldsTest.BadWordsAreTokenizedAsVllmTokenizesThem, "
                          "DifferentialTest")},
      {"logits_processors", Refused({{"logits_processors", {"m.P"}}})},
      {"spaces_between_special_tokens", Refused({{"spaces_between_special_tokens", false}})},
      {"guided_json", Refused({{"guided_json", {{"type", "object"}}}})},
      {"guided_regex", Refused({{"guided_regex", "a+"}})},
      {"guided_choice", Refused({{"guided_choice", {"a", "b"}}})},
      {"guided_grammar", Refused({{"guided_grammar", "root ::= \"a\""}})},
      {"guided_decoding_backend", Refused({{"guided_decoding_backend", "xgrammar"}})},
      {"guided_whitespace_pattern", Refused({{"guided_whitespace_pattern", " "}})},
      {"structural_tag", Refused({{"structural_tag", "{}"}})},
      {"structured_outputs",
       Built({{"structured_outputs", {{"json", {{"type", "integer"}}}}}}, kStructured)},
      {"request_id", Built({{"request_id", "r1"}},
                           "FrontendHttpRoutesTest.TheResponseIdIsTheClientsRequestIdAsVllms")},
      {"cache_salt",
       Built({{"cache_salt", "s"}}, "FrontendTest.CacheSaltSharesCachedPrefixesOnlyWithinTheSalt")},
      {"kv_transfer_params", Refused({{"kv_transfer_params", Json::object()}})},
      {"vllm_xargs", Refused({{"vllm_xargs", {{"k", 1}}}})},
      {"mm_processor_kwargs", Refused({{"mm_processor_kwargs", Json::object()}})},
      {"media_io_kwargs", Refused({{"media_io_kwargs", Json::object()}})},
      {"suffix", Refused({{"suffix", "x"}})},
      {"prompt_embeds", Refused({{"prompt_embeds", "AAAA"}})},
      {"tool_choice", Built({{"tools", tools}, {"tool_choice", "auto"}},
                            "OpenAiParseTest.ToolChoiceIsReadAsVllmReadsIt, "
                            "FrontendToolCallsTest")},
      {"continue_final_message", Built({{"continue_final_message", true}}, kContinue)},
      {"documents",
       Built({{"documents", {{{"title", "t"}, {"text", "x"}}}}},
             "FrontendRequestFieldsTest.DocumentsAreTheTemplatesDocumentsAndNoneWithout")},
      {"chat_template",
       Built({{"chat_template", "{{ messages }}"}},
             "FrontendRequestFieldsTest.ARequestsChatTemplateNeedsTheServersTrust")},
      {"reasoning_effort", Refused({{"reasoning_effort", "low"}})},
      {"include_reasoning",
       Built({{"include_reasoning", false}}, "FrontendReasoningTest (needs --reasoning-parser)")},
      {"parallel_tool_calls",
       Built({{"tools", tools}, {"tool_choice", "none"}, {"parallel_tool_calls", false}},
             "FrontendToolCallsTest.ParallelToolCallsFalseKeepsTheFirstCall")},
      // OpenAI's own that change the answer.
      {"functions", Refused({{"functions", {{{"name", "f"}}}}})},
      {"function_call", Refused({{"function_call", "auto"}})},
      {"audio", Refused({{"audio", {{"voice", "alloy"}, {"format", "wav"}}}})},
      {"modalities", Refused({{"modalities", {"text", "audio"}}})},
      {"web_search_options", Refused({{"web_search_options", Json::object()}})},
      {"verbosity", Refused({{"verbosity", "low"}})},
  };
  return t;
}

void CheckEveryField(Endpoint e, const std::vector<std::string>& vllm_fields) {
  const std::map<std::string, Treatment> table = Table(e);
  const Json base = e == Endpoint::kChat
                        ? Json{{"messages", {{{"role", "user"}, {"content", "x"}}}}}
                        : Json{{"prompt", "x"}};
  for (const std::string& field : vllm_fields) {
    SCOPED_TRACE(field);
    auto it = table.find(field);
    if (it == table.end()) {
      ADD_FAILURE() << "vLLM's field '" << field << "' is neither built nor refused";
      continue;
    }
    Json body = base;
    body.update(it->second.value);
    CompletionRequest request;
    const std::optional<ApiError> error = ParseCompletionRequest(body.dump(), e, &request);
    if (it->second.built) {
      EXPECT_FALSE(error) << body.dump() << ": " << error->message;
      EXPECT_FALSE(it->second.test.empty());
    } else {
      ASSERT_TRUE(error) << body.dump() << " is accepted";
      EXPECT_EQ(error->http_status, 400);
      EXPECT_EQ(error->param, it->second.param.empty() ? field : it->second.param);
      EXPECT_NE(error->message.find(it->second.param.empty() ? field : it->second.param),
                std::string::npos)
          << error->message;
      // Its neutral values and null are accepted.
      Json null_body = base;
      null_body[field] = nullptr;
      EXPECT_FALSE(ParseCompletionRequest(null_body.dump(), e, &request)) << null_body.dump();
    }
  }
}

TEST(VllmFieldsTest, EveryCompletionRequestFieldIsBuiltOrRefusedByName) {
  CheckEveryField(Endpoint::kCompletions, kVllmCompletionFields);
}

TEST(VllmFieldsTest, EveryChatCompletionRequestFieldIsBuiltOrRefusedByName) {
  CheckEveryField(Endpoint::kChat, kVllmChatFields);
}

// OpenAI's chat fields beyond vLLM's: those that change the answer are
// refused by name (above), the others accepted; modalities ["text"] is
// its neutral value.
TEST(VllmFieldsTest, EveryOpenAiChatFieldIsBuiltRefusedOrChangesNothing) {
  std::vector<std::string> refused;
  for (const std::string& field : kOpenAiOnlyChatFields) {
    if (!kIgnoredOpenAiFields.contains(field)) refused.push_back(field);
  }
  CheckEveryField(Endpoint::kChat, refused);
  const Json base = {{"messages", {{{"role", "user"}, {"content", "x"}}}}};
  for (const auto& [field, value] : kIgnoredOpenAiFields) {
    Json body = base;
    body[field] = value;
    CompletionRequest request;
    EXPECT_FALSE(ParseCompletionRequest(body.dump(), Endpoint::kChat, &request)) << body.dump();
  }
  Json body = base;
  body["modalities"] = {"text"};
  CompletionRequest request;
  EXPECT_FALSE(ParseCompletionRequest(body.dump(), Endpoint::kChat, &request));
}

// stream_options: include_usage, vLLM's continuous_usage_stats (implying
// include_usage unless it is false, as vLLM's default is true) and OpenAI's
// include_obfuscation (false only); errors name stream_options.<key>.
TEST(VllmFieldsTest, StreamOptionsAreReadAsVllmAndOpenAiReadThem) {
  auto parse = [](const Json& options, CompletionRequest* out) {
    const Json body = {{"prompt", "x"}, {"stream", true}, {"stream_options", options}};
    return ParseCompletionRequest(body.dump(), Endpoint::kCompletions, out);
  };
  struct Case {
    Json options;
    bool include_usage, continuous;
  };
  for (const Case& c : std::vector<Case>{
           {Json::object(), false, false},
           {{{"include_usage", true}}, true, false},
           {{{"continuous_usage_stats", true}}, true, true},
           {{{"continuous_usage_stats", true}, {"include_usage", false}}, false, false},
           {{{"continuous_usage_stats", false}, {"include_usage", true}}, true, false},
           {{{"include_obfuscation", false}, {"include_usage", true}}, true, false}}) {
    CompletionRequest r;
    ASSERT_FALSE(parse(c.options, &r)) << c.options.dump();
    EXPECT_EQ(r.include_usage, c.include_usage) << c.options.dump();
    EXPECT_EQ(r.continuous_usage, c.continuous) << c.options.dump();
  }
  for (const auto& [options, param] : std::vector<std::pair<Json, std::string>>{
           {{{"include_usage", 1}}, "stream_options.include_usage"},
           {{{"continuous_usage_stats", "yes"}}, "stream_options.continuous_usage_stats"},
           {{{"include_obfuscation", true}}, "stream_options.include_obfuscation"}}) {
    CompletionRequest r;
    const std::optional<ApiError> e = parse(options, &r);
    ASSERT_TRUE(e) << options.dump();
    EXPECT_EQ(e->param, param);
    EXPECT_NE(e->message.find(param), std::string::npos) << e->message;
  }
}

TEST(VllmFieldsTest, NewFieldsAreReadAndCheckedLikeVllm) {
  CompletionRequest r;
  ASSERT_FALSE(ParseCompletionRequest(
      R"({"prompt":"x","include_stop_str_in_output":true,"truncate_prompt_tokens":-1,"priority":-7})",
      Endpoint::kCompletions, &r));
  EXPECT_TRUE(r.include_stop_str_in_output);
  EXPECT_EQ(r.truncate_prompt_tokens, -1);
  EXPECT_EQ(r.priority, -7);
  auto param = [](const std::string& body, Endpoint e = Endpoint::kCompletions) {
    CompletionRequest out;
    auto error = ParseCompletionRequest(body, e, &out);
    return error ? error->param : std::string();
  };
  EXPECT_EQ(param(R"({"prompt":"x","truncate_prompt_tokens":0})"), "truncate_prompt_tokens");
  EXPECT_EQ(param(R"({"prompt":"x","truncate_prompt_tokens":-2})"), "truncate_prompt_tokens");
  EXPECT_EQ(param(R"({"prompt":"x","truncate_prompt_tokens":1.5})"), "truncate_prompt_tokens");
  EXPECT_EQ(param(R"({"prompt":"x","priority":"high"})"), "priority");
  EXPECT_EQ(param(R"({"prompt":"x","priority":4294967296})"), "priority");
  EXPECT_EQ(param(R"({"prompt":"x","include_stop_str_in_output":1})"),
            "include_stop_str_in_output");
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  ASSERT_FALSE(ParseCompletionRequest(chat + R"("chat_template_kwargs":{"enable_thinking":false}})",
                                      Endpoint::kChat, &r));
  EXPECT_EQ(r.chat_template_kwargs, nlohmann::ordered_json({{"enable_thinking", false}}));
  EXPECT_EQ(param(chat + R"("chat_template_kwargs":[1]})", Endpoint::kChat), "chat_template_kwargs");
  EXPECT_EQ(param(chat + R"("chat_template_kwargs":{"messages":[]}})", Endpoint::kChat),
            "chat_template_kwargs");
}

}  // namespace
}  // namespace tandem::frontend
