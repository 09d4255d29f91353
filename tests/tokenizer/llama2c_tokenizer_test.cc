// llama2.c's tokenizer.bin against run.c (random32k.reference.json, which
// run.c produced) and SentencePiece (the README's contract for decoding).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tandem/tokenizer/tokenizer.h"
#include "test_util.h"

namespace tandem::tokenizer::testing {
namespace {

using ::testing::HasSubstr;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = std::string(TANDEM_BINARY_DIR) + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

class Llama2cTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto bin = LoadTokenizer(SharedModel("tokenizer.bin"));
    ASSERT_TRUE(bin.ok()) << bin.status();
    bin_ = bin->release();
    auto sp = LoadTokenizer(SharedModel("tokenizer.model"));
    ASSERT_TRUE(sp.ok()) << sp.status();
    sp_ = sp->release();
  }
  static const Tokenizer* bin_;
  static const Tokenizer* sp_;
};
const Tokenizer* Llama2cTokenizerTest::bin_ = nullptr;
const Tokenizer* Llama2cTokenizerTest::sp_ = nullptr;

TEST_F(Llama2cTokenizerTest, LoadsAsLlama2cWithFixedSpecialIds) {
  EXPECT_EQ(bin_->kind(), TokenizerKind::kLlama2c);
  EXPECT_EQ(bin_->vocab_size(), 32000);
  EXPECT_EQ(bin_->bos_id(), 1);
  EXPECT_EQ(bin_->eos_id(), 2);
  EXPECT_EQ(*bin_->IdToPiece(15043), " Hello");
  EXPECT_EQ(bin_->PieceToId(" Hello"), 15043);
  EXPECT_FALSE(bin_->PieceToId("no such piece").has_value());
}

TEST_F(Llama2cTokenizerTest, EncodesReferencePromptsAsRunC) {
  std::ifstream file(SharedModel("random32k.reference.json"));
  const nlohmann::json ref = nlohmann::json::parse(file);
  ASSERT_EQ(ref.size(), 12u);
  for (const auto& c : ref) {
    const auto ids = bin_->Encode(c["prompt_text"].get<std::string>());
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["prompt_token_ids"].get<std::vector<int32_t>>()) << c["prompt_text"];
  }
}

// The README: a correct pipeline decodes the ids to the text SentencePiece
// decodes them to.
TEST_F(Llama2cTokenizerTest, DecodesReferenceConversationsAsSentencePiece) {
  std::ifstream file(SharedModel("random32k.reference.json"));
  const nlohmann::json ref = nlohmann::json::parse(file);
  for (const auto& c : ref) {
    std::vector<int32_t> ids = c["prompt_token_ids"].get<std::vector<int32_t>>();
    for (const int id : c["expected_output_token_ids"]) ids.push_back(id);
    const auto ours = bin_->Decode(ids, {.skip_special_tokens = true});
    const auto sentencepiece = sp_->Decode(ids);
    ASSERT_TRUE(ours.ok()) << ours.status();
    ASSERT_TRUE(sentencepiece.ok()) << sentencepiece.status();
    EXPECT_EQ(*ours, *sentencepiece) << c["prompt_text"];
  }
}

// run.c's encode() over the whole corpus (tools/runc_references.py).
TEST_F(Llama2cTokenizerTest, EncodesTheCorpusAsRunC) {
  const nlohmann::json ref = ReadJson(TestData("runc_encode.json"));
  const std::vector<std::string> texts = CorpusTexts();
  ASSERT_EQ(ref["cases"].size(), texts.size());
  int failures = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ids = bin_->Encode(texts[i]);
    ASSERT_TRUE(ids.ok());
    const auto want = ref["cases"][i].get<std::vector<int32_t>>();
    if (*ids != want && ++failures <= 5) {
      ADD_FAILURE() << Quote(texts[i]) << ": ours " << nlohmann::json(*ids).dump() << ", run.c "
                    << nlohmann::json(want).dump();
    }
  }
  EXPECT_EQ(failures, 0);
}

