// vLLM's pythonic and llama4_pythonic tool-call parsers
// (pythonic_tool_calls.h): what they take out of an answer, written cases
// first, then thousands of generated and mutated answers held to vLLM's
// own steps run by Python's ast and json (vllm_tool_parsers.py).
#include "pythonic_tool_calls.h"

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "python_json.h"
#include "tandem/frontend/tool_calls.h"
#include "vllm_tool_reference.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::json;
using Calls = std::vector<std::pair<std::string, std::string>>;

Calls NamesAndArguments(const ExtractedToolCalls& e) {
  Calls out;
  for (const ToolCall& c : e.calls) out.emplace_back(c.name, c.arguments);
  return out;
}

Calls Pythonic(const std::string& text) {
  return NamesAndArguments(ExtractToolCalls(ToolParser::kPythonic, text));
}

TEST(PythonicToolCallsTest, AListOfCallsGivesItsKeywordArgumentsAsJsonDumps) {
  EXPECT_EQ(Pythonic(R"([get_weather(city="Paris", days=[1, 2.5], metric=True, note=None)])"),
            (Calls{{"get_weather",
                    R"({"city": "Paris", "days": [1, 2.5], "metric": true, "note": null})"}}));
  const ExtractedToolCalls two =
      ExtractToolCalls(ToolParser::kPythonic, "[now(), search(q='it\\'s',\n  n=3,)]\n");
  EXPECT_EQ(NamesAndArguments(two), (Calls{{"now", "{}"}, {"search", R"({"q": "it's", "n": 3})"}}));
  EXPECT_FALSE(two.content.has_value()) << "content is null with calls";
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[0].id.rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_NE(two.calls[0].id, two.calls[1].id);
  // Numbers as Python reads them and json.dumps writes them.
  EXPECT_EQ(Pythonic("[f(a=1e15, b=1e16, c=0.0001, d=1e-5, e=1_000.5, g=0x_1F, h=0o17, "
                     "i=0b101, j=.5, k=5., l=1e999)]"),
            (Calls{{"f", R"({"a": 1000000000000000.0, "b": 1e+16, "c": 0.0001, "d": 1e-05, )"
                         R"("e": 1000.5, "g": 31, "h": 15, "i": 5, "j": 0.5, "k": 5.0, )"
                         R"("l": Infinity})"}}));
  // Strings: escapes, raw strings, triple quotes, adjacent literals joined.
  EXPECT_EQ(Pythonic(R"([f(a="\x41\u00e9\101\n", b=r'\d\'', c='''x
"y"''', d="p" 'q', e="\q")])"),
            (Calls{{"f", R"({"a": "AéA\n", "b": "\\d\\'", "c": "x\n\"y\"", "d": "pq", )"
                         R"("e": "\\q"})"}}));
  // Dict keys Python holds equal are one key: the first written, the last value.
  EXPECT_EQ(Pythonic(R"([f(d={1: "a", True: "b", 1.0: "c", "1": "d", None: 0})])"),
            (Calls{{"f", R"({"d": {"1": "c", "1": "d", "null": 0}})"}}));
  // A repeated keyword parses (Python's compiler, not its parser, refuses
  // it): its first place, its last value.
  EXPECT_EQ(Pythonic("[f(a=1, b=2, a=3)]"), (Calls{{"f", R"({"a": 3, "b": 2})"}}));
  // Positional arguments are dropped (here after a call the pattern took).
  EXPECT_EQ(Pythonic("[g(a=1), f(x.y, [1], b=2)]"), (Calls{{"g", R"({"a": 1})"}, {"f", R"({"b": 2})"}}));
}

// Where vLLM finds no call, the whole answer is the content.
TEST(PythonicToolCallsTest, WhatVllmCannotReadStaysContent) {
  for (const std::string text : {
           "It is sunny.",
           "Sure: [f(a=1)]",           // not at the start
           " [f(a=1)]",                // nor after a space
           "[f( a=1)]",                // the pattern wants a name after "("
           "[f(1)]",                   // or ")": positional only
           "[f(a=-1)]",                // a unary minus is no literal
           "[f(a=(1, 2))]",            // nor a tuple
           "[f(a=x)]",                 // nor a name
           "[f(a={1, 2})]",            // nor a set
           "[f(a=1 + 2)]",             // nor a sum
           "[f(a=b'x')]",              // bytes are no JSON
           "[f(a=1j)]",                // nor a complex number
           "[f(a=1)] and more",        // not a statement Python reads
           "[f(a=1)]\n  indented",     // an unexpected indent
           "[m.f(a=1)]",               // not a plain name
           "[f(a=1), 3]",              // not every element a call
           "[f(a=0777)]",              // leading zeros
           "[f(a=1_)]",                // a trailing underscore
           "[f(a='open)]",             // an open string
           "[f(a=1)",                  // an open list
       }) {
    const ExtractedToolCalls e = ExtractToolCalls(ToolParser::kPythonic, text);
    EXPECT_TRUE(e.calls.empty()) << text;
    EXPECT_EQ(e.content, text);
  }
  // Later statements Python reads keep the calls.
  EXPECT_EQ(Pythonic("[f(a=1)];\n# done\n[g(b=2)]\nprint('x')\n"), (Calls{{"f", R"({"a": 1})"}}));
}

// Python's grammar where the generated answers rarely reach it: operators,
// comparisons, conditionals, named expressions and unpacking in positional
// arguments, augmented and annotated assignments after the calls, and what
// Python refuses there, all as vLLM's steps decide.
TEST(PythonicToolCallsTest, TheRestOfPythonsGrammarIsReadAsPythonReadsIt) {
  std::vector<testing::ReferenceCase> cases;
  for (const char* text : {
           "[g(a=1), f(x == y, b=2)]", "[g(a=1), f(x is not y, z not in w, k := 3, *s, b=2)]",
           "[g(a=1), f(x if y else z, m[1:2, ::3], -u ** 2 // 3, b=2)]",
           "[f(a=1)]\nx += 1\ny: int = 2\nz = *w, 3\nv[1:2, ::3] = (u := 4)\n",
           "[f(a=1)]\\\n",             // a continuation into the end
           "[g(a=1), f(x == not y)]",  // not after a comparison
           "[g(a=1), f(x is not y, z not in w, k := 3, *s, b=2, **d)]",  // **d: no literal
           "[g(a=1), f(x if y else z, b=[*q], c=2)]",                    // [*q]: no literal
           "[g(a=1), f(x if y, b=2)]",                                   // no else
           "[g(a=1), f(m[], b=2)]",                                      // an empty subscript
           "[f(a=1)]\n(x) += 1 +",                                       // a dangling operator
       }) {
    cases.push_back({ToolParser::kPythonic, text});
  }
  const testing::ReferenceTally tally = testing::ExpectVllmsCalls(cases);
  EXPECT_EQ(tally.mismatches, 0);
  EXPECT_EQ(tally.with_calls, 4);
}

TEST(PythonicToolCallsTest, Llama4DropsItsPythonTagsAndWritesAsciiJson) {
  const ExtractedToolCalls e = ExtractToolCalls(
      ToolParser::kLlama4Pythonic, "<|python_start|>[f(city=\"Zürich 😀\")]<|python_end|>");
  EXPECT_EQ(NamesAndArguments(e), (Calls{{"f", R"({"city": "Z\u00fcrich \ud83d\ude00"})"}}));
  EXPECT_EQ(Pythonic("[f(city=\"Zürich\")]"), (Calls{{"f", R"({"city": "Zürich"})"}}));
  // pythonic keeps the tags: no call.
  EXPECT_TRUE(Pythonic("<|python_start|>[f(a=1)]<|python_end|>").empty());
  const ExtractedToolCalls text =
      ExtractToolCalls(ToolParser::kLlama4Pythonic, "<|python_start|>No call<|python_end|>");
  EXPECT_EQ(text.content, "No call") << "vLLM's content is the answer without the tags";
}

TEST(PythonicToolCallsTest, StreamsHoldOnlyAnAnswerThatStartsWithABracket) {
  for (const auto& [parser, answer, held] :
       std::vector<std::tuple<ToolParser, std::string, bool>>{
           {ToolParser::kPythonic, "[f(a=1), g()]", true},
           {ToolParser::kPythonic, "It is [f(a=1)]", false},
           {ToolParser::kLlama4Pythonic, "<|python_start|>[f(a=1)]<|python_end|>", true},
           {ToolParser::kLlama4Pythonic, "<|python", true},
           {ToolParser::kLlama4Pythonic, "Plain words", false}}) {
    ToolCallStream stream(parser);
    std::string out;
    for (char c : answer) out += stream.Push(std::string(1, c));
    const ExtractedToolCalls end = stream.Finish();
    const ExtractedToolCalls whole = ExtractToolCalls(parser, answer);
    EXPECT_EQ(out.empty(), held) << answer;
    EXPECT_EQ(NamesAndArguments(end), NamesAndArguments(whole)) << answer;
    if (!held) {
      EXPECT_EQ(out + end.content.value_or(""), answer);
    }
  }
}

TEST(PythonicToolCallsTest, FloatsAreWrittenAsPythonsRepr) {
  using internal::PythonFloatRepr;
  EXPECT_EQ(PythonFloatRepr(1.0), "1.0");
  EXPECT_EQ(PythonFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PythonFloatRepr(0.1), "0.1");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(1.5e16), "1.5e+16");
  EXPECT_EQ(PythonFloatRepr(9999999999999998.0), "9999999999999998.0");
  EXPECT_EQ(PythonFloatRepr(1e-4), "0.0001");
  EXPECT_EQ(PythonFloatRepr(1.25e-5), "1.25e-05");
  EXPECT_EQ(PythonFloatRepr(1e300), "1e+300");
  EXPECT_EQ(PythonFloatRepr(5e-324), "5e-324");
  EXPECT_EQ(PythonFloatRepr(123456.789), "123456.789");
}

// Random answers in the shapes models write, and broken ones.
class AnswerGenerator : public testing::RandomText {
 public:
  using RandomText::RandomText;

  std::string Answer(bool llama4) {
    std::string out;
    if (Chance(0.05)) out += Pick({"Sure: ", " ", "\n"});
    if (llama4 && Chance(0.3)) out += "<|python_start|>";
    out += "[";
    const int n = 1 + Int(3);
    for (int k = 0; k < n; ++k) {
      if (k > 0) out += Pick({", ", ",", ",\n  ", " , "});
      out += Call();
    }
    if (Chance(0.03)) out += ",";  // Python reads it, vLLM's pattern does not
    out += "]";
    if (llama4 && Chance(0.3)) out += "<|python_end|>";
    out += Pick({"", "", "", "\n", " ", ";", "\n\nDone.", "\n[g(a=2)]", " # ok", "\nprint(1)",
                 "\n  x", "; x = 1", "\n\n"});
    if (Chance(0.25)) {
      Mutate(&out,
             {"(", ")", "[", "]", "{", "}", ",", "=", "'", "\"", "\\", " ", "\n", "#", ":", "*"});
    }
    return out;
  }

 private:
  std::string Call() {
    std::string out = Chance(0.9) ? Pick({"get_weather", "f", "search_web", "now", "Calc2",
                                          "lookup"})
                                  : Pick({"_private", "x.y"});
    out += Chance(0.03) ? " (" : "(";
    if (Chance(0.03)) out += " ";
    if (Chance(0.05)) out += Value(1) + ", ";  // positional
    const int n = Int(4);
    for (int k = 0; k < n; ++k) {
      if (k > 0) out += Pick({", ", ",", ",\n    ", ", # why\n "});
      out += Pick({"city", "q", "n", "units", "filters", "a_b", "x1"});
      out += Chance(0.9) ? "=" : Pick({" = ", " ="});  // vLLM's pattern wants name=
      out += Value(0);
    }
    if (n > 0 && Chance(0.1)) out += ",";
    return out + ")";
  }

  std::string Value(int depth) {
    switch (depth > 2 ? Int(6) : Int(12)) {
      case 0:
      case 1:
        return String();
      case 2:
        return Pick({"0", "7", "42", "1_000", "0x1F", "0X_ff", "0o17", "0b101", "00",
                     "18446744073709551615", "9223372036854775808", "12345678901234"});
      case 3:
        return Pick({"1.5", "1e15", "1e16", "0.0001", "1e-5", ".5", "5.", "1_0.5", "1E+3",
                     "123456789.123456789", "1e999", "0.1", "3.141592653589793", "2.5e-310",
                     "1.0", "100.0"});
      case 4:
        return Pick({"True", "False", "None", "(3)", "[]", "{}"});
      case 5:
        return Pick({"null", "true", "x", "-1", "+2", "-1.5", "~3", "not x", "a.b", "g(1)",
                     "(1,)", "()", "{1, 2}", "(1, 2)", "b'x'", "1j", "0j", "...", "b'a' b'b'"});
      case 6:
      case 7:
      case 8: {
        std::string out = "[";
        const int n = Int(4);
        for (int k = 0; k < n; ++k) out += (k > 0 ? ", " : "") + Value(depth + 1);
        return out + "]";
      }
      default: {
        std::string out = "{";
        const int n = Int(4);
        for (int k = 0; k < n; ++k) {
          out += (k > 0 ? ", " : "");
          out += Chance(0.7) ? Pick({"\"1\"", "1", "1.0", "True", "None", "'k'", "\"k\"", "2.5",
                                     "0x10", "16", "0", "0j", "b'k'", "1j"})
                             : Value(depth + 1);
          out += ": " + Value(depth + 1);
        }
        return out + "}";
      }
    }
  }

  std::string String() {
    const std::string quote = Pick({"\"", "'", "\"\"\"", "'''"});
    const bool raw = Chance(0.15);
    std::string out = (raw ? "r" : Chance(0.05) ? "u" : "") + quote;
    const int n = Int(5);
    for (int k = 0; k < n; ++k) {
      std::string piece = Pick({"Paris", " ", "é", "日本", "😀", "\\n", "\\t", "\\\\", "\\x41",
                                "\\u00e9", "\\U0001F600", "\\101", "\\d", "\\0", "\\'", "\\\"",
                                "a\"b", "a'b", "{x}", "\\\n", "#"});
      // The quote inside ends the string early: now and then.
      if (piece.find(quote[0]) != std::string::npos && piece[0] != '\\' && !Chance(0.1)) {
        piece = "x";
      }
      out += piece;
    }
    out += quote;
    if (Chance(0.1)) out += " " + String();  // adjacent literals
    return out;
  }
};

TEST(PythonicToolCallsTest, GeneratedAnswersMatchVllmsStepsRunByPython) {
  std::vector<testing::ReferenceCase> cases;
  AnswerGenerator gen(testing::GeneratorSeed(20261202));
  for (int k = 0; k < 4000; ++k) {
    const bool llama4 = k % 4 == 3;
    cases.push_back(
        {llama4 ? ToolParser::kLlama4Pythonic : ToolParser::kPythonic, gen.Answer(llama4)});
  }
  const testing::ReferenceTally tally = testing::ExpectVllmsCalls(cases);
  EXPECT_EQ(tally.mismatches, 0);
  // The corpus holds both kinds of answer.
  EXPECT_GT(tally.with_calls, 500);
  EXPECT_LT(tally.with_calls, 3500);
}

}  // namespace
}  // namespace tandem::frontend
