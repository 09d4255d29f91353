// Tool choices and structured outputs as the OpenAI layer parses them: the
// schema's text sent to the scheduler, vLLM's schemas for forced tool
// calls, and the 400s naming what cannot be held.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "openai_test_util.h"
#include "tandem/frontend/openai.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::json;

// tool_choice as vLLM's check_tool_usage reads it: "auto" by default with
// tools (the server then needs --enable-auto-tool-choice), "none" renders
// them only; "required" and a named tool force calls (ForcedToolChoice).
TEST(OpenAiParseTest, ToolChoiceIsReadAsVllmReadsIt) {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}}])";
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  CompletionRequest r;
  ASSERT_FALSE(Parse(chat + tools + "}", Endpoint::kChat, &r));
  EXPECT_EQ(r.tool_choice, "auto");
  EXPECT_FALSE(r.tool_parser) << "the server sets it";
  ASSERT_EQ(r.tools.size(), 1u);
  ASSERT_FALSE(Parse(chat + tools + R"(,"tool_choice":"none"})", Endpoint::kChat, &r));
  EXPECT_EQ(r.tool_choice, "none");
  ASSERT_FALSE(Parse(chat + tools + R"(,"tool_choice":"auto","parallel_tool_calls":true})",
                     Endpoint::kChat, &r));
  EXPECT_EQ(r.tool_choice, "auto");
  CompletionRequest none;
  ASSERT_FALSE(Parse(chat + R"("tool_choice":"none"})", Endpoint::kChat, &none));
  EXPECT_EQ(none.tool_choice, "");
  EXPECT_FALSE(r.forced_tool);
  EXPECT_TRUE(r.json_schema.empty());
  for (const std::string& bad :
       {chat + tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})",
        chat + tools + R"(,"tool_choice":{"type":"function","name":"f"}})",
        chat + tools + R"(,"tool_choice":"sometimes"})", chat + R"("tool_choice":"auto"})",
        chat + R"("tool_choice":"required"})"}) {
    EXPECT_EQ(ErrorParam(bad, Endpoint::kChat), "tool_choice") << bad;
  }
  EXPECT_TRUE(r.parallel_tool_calls);
  ASSERT_FALSE(Parse(chat + tools + R"(,"parallel_tool_calls":false})", Endpoint::kChat, &r));
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(ErrorParam(chat + tools + R"(,"parallel_tool_calls":"no"})", Endpoint::kChat),
            "parallel_tool_calls");
  EXPECT_EQ(ErrorParam(std::string(R"({"prompt":"x",)") + tools + "}"), "tools");
}

