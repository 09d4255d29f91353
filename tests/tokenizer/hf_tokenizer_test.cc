// tokenizer.json behaviour on small synthetic files (no npm needed, so these
// also run under the sanitizers): BPE ranks, added tokens, post-processor,
// decoders, and the errors for what is not supported.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "hf_components.h"
#include "test_util.h"

namespace tandem::tokenizer::testing {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// GPT-2's bytes_to_unicode(), written out again here.
std::string ByteChar(int b) {
  const auto printable = [](int x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
  };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += !printable(x);
  }
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
}

std::string WriteTokenizer(const std::string& name, const Json& json) {
  const std::string dir = std::string(TANDEM_BINARY_DIR) + "/hf_tokenizer_test/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << json.dump();
  return dir + "/tokenizer.json";
}

constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Byte-level BPE in Llama 3's shape: ids 0-255 are the byte characters.
Json ByteLevelJson() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  vocab["\xC4\xA0t"] = 256;    // Ġt
  vocab["he"] = 257;
  vocab["\xC4\xA0the"] = 258;  // Ġthe
  vocab["\xC4\xA0\xC4\xA0"] = 259;
  auto added = [](int id, const char* content, bool special) {
    return Json{{"id", id}, {"content", content}, {"special", special}, {"normalized", false},
                {"lstrip", false}, {"rstrip", false}, {"single_word", false}};
  };
  return Json{
      {"added_tokens", {added(260, "<|eot|>", true), added(261, "<tool>", false),
                        added(262, "<|bos|>", true)}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {262}}, {"tokens", {"<|bos|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"ignore_merges", true},
        {"merges", {"\xC4\xA0 t", "h e", "\xC4\xA0t he", "\xC4\xA0 \xC4\xA0"}}}}};
}

class HfByteLevelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = LoadTokenizer(WriteTokenizer("bytelevel", ByteLevelJson()));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(HfByteLevelTest, MergesLowestRankFirstAndMatchesAddedTokensBeforeSplitting) {
  // "the" -> t + he (rank 1; "Ġt he" needs Ġt); " the" -> Ġt (0), he (1), Ġthe (2).
  EXPECT_EQ(*tok_->Encode("the the<|eot|>"), (std::vector<int32_t>{262, 't', 257, 258, 260}));
  EXPECT_EQ(*tok_->Encode("the", {.add_special_tokens = false}), (std::vector<int32_t>{'t', 257}));
  EXPECT_EQ(tok_->bos_id(), 262) << "from the post-processor when there is no config";
  EXPECT_EQ(tok_->vocab_size(), 263);
}

TEST_F(HfByteLevelTest, TokenizesSpecialTokensAsTextWhenAskedButKeepsPlainAddedTokens) {
  const auto ids = tok_->Encode("<|eot|><tool>", {.add_special_tokens = false,
                                                  .parse_special_tokens = false});
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ::testing::Not(::testing::Contains(260)));
  EXPECT_EQ(ids->back(), 261);
  EXPECT_EQ(*tok_->Decode(*ids), "<|eot|><tool>");
}

TEST_F(HfByteLevelTest, SkipsOnlySpecialTokensAndKeepsAddedTokenTextApart) {
  const std::vector<int32_t> ids = {262, 258, 260, 261, 0xC3, 0xA9};  // é as two byte chars
  EXPECT_EQ(*tok_->Decode(ids), "<|bos|> the<|eot|><tool>\xC3\xA9");
  EXPECT_EQ(*tok_->Decode(ids, {.skip_special_tokens = true}), " the<tool>\xC3\xA9");
  EXPECT_TRUE(tok_->IsSpecial(260));
  EXPECT_FALSE(tok_->IsSpecial(261));
}

TEST_F(HfByteLevelTest, ReplacesIllFormedBytesPerMaximalSubpart) {
  // E6 97 then 'A': one U+FFFD for the truncated character (WHATWG, Rust's
  // from_utf8_lossy); an added token ends the byte run.
  EXPECT_EQ(*tok_->Decode({0xE6, 0x97, 'A', 0xE6, 260, 0x97}),
            "\xEF\xBF\xBD" "A\xEF\xBF\xBD<|eot|>\xEF\xBF\xBD");
}

