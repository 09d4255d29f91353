// --reasoning-parser's split of an answer into thinking and content
// (reasoning.h): whole, and over every way a stream may cut the text.
#include "tandem/frontend/reasoning.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::frontend {
namespace {

using Json = nlohmann::ordered_json;

struct Case {
  std::string text;
  bool starts_in_reasoning;
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
};

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      // Older Qwen3 templates: the model opens the block itself.
      {"<think>\nHm.\n</think>\n\nSunny.", true, "\nHm.\n", "\n\nSunny."},
      // DeepSeek-R1 and newer Qwen3: <think> is in the prompt.
      {"Hm.</think>Sunny.", true, "Hm.", "Sunny."},
      // Cut while thinking: all of it is reasoning.
      {"Hm, let me", true, "Hm, let me", std::nullopt},
      {"<think>Hm", true, "Hm", std::nullopt},
      {"<thi", true, "<thi", std::nullopt},
      // Nothing after the block: content null; an empty block: reasoning "".
      {"Hm.</think>", true, "Hm.", std::nullopt},
      {"</think>Sunny.", true, "", "Sunny."},
      {"<think></think>Sunny.", true, "", "Sunny."},
      // Only the first </think> ends it; an opening tag later is text.
      {"a</think>b</think>c", true, "a", "b</think>c"},
      {"a<think>b</think>c", true, "a<think>b", "c"},
      {"x</thin", true, "x</thin", std::nullopt},
      // The prompt closed the block (or thinking is off): all content.
      {"Sunny.</think>", false, std::nullopt, "Sunny.</think>"},
      {"", false, std::nullopt, ""},
  };
  return cases;
}

TEST(ReasoningTest, TheThinkingIsTheTextUpToTheFirstEndTag) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.text);
    const ReasoningSplit split = SplitReasoning(c.text, c.starts_in_reasoning);
    EXPECT_EQ(split.reasoning, c.reasoning);
    EXPECT_EQ(split.content, c.content);
  }
}

// Whatever the cuts between deltas, a stream carries the whole split, and
// never a piece of a tag that the split drops.
TEST(ReasoningTest, AStreamCarriesTheWholeSplitWhereverTheTextIsCut) {
  std::mt19937 rng(7);
  for (const Case& c : Cases()) {
    for (int trial = 0; trial < 200; ++trial) {
      SCOPED_TRACE(c.text + " trial " + std::to_string(trial));
      ReasoningStream stream(c.starts_in_reasoning);
      std::string reasoning, content;
      size_t at = 0;
      while (at < c.text.size()) {
        const size_t n = std::min<size_t>(c.text.size() - at, 1 + rng() % 4);
        ReasoningStream::Piece piece = stream.Push(std::string_view(c.text).substr(at, n));
        // Content comes only after all of the reasoning.
        if (!piece.reasoning.empty()) {
          EXPECT_TRUE(content.empty());
        }
        reasoning += piece.reasoning;
        content += piece.content;
        at += n;
      }
      reasoning += stream.Finish().reasoning;
      EXPECT_EQ(reasoning, c.reasoning.value_or(""));
      EXPECT_EQ(content, c.content.value_or(""));
    }
  }
}

TEST(ReasoningTest, AnswersStartAsThinkingUnlessThePromptClosedTheBlockOrThinkingIsOff) {
  const Json none;
  for (ReasoningParser p : {ReasoningParser::kDeepSeekR1, ReasoningParser::kQwen3}) {
    EXPECT_TRUE(StartsInReasoning(p, "<|im_start|>assistant\n", none));
    EXPECT_TRUE(StartsInReasoning(p, "<｜Assistant｜><think>\n", none));
    // Qwen3's template with enable_thinking false writes an empty block.
    EXPECT_FALSE(StartsInReasoning(p, "<|im_start|>assistant\n<think>\n\n</think>\n\n", none));
    // A closed block in an earlier turn, a new one opened for this answer.
    EXPECT_TRUE(StartsInReasoning(p, "a<think>x</think>b<think>\n", none));
  }
  const Json off = Json::parse(R"({"enable_thinking": false})");
  EXPECT_FALSE(StartsInReasoning(ReasoningParser::kQwen3, "<|im_start|>assistant\n", off));
  EXPECT_TRUE(StartsInReasoning(ReasoningParser::kDeepSeekR1, "<|im_start|>assistant\n", off));
  EXPECT_EQ(ReasoningParserNamed("qwen3"), ReasoningParser::kQwen3);
  EXPECT_EQ(ReasoningParserNamed("deepseek_r1"), ReasoningParser::kDeepSeekR1);
  EXPECT_FALSE(ReasoningParserNamed("granite"));
}

}  // namespace
}  // namespace tandem::frontend