// tool_choice "required" and a named tool as vLLM's _get_json_schema_from_tool
// writes their schemas: the named tool's parameters (none: an object without
// members); for "required", a non-empty list of {"name", "parameters"} of any
// tool, their $defs at the root. What the grammar cannot hold, and another
// constraint beside them, are 400s naming the field.
TEST(OpenAiParseTest, AForcedToolChoiceConstrainsTheOutputToCalls) {
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}},)"
                            R"({"type":"function","function":{"name":"g","parameters":)"
                            R"({"type":"object","properties":{"p":{"$ref":"#/$defs/P"}},)"
                            R"("required":["p"],"$defs":{"P":{"type":"integer"}}}}}])";
  CompletionRequest r;
  ASSERT_FALSE(
      Parse(chat + tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})",
            Endpoint::kChat, &r));
  ASSERT_TRUE(r.forced_tool);
  EXPECT_EQ(r.forced_tool->name, "g");
  EXPECT_EQ(r.json_schema_field, "tool_choice");
  EXPECT_EQ(Json::parse(r.json_schema), Json::parse(R"({"type":"object","properties":)"
                                                    R"({"p":{"$ref":"#/$defs/P"}},"required":)"
                                                    R"(["p"],"$defs":{"P":{"type":"integer"}}})"));
  ASSERT_FALSE(
      Parse(chat + tools + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})",
            Endpoint::kChat, &r));
  EXPECT_EQ(Json::parse(r.json_schema), Json::parse(R"({"type":"object","properties":{}})"));
  ASSERT_FALSE(Parse(chat + tools + R"(,"tool_choice":"required"})", Endpoint::kChat, &r));
  ASSERT_TRUE(r.forced_tool);
  EXPECT_FALSE(r.forced_tool->name);
  EXPECT_EQ(Json::parse(r.json_schema), Json::parse(R"({"type":"array","minItems":1,"items":)"
                                                    R"({"anyOf":[{"type":"object","properties":)"
                                                    R"({"name":{"type":"string","enum":["f"]},)"
                                                    R"("parameters":{"type":"object",)"
                                                    R"("properties":{}}},"required":["name",)"
                                                    R"("parameters"]},{"type":"object",)"
                                                    R"("properties":{"name":{"type":"string",)"
                                                    R"("enum":["g"]},"parameters":{"type":)"
                                                    R"("object","properties":{"p":{"$ref":)"
                                                    R"("#/$defs/P"}},"required":["p"]}},)"
                                                    R"("required":["name","parameters"]}]},)"
                                                    R"("$defs":{"P":{"type":"integer"}}})"));
  // The grammar's refusals name the tool.
  const std::string patterned =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":)"
      R"({"type":"object","properties":{"s":{"type":"string","format":"email"}}}}}])";
  for (const char* choice : {R"("required")", R"({"type":"function","function":{"name":"f"}})"}) {
    EXPECT_EQ(ErrorParam(chat + patterned + ",\"tool_choice\":" + choice + "}", Endpoint::kChat),
              "tools[0].function.parameters")
        << choice;
  }
  // Under "required" the root is the list: a tool's "#" cannot mean itself;
  // two tools' $defs of one name must agree.
  const std::string self =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":)"
      R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}}}}}])";
  EXPECT_EQ(ErrorParam(chat + self + R"(,"tool_choice":"required"})", Endpoint::kChat),
            "tools[0].function.parameters");
  ASSERT_FALSE(Parse(chat + self + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})",
                     Endpoint::kChat, &r));
  const std::string clash =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",)"
      R"("$defs":{"P":{"type":"integer"}}}}},{"type":"function","function":{"name":"g",)"
      R"("parameters":{"type":"object","$defs":{"P":{"type":"string"}}}}}])";
  EXPECT_EQ(ErrorParam(chat + clash + R"(,"tool_choice":"required"})", Endpoint::kChat),
            "tools[1].function.parameters");
  // One constraint at a time; and none that may leave no token to draw.
  EXPECT_EQ(ErrorParam(chat + tools +
                           R"(,"tool_choice":"required","response_format":{"type":"json_object"}})",
                       Endpoint::kChat),
            "response_format");
  EXPECT_EQ(ErrorParam(chat + tools +
                           R"(,"tool_choice":"required","structured_outputs":{"choice":["a"]}})",
                       Endpoint::kChat),
            "structured_outputs");
  EXPECT_EQ(
      ErrorParam(chat + tools + R"(,"tool_choice":"required","ignore_eos":true})", Endpoint::kChat),
      "ignore_eos");
}

