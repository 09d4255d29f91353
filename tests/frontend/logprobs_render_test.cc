// OpenAI's logprobs as tandem-frontend renders them (issue 30): the shapes of
// vLLM's _create_completion_logprobs, _create_chat_logprobs and
// prompt_logprobs, token texts and bytes, and the request fields' checks.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tandem/frontend/openai.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::frontend {
namespace {

using Json = nlohmann::ordered_json;

LogprobToken Tok(int32_t id, std::string bytes, float logprob) {
  return {.token_id = id, .bytes = std::move(bytes), .logprob = logprob};
}

// Three positions: " Once" the most likely; "é" (two bytes) outside the top 2
// at -inf; a lone byte 0xE6 (not UTF-8 alone) the second most likely.
std::vector<PositionLogprobs> Positions() {
  std::vector<PositionLogprobs> p(3);
  p[0] = {.token = Tok(10, " Once", -0.25f),
          .rank = 1,
          .top = {Tok(10, " Once", -0.25f), Tok(11, " Two", -1.5f), Tok(12, " x", -3.0f)}};
  p[1] = {.token = Tok(20, "\xC3\xA9", -INFINITY),
          .rank = 4,
          .top = {Tok(21, "a", -0.5f), Tok(22, "b", -1.0f), Tok(23, "c", -2.0f)}};
  p[2] = {.token = Tok(30, "\xE6", -0.75f),
          .rank = 2,
          .top = {Tok(31, "\xE6\x88", -0.5f), Tok(30, "\xE6", -0.75f), Tok(32, "d", -4.0f)}};
  return p;
}

TEST(LogprobsRenderTest, CompletionsHaveOpenAisFourListsWithTheChosenTokenInTopLogprobs) {
  int64_t offset = 0;
  const Json j = CompletionLogprobs(Positions(), 2, &offset);
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j["tokens"], Json({" Once", "\xC3\xA9", "\xEF\xBF\xBD"}));
  // -inf is clamped at -9999.0, as vLLM does.
  EXPECT_EQ(j["token_logprobs"], Json({-0.25, -9999.0, -0.75}));
  // The top 2 plus the chosen token when it is not among them; the chosen
  // first (vLLM's dict order).
  EXPECT_EQ(j["top_logprobs"][0].dump(), R"({" Once":-0.25," Two":-1.5})");
  EXPECT_EQ(j["top_logprobs"][1].dump(), R"({"é":-9999.0,"a":-0.5,"b":-1.0})");
  // 0xE6 and 0xE6 0x88 both read as one U+FFFD: one key, the later value (a
  // Python dict's).
  EXPECT_EQ(j["top_logprobs"][2].dump(), R"({"�":-0.75})");
  // Each offset: the previous plus the previous token's length in code points.
  EXPECT_EQ(j["text_offset"], Json({0, 5, 6}));
  EXPECT_EQ(offset, 7);
}

TEST(LogprobsRenderTest, AnUnscoredPositionHasNullsAndOffsetsStartWhereTold) {
  std::vector<PositionLogprobs> p = Positions();
  p.insert(p.begin(), PositionLogprobs{.token = Tok(1, "<s>", 0), .scored = false});
  int64_t offset = 4;
  const Json j = CompletionLogprobs(p, 1, &offset);
  EXPECT_EQ(j["tokens"][0], "<s>");
  EXPECT_TRUE(j["token_logprobs"][0].is_null());
  EXPECT_TRUE(j["top_logprobs"][0].is_null());
  EXPECT_EQ(j["token_logprobs"][1], -0.25);
  EXPECT_EQ(j["text_offset"], Json({4, 7, 12, 13}));
}

TEST(LogprobsRenderTest, StreamedChunksAddUpToTheWholeChoice) {
  const std::vector<PositionLogprobs> all = Positions();
  int64_t whole_offset = 0;
  const Json whole = CompletionLogprobs(all, 3, &whole_offset);
  int64_t offset = 0;
  Json joined = {{"tokens", Json::array()},
                 {"token_logprobs", Json::array()},
                 {"top_logprobs", Json::array()},
                 {"text_offset", Json::array()}};
  Json chat_joined = Json::array();
  for (const auto& part : {std::vector<PositionLogprobs>(all.begin(), all.begin() + 1),
                           std::vector<PositionLogprobs>(),
                           std::vector<PositionLogprobs>(all.begin() + 1, all.end())}) {
    const Json chunk = CompletionLogprobs(part, 3, &offset);
    for (const auto& [key, list] : chunk.items()) {
      for (const Json& v : list) joined[key].push_back(v);
    }
    const Json chat = ChatLogprobs(part, 3);
    for (const Json& v : chat["content"]) chat_joined.push_back(v);
  }
  EXPECT_EQ(joined, whole);
  EXPECT_EQ(offset, whole_offset);
  EXPECT_EQ(chat_joined, ChatLogprobs(all, 3)["content"]);
}