TEST_F(HfByteLevelTest, StreamsBytesOfACharacterAsOneDelta) {
  IncrementalDetokenizer detok(*tok_);
  EXPECT_EQ(*detok.Push(0xF0), "");
  EXPECT_EQ(*detok.Push(0x9F), "");
  EXPECT_EQ(*detok.Push(0x98), "");
  EXPECT_EQ(*detok.Push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(*detok.Push(0xF0), "");
  EXPECT_EQ(*detok.Push(260), "\xEF\xBF\xBD<|eot|>");
  EXPECT_EQ(detok.Finish(), "");
}

TEST_F(HfByteLevelTest, RejectsTextThatIsNotUtf8AndIdsWithoutAnEntry) {
  const auto ids = tok_->Encode("ok\xFF");
  ASSERT_FALSE(ids.ok());
  EXPECT_THAT(ids.status().message(), HasSubstr("byte offset 2"));
  const auto text = tok_->Decode({258, 263});
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), HasSubstr("263"));
}

// Llama 2's shape: Prepend + Replace normalizers, byte fallback, and the
// Replace/ByteFallback/Fuse/Strip decoder.
Json MetaspaceJson() {
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  vocab["\xE2\x96\x81"] = 259;  // ▁
  vocab["H"] = 260;
  vocab["i"] = 261;
  vocab["\xE2\x96\x81H"] = 262;
  vocab["\xE2\x96\x81Hi"] = 263;
  auto special = [](int id, const char* content) {
    return Json{{"id", id}, {"content", content}, {"special", true}, {"normalized", false}};
  };
  return Json{
      {"added_tokens", {special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                         {{"type", "Replace"}, {"pattern", {{"String", " "}}},
                          {"content", "\xE2\x96\x81"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"unk_token", "<unk>"}, {"byte_fallback", true},
        {"fuse_unk", true}, {"merges", {"\xE2\x96\x81 H", "\xE2\x96\x81H i"}}}}};
}

class HfMetaspaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = LoadTokenizer(WriteTokenizer("metaspace", MetaspaceJson()));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(HfMetaspaceTest, PrependsTheDummySpaceAndFallsBackToBytes) {
  // é is not in the vocabulary: C3 A9 as byte tokens.
  EXPECT_EQ(*tok_->Encode("Hi Hi\xC3\xA9"),
            (std::vector<int32_t>{1, 263, 263, 3 + 0xC3, 3 + 0xA9}));
}

TEST_F(HfMetaspaceTest, StripsOneLeadingSpaceOfTheWholeTextOnly) {
  EXPECT_EQ(*tok_->Decode({1, 263, 263}, {.skip_special_tokens = true}), "Hi Hi");
  EXPECT_EQ(*tok_->Decode({1, 263, 263}), "<s> Hi Hi");
  EXPECT_EQ(*tok_->Decode({259, 259, 263}, {.skip_special_tokens = true}), "  Hi");
  IncrementalDetokenizer detok(*tok_, {.skip_special_tokens = true});
  EXPECT_EQ(*detok.Push(1), "");
  EXPECT_EQ(*detok.Push(2), "");
  EXPECT_EQ(*detok.Push(263), "Hi");
  EXPECT_EQ(*detok.Push(263), " Hi");
}

TEST_F(HfMetaspaceTest, DecodesAnIllFormedByteRunAsOneWhatwgSequence) {
  // E6 97 41 in one run: U+FFFD for E6 97, then A (TextDecoder's rule).
  EXPECT_EQ(*tok_->Decode({3 + 0xE6, 3 + 0x97, 3 + 0x41, 261}), "\xEF\xBF\xBD" "Ai");
}

TEST(HfTokenizerErrorsTest, NamesWhatIsNotSupported) {
  struct Case {
    std::string name;
    std::function<void(Json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"unigram", [](Json& j) { j["model"]["type"] = "Unigram"; },
       "tokenizer.json: model.type 'Unigram' is not supported"},
      {"bert_normalizer", [](Json& j) { j["normalizer"] = {{"type", "BertNormalizer"}}; },
       "normalizer: normalizer type 'BertNormalizer' is not supported"},
      {"lookbehind",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?<=a)b"; },
       "regex construct (?<... at offset 0"},
      {"possessive",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a++"; },
       "possessive quantifier at offset 2"},
      {"wordpiece_decoder", [](Json& j) { j["decoder"] = {{"type", "WordPiece"}}; },
       "decoder type 'WordPiece' is not supported"},
      {"metaspace_decoder_scheme",
       [](Json& j) { j["decoder"] = {{"type", "Metaspace"}, {"prepend_scheme", "frist"}}; },
       "prepend_scheme 'frist' is not supported"},
      {"bad_merge", [](Json& j) { j["model"]["merges"].push_back("x yz"); },
       "merges[4] (\"x\", \"yz\") uses a token not in the vocab"},
      {"single_word", [](Json& j) { j["added_tokens"][0]["single_word"] = true; },
       "added_tokens[0]: single_word is not supported"},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; }, "BPE dropout is not supported"},
      // Ids index dense tables: one far-off id would allocate a huge one.
      {"far_vocab_id", [](Json& j) { j["model"]["vocab"]["far"] = 1 << 22; },
       "vocab entry \"far\" has no valid id"},
      {"far_added_id", [](Json& j) { j["added_tokens"][0]["id"] = 1 << 22; },
       "added_tokens[0]: has no valid 'id'"},
  };
  for (const Case& c : cases) {
    Json json = ByteLevelJson();
    c.edit(json);
    const auto tok = LoadTokenizer(WriteTokenizer("error_" + c.name, json));
    ASSERT_FALSE(tok.ok()) << c.name;
    EXPECT_THAT(tok.status().message(), HasSubstr(c.message)) << c.name;
  }
}