TEST(OpenAiParseTest, StructuredOutputsParseIntoTheSchemasText) {
  CompletionRequest r;
  // The schema's text keeps the order the client wrote its properties in.
  ASSERT_FALSE(Parse(R"({"messages":[{"role":"user","content":"x"}],
      "response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,
      "schema":{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}}}}}})",
                     Endpoint::kChat, &r));
  EXPECT_EQ(r.json_schema,
            R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}}})");
  r = {};
  ASSERT_FALSE(Parse(R"({"prompt":"x","response_format":{"type":"json_object"}})",
                     Endpoint::kCompletions, &r));
  EXPECT_EQ(r.json_schema, R"({"type":"object","additionalProperties":true})");
  r = {};
  ASSERT_FALSE(
      Parse(R"({"prompt":"x","response_format":{"type":"text"}})", Endpoint::kCompletions, &r));
  EXPECT_EQ(r.json_schema, "");
  // vLLM's structured_outputs: json as an object or as its text, json_object.
  for (const char* body : {R"({"prompt":"x","structured_outputs":{"json":{"enum":[1,2]}}})",
                           R"({"prompt":"x","structured_outputs":{"json":"{\"enum\":[1,2]}"}})"}) {
    r = {};
    ASSERT_FALSE(Parse(body, Endpoint::kCompletions, &r)) << body;
    EXPECT_EQ(r.json_schema, R"({"enum":[1,2]})");
  }
  r = {};
  ASSERT_FALSE(Parse(R"({"prompt":"x","structured_outputs":{"json_object":true,
      "disable_any_whitespace":false}})",
                     Endpoint::kCompletions, &r));
  EXPECT_EQ(r.json_schema, R"({"type":"object","additionalProperties":true})");
  EXPECT_FALSE(r.disable_any_whitespace);
  // disable_any_whitespace: with json, json_object, and response_format's
  // schema (vLLM sets it on the same structured_outputs); a regex or a
  // choice has no JSON whitespace to take it.
  for (
      const char* body :
      {R"({"prompt":"x","structured_outputs":{"json_object":true,"disable_any_whitespace":true}})",
       R"({"prompt":"x","structured_outputs":{"disable_any_whitespace":true,"json":{"type":"string"}}})",
       R"({"prompt":"x","structured_outputs":{"disable_any_whitespace":true},
            "response_format":{"type":"json_object"}})"}) {
    r = {};
    ASSERT_FALSE(Parse(body, Endpoint::kCompletions, &r)) << body;
    EXPECT_TRUE(r.disable_any_whitespace) << body;
  }
  r = {};
  ASSERT_FALSE(
      Parse(R"({"prompt":"x","structured_outputs":{"regex":"a","disable_any_whitespace":true}})",
            Endpoint::kCompletions, &r));
  EXPECT_FALSE(r.disable_any_whitespace);
  EXPECT_EQ(r.regex, "a");
  // disable_additional_properties: additionalProperties false where an
  // object lists properties and leaves it out, as the schema compiler holds
  // it anyway (grammar_test ObjectsHoldTheirPropertiesInOrder): the schema
  // goes on as written. disable_fallback: there is no other backend, what
  // the one cannot hold is refused by name (below).
  for (const char* flags :
       {R"("disable_additional_properties":true)", R"("disable_additional_properties":false)",
        R"("disable_fallback":true,"disable_additional_properties":true)"}) {
    r = {};
    ASSERT_FALSE(Parse(std::string(R"({"prompt":"x","structured_outputs":{"json":)"
                                   R"({"properties":{"a":{}}},)") +
                           flags + "}}",
                       Endpoint::kCompletions, &r))
        << flags;
    EXPECT_EQ(r.json_schema, R"({"properties":{"a":{}}})");
  }
  // structured_outputs.choice: raw strings, a null json beside it.
  r = {};
  ASSERT_FALSE(Parse(R"({"prompt":"x","structured_outputs":{"choice":["yes","no","\"q\""],
      "json":null}})",
                     Endpoint::kCompletions, &r));
  EXPECT_EQ(r.json_schema, "");
  EXPECT_THAT(r.choice, ::testing::ElementsAre("yes", "no", "\"q\""));
  EXPECT_EQ(r.json_schema_field, "structured_outputs");
  // structured_outputs.regex: the pattern as sent.
  r = {};
  ASSERT_FALSE(
      Parse(R"({"prompt":"x","structured_outputs":{"regex":"\\d{3}-[a-z]+","choice":null}})",
            Endpoint::kCompletions, &r));
  EXPECT_EQ(r.regex, R"(\d{3}-[a-z]+)");
  EXPECT_TRUE(r.choice.empty());
  EXPECT_TRUE(r.HasGrammar());
  EXPECT_EQ(r.json_schema_field, "structured_outputs");
}