// vLLM's return_tokens_as_token_ids: every token, chosen or top, reads
// "token_id:<id>" (so 0xE6 and 0xE6 0x88 stay apart), the offsets count
// those texts, and chat's bytes are the text's (vLLM encodes the string).
TEST(LogprobsRenderTest, AsTokenIdsEveryTokenReadsItsId) {
  int64_t offset = 0;
  const Json j = CompletionLogprobs(Positions(), 2, &offset, /*as_token_ids=*/true);
  EXPECT_EQ(j["tokens"], Json({"token_id:10", "token_id:20", "token_id:30"}));
  EXPECT_EQ(j["top_logprobs"][0].dump(), R"({"token_id:10":-0.25,"token_id:11":-1.5})");
  EXPECT_EQ(j["top_logprobs"][2].dump(), R"({"token_id:30":-0.75,"token_id:31":-0.5})");
  EXPECT_EQ(j["text_offset"], Json({0, 11, 22}));
  EXPECT_EQ(offset, 33);
  const Json chat = ChatLogprobs(Positions(), 2, /*as_token_ids=*/true);
  const Json& first = chat["content"][0];
  EXPECT_EQ(first["token"], "token_id:10");
  EXPECT_EQ(first["bytes"], Json({'t', 'o', 'k', 'e', 'n', '_', 'i', 'd', ':', '1', '0'}));
  EXPECT_EQ(first["top_logprobs"][1]["token"], "token_id:11");
  EXPECT_EQ(chat["content"][2]["top_logprobs"][0]["token"], "token_id:31");
}

