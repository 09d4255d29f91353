// The text tandem-frontend returns for generated ids is the prompt-primed
// decode, as vLLM's: Decode(prompt ids + output ids) minus Decode(prompt
// ids), so the first generated word keeps its leading space (issue 30). For
// every tokenizer family (llama2.c, SentencePiece, byte-level BPE,
// Metaspace), the real frontend binary talks to an in-process fake scheduler
// that answers with chosen output ids, one message per token: outputs that
// start with a space-prefixed word and with a multi-byte character, after
// a text prompt and after token-id prompts that end in a byte-fallback
// piece, through /v1/completions (plain, streamed, echo, a stop string
// that starts in the first token's space) and /v1/chat/completions (plain
// and streamed deltas). The expected text comes from the tokenizer's whole
// Decode, which tests/tokenizer checks against the references, without
// clean_up_tokenization_spaces (vLLM's detokenizer never applies it).
#include <sstream>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

const std::string kModels = std::string(TANDEM_SHARED_DIR) + "/models/";
const std::string kNpm = std::string(TANDEM_BINARY_DIR) + "/tokenizer_npm/models/";

struct Family {
  const char* name;
  std::string tokenizer;
  bool byte_fallback;  // has <0xXX> pieces
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

// The first `n` UTF-8 characters of `s`.
std::string FirstChars(const std::string& s, int n) {
  size_t end = 0;
  for (int i = 0; i < n && end < s.size(); ++i) {
    ++end;
    while (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) ++end;
  }
  return s.substr(0, end);
}

std::string Dump(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json PostJson(const Service& frontend, const std::string& path, const Json& body,
              std::string* raw = nullptr) {
  httplib::Client client("http://" + frontend.address());
  client.set_read_timeout(30, 0);
  auto res = client.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(res) << body.dump();
  if (!res) return Json();
  EXPECT_EQ(res->status, 200) << body.dump() << ": " << res->body;
  if (raw != nullptr) *raw = res->body;
  return Json::parse(res->body, nullptr, false);
}

// The text of a stream (completions' text or chat's delta content) and its
// finish reason.
struct Streamed {
  std::string text, finish_reason;
  Json stop_reason;
};
Streamed ParseSse(const std::string& body) {
  Streamed out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
    const Json chunk = Json::parse(line.substr(6));
    for (const Json& c : chunk["choices"]) {
      if (c.contains("text")) out.text += c["text"].get<std::string>();
      if (c.contains("delta")) out.text += c["delta"].value("content", "");
      if (!c["finish_reason"].is_null()) {
        out.finish_reason = c["finish_reason"];
        out.stop_reason = c["stop_reason"];
      }
    }
  }
  return out;
}

class FrontendTextTest : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    auto tok = tokenizer::LoadTokenizer(GetParam().tokenizer);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    scheduler_ = std::make_unique<FakeScheduler>(
        FakeModelInfo(GetParam().name, tok_->vocab_size(), /*max_model_len=*/4096));
    frontend_ = StartFrontend(MakeTempDir("frontend-text"), "frontend", {scheduler_->address()},
                              {"--tokenizer", GetParam().tokenizer, "--chat-template", "llama-2"});
  }

  std::vector<int32_t> Encode(const std::string& text, bool special) {
    auto ids = tok_->Encode(text, {.add_special_tokens = special});
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  // The ids of `text` after its first `head` characters: Encode(text)
  // split where the decode of the head is `head`.
  std::vector<int32_t> Tail(const std::string& text, const std::string& head) {
    const std::vector<int32_t> ids = Encode(text, true);
    for (size_t k = 1; k < ids.size(); ++k) {
      auto d = tok_->Decode(std::vector<int32_t>(ids.begin(), ids.begin() + k),
                            {.skip_special_tokens = true});
      if (d.ok() && *d == head) return std::vector<int32_t>(ids.begin() + k, ids.end());
    }
    ADD_FAILURE() << "no split of " << Dump(text) << " after " << Dump(head);
    return {};
  }

  // Decode(prompt + output) minus Decode(prompt), as the frontend decodes
  // (skip_special_tokens; never clean_up_tokenization_spaces, as vLLM,
  // though Llama 3's tokenizer_config.json asks for it).
  std::string Expected(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), output.begin(), output.end());
    const tokenizer::DecodeOptions as_served{.skip_special_tokens = true,
                                             .clean_up_tokenization_spaces = false};
    const auto whole = tok_->Decode(all, as_served);
    const auto head = tok_->Decode(prompt, as_served);
    EXPECT_TRUE(whole.ok() && head.ok());
    EXPECT_EQ(whole->substr(0, head->size()), *head) << "the case is not a continuation";
    return whole->substr(head->size());
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<FakeScheduler> scheduler_;
  Service frontend_;
};