TEST(OpenAiParseTest, StructuredOutputsTheGrammarCannotHoldAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n",
          "schema":{"type":"object","properties":{"a":{"type":"number","multipleOf":2}}}}})",
       "response_format.json_schema.schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n"}})",
       "response_format.json_schema.schema"},
      {R"("response_format":{"type":"yaml"})", "response_format.type"},
      {R"("response_format":"json")", "response_format"},
      {R"x("structured_outputs":{"regex":"a(?=b)"})x", "structured_outputs.regex"},
      {R"("structured_outputs":{"regex":""})", "structured_outputs.regex"},
      {R"("structured_outputs":{"regex":["a"]})", "structured_outputs.regex"},
      {R"("structured_outputs":{"regex":"a","choice":["a"]})", "structured_outputs"},
      {R"("structured_outputs":{"regex":"a"},"response_format":{"type":"json_object"})",
       "structured_outputs"},
      {R"("structured_outputs":{"regex":"a"},"ignore_eos":true)", "ignore_eos"},
      {R"("structured_outputs":{"grammar":"root ::= root \"a\" | \"b\""})",
       "structured_outputs.grammar"},
      {R"("structured_outputs":{"grammar":"start: \"a\""})", "structured_outputs.grammar"},
      {R"("structured_outputs":{"grammar":""})", "structured_outputs.grammar"},
      {R"("structured_outputs":{"grammar":"root ::= \"a\"","regex":"a"})", "structured_outputs"},
      {R"("guided_regex":"a+")", "guided_regex"},
      {R"("structured_outputs":{"choice":[]})", "structured_outputs.choice"},
      {R"("structured_outputs":{"choice":["a",""]})", "structured_outputs.choice"},
      {R"("structured_outputs":{"choice":"a"})", "structured_outputs.choice"},
      {R"("structured_outputs":{"choice":["a",1]})", "structured_outputs.choice"},
      {R"("structured_outputs":{"choice":["a"],"json_object":true})", "structured_outputs"},
      {R"("structured_outputs":{"choice":["a"]},"response_format":{"type":"json_object"})",
       "structured_outputs"},
      {R"("structured_outputs":{"choice":["a"]},"min_tokens":2)", "min_tokens"},
      {R"("structured_outputs":{"choice":["a"]},"bad_words":["a"])", "bad_words"},
      {R"("guided_choice":["a"])", "guided_choice"},
      {R"("structured_outputs":{"json":"{nope"})", "structured_outputs.json"},
      {R"("structured_outputs":{"json":{"type":"string"},"json_object":true})",
       "structured_outputs"},
      {R"("structured_outputs":{"json":{"type":"string"}},
          "response_format":{"type":"json_object"})",
       "structured_outputs"},
      {R"("response_format":{"type":"json_object"},"ignore_eos":true)", "ignore_eos"},
      {R"("response_format":{"type":"json_object"},"min_tokens":2)", "min_tokens"},
      {R"("structured_outputs":{"json":{"type":"string"}},"allowed_token_ids":[3])",
       "allowed_token_ids"},
      {R"("guided_json":{"type":"string"})", "guided_json"},
      {R"("structured_outputs":{"json_object":true,"disable_any_whitespace":"yes"})",
       "structured_outputs.disable_any_whitespace"},
      {R"("structured_outputs":{"json_object":true,"disable_fallback":"no"})",
       "structured_outputs.disable_fallback"},
      {R"("structured_outputs":{"json_object":true,"disable_additional_properties":1})",
       "structured_outputs.disable_additional_properties"},
  };
  for (const auto& [fields, param] : cases) {
    EXPECT_EQ(ErrorParam(std::string(R"({"prompt":"x",)") + fields + "}"), param) << fields;
  }
  CompletionRequest r;
  const auto e = Parse(R"x({"prompt":"x","structured_outputs":{"json":{"type":"string",
      "pattern":"a(?!b)"}}})x",
                       Endpoint::kCompletions, &r);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("'pattern': regex: lookaround"), std::string::npos) << e->message;
}

}  // namespace
}  // namespace tandem::frontend