TEST(LogprobsRenderTest, ChatListsTheMostLikelyAndTheTokensOwnBytes) {
  const Json j = ChatLogprobs(Positions(), 2);
  ASSERT_EQ(j.size(), 1u);
  const Json& content = j["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[0].dump(),
            R"({"token":" Once","logprob":-0.25,"bytes":[32,79,110,99,101],"top_logprobs":[)"
            R"({"token":" Once","logprob":-0.25,"bytes":[32,79,110,99,101]},)"
            R"({"token":" Two","logprob":-1.5,"bytes":[32,84,119,111]}]})");
  // OpenAI's list: the 2 most likely, the chosen token not added.
  EXPECT_EQ(content[1]["logprob"], -9999.0);
  EXPECT_EQ(content[1]["bytes"], Json({0xC3, 0xA9}));
  ASSERT_EQ(content[1]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[1]["top_logprobs"][0]["token"], "a");
  EXPECT_EQ(content[1]["top_logprobs"][1]["token"], "b");
  // Not UTF-8 alone: the text is U+FFFD, the bytes are the token's own.
  EXPECT_EQ(content[2]["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(content[2]["bytes"], Json({0xE6}));
  EXPECT_EQ(content[2]["top_logprobs"][0]["bytes"], Json({0xE6, 0x88}));
  EXPECT_EQ(ChatLogprobs(Positions(), 0)["content"][0]["top_logprobs"], Json::array());
}

TEST(LogprobsRenderTest, PromptLogprobsAreVllmsDictsByTokenId) {
  std::vector<PositionLogprobs> p = Positions();
  p.insert(p.begin(), PositionLogprobs{.token = Tok(1, "<s>", 0), .scored = false});
  const Json j = PromptLogprobs(p, 2);
  ASSERT_EQ(j.size(), 4u);
  EXPECT_TRUE(j[0].is_null());
  EXPECT_EQ(j[1].dump(), R"({"10":{"logprob":-0.25,"rank":1,"decoded_token":" Once"},)"
                         R"("11":{"logprob":-1.5,"rank":2,"decoded_token":" Two"}})");
  EXPECT_EQ(j[2].dump(), R"({"20":{"logprob":-9999.0,"rank":4,"decoded_token":"é"},)"
                         R"("21":{"logprob":-0.5,"rank":1,"decoded_token":"a"},)"
                         R"("22":{"logprob":-1.0,"rank":2,"decoded_token":"b"}})");
  EXPECT_EQ(j[3]["30"]["rank"], 2);
  EXPECT_EQ(j[3].size(), 2u);  // 30 is also the second most likely
}

TEST(LogprobsRenderTest, TokenBytesOfEachVocabularyKind) {
  EXPECT_EQ(tokenizer::PieceBytes("<0x0A>", false), "\n");
  EXPECT_EQ(tokenizer::PieceBytes("<0xE6>", true), "\xE6");
  EXPECT_EQ(tokenizer::PieceBytes("<0xZZ>", false), "<0xZZ>");
  EXPECT_EQ(tokenizer::PieceBytes("\xE2\x96\x81Once\xE2\x96\x81upon", false), " Once upon");
  // GPT-2's alphabet: "Ġ" a space, "æĪ" the bytes E6 88, "Ċ" a newline.
  EXPECT_EQ(tokenizer::PieceBytes("\xC4\xA0Once", true), " Once");
  EXPECT_EQ(tokenizer::PieceBytes("\xC3\xA6\xC4\xAA", true), "\xE6\x88");
  EXPECT_EQ(tokenizer::PieceBytes("\xC4\x8A", true), "\n");
  EXPECT_EQ(tokenizer::PieceBytes("<|im_end|>", true), "<|im_end|>");
  // A character outside the alphabet: an added token, as it is.
  EXPECT_EQ(tokenizer::PieceBytes("<\xEF\xBD\x9C"
                                  "end\xE2\x96\x81of\xEF\xBD\x9C>",
                                  true),
            "<\xEF\xBD\x9C"
            "end\xE2\x96\x81of\xEF\xBD\x9C>");
}

TEST(LogprobsRenderTest, TokenTextReplacesEachIllFormedSubpart) {
  EXPECT_EQ(tokenizer::ReplaceInvalidUtf8("abc"), "abc");
  EXPECT_EQ(tokenizer::ReplaceInvalidUtf8("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(tokenizer::ReplaceInvalidUtf8("\xE6\x88"),
            "\xEF\xBF\xBD");  // a cut character: one U+FFFD
  EXPECT_EQ(tokenizer::ReplaceInvalidUtf8("a\xFF"
                                          "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(tokenizer::ReplaceInvalidUtf8("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(tokenizer::ReplaceInvalidUtf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

std::string ErrorParam(const std::string& body, Endpoint e, std::string* message = nullptr) {
  CompletionRequest r;
  auto error = ParseCompletionRequest(body, e, &r);
  if (!error) return "";
  EXPECT_EQ(error->http_status, 400);
  if (message != nullptr) *message = error->message;
  return error->param;
}

TEST(LogprobsParseTest, FieldsAreReadWithVllmsTypesAndRules) {
  const Endpoint kCmpl = Endpoint::kCompletions, kChat = Endpoint::kChat;
  CompletionRequest r;
  ASSERT_FALSE(
      ParseCompletionRequest(R"({"prompt":"x","logprobs":3,"prompt_logprobs":2})", kCmpl, &r));
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(r.prompt_logprobs, 2);
  EXPECT_EQ(PromptLogprobsToAsk(r), 2);
  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":"x","logprobs":0,"echo":true})", kCmpl, &r));
  EXPECT_EQ(r.logprobs, 0);
  EXPECT_EQ(PromptLogprobsToAsk(r), 0);  // echo scores the prompt with the same N
  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":"x","logprobs":null,"echo":true})", kCmpl, &r));
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(PromptLogprobsToAsk(r));

  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  ASSERT_FALSE(
      ParseCompletionRequest("{" + msgs + R"(,"logprobs":true,"top_logprobs":4})", kChat, &r));
  EXPECT_EQ(r.logprobs, 4);
  ASSERT_FALSE(ParseCompletionRequest("{" + msgs + R"(,"logprobs":true})", kChat, &r));
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_FALSE(
      ParseCompletionRequest("{" + msgs + R"(,"logprobs":false,"top_logprobs":0})", kChat, &r));
  EXPECT_FALSE(r.logprobs);

  EXPECT_EQ(ErrorParam(R"({"prompt":"x","logprobs":-1})", kCmpl), "logprobs");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","logprobs":true})", kCmpl), "logprobs");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","logprobs":"2"})", kCmpl), "logprobs");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","logprobs":1.5})", kCmpl), "logprobs");
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","prompt_logprobs":-1})", kCmpl), "prompt_logprobs");
  EXPECT_EQ(ErrorParam("{" + msgs + R"(,"logprobs":1})", kChat), "logprobs");
  EXPECT_EQ(ErrorParam("{" + msgs + R"(,"logprobs":true,"top_logprobs":-2})", kChat),
            "top_logprobs");
  // top_logprobs > 0 needs logprobs true (vLLM's rule).
  EXPECT_EQ(ErrorParam("{" + msgs + R"(,"top_logprobs":2})", kChat), "top_logprobs");
  EXPECT_EQ(ErrorParam("{" + msgs + R"(,"logprobs":false,"top_logprobs":2})", kChat),
            "top_logprobs");
  // prompt_logprobs are not streamed (vLLM's rule); 0 is accepted and renders nothing.
  EXPECT_EQ(ErrorParam(R"({"prompt":"x","stream":true,"prompt_logprobs":1})", kCmpl),
            "prompt_logprobs");
  EXPECT_EQ(ErrorParam("{" + msgs + R"(,"stream":true,"prompt_logprobs":1})", kChat),
            "prompt_logprobs");
  ASSERT_FALSE(
      ParseCompletionRequest(R"({"prompt":"x","stream":true,"prompt_logprobs":0})", kCmpl, &r));
  EXPECT_FALSE(r.prompt_logprobs);
}

