// vLLM's hermes tool-call parser (tool_calls.h): what it takes out of an
// answer's text and what it leaves, Python's json.dumps of the arguments,
// and the stream that holds a call back so that streamed and whole answers
// agree for every way the text is cut into deltas.
#include "tandem/frontend/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "python_json.h"
#include "vllm_tool_reference.h"

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

// Python's json.loads then json.dumps, as vLLM rewrites a call's arguments.
TEST(ToolCallsTest, ArgumentsAreWrittenAsPythonsJsonDumps) {
  auto redump = [](std::string_view json, bool ascii = false) {
    const std::optional<internal::PyJson> v = internal::PyJsonLoads(json);
    if (!v) return std::string("<refused>");
    return internal::PyJsonDumps(*v, ascii).value_or("<unencodable>");
  };
  EXPECT_EQ(redump(R"({"b":{"z":[],"a":{}},"a":[1,[2,3]],"s":"q\"\\é\u0001\/"})"),
            R"({"b": {"z": [], "a": {}}, "a": [1, [2, 3]], "s": "q\"\\é\u0001/"})");
  EXPECT_EQ(redump("[1.0, 1e20, 0.1, -0.5, 12345678901234, 1e15, -0, -0.0, 1E400]"),
            "[1.0, 1e+20, 0.1, -0.5, 12345678901234, 1000000000000000.0, 0, -0.0, Infinity]");
  // What Python reads and nlohmann would not: NaN, Infinity, big integers.
  EXPECT_EQ(redump("[NaN, -Infinity, 123456789012345678901234567890]"),
            "[NaN, -Infinity, 123456789012345678901234567890]");
  // A repeated key: its first place, its last value.
  EXPECT_EQ(redump(R"({"a": 1, "b": 2, "a": 3})"), R"({"a": 3, "b": 2})");
  // Surrogate pairs join; ensure_ascii writes them back as pairs.
  EXPECT_EQ(redump(R"(["\ud83d\ude00é\u007f"])"), "[\"😀é\x7f\"]");
  EXPECT_EQ(redump(R"(["\ud83d\ude00é\u007f"])", true), R"(["\ud83d\ude00\u00e9\u007f"])");
  // What Python refuses: trailing commas, control characters, bad escapes,
  // extra data.
  for (const char* bad : {"[1,]", "{\"a\":1,}", "[\"a\nb\"]", R"(["\x41"])", "[1] 2", "[01]",
                          "[.5]", "[1.]", "{'a': 1}"}) {
    EXPECT_EQ(redump(bad), "<refused>") << bad;
  }
  // A lone surrogate: Python reads it, and vLLM cannot send it; one a later
  // value of its key replaces is gone before anything is written.
  EXPECT_EQ(redump(R"(["\ud800"])"), "<unencodable>");
  EXPECT_EQ(redump(R"({"\udc00x": 1})"), "<unencodable>");
  EXPECT_EQ(redump(R"({"a": "\ud83dx", "a": 2})"), R"({"a": 2})");
  EXPECT_EQ(redump(" \n[1]\t "), "[1]");
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