TEST(HfTokenizerErrorsTest, NamesTheByteOfBadJsonAndAConfigPassedAsTokenizer) {
  const std::string dir = std::string(TANDEM_BINARY_DIR) + "/hf_tokenizer_test/bad_json";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": {\"type\": \"BPE\",, }";
  auto tok = LoadTokenizer(dir);
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("not valid JSON at byte"));
  std::ofstream(dir + "/tokenizer.json") << "{\"bos_token\": \"<s>\"}";
  tok = LoadTokenizer(dir + "/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("has no 'model' object"));
  // A number beyond a double's range makes nlohmann throw out_of_range, not
  // parse_error (found by fuzz_hf_tokenizer_json): still a clear error.
  std::ofstream(dir + "/tokenizer.json") << "{\"version\": 1e999999}";
  tok = LoadTokenizer(dir + "/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(tok.status().message(), HasSubstr("number overflow"));
}

TEST(HfTokenizerConfigTest, TakesBosEosAndTheChatTemplateFromTokenizerConfig) {
  const std::string path = WriteTokenizer("with_config", ByteLevelJson());
  const std::string dir = std::filesystem::path(path).parent_path();
  std::ofstream(dir + "/tokenizer_config.json")
      << Json{{"bos_token", {{"content", "<|bos|>"}}}, {"eos_token", "<|eot|>"},
              {"chat_template", {{{"name", "tool_use"}, {"template", "T"}},
                                 {{"name", "default"}, {"template", "D"}}}},
              {"clean_up_tokenization_spaces", true}}
             .dump();
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_id(), 262);
  EXPECT_EQ((*tok)->eos_id(), 260);
  EXPECT_EQ((*tok)->eos_token(), "<|eot|>");
  EXPECT_EQ((*tok)->chat_template(), "D");
  EXPECT_EQ((*tok)->tool_use_chat_template(), "T");
  // transformers >= 4.43 saves it in additional_chat_templates/, which wins.
  std::filesystem::create_directories(dir + "/additional_chat_templates");
  std::ofstream(dir + "/additional_chat_templates/tool_use.jinja") << "F";
  auto with_file = LoadTokenizer(dir);
  ASSERT_TRUE(with_file.ok()) << with_file.status();
  EXPECT_EQ((*with_file)->tool_use_chat_template(), "F");
  EXPECT_EQ((*with_file)->chat_template(), "D");
  std::filesystem::remove_all(dir + "/additional_chat_templates");
  // clean_up_tokenization_spaces from the config, unless the caller says.
  const std::vector<int32_t> ids = *(*tok)->Encode("x .", {.add_special_tokens = false});
  EXPECT_EQ(*(*tok)->Decode(ids), "x.");
  EXPECT_EQ(*(*tok)->Decode(ids, {.clean_up_tokenization_spaces = false}), "x .");
}

