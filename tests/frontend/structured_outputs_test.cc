// Structured outputs through the three services (random32k, the worker given
// llama2.c's tokenizer.bin of the same vocabulary): every answer that ends
// with "stop" is a document of its schema, read back with nlohmann's JSON
// parser and checked field by field; one cut by max_tokens is the beginning
// of one. What the grammar refuses is a 400 naming the field.
#include <set>
#include <string>
#include <vector>

#include "frontend_test_util.h"
#include "re2/re2.h"
#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/json_schema.h"

namespace tandem::testing {
namespace {

class FrontendStructuredOutputsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("structured");
    worker_ = StartWorker(
        dir_, "worker",
        {"--model", kModels + "/random32k.bin", "--tokenizer", kModels + "/tokenizer.bin"});
    scheduler_ = StartScheduler(dir_, "scheduler", worker_.address(), {});
    frontend_ = StartFrontend(dir_, "frontend", {scheduler_.address()},
                              {"--tokenizer", kLlama2Tokenizer, "--chat-template", "llama-2"});
  }

  std::string dir_;
  Service worker_, scheduler_, frontend_;
};

const Json kPerson = Json::parse(R"({"type": "object",
  "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                 "ok": {"type": "boolean"}},
  "required": ["name", "age", "ok"]})");

// Whether `text` can begin a document of `schema` (the grammar's view).
bool Begins(const Json& schema, const std::string& text) {
  auto compiled = grammar::CompileJsonSchema(nlohmann::ordered_json::parse(schema.dump()));
  if (!compiled.ok()) return false;
  grammar::JsonMatcher m(*compiled);
  return m.Accept(text);
}

void ExpectPerson(const std::string& text) {
  const Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(doc.is_object()) << text;
  EXPECT_EQ(doc.size(), 3u) << text;
  ASSERT_TRUE(doc.contains("name") && doc["name"].is_string()) << text;
  // maxLength counts characters: at most 8 code points of UTF-8.
  const std::string name = doc["name"];
  EXPECT_LE(std::count_if(name.begin(), name.end(), [](char c) { return (c & 0xC0) != 0x80; }), 8)
      << text;
  ASSERT_TRUE(doc.contains("age") && doc["age"].is_number_integer()) << text;
  EXPECT_GE(doc["age"].get<int64_t>(), 0) << text;
  EXPECT_LE(doc["age"].get<int64_t>(), 120) << text;
  EXPECT_TRUE(doc.contains("ok") && doc["ok"].is_boolean()) << text;
}