// tool_choice "required" and named (the output held to the calls' JSON), as
// vLLM's _parse_tool_calls_from_content reads them: a named call's arguments
// are the text as it is; "required"'s parameters are json.dumps'd; the
// content is "" with calls; a list cut short has none and is the content.
// A stream holds everything and ends with the same.
TEST(ToolCallsTest, AForcedToolChoicesAnswerIsItsCalls) {
  using Calls = std::vector<std::pair<std::string, std::string>>;
  const ForcedToolChoice named{.name = "get_weather"};
  const std::string arguments = "{ \"city\":\"Z\u00fcrich\" ,\"days\": 2}";
  ExtractedToolCalls e = ExtractForcedToolCalls(named, arguments);
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"get_weather", arguments}}));
  EXPECT_EQ(e.content, "");
  EXPECT_EQ(e.calls[0].id.rfind("chatcmpl-tool-", 0), 0u);

  const ForcedToolChoice required;
  e = ExtractForcedToolCalls(required,
                             "[{\"name\": \"f\", \"parameters\": {\"x\":1.50,\"s\":\"\\u00e9\"}},\n"
                             " {\"name\":\"g\",\"parameters\":{}}]");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"f", "{\"x\": 1.5, \"s\": \"\u00e9\"}"}, {"g", "{}"}}));
  EXPECT_EQ(e.content, "");
  for (const std::string& cut : {std::string("[{\"name\": \"f\", \"param"), std::string("[]"),
                                 std::string("[{\"name\": 1, \"parameters\": {}}]")}) {
    e = ExtractForcedToolCalls(required, cut);
    EXPECT_TRUE(e.calls.empty()) << cut;
    EXPECT_EQ(e.content, cut);
  }

  std::mt19937 rng(9);
  for (const auto& [forced, text] :
       {std::pair{named, arguments},
        std::pair{required, std::string("[{\"name\":\"f\",\"parameters\":{}}]")},
        std::pair{required, std::string("[{\"name\":\"f\",")}}) {
    const ExtractedToolCalls whole = ExtractForcedToolCalls(forced, text);
    ToolCallStream stream(forced);
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::min<size_t>(1 + rng() % 5, text.size() - at);
      EXPECT_EQ(stream.Push(text.substr(at, n)), "") << "nothing goes out before the end";
      at += n;
    }
    const ExtractedToolCalls end = stream.Finish();
    EXPECT_EQ(end.content.value_or(""), whole.content.value_or("")) << text;
    ASSERT_EQ(end.calls.size(), whole.calls.size()) << text;
    for (size_t i = 0; i < end.calls.size(); ++i) {
      EXPECT_EQ(end.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(end.calls[i].arguments, whole.calls[i].arguments);
    }
  }
}

// llama3_json: vLLM's pattern (objects nesting one level, joined by ";"),
// "parameters" or "arguments", content null with calls, and its quirks:
// braces inside strings count, a ";" inside a string splits.
TEST(ToolCallsTest, Llama3JsonCallsAreEveryObjectVllmDecodes) {
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
  // Any depth, and strings with braces and semicolons in them.
  e = extract(R"({"name": "f", "parameters": {"a": {"b": {"c": "x;}{"}}}})");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"f", R"({"a": {"b": {"c": "x;}{"}}})"}}));
  // A "{" right after an object is skipped (vLLM's end index is inclusive),
  // so the next call's inner object is read, and it is no call.
  const std::string adjacent =
      R"({"name": "a", "arguments": {}}{"name": "b", "arguments": {"x": 1}})";
  EXPECT_EQ(extract(adjacent).content, adjacent);
  for (const std::string bad :
       {R"({"name": "f"})", R"({"parameters": {}})", R"(use {x} here)",
        R"({"name": "f", "parameters": {}} and {oops})", R"({"name": 7, "parameters": {}})"}) {
    e = extract(bad);
    EXPECT_TRUE(e.calls.empty()) << bad;
    EXPECT_EQ(e.content, bad);
  }
  EXPECT_EQ(ToolParserNamed("llama4_json"), ToolParser::kLlama3Json);
  EXPECT_EQ(ToolParserNamed("hermes"), ToolParser::kHermes);
  EXPECT_EQ(ToolParserNamed("mistral"), ToolParser::kMistral);
  EXPECT_FALSE(ToolParserNamed("granite"));
}