// transformers 5: add_bos_token / add_eos_token in tokenizer_config.json
// replace tokenizer.json's template ([bos] $A [eos], a flag not named is
// false), as Phi-3's add_bos_token false drops the <s> its tokenizer.json
// adds; split_special_tokens true is refused, not ignored.
TEST(HfTokenizerConfigTest, AddBosAndEosTokenReplaceThePostProcessorsTemplate) {
  const std::string path = WriteTokenizer("add_bos_eos", ByteLevelJson());
  const std::string dir = std::filesystem::path(path).parent_path();
  auto encode = [&](const Json& config) -> absl::StatusOr<std::vector<int32_t>> {
    std::ofstream(dir + "/tokenizer_config.json") << config.dump();
    auto tok = LoadTokenizer(dir);
    if (!tok.ok()) return tok.status();
    return (*tok)->Encode("x");
  };
  const Json tokens = {{"bos_token", "<|bos|>"}, {"eos_token", "<|eot|>"}};
  const std::vector<int32_t> x = *encode(tokens);
  ASSERT_EQ(x.size(), 2u);
  EXPECT_EQ(x.front(), 262) << "tokenizer.json's template: <|bos|> $A";
  const int32_t text = x.back();
  Json c = tokens;
  c["add_bos_token"] = false;
  c["add_eos_token"] = true;
  EXPECT_EQ(*encode(c), (std::vector<int32_t>{text, 260}));
  c = tokens;
  c["add_eos_token"] = true;  // add_bos_token not named: false, as transformers 5 reads it
  EXPECT_EQ(*encode(c), (std::vector<int32_t>{text, 260}));
  c = tokens;
  c["add_bos_token"] = true;
  EXPECT_EQ(*encode(c), (std::vector<int32_t>{262, text}));
  c = tokens;
  c["add_bos_token"] = false;
  EXPECT_EQ(*encode(c), (std::vector<int32_t>{text}));
  c = tokens;
  c["add_bos_token"] = "yes";
  EXPECT_THAT(encode(c).status().message(), HasSubstr("\"add_bos_token\" is not a boolean"));
  c = tokens;
  c["split_special_tokens"] = true;
  EXPECT_THAT(encode(c).status().message(),
              HasSubstr("split_special_tokens true is not supported"));
  c = tokens;
  c["bos_token"] = "<|nowhere|>";
  c["add_bos_token"] = true;
  EXPECT_THAT(encode(c).status().message(), HasSubstr("not in the vocabulary"));
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// transformers >= 4.43 saves the template as chat_template.jinja beside
// tokenizer_config.json, which then has none; a directory may also have no
// tokenizer_config.json at all.
TEST(HfTokenizerConfigTest, TakesTheChatTemplateFromChatTemplateJinja) {
  const std::string chatml = ReadText(TestData("chat_templates/chatml.jinja"));
  const std::string path = WriteTokenizer("with_jinja", ByteLevelJson());
  const std::string dir = std::filesystem::path(path).parent_path();
  std::ofstream(dir + "/chat_template.jinja") << chatml;
  for (const std::string& where : {dir, path}) {
    auto tok = LoadTokenizer(where);
    ASSERT_TRUE(tok.ok()) << where << ": " << tok.status();
    EXPECT_EQ((*tok)->chat_template(), chatml) << where;
    EXPECT_EQ((*tok)->bos_id(), 262) << where << ": the post-processor's BOS as without it";
  }
  // llama2.c and SentencePiece tokenizers take it the same way.
  const std::string bin_dir = std::string(TANDEM_BINARY_DIR) + "/hf_tokenizer_test/bin_with_jinja";
  std::filesystem::create_directories(bin_dir);
  std::filesystem::copy_file(SharedModel("tokenizer.bin"), bin_dir + "/tokenizer.bin",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(bin_dir + "/chat_template.jinja") << chatml;
  auto bin = LoadTokenizer(bin_dir);
  ASSERT_TRUE(bin.ok()) << bin.status();
  EXPECT_EQ((*bin)->chat_template(), chatml);
  EXPECT_EQ((*bin)->bos_id(), 1);
}

// As in transformers (PreTrainedTokenizerBase._from_pretrained: "If
// independent chat template file(s) exist, they take priority over template
// entries in the tokenizer config").
TEST(HfTokenizerConfigTest, ChatTemplateJinjaWinsOverTokenizerConfigsTemplate) {
  const std::string path = WriteTokenizer("config_and_jinja", ByteLevelJson());
  const std::string dir = std::filesystem::path(path).parent_path();
  std::ofstream(dir + "/tokenizer_config.json")
      << Json{{"eos_token", "<|eot|>"}, {"chat_template", "from the config"}}.dump();
  std::ofstream(dir + "/chat_template.jinja") << "from the file";
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->chat_template(), std::string("from the file"));
  EXPECT_EQ((*tok)->eos_id(), 260) << "the rest of tokenizer_config.json still counts";
  std::filesystem::remove(dir + "/chat_template.jinja");
  tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->chat_template(), std::string("from the config"));
}