TEST_P(FrontendTextTest, EveryPathReturnsThePromptPrimedDecode) {
  // Outputs: a space-prefixed word first, a multi-byte character first,
  // and spaces that clean_up_tokenization_spaces would remove.
  const std::vector<std::vector<int32_t>> outputs = {
      Tail("Hello world, and 日本 😀 done", "Hello"),
      Tail("Hello日本語 and more", "Hello"),
      Tail("Hello world ! Yes , it is n't x .y", "Hello"),
  };
  for (const auto& output : outputs) ASSERT_FALSE(output.empty());
  // Prompts: text, and token ids ending in a newline and in the last byte of
  // an emoji (byte-fallback pieces where the family has them).
  std::vector<Json> prompts = {"Once upon a time", Encode("Once upon a time\n", true),
                               Encode("Once upon a 😀", true)};
  if (GetParam().byte_fallback) {
    for (size_t i = 1; i < prompts.size(); ++i) {
      const auto piece = tok_->IdToPiece(prompts[i].back().get<int32_t>());
      ASSERT_TRUE(piece.ok());
      EXPECT_EQ(piece->rfind("<0x", 0), 0u) << "not a byte-fallback piece: " << *piece;
    }
  }
  for (const std::vector<int32_t>& output : outputs) {
    scheduler_->SetOutput(output, v1::FINISH_REASON_LENGTH);
    for (const Json& prompt : prompts) {
      SCOPED_TRACE("prompt " + prompt.dump() + " output " + Json(output).dump());
      const Json body = {{"prompt", prompt}, {"max_tokens", 64}, {"return_token_ids", true}};
      const Json plain = PostJson(frontend_, "/v1/completions", body);
      ASSERT_TRUE(plain.is_object());
      const std::vector<int32_t> prompt_ids = plain["choices"][0]["prompt_token_ids"];
      ASSERT_EQ(plain["choices"][0]["token_ids"].get<std::vector<int32_t>>(), output);
      const std::string expected = Expected(prompt_ids, output);
      EXPECT_EQ(Dump(plain["choices"][0]["text"]), Dump(expected)) << "completions";

      Json streamed_body = body;
      streamed_body["stream"] = true;
      std::string raw;
      PostJson(frontend_, "/v1/completions", streamed_body, &raw);
      EXPECT_EQ(Dump(ParseSse(raw).text), Dump(expected)) << "completions, streamed";

      // echo: the prompt's text, then the same continuation.
      Json echo_body = body;
      echo_body["echo"] = true;
      const std::string prompt_text =
          prompt.is_string() ? prompt.get<std::string>() : *tok_->Decode(prompt_ids);
      EXPECT_EQ(Dump(PostJson(frontend_, "/v1/completions", echo_body)["choices"][0]["text"]),
                Dump(prompt_text + expected))
          << "echo";
      echo_body["stream"] = true;
      PostJson(frontend_, "/v1/completions", echo_body, &raw);
      EXPECT_EQ(Dump(ParseSse(raw).text), Dump(prompt_text + expected)) << "echo, streamed";

      // A stop string made of the first two characters (the first token's
      // leading space and more): it matches only when that space is there.
      const std::string stop = FirstChars(expected, 2);
      for (const bool stream : {false, true}) {
        Json stop_body = body;
        stop_body["stop"] = stop;
        stop_body["stream"] = stream;
        const Json j = PostJson(frontend_, "/v1/completions", stop_body, &raw);
        const Streamed got = stream ? ParseSse(raw)
                                    : Streamed{j["choices"][0]["text"],
                                               j["choices"][0]["finish_reason"],
                                               j["choices"][0]["stop_reason"]};
        EXPECT_EQ(Dump(got.text), Dump("")) << "stop " << Dump(stop) << ", stream " << stream;
        EXPECT_EQ(got.finish_reason, "stop");
        EXPECT_EQ(got.stop_reason, Json(stop));
      }
    }
    // Chat: the rendered conversation is the prompt.
    SCOPED_TRACE("chat, output " + Json(output).dump());
    const Json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                       {"max_tokens", 64},
                       {"return_token_ids", true}};
    const Json plain = PostJson(frontend_, "/v1/chat/completions", chat);
    ASSERT_TRUE(plain.is_object());
    const std::string expected = Expected(plain["prompt_token_ids"], output);
    EXPECT_EQ(Dump(plain["choices"][0]["message"]["content"]), Dump(expected)) << "chat";
    Json streamed = chat;
    streamed["stream"] = true;
    std::string raw;
    PostJson(frontend_, "/v1/chat/completions", streamed, &raw);
    EXPECT_EQ(Dump(ParseSse(raw).text), Dump(expected)) << "chat deltas";
  }
}

// A sanitizer build cannot load SentencePiece beside gRPC's protobuf (see
// libs/tokenizer/sentencepiece_shim.h): there the family is left out.
std::vector<Family> Families() {
  std::vector<Family> out = {Family{"Llama2c", kModels + "tokenizer.bin", true},
                             Family{"ByteLevelLlama3", kNpm + "llama3", false},
                             Family{"ByteLevelQwen2", kNpm + "qwen2", false},
                             Family{"Metaspace", kNpm + "llama2_metaspace", true}};
#ifndef TANDEM_SANITIZER_BUILD
  out.push_back(Family{"SentencePiece", kModels + "tokenizer.model", true});
#endif
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, FrontendTextTest, ::testing::ValuesIn(Families()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::testing