TEST(ToolCallsTest, MistralCallsFollowTheToolCallsTag) {
  using Calls = std::vector<std::pair<std::string, std::string>>;
  auto extract = [](std::string_view text) { return ExtractToolCalls(ToolParser::kMistral, text); };
  ExtractedToolCalls e =
      extract(R"(Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, )"
              R"({"name": "now", "arguments": {}}] )");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"get_weather", R"({"city": "Paris"})"}, {"now", "{}"}}));
  EXPECT_EQ(e.content, "Checking. ");
  for (const ToolCall& c : e.calls) {  // Mistral's ids: 9 letters and digits
    EXPECT_EQ(c.id.size(), 9u) << c.id;
    EXPECT_TRUE(std::all_of(c.id.begin(), c.id.end(), [](char ch) { return std::isalnum(ch); }));
  }
  EXPECT_NE(e.calls[0].id, e.calls[1].id);
  // What follows the list makes vLLM fall back to its regex, which passes
  // string arguments as they are.
  e = extract(R"([TOOL_CALLS][{"name": "f", "arguments": "{\"a\": 1}"}] done)");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"f", R"({"a": 1})"}}));
  EXPECT_FALSE(e.content.has_value());
  for (const std::string& bad :
       {std::string("No tag."), std::string(R"([TOOL_CALLS][{"name": "f", "arguments": {}}] x)"),
        std::string(R"([TOOL_CALLS]{"name": "f", "arguments": {}})"),
        std::string(R"([TOOL_CALLS][{"name": "f", "arguments": {}}][TOOL_CALLS])"),
        std::string(R"(a [TOOL_CALLS] not json)")}) {
    e = extract(bad);
    EXPECT_TRUE(e.calls.empty()) << bad;
    EXPECT_EQ(e.content, bad);
  }
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

// Random hermes and llama3_json answers in the shapes models write, and
// broken ones: JSON with Python's edge values (NaN, Infinity, big and
// negative-zero integers, exponents, escapes, surrogate pairs, repeated
// keys), objects nested deep, text around and between the calls.
class JsonAnswerGenerator : public testing::RandomText {
 public:
  using RandomText::RandomText;

  std::string Answer(ToolParser parser) {
    std::string out = Pick({"", "", "", "Sure! ", "Let me check.\n", "{x} ", "<|python_tag|>"});
    const int n = 1 + Int(3);
    if (parser == ToolParser::kMistral) {
      out += "[TOOL_CALLS]" + Pick({" [", "[", "\n[ ", " ", " [", " ["});
      for (int k = 0; k < n; ++k) out += (k > 0 ? Pick({", ", ",", " "}) : "") + Call(parser);
      out += Pick({"]", "]", "]", "] ", "", "]}"});
      if (Chance(0.05)) out += "[TOOL_CALLS]";
    }
    for (int k = 0; k < n && parser != ToolParser::kMistral; ++k) {
      if (parser == ToolParser::kHermes) {
        if (k > 0) out += Pick({"\n", "", " and "});
        out += "<tool_call>" + Pick({"\n", "", " "}) + Call(parser) + Pick({"\n", "", " "});
        if (k + 1 < n || Chance(0.8)) out += "</tool_call>";
      } else {
        if (k > 0) out += Pick({"; ", ";", " ", "\n", "", " ; "});
        out += Call(parser);
      }
    }
    out += Pick({"", "", "", " ok", "\n{oops}", " }", "\n"});
    if (Chance(0.2)) Mutate(&out, {"{", "}", "\"", ",", ":", "\\", " ", "[", "]", "\n"});
    return out;
  }

 private:
  std::string Call(ToolParser parser) {
    std::vector<std::string> members;
    members.push_back("\"name\"" + Pick({": ", ":", " : "}) +
                      (Chance(0.95) ? Pick({"\"get_weather\"", "\"f\"", "\"search\"", "\"é\""})
                                    : Pick({"7", "null", "[\"f\"]"})));
    const char* key = parser != ToolParser::kLlama3Json || Chance(0.5) ? "arguments" : "parameters";
    if (Chance(0.97)) members.push_back("\"" + std::string(key) + "\": " + Value(0));
    if (Chance(0.1)) members.push_back("\"name\": \"g\"");  // a repeated key
    if (Chance(0.5)) std::swap(members.front(), members.back());
    std::string out = "{";
    for (size_t k = 0; k < members.size(); ++k) out += (k > 0 ? ", " : "") + members[k];
    return out + "}";
  }

