// IncrementalDetokenizer on tokenizer.bin and tokenizer.model (the
// tokenizer.json kinds are covered the same way in reference_test.cc):
// deltas add up to Decode() and never split a UTF-8 character.
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace tandem::tokenizer::testing {
namespace {

using ::testing::ElementsAre;

class IncrementalDetokenizerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto tok = LoadTokenizer(SharedModel(GetParam()));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
  }
  std::vector<std::string> Deltas(const std::vector<int32_t>& ids, const DecodeOptions& options) {
    IncrementalDetokenizer detok(*tok_, options);
    std::vector<std::string> out;
    for (const int32_t id : ids) out.push_back(*detok.Push(id));
    out.push_back(detok.Finish());
    return out;
  }
  static int32_t Byte(int b) { return 3 + b; }  // both files put <0x00> at 3
  std::unique_ptr<Tokenizer> tok_;
};

TEST_P(IncrementalDetokenizerTest, StreamsTheCorpusToItsDecode) {
  for (const std::string& text : CorpusTexts()) {
    const auto ids = tok_->Encode(text);
    ASSERT_TRUE(ids.ok());
    for (const bool skip : {false, true}) {
      if (!StreamMatchesDecode(*tok_, *ids, {.skip_special_tokens = skip}, Quote(text))) return;
    }
  }
}

TEST_P(IncrementalDetokenizerTest, StreamsRandomIdsToTheirDecode) {
  std::mt19937 rng(11);
  for (int n = 0; n < 3000; ++n) {
    std::vector<int32_t> ids;
    if (rng() % 2) ids.push_back(1);
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) {
      const uint32_t r = rng() % 10;
      ids.push_back(r < 5 ? Byte(static_cast<int>(rng() % 256))
                    : r < 6 ? static_cast<int32_t>(rng() % 3)
                            : static_cast<int32_t>(rng() % 32000));
    }
    for (const bool skip : {false, true}) {
      if (!StreamMatchesDecode(*tok_, ids, {.skip_special_tokens = skip}, nlohmann::json(ids).dump())) {
        return;
      }
    }
  }
}

TEST_P(IncrementalDetokenizerTest, HoldsAnEmojiSplitAcrossByteTokensUntilItIsComplete) {
  // 😀 is F0 9F 98 80.
  EXPECT_THAT(Deltas({1, 15043, Byte(0xF0), Byte(0x9F), Byte(0x98), Byte(0x80), 3186},
                     {.skip_special_tokens = true}),
              ElementsAre("", "Hello", "", "", "", "\xF0\x9F\x98\x80", " world", ""));
}

TEST_P(IncrementalDetokenizerTest, StripsTheSpaceAfterBosOnceLikeDecode) {
  const std::vector<int32_t> ids = {1, 15043, 3186};  // <s> ▁Hello ▁world
  EXPECT_THAT(Deltas(ids, {.skip_special_tokens = true}), ElementsAre("", "Hello", " world", ""));
}

