// vLLM's hermes tool-call parser (tool_calls.h): what it takes out of an
// answer's text and what it leaves, Python's json.dumps of the arguments,
// and the stream that holds a call back so that streamed and whole answers
// agree for every way the text is cut into deltas.
#include "tandem/frontend/tool_calls.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::ordered_json;

std::vector<std::pair<std::string, std::string>> NamesAndArguments(const ExtractedToolCalls& e) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const ToolCall& c : e.calls) out.emplace_back(c.name, c.arguments);
  return out;
}

TEST(ToolCallsTest, HermesCallsAreTakenOutAndTheTextBeforeIsTheContent) {
  using Calls = std::vector<std::pair<std::string, std::string>>;
  // No tag: all content.
  ExtractedToolCalls e = ExtractToolCalls(ToolParser::kHermes, "It is sunny.");
  EXPECT_TRUE(e.calls.empty());
  EXPECT_EQ(e.content, "It is sunny.");
  // One call, text before it: the content; the arguments as json.dumps.
  e = ExtractToolCalls(
      ToolParser::kHermes,
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\":\"Paris\",\"days\":[1,2.5],\"metric\":true,\"note\":null}}\n</tool_call>");
  EXPECT_EQ(NamesAndArguments(e),
            (Calls{{"get_weather",
                    R"({"city": "Paris", "days": [1, 2.5], "metric": true, "note": null})"}}));
  EXPECT_EQ(e.content, "Let me check.\n");
  ASSERT_EQ(e.calls.size(), 1u);
  EXPECT_EQ(e.calls[0].id.rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(e.calls[0].id.size(), std::string("chatcmpl-tool-").size() + 32);
  // Two calls, nothing before: content null; text between and after them is
  // not content (vLLM keeps only what precedes the first tag); a last call
  // left open to the end still counts.
  e = ExtractToolCalls(ToolParser::kHermes,
                       "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\nand\n"
                       "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": \"é\\n\"}}");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"a", "{}"}, {"b", "{\"x\": \"é\\n\"}"}}));
  EXPECT_FALSE(e.content.has_value());
  EXPECT_NE(e.calls[0].id, e.calls[1].id);
  // Arguments given as a string stay a JSON string (json.dumps of a str).
  e = ExtractToolCalls(ToolParser::kHermes,
                       R"(<tool_call>{"name": "f", "arguments": "{\"k\": 1}"}</tool_call>)");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"f", R"("{\"k\": 1}")"}}));
  // Any call that does not parse: no call, the whole text is the content.
  for (const std::string bad :
       {"<tool_call>{\"name\": \"f\"}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
        "x<tool_call>{\"name\": \"f\", \"arguments\": {}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>oops</tool_call>",
        "<tool_call>[1]</tool_call>"}) {
    e = ExtractToolCalls(ToolParser::kHermes, bad);
    EXPECT_TRUE(e.calls.empty()) << bad;
    EXPECT_EQ(e.content, bad);
  }
}

TEST(ToolCallsTest, ArgumentsAreWrittenAsPythonsJsonDumps) {
  EXPECT_EQ(PythonJsonDumps(Json::parse(R"({"b":{"z":[],"a":{}},"a":[1,[2,3]],"s":"q\"\\é\u0001"})")),
            R"({"b": {"z": [], "a": {}}, "a": [1, [2, 3]], "s": "q\"\\é\u0001"})");
  EXPECT_EQ(PythonJsonDumps(Json::parse("[1.0, 1e20, 0.1, -0.5, 12345678901234]")),
            "[1.0, 1e+20, 0.1, -0.5, 12345678901234]");
}

// Pushes `answer` into a stream in random pieces of 1 to `max_piece` bytes:
// the content it let out, the end's included, and the end.
std::pair<std::string, ExtractedToolCalls> StreamInPieces(ToolParser parser,
                                                          const std::string& answer,
                                                          std::mt19937& rng, size_t max_piece) {
  ToolCallStream stream(parser);
  std::string content;
  for (size_t at = 0; at < answer.size();) {
    const size_t n = 1 + rng() % max_piece;
    const std::string out = stream.Push(answer.substr(at, n));
    EXPECT_EQ(out.find("<tool_call>"), std::string::npos) << "a tag went out as content";
    content += out;
    at += n;
  }
  ExtractedToolCalls end = stream.Finish();
  content += end.content.value_or("");
  return {content, std::move(end)};
}

