// The OpenAI and vLLM logprobs objects (completions', chat's and vLLM's
// prompt_logprobs) from a request's scored positions; declared in openai.h.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "openai_parse.h"
#include "tandem/frontend/openai.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::frontend {

using internal::Json;

namespace {

double Clamped(float logprob) { return std::max(static_cast<double>(logprob), -9999.0); }

// Code points, as Python's len() of the text.
int64_t TextLength(std::string_view text) {
  return std::count_if(text.begin(), text.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

Json BytesList(std::string_view bytes) {
  Json list = Json::array();
  for (char b : bytes) list.push_back(static_cast<unsigned char>(b));
  return list;
}

// A token's text in the logprobs: its own (invalid UTF-8 replaced), or
// vLLM's "token_id:<id>".
std::string TokenText(const LogprobToken& t, bool as_token_ids) {
  return as_token_ids ? absl::StrCat("token_id:", t.token_id)
                      : tokenizer::ReplaceInvalidUtf8(t.bytes);
}

size_t NumTop(const PositionLogprobs& p, int32_t num_top) {
  return std::min(p.top.size(), static_cast<size_t>(std::max(num_top, 0)));
}

}  // namespace

Json CompletionLogprobs(const std::vector<PositionLogprobs>& positions, int32_t num_top,
                        int64_t* text_offset, bool as_token_ids) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       offsets = Json::array();
  for (const PositionLogprobs& p : positions) {
    const std::string text = TokenText(p.token, as_token_ids);
    tokens.push_back(text);
    offsets.push_back(*text_offset);
    *text_offset += TextLength(text);
    if (!p.scored) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(Clamped(p.token.logprob));
    Json top = Json::object();
    top[text] = Clamped(p.token.logprob);
    for (size_t i = 0; i < NumTop(p, num_top); ++i) {
      top[TokenText(p.top[i], as_token_ids)] = Clamped(p.top[i].logprob);
    }
    top_logprobs.push_back(std::move(top));
  }
  Json j;
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(token_logprobs);
  j["top_logprobs"] = std::move(top_logprobs);
  j["text_offset"] = std::move(offsets);
  return j;
}

Json ChatLogprobs(const std::vector<PositionLogprobs>& positions, int32_t num_top,
                  bool as_token_ids) {
  // {"token", "logprob", "bytes"}: the token's own bytes, or with
  // as_token_ids those of its text.
  auto entry = [&](const LogprobToken& t, Json logprob) {
    std::string text = TokenText(t, as_token_ids);
    Json bytes = BytesList(as_token_ids ? text : t.bytes);
    return Json{
        {"token", std::move(text)}, {"logprob", std::move(logprob)}, {"bytes", std::move(bytes)}};
  };
  Json content = Json::array();
  for (const PositionLogprobs& p : positions) {
    Json top = Json::array();
    for (size_t i = 0; i < NumTop(p, num_top); ++i) {
      top.push_back(entry(p.top[i], Clamped(p.top[i].logprob)));
    }
    Json e = entry(p.token, p.scored ? Json(Clamped(p.token.logprob)) : Json());
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}};
}

Json PromptLogprobs(const std::vector<PositionLogprobs>& positions, int32_t num_top) {
  Json list = Json::array();
  for (const PositionLogprobs& p : positions) {
    if (!p.scored) {
      list.push_back(nullptr);
      continue;
    }
    Json d = Json::object();
    d[absl::StrCat(p.token.token_id)] = {
        {"logprob", Clamped(p.token.logprob)},
        {"rank", p.rank},
        {"decoded_token", tokenizer::ReplaceInvalidUtf8(p.token.bytes)}};
    for (size_t i = 0; i < NumTop(p, num_top); ++i) {
      const std::string key = absl::StrCat(p.top[i].token_id);
      if (d.contains(key)) continue;  // the prompt's own token
      d[key] = {{"logprob", Clamped(p.top[i].logprob)},
                {"rank", static_cast<int32_t>(i) + 1},
                {"decoded_token", tokenizer::ReplaceInvalidUtf8(p.top[i].bytes)}};
    }
    list.push_back(std::move(d));
  }
  return list;
}

}  // namespace tandem::frontend