// A stream's answers by choice index: (text, finish_reason), the text from
// completions' "text" or chat's "delta.content".
std::map<int, std::pair<std::string, std::string>> StreamedAnswers(const std::string& raw) {
  std::map<int, std::pair<std::string, std::string>> by_index;
  std::istringstream lines(raw);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const Json chunk = Json::parse(line.substr(6));
    for (const Json& c : chunk["choices"]) {
      auto& [text, finish] = by_index[c["index"].get<int>()];
      if (c.contains("text")) text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content")) {
        text += c["delta"]["content"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  return by_index;
}

// The answers of a /v1/completions request by choice index (text,
// finish_reason), whole or streamed as `body` says; the status must be 200.
std::map<int, std::pair<std::string, std::string>> CompletionAnswers(const std::string& address,
                                                                     const Json& body) {
  const HttpResult r = Post(address, "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  if (body.value("stream", false)) return StreamedAnswers(r.raw);
  std::map<int, std::pair<std::string, std::string>> answers;
  for (const Json& c : r.body["choices"]) {
    answers[c["index"].get<int>()] = {c["text"], c["finish_reason"]};
  }
  return answers;
}

// The n answers of a chat request constrained by `schema` (text, finish_reason).
std::vector<std::pair<std::string, std::string>> Answers(const std::string& address,
                                                         const Json& schema, bool stream) {
  const Json body = {
      {"messages", {{{"role", "user"}, {"content", "Who are you? Answer in JSON."}}}},
      {"response_format",
       {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", schema}}}}},
      {"n", 4},
      {"temperature", 1.0},
      {"seed", 11},
      {"max_tokens", 200},
      {"stream", stream}};
  const HttpResult r = Post(address, "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  std::vector<std::pair<std::string, std::string>> answers;
  if (stream) {
    for (auto& [index, answer] : StreamedAnswers(r.raw)) answers.push_back(answer);
  } else if (r.status == 200) {
    for (const Json& c : r.body["choices"]) {
      answers.emplace_back(c["message"]["content"], c["finish_reason"]);
    }
  }
  EXPECT_EQ(answers.size(), 4u);
  return answers;
}

TEST_F(FrontendStructuredOutputsTest, EveryChoiceIsADocumentOfItsSchemaOrItsBeginning) {
  // random32k's random logits favour the many whitespace tokens wherever
  // JSON allows whitespace, so within its 256-token context an object
  // rarely closes: each answer must begin a document, and one that stops
  // must be whole.
  for (bool stream : {false, true}) {
    for (const auto& [text, finish] : Answers(frontend_.address(), kPerson, stream)) {
      SCOPED_TRACE(text);
      EXPECT_TRUE(Begins(kPerson, text));
      if (finish == "stop") {
        ExpectPerson(text);
      } else {
        EXPECT_EQ(finish, "length");
      }
    }
  }
  // A string allows no whitespace around it and ends within its maxLength:
  // every answer is whole.
  const Json name = {{"type", "string"}, {"minLength", 2}, {"maxLength", 12}};
  for (bool stream : {false, true}) {
    for (const auto& [text, finish] : Answers(frontend_.address(), name, stream)) {
      SCOPED_TRACE(text);
      EXPECT_EQ(finish, "stop");
      const Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(doc.is_string());
      const std::string value = doc;
      const auto chars =
          std::count_if(value.begin(), value.end(), [](char c) { return (c & 0xC0) != 0x80; });
      EXPECT_GE(chars, 2);
      EXPECT_LE(chars, 12);
    }
  }
  // The masks of a state met again (the whitespace between members, the
  // inside of a string) came from the worker's cache; each mask is counted
  // once and took host time.
  const double kept = ScrapeMetric(worker_, R"(tandem_worker_grammar_masks_total{source="cache"})");
  const double walked =
      ScrapeMetric(worker_, R"(tandem_worker_grammar_masks_total{source="walk"})");
  EXPECT_GT(walked, 0);
  EXPECT_GT(kept, walked);
  EXPECT_GT(ScrapeMetric(worker_, "tandem_worker_grammar_mask_seconds_total"), 0);
  EXPECT_GT(ScrapeMetric(worker_, "tandem_worker_grammar_mask_cache_bytes"), 0);
}

// vLLM's structured_outputs.disable_any_whitespace: the answer is written
// as Python's json.dumps writes it. Without the whitespace random32k favours,
// every Person closes well within max_tokens.
TEST_F(FrontendStructuredOutputsTest, WithoutAnyWhitespaceAnAnswerIsWrittenAsJsonDumpsWritesIt) {
  // The text with every string literal emptied: what is left is the
  // separators and the other values.
  const RE2 string_literal(R"re("(?:[^"\\]|\\.)*")re");
  for (bool stream : {false, true}) {
    const Json body = {
        {"messages", {{{"role", "user"}, {"content", "Who are you? Answer in JSON."}}}},
        {"structured_outputs", {{"json", kPerson}, {"disable_any_whitespace", true}}},
        {"n", 4},
        {"temperature", 1.0},
        {"seed", 5},
        {"max_tokens", 200},
        {"stream", stream}};
    const HttpResult r = Post(frontend_.address(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.raw;
    std::vector<std::pair<std::string, std::string>> answers;
    if (stream) {
      for (auto& [index, answer] : StreamedAnswers(r.raw)) answers.push_back(answer);
    } else {
      for (const Json& c : r.body["choices"]) {
        answers.emplace_back(c["message"]["content"], c["finish_reason"]);
      }
    }
    ASSERT_EQ(answers.size(), 4u);
    for (const auto& [text, finish] : answers) {
      SCOPED_TRACE(text);
      EXPECT_EQ(finish, "stop");
      ExpectPerson(text);
      std::string skeleton = text;
      RE2::GlobalReplace(&skeleton, string_literal, "\"\"");
      // {"": N, "": "", "": true} (kPerson is a Json: its properties go out
      // in key order, age first): each separator with its one space, no
      // other whitespace.
      EXPECT_TRUE(
          RE2::FullMatch(skeleton, R"re(\{"": (0|[1-9][0-9]*), "": "", "": (true|false)\})re"))
          << skeleton;
    }
  }
}

// tool_choice named and "required" on the real model: a named tool's one
// call has arguments that begin its parameters' document (whole when the
// choice stops); "required" answers calls of the tools with their
// parameters, or, cut by max_tokens, the beginning of the list as content.
TEST_F(FrontendStructuredOutputsTest, AForcedToolChoiceAnswersCallsOfTheTools) {
  const Json tools = {
      {{"type", "function"}, {"function", {{"name", "lookup"}, {"parameters", kPerson}}}},
      {{"type", "function"}, {"function", {{"name", "ping"}}}}};
  Json body = {{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}},
               {"tools", tools},
               {"tool_choice", {{"type", "function"}, {"function", {{"name", "lookup"}}}}},
               {"n", 4},
               {"temperature", 1.0},
               {"seed", 5},
               {"max_tokens", 200}};
  HttpResult r = Post(frontend_.address(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  for (const Json& c : r.body["choices"]) {
    SCOPED_TRACE(c.dump());
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
    const Json& call = c["message"]["tool_calls"][0]["function"];
    EXPECT_EQ(call["name"], "lookup");
    EXPECT_TRUE(Begins(kPerson, call["arguments"]));
    if (c["finish_reason"] == "stop") {
      ExpectPerson(call["arguments"]);
    } else {
      EXPECT_EQ(c["finish_reason"], "length");
    }
  }
  // vLLM's schema for "required" (its _get_json_schema_from_tool).
  Json alternatives = Json::array();
  for (const auto& [name, parameters] :
       {std::pair{"lookup", kPerson},
        std::pair{"ping", Json{{"type", "object"}, {"properties", Json::object()}}}}) {
    alternatives.push_back(
        {{"type", "object"},
         {"properties",
          {{"name", {{"type", "string"}, {"enum", {name}}}}, {"parameters", parameters}}},
         {"required", {"name", "parameters"}}});
  }
  const Json required = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", alternatives}}}};
  body["tool_choice"] = "required";
  body["max_tokens"] = 100;
  r = Post(frontend_.address(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  for (const Json& c : r.body["choices"]) {
    SCOPED_TRACE(c.dump());
    if (c["finish_reason"] == "length") {
      EXPECT_TRUE(Begins(required, c["message"]["content"]));
      EXPECT_FALSE(c["message"].contains("tool_calls"));
      continue;
    }
    EXPECT_EQ(c["finish_reason"], "tool_calls");
    EXPECT_EQ(c["message"]["content"], "");
    ASSERT_FALSE(c["message"]["tool_calls"].empty());
    for (const Json& t : c["message"]["tool_calls"]) {
      if (t["function"]["name"] == "ping") {
        EXPECT_EQ(t["function"]["arguments"], "{}");
      } else {
        EXPECT_EQ(t["function"]["name"], "lookup");
        ExpectPerson(t["function"]["arguments"]);
      }
    }
  }
}

TEST_F(FrontendStructuredOutputsTest, AnEnumIsAnsweredWithOneOfItsValues) {
  const Json schema = {{"enum", {"yes", "no", 42}}};
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    Json body = {
        {"structured_outputs", {{"json", schema}}}, {"max_tokens", 50}, {"temperature", 0}};
    if (std::string(path) == "/v1/completions") {
      body["prompt"] = "Is it so?";
    } else {
      body["messages"] = {{{"role", "user"}, {"content", "Is it so?"}}};
    }
    const HttpResult r = Post(frontend_.address(), path, body);
    ASSERT_EQ(r.status, 200) << r.raw;
    const Json& c = r.body["choices"][0];
    const std::string text = c.contains("text") ? c["text"] : c["message"]["content"];
    EXPECT_EQ(c["finish_reason"], "stop") << text;
    EXPECT_TRUE(text == "\"yes\"" || text == "\"no\"" || text == "42") << text;
  }
}

// vLLM's structured_outputs.choice: raw text, exactly one of the strings
// ("pos" begins "positive": it may end there or go on).
TEST_F(FrontendStructuredOutputsTest, AChoiceIsAnsweredWithOneOfItsStrings) {
  const std::vector<std::string> choices = {"positive", "negative", "pos", "n/a \"x\""};
  std::set<std::string> seen;
  for (bool stream : {false, true}) {
    const Json body = {{"prompt", "The review was"},
                       {"structured_outputs", {{"choice", choices}}},
                       {"n", 6},
                       {"temperature", 1.0},
                       {"seed", stream ? 5 : 6},
                       {"max_tokens", 50},
                       {"stream", stream}};
    const auto answers = CompletionAnswers(frontend_.address(), body);
    ASSERT_EQ(answers.size(), 6u) << body;
    for (const auto& [index, answer] : answers) {
      const auto& [text, finish] = answer;
      EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << text;
      EXPECT_EQ(finish, "stop") << text;
      seen.insert(text);
    }
  }
  EXPECT_GE(seen.size(), 2u);
  // An empty choice is a 400 naming the field.
  const HttpResult bad = Post(frontend_.address(), "/v1/completions",
                              {{"prompt", "x"}, {"structured_outputs", {{"choice", {"a", ""}}}}});
  EXPECT_EQ(bad.status, 400) << bad.raw;
  EXPECT_EQ(bad.body["error"]["param"], "structured_outputs.choice") << bad.raw;
}

// structured_outputs.regex: every answer, whole or streamed, is text RE2
// matches whole, ended by the grammar ("stop") well before max_tokens.
TEST_F(FrontendStructuredOutputsTest, ARegexAnswerIsTextThePatternMatches) {
  const std::string pattern = R"((Yes|No), [a-z]{2,8}( [a-z]{2,8}){0,3}\.)";
  const RE2 re(pattern);
  ASSERT_TRUE(re.ok());
  std::set<std::string> seen;
  for (bool stream : {false, true}) {
    const Json body = {{"prompt", "Answer:"},
                       {"structured_outputs", {{"regex", pattern}}},
                       {"n", 4},
                       {"temperature", 1.0},
                       {"seed", stream ? 7 : 8},
                       {"max_tokens", 60},
                       {"stream", stream}};
    const auto answers = CompletionAnswers(frontend_.address(), body);
    ASSERT_EQ(answers.size(), 4u) << body;
    for (const auto& [index, answer] : answers) {
      const auto& [text, finish] = answer;
      EXPECT_TRUE(RE2::FullMatch(text, re)) << "'" << text << "'";
      EXPECT_EQ(finish, "stop") << text;
      seen.insert(text);
    }
  }
  EXPECT_GE(seen.size(), 4u);
  const HttpResult bad = Post(frontend_.address(), "/v1/completions",
                              {{"prompt", "x"}, {"structured_outputs", {{"regex", "(\\w+) \\1"}}}});
  EXPECT_EQ(bad.status, 400) << bad.raw;
  EXPECT_EQ(bad.body["error"]["param"], "structured_outputs.regex") << bad.raw;
  EXPECT_NE(bad.raw.find("back-reference"), std::string::npos) << bad.raw;
}

// structured_outputs.grammar (xgrammar's EBNF): every answer, whole or
// streamed, is text of the grammar (RE2 checks the same language written as
// one pattern), ended by the grammar; a grammar that is refused is a 400
// naming the field and why.
TEST_F(FrontendStructuredOutputsTest, AGrammarAnswerIsTextOfTheGrammar) {
  const std::string grammar =
      "root ::= answer \", \" words \".\"\n"
      "answer ::= \"Yes\" | \"No\"\n"
      "words ::= word (\" \" word){0,3}\n"
      "word ::= [a-z]{2,8}\n";
  const RE2 re(R"((Yes|No), [a-z]{2,8}( [a-z]{2,8}){0,3}\.)");
  ASSERT_TRUE(re.ok());
  std::set<std::string> seen;
  for (bool stream : {false, true}) {
    const Json body = {{"prompt", "Answer:"},
                       {"structured_outputs", {{"grammar", grammar}}},
                       {"n", 4},
                       {"temperature", 1.0},
                       {"seed", stream ? 7 : 8},
                       {"max_tokens", 60},
                       {"stream", stream}};
    const auto answers = CompletionAnswers(frontend_.address(), body);
    ASSERT_EQ(answers.size(), 4u) << body;
    for (const auto& [index, answer] : answers) {
      const auto& [text, finish] = answer;
      EXPECT_TRUE(RE2::FullMatch(text, re)) << "'" << text << "'";
      EXPECT_EQ(finish, "stop") << text;
      seen.insert(text);
    }
  }
  EXPECT_GE(seen.size(), 4u);
  const HttpResult bad =
      Post(frontend_.address(), "/v1/completions",
           {{"prompt", "x"}, {"structured_outputs", {{"grammar", "root ::= root \"a\" | \"b\""}}}});
  EXPECT_EQ(bad.status, 400) << bad.raw;
  EXPECT_EQ(bad.body["error"]["param"], "structured_outputs.grammar") << bad.raw;
  EXPECT_NE(bad.raw.find("left recursion"), std::string::npos) << bad.raw;
}

// A schema the grammar compiles but cannot go on with (300 alike string
// branches: more readings at its first byte than the matcher holds) ends its
// request with an error that says so, never an empty answer that "stopped";
// the services go on serving.
TEST_F(FrontendStructuredOutputsTest, ADocumentNoTokenCanContinueIsAnErrorNotAnAnswer) {
  Json branches = Json::array();
  for (int i = 0; i < 300; ++i) branches.push_back({{"type", "string"}});
  for (bool stream : {false, true}) {
    const HttpResult r = Post(frontend_.address(), "/v1/completions",
                              {{"prompt", "x"},
                               {"structured_outputs", {{"json", {{"anyOf", branches}}}}},
                               {"max_tokens", 8},
                               {"stream", stream}});
    EXPECT_NE(r.raw.find("the json_schema's readings passed 256 at once"), std::string::npos)
        << r.raw;
    EXPECT_EQ(r.raw.find("\"finish_reason\":\"stop\""), std::string::npos) << r.raw;
    if (!stream) {
      EXPECT_EQ(r.status, 500) << r.raw;
    }
  }
  const HttpResult fine =
      Post(frontend_.address(), "/v1/completions",
           {{"prompt", "x"}, {"structured_outputs", {{"choice", {"a", "b"}}}}, {"max_tokens", 8}});
  EXPECT_EQ(fine.status, 200) << fine.raw;
}

TEST_F(FrontendStructuredOutputsTest, WhatTheGrammarCannotHoldIsA400NamingTheField) {
  const Json body = {
      {"prompt", "x"},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema", {{"name", "n"}, {"schema", {{"type", "string"}, {"format", "email"}}}}}}}};
  const HttpResult r = Post(frontend_.address(), "/v1/completions", body);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(r.body["error"]["param"], "response_format.json_schema.schema") << r.raw;
  EXPECT_NE(
      r.body["error"]["message"].get<std::string>().find("'format' \"email\": xgrammar's email"),
      std::string::npos)
      << r.raw;
}

}  // namespace
}  // namespace tandem::testing