// The stream lets out exactly the text before the first tag, holding back a
// tail that may begin one, and at the end gives what the whole-text
// extraction gives: for every cut of the text into deltas.
TEST(ToolCallsTest, AStreamGivesTheWholeAnswersContentAndCallsForAnyCut) {
  const std::vector<std::string> answers = {
      "Plain text with a < and <tool and <tool_cal but no tag.",
      "Let me check.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"g\", "
      "\"arguments\": [1]}",
      "Broken <tool_call>{\"name\": \"f\"</tool_call> after",
      "ends in a partial tag <tool_"};
  std::mt19937 rng(5);
  for (const std::string& answer : answers) {
    const ExtractedToolCalls whole = ExtractToolCalls(ToolParser::kHermes, answer);
    for (int trial = 0; trial < 50; ++trial) {
      const auto [content, end] = StreamInPieces(ToolParser::kHermes, answer, rng, 7);
      EXPECT_EQ(content, whole.content.value_or("")) << answer;
      ASSERT_EQ(end.calls.size(), whole.calls.size()) << answer;
      for (size_t i = 0; i < end.calls.size(); ++i) {
        EXPECT_EQ(end.calls[i].name, whole.calls[i].name);
        EXPECT_EQ(end.calls[i].arguments, whole.calls[i].arguments);
      }
    }
  }
}

// llama3_json: vLLM's pattern (objects nesting one level, joined by ";"),
// "parameters" or "arguments", content null with calls, and its quirks:
// braces inside strings count, a ";" inside a string splits.
TEST(ToolCallsTest, Llama3JsonCallsFollowVllmsPattern) {
  using Calls = std::vector<std::pair<std::string, std::string>>;
  auto extract = [](std::string_view text) {
    return ExtractToolCalls(ToolParser::kLlama3Json, text);
  };
  ExtractedToolCalls e = extract("No call here.");
  EXPECT_TRUE(e.calls.empty());
  EXPECT_EQ(e.content, "No call here.");
  e = extract(R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 2}})");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"get_weather", R"({"city": "Paris", "days": 2})"}}));
  EXPECT_FALSE(e.content.has_value());
  e = extract(R"(Sure! {"name": "a", "parameters": {}} ;  {"name": "b", "arguments": [1,2]} ok)");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"a", "{}"}, {"b", "[1, 2]"}}));
  EXPECT_FALSE(e.content.has_value()) << "null, whatever surrounds the calls";
  for (const std::string bad :
       {R"({"name": "f", "parameters": {"a": {"b": 1}}})",  // the match is the inner object
        R"({"name": "f"})", R"({"parameters": {}})", R"(use {x} here)",
        R"({"name": "f", "parameters": {"s": "a;b"}})",  // split inside the string
        R"({"name": 7, "parameters": {}})"}) {
    e = extract(bad);
    EXPECT_TRUE(e.calls.empty()) << bad;
    EXPECT_EQ(e.content, bad);
  }
  EXPECT_EQ(ToolParserNamed("llama4_json"), ToolParser::kLlama3Json);
  EXPECT_EQ(ToolParserNamed("hermes"), ToolParser::kHermes);
  EXPECT_FALSE(ToolParserNamed("mistral"));
}

// llama3_json streams as vLLM's: an answer that starts with "{" (or the
// python tag) is held and extracted at the end, as the whole answer is;
// any other streams as content, calls or not.
TEST(ToolCallsTest, Llama3JsonStreamsHoldOnlyAnAnswerThatStartsAsACall) {
  std::mt19937 rng(9);
  for (const std::string& answer :
       {std::string(R"({"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}})"),
        std::string(R"(<|python_tag|>{"name": "a", "parameters": {}})"),
        std::string(R"({not a call})"), std::string(R"(Sure: {"name": "a", "parameters": {}})"),
        std::string("<|pyth"), std::string("<b>plain</b>")}) {
    const bool as_call = answer[0] == '{' || answer.rfind("<|python_tag|>", 0) == 0;
    const ExtractedToolCalls whole = ExtractToolCalls(ToolParser::kLlama3Json, answer);
    for (int trial = 0; trial < 30; ++trial) {
      const auto [content, end] = StreamInPieces(ToolParser::kLlama3Json, answer, rng, 5);
      if (as_call) {
        EXPECT_EQ(content, whole.content.value_or("")) << answer;
        EXPECT_EQ(NamesAndArguments(end), NamesAndArguments(whole)) << answer;
      } else {
        EXPECT_EQ(content, answer);
        EXPECT_TRUE(end.calls.empty()) << answer;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::frontend