TEST(LogprobsParseTest, CountsAboveTheServersLimitAreRefusedNamingFieldAndLimit) {
  CompletionRequest r;
  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":"x","logprobs":20,"prompt_logprobs":20})",
                                      Endpoint::kCompletions, &r));
  EXPECT_FALSE(CheckLogprobsLimit(r, 20));
  r.logprobs = 21;
  std::optional<ApiError> e = CheckLogprobsLimit(r, 20);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "logprobs");
  EXPECT_NE(e->message.find("at most 20"), std::string::npos) << e->message;
  r.logprobs = 1;
  r.prompt_logprobs = 21;
  e = CheckLogprobsLimit(r, 20);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt_logprobs");
  r.endpoint = Endpoint::kChat;
  r.prompt_logprobs.reset();
  r.logprobs = 5;
  e = CheckLogprobsLimit(r, 4);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "top_logprobs");
  EXPECT_NE(e->message.find("'top_logprobs' (5) must be at most 4"), std::string::npos);
}

TEST(LogprobsRenderTest, ResponsesCarryLogprobsWhereOpenAiAndVllmPutThem) {
  CompletionRequest request;
  request.prompt_logprobs = 1;
  const ResponseHead head{.id = "cmpl-1", .created = 1, .model = "m"};
  Choice c{.index = 0, .text = "x", .finish_reason = FinishReason::kLength};
  c.logprobs = Json{{"tokens", {"x"}}};
  c.prompt_logprobs = Json::array({nullptr});
  Json j = CompletionResponse(request, head, {c}, Usage{}, {{1}});
  EXPECT_EQ(j["choices"][0]["logprobs"], c.logprobs);
  EXPECT_EQ(j["choices"][0]["prompt_logprobs"], c.prompt_logprobs);
  EXPECT_FALSE(j.contains("prompt_logprobs"));
  // Chat: one prompt_logprobs on the response, as vLLM's.
  request.endpoint = Endpoint::kChat;
  j = CompletionResponse(request, head, {c}, Usage{}, {{1}});
  EXPECT_EQ(j["choices"][0]["logprobs"], c.logprobs);
  EXPECT_FALSE(j["choices"][0].contains("prompt_logprobs"));
  EXPECT_EQ(j["prompt_logprobs"], c.prompt_logprobs);
  // Not asked: null logprobs, no prompt_logprobs.
  request.prompt_logprobs.reset();
  j = CompletionResponse(request, head, {Choice{}}, Usage{}, {{1}});
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(j.contains("prompt_logprobs"));
}

}  // namespace
}  // namespace tandem::frontend