TEST_P(IncrementalDetokenizerTest, TurnsAnUnfinishedCharacterIntoReplacementAtTheEnd) {
  const auto deltas = Deltas({1, 15043, Byte(0xE6), Byte(0x97)}, {.skip_special_tokens = true});
  EXPECT_EQ(deltas[3], "");
  // One U+FFFD per byte, as SentencePiece decodes a bad byte run.
  EXPECT_EQ(deltas.back(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_P(IncrementalDetokenizerTest, RejectsAnIdOutsideTheVocabularyAndCarriesOn) {
  IncrementalDetokenizer detok(*tok_, {.skip_special_tokens = true});
  EXPECT_EQ(*detok.Push(1), "");
  EXPECT_EQ(*detok.Push(Byte(0xC3)), "");
  const auto bad = detok.Push(32000);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(detok.Push(-1).ok());
  EXPECT_EQ(*detok.Push(Byte(0xA9)), "\xC3\xA9");  // é, still whole
  EXPECT_EQ(detok.num_ids(), 3);
  EXPECT_EQ(detok.Finish(), "");
  EXPECT_FALSE(detok.Push(15043).ok()) << "Push after Finish";
}

// A stream primed with the prompt: its text is Decode(prompt + output)
// minus Decode(prompt), as vLLM's detokenizer gives it (issue 30).
std::string Continue(const Tokenizer& tok, const std::vector<int32_t>& prompt,
                     const std::vector<int32_t>& output) {
  IncrementalDetokenizer detok(tok, {.skip_special_tokens = true}, prompt);
  std::string text;
  for (const int32_t id : output) text += *detok.Push(id);
  return text + detok.Finish();
}

TEST_P(IncrementalDetokenizerTest, AContinuationKeepsItsFirstWordsLeadingSpace) {
  // <s> ▁Hello | ▁world: a fresh stream strips the space, a primed one not.
  EXPECT_EQ(Continue(*tok_, {1, 15043}, {3186}), " world");
  EXPECT_EQ(Continue(*tok_, {1}, {15043, 3186}), "Hello world") << "after BOS alone: stripped";
  // A prompt ending with byte-fallback pieces: 😀 (four bytes), a newline.
  EXPECT_EQ(Continue(*tok_, {1, 15043, Byte(0xF0), Byte(0x9F), Byte(0x98), Byte(0x80)}, {3186}),
            " world");
  EXPECT_EQ(Continue(*tok_, {1, 15043, Byte(0x0A)}, {3186}), " world");
  // Output that starts with a multi-byte character (日 = E6 97 A5).
  EXPECT_EQ(Continue(*tok_, {1, 15043}, {Byte(0xE6), Byte(0x97), Byte(0xA5), 3186}),
            "\xE6\x97\xA5 world");
  // A prompt whose last byte pieces begin a character the output completes:
  // the output starts with that character (Decode(prompt) ends in U+FFFD).
  EXPECT_EQ(Continue(*tok_, {1, 15043, Byte(0xE6)}, {Byte(0x97), Byte(0xA5)}), "\xE6\x97\xA5");
  // A prompt longer than the context the stream is primed with.
  std::vector<int32_t> long_prompt = {1};
  for (int i = 0; i < 50; ++i) long_prompt.push_back(15043);
  EXPECT_EQ(Continue(*tok_, long_prompt, {3186}), " world");
}

TEST_P(IncrementalDetokenizerTest, AContinuationOfTheCorpusIsItsDecodeMinusThePrompts) {
  std::vector<std::vector<int32_t>> cases;
  for (const std::string& text : CorpusTexts()) cases.push_back(*tok_->Encode(text));
  for (const bool skip : {false, true}) {
    int checked = 0, skipped = 0;
    EXPECT_EQ(CheckPrimedSplits(*tok_, cases, {.skip_special_tokens = skip}, 4, 5, &checked, &skipped), 0);
    EXPECT_LT(skipped, checked / 2) << "too few cases checked";
  }
}

TEST_P(IncrementalDetokenizerTest, AContinuationOfRandomIdsIsItsDecodeMinusThePrompts) {
  std::mt19937 rng(12);
  std::vector<std::vector<int32_t>> cases;
  for (int n = 0; n < 1500; ++n) {
    std::vector<int32_t> ids;
    if (rng() % 2) ids.push_back(1);
    const int len = 2 + static_cast<int>(rng() % 50);
    for (int i = 0; i < len; ++i) {
      const uint32_t r = rng() % 10;
      ids.push_back(r < 4 ? Byte(static_cast<int>(rng() % 256))
                    : r < 5 ? static_cast<int32_t>(rng() % 3)
                            : static_cast<int32_t>(rng() % 32000));
    }
    cases.push_back(std::move(ids));
  }
  for (const bool skip : {false, true}) {
    int checked = 0, skipped = 0;
    EXPECT_EQ(CheckPrimedSplits(*tok_, cases, {.skip_special_tokens = skip}, 6, 5, &checked, &skipped), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shared, IncrementalDetokenizerTest,
                         ::testing::Values("tokenizer.bin", "tokenizer.model"),
                         [](const auto& info) {
                           return info.param == "tokenizer.bin" ? std::string("Llama2c")
                                                                : std::string("SentencePiece");
                         });

}  // namespace
}  // namespace tandem::tokenizer::testing