// Random ids after BOS (byte tokens half the time, so runs of bytes that are
// not UTF-8 are common) decode as libsentencepiece decodes them.
TEST_F(Llama2cTokenizerTest, DecodesRandomIdsAsSentencePiece) {
  std::mt19937 rng(7);
  int failures = 0;
  for (int n = 0; n < 2000; ++n) {
    std::vector<int32_t> ids = {1};
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) {
      ids.push_back(rng() % 2 ? 3 + static_cast<int32_t>(rng() % 256)
                              : 3 + static_cast<int32_t>(rng() % (32000 - 3)));
    }
    const auto ours = bin_->Decode(ids, {.skip_special_tokens = true});
    const auto sentencepiece = sp_->Decode(ids);
    ASSERT_TRUE(ours.ok() && sentencepiece.ok());
    if (*ours != *sentencepiece && ++failures <= 5) {
      ADD_FAILURE() << nlohmann::json(ids).dump() << ": ours " << Quote(*ours)
                    << ", sentencepiece " << Quote(*sentencepiece);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_F(Llama2cTokenizerTest, StripsTheLeadingSpaceOnlyAfterBos) {
  EXPECT_EQ(*bin_->Decode({1, 15043, 3186}, {.skip_special_tokens = true}), "Hello world");
  EXPECT_EQ(*bin_->Decode({15043, 3186}), " Hello world");
  EXPECT_EQ(*bin_->Decode({1, 15043}), "\n<s>\nHello");
}

TEST_F(Llama2cTokenizerTest, ReplacesEachBadByteOfAByteRunAsSentencePiece) {
  auto byte = [](int b) { return b + 3; };
  // 日 is E6 97 A5: complete, truncated before a letter, and a stray
  // continuation byte.
  const std::vector<int32_t> ids = {1,       byte(0xE6), byte(0x97), byte(0xA5), byte(0xE6),
                                    byte(0x97), 29874 /* "a" */, byte(0x97), byte(0xFF)};
  const auto ours = bin_->Decode(ids);
  ASSERT_TRUE(ours.ok());
  EXPECT_EQ(*ours, "\n<s>\n日\xEF\xBF\xBD\xEF\xBF\xBD" "a\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(*bin_->Decode(ids, {.skip_special_tokens = true}), *sp_->Decode(ids));
}

TEST_F(Llama2cTokenizerTest, RejectsIdsOutsideTheVocabularyWithTheirPosition) {
  const auto text = bin_->Decode({1, 15043, 32000});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("position 2"));
  EXPECT_THAT(text.status().message(), HasSubstr("32000"));
  EXPECT_FALSE(bin_->Decode({-1}).ok());
  EXPECT_FALSE(bin_->IdToPiece(-5).ok());
}

TEST_F(Llama2cTokenizerTest, EncodesEmptyTextAsBosAlone) {
  EXPECT_EQ(*bin_->Encode(""), std::vector<int32_t>{1});
  EXPECT_EQ(*bin_->Encode("", {.add_special_tokens = false}), std::vector<int32_t>{});
}

TEST_F(Llama2cTokenizerTest, EncodesEveryByteSequenceLikeRunCWithoutLosingBytes) {
  // Invalid UTF-8 goes through byte fallback and decodes back to U+FFFD.
  const auto ids = bin_->Encode(std::string("a\xFF\xE6\x97 b\0c", 8));
  ASSERT_TRUE(ids.ok());
  // BOS, " a" (dummy prefix merged), <0xFF>, <0xE6>, <0x97>, " b", <0x00>, "c".
  const std::vector<int32_t> want = {1, 263, 0xFF + 3, 0xE6 + 3, 0x97 + 3, 289, 0x00 + 3, 29883};
  EXPECT_EQ(*ids, want);
}

TEST(Llama2cTokenizerFileTest, NamesTheOffsetOfATruncatedPiece) {
  const std::string bytes = ReadBytes(SharedModel("tokenizer.bin"));
  ASSERT_GT(bytes.size(), 1000u);
  const std::string path = WriteTemp("truncated_tokenizer.bin", bytes.substr(0, 1000));
  const auto tok = LoadTokenizer(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("truncated at offset"));
  EXPECT_THAT(tok.status().message(), HasSubstr("truncated_tokenizer.bin"));
}

TEST(Llama2cTokenizerFileTest, NamesAPieceWithAnImpossibleLength) {
  std::string bytes = ReadBytes(SharedModel("tokenizer.bin"));
  const int32_t huge = 1 << 24;
  std::memcpy(bytes.data() + 4 + 4, &huge, 4);  // piece 0's length
  const auto tok = LoadTokenizer(WriteTemp("bad_length_tokenizer.bin", bytes));
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("piece 0 at offset 4 has length 16777216"));
}

TEST(Llama2cTokenizerFileTest, RejectsAVocabularyWithoutByteTokens) {
  std::string bytes = ReadBytes(SharedModel("tokenizer.bin"));
  // Keep max_token_length and the first three pieces only.
  size_t offset = 4;
  for (int i = 0; i < 3; ++i) {
    int32_t len;
    std::memcpy(&len, bytes.data() + offset + 4, 4);
    offset += 8 + len;
  }
  const auto tok = LoadTokenizer(WriteTemp("three_pieces_tokenizer.bin", bytes.substr(0, offset)));
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("needs at least 259"));
}

TEST(LoadTokenizerTest, NamesAMissingPath) {
  const auto tok = LoadTokenizer("/nonexistent/tokenizer.bin");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tok.status().message(), HasSubstr("/nonexistent/tokenizer.bin"));
}

}  // namespace
}  // namespace tandem::tokenizer::testing