// A multimodal checkpoint (gemma-3-4b-it, Mistral Small 3.1) carries its
// processor's template in chat_template.json; vLLM renders a multimodal
// model's processor template before its tokenizer's. A text-only model's
// chat_template.json is no processor's and changes nothing.
TEST(HfTokenizerConfigTest, AMultimodalModelTakesItsProcessorsChatTemplateJson) {
  const std::string path = WriteTokenizer("processor_template", ByteLevelJson());
  const std::string dir = std::filesystem::path(path).parent_path();
  std::ofstream(dir + "/tokenizer_config.json")
      << Json{{"eos_token", "<|eot|>"}, {"chat_template", "from the config"}}.dump();
  std::ofstream(dir + "/chat_template.json")
      << Json{{"chat_template", "from the processor"}}.dump();
  std::ofstream(dir + "/config.json") << Json{{"model_type", "gemma3_text"}}.dump();
  auto text_only = LoadTokenizer(dir);
  ASSERT_TRUE(text_only.ok()) << text_only.status();
  EXPECT_EQ((*text_only)->chat_template(), std::string("from the config"));
  std::ofstream(dir + "/config.json") << Json{
      {"model_type", "gemma3"},
      {"text_config", Json::object()},
      {"vision_config", Json::object()}}.dump();
  auto multimodal = LoadTokenizer(dir);
  ASSERT_TRUE(multimodal.ok()) << multimodal.status();
  EXPECT_EQ((*multimodal)->chat_template(), std::string("from the processor"));
  EXPECT_EQ((*multimodal)->eos_id(), 260) << "the rest of tokenizer_config.json still counts";
  std::ofstream(dir + "/chat_template.jinja") << "from the file";
  auto jinja = LoadTokenizer(dir);
  ASSERT_TRUE(jinja.ok()) << jinja.status();
  EXPECT_EQ((*jinja)->chat_template(), std::string("from the file"));
  std::filesystem::remove(dir + "/chat_template.jinja");
  std::ofstream(dir + "/chat_template.json") << Json{{"chat_template", 7}}.dump();
  auto bad = LoadTokenizer(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("chat_template.json"), std::string::npos) << bad.status();
}

// tokenizers' Split pre-tokenizer, every SplitDelimiterBehavior, on the
// crate's own examples: its docstring's "the-final--countdown" split on "-",
// and split.rs's `basic` test (words and punctuation, inverted, so the
// whitespace between them is the delimiter). Gemma 3's tokenizer.json uses
// MergedWithPrevious, which was refused.
TEST(HfSplitTest, EveryDelimiterBehaviorCutsAsTheTokenizersCrate) {
  struct Case {
    Json pattern;
    bool invert;
    std::string text;
    std::map<std::string, std::vector<std::string>> want;
  };
  const std::vector<Case> cases = {
      {{{"String", "-"}},
       false,
       "the-final--countdown",
       {{"Removed", {"the", "final", "countdown"}},
        {"Isolated", {"the", "-", "final", "-", "-", "countdown"}},
        {"MergedWithPrevious", {"the-", "final-", "-", "countdown"}},
        {"MergedWithNext", {"the", "-final", "-", "-countdown"}},
        {"Contiguous", {"the", "-", "final", "--", "countdown"}}}},
      // split.rs writes \w+|[^\w\s]+; the same matches here, in what
      // SplitRegex reads.
      {{{"Regex", "\\p{L}+|[^\\p{L}\\s]+"}},
       true,
       "How are you doing?",
       {{"Removed", {"How", "are", "you", "doing", "?"}},
        {"Isolated", {"How", " ", "are", " ", "you", " ", "doing", "?"}},
        {"MergedWithPrevious", {"How ", "are ", "you ", "doing", "?"}},
        {"MergedWithNext", {"How", " are", " you", " doing", "?"}},
        {"Contiguous", {"How", " ", "are", " ", "you", " ", "doing?"}}}},
  };
  for (const Case& c : cases) {
    for (const auto& [behavior, want] : c.want) {
      SCOPED_TRACE(c.text + " / " + behavior);
      const Json json = {
          {"type", "Split"}, {"pattern", c.pattern}, {"behavior", behavior}, {"invert", c.invert}};
      auto split = internal::ParsePreTokenizer(json, "pre_tokenizer");
      ASSERT_TRUE(split.ok()) << split.status();
      std::vector<std::string> pieces = {c.text};
      (*split)->PreTokenize(&pieces, 0);
      EXPECT_EQ(pieces, want);
    }
  }
  auto unknown = internal::ParsePreTokenizer(
      {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Sideways"}}, "x");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("Split behavior 'Sideways'"));
}

}  // namespace
}  // namespace tandem::tokenizer::testing