  std::string Value(int depth) {
    switch (depth > 3 ? Int(4) : Int(9)) {
      case 0:
        return String();
      case 1:
        return Pick({"0", "-0", "7", "-12", "12345678901234567890123", "1.5", "-0.0", "1e15",
                     "1E16", "1e-5", "2.5e-310", "1E400", "-1e400", "0.1", "100.0", "3.0e2"});
      case 2:
        return Pick({"true", "false", "null", "NaN", "Infinity", "-Infinity"});
      case 3:
        return Pick({"[]", "{}", "[ ]", "{ }"});
      case 4:
      case 5: {
        std::string out = "[";
        const int n = Int(4);
        for (int k = 0; k < n; ++k) out += (k > 0 ? Pick({", ", ","}) : "") + Value(depth + 1);
        return out + "]";
      }
      default: {
        std::string out = "{";
        const int n = Int(4);
        for (int k = 0; k < n; ++k) {
          out += (k > 0 ? Pick({", ", ","}) : "") + Pick({"\"city\"", "\"a\"", "\"a\"", "\"é\""}) +
                 Pick({": ", ":"}) + Value(depth + 1);
        }
        return out + "}";
      }
    }
  }

  std::string String() {
    std::string out = "\"";
    const int n = Int(4);
    for (int k = 0; k < n; ++k) {
      out += Pick({"Paris", " ", "é", "😀", "\\n", "\\\"", "\\\\", "\\/", "\\u00e9",
                   "\\ud83d\\ude00", "\\u0000", "{", "}", ";", "<tool_call>", "\\t"});
    }
    return out + "\"";
  }
};

// A model can write brackets a hundred thousand deep: Python's parsers give
// up (content), and ours must too, without running out of stack.
TEST(ToolCallsTest, DeepNestingIsContentNotACrash) {
  const std::string deep(100000, '[');
  const std::string deep_braces(100000, '{');
  for (const auto& [parser, text] : std::vector<std::pair<ToolParser, std::string>>{
           {ToolParser::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": " + deep},
           {ToolParser::kLlama3Json, "{\"name\": \"f\", \"parameters\": " + deep},
           {ToolParser::kLlama3Json, deep_braces},
           {ToolParser::kMistral, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": " + deep},
           {ToolParser::kPythonic, "[f(a=" + deep + "1" + std::string(100000, ']') + ")]"},
           {ToolParser::kPythonic, "[f(a=" + std::string(100000, '(') + "1)]"},
           {ToolParser::kPythonic, "[f(a=1), g(" + std::string(100000, '-') + "1)]"}}) {
    const ExtractedToolCalls e = ExtractToolCalls(parser, text);
    EXPECT_TRUE(e.calls.empty()) << text.substr(0, 40);
    EXPECT_EQ(e.content, text);
  }
  // Within Python's limits nesting still reads.
  const ExtractedToolCalls nested = ExtractToolCalls(
      ToolParser::kPythonic, "[f(a=" + std::string(150, '[') + std::string(150, ']') + ")]");
  ASSERT_EQ(nested.calls.size(), 1u);
}

// hermes, llama3_json and mistral.
TEST(ToolCallsTest, GeneratedJsonAnswersMatchVllmsStepsRunByPython) {
  std::vector<testing::ReferenceCase> cases;
  JsonAnswerGenerator gen(testing::GeneratorSeed(20261203));
  for (int k = 0; k < 4500; ++k) {
    const ToolParser parser = std::vector<ToolParser>{ToolParser::kHermes, ToolParser::kLlama3Json,
                                                      ToolParser::kMistral}[k % 3];
    cases.push_back({parser, gen.Answer(parser)});
  }
  const testing::ReferenceTally tally = testing::ExpectVllmsCalls(cases);
  EXPECT_EQ(tally.mismatches, 0);
  EXPECT_GT(tally.with_calls, 900);  // both kinds of answer
  EXPECT_LT(tally.with_calls, 4000);
}

}  // namespace
}  // namespace tandem::frontend
