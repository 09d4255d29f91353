#include "tandem/frontend/prompts.h"

#include <algorithm>
#include <climits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "openai_parse.h"

namespace tandem::frontend {

ServedTokenizer::ServedTokenizer(std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
                                 std::optional<tokenizer::ChatTemplate> chat_template,
                                 absl::StatusOr<std::optional<tokenizer::ChatTemplate>> tool_use)
    : tokenizer_(std::move(tokenizer)),
      chat_template_(std::move(chat_template)),
      tool_use_(std::move(tool_use)) {
  token_bytes_ = tokenizer::VocabularyBytes(*tokenizer_);
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    absl::StatusOr<std::string> piece = tokenizer_->IdToPiece(id);
    if (piece.ok()) max_token_bytes_ = std::max<int64_t>(max_token_bytes_, piece->size());
  }
}

const std::string& ServedTokenizer::TokenBytes(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && static_cast<size_t>(id) < token_bytes_.size() ? token_bytes_[id] : kNone;
}

int64_t ServedTokenizer::PromptByteLimit(const ModelInfo& model) const {
  if (model.max_model_len <= 0 || model.max_model_len == INT32_MAX) return INT64_MAX;
  return int64_t{model.max_model_len} * max_token_bytes_;
}

ApiError ContextLengthError(const std::string& message, const std::string& param) {
  ApiError e = BadRequest(message, param);
  e.code = "context_length_exceeded";
  return e;
}

namespace {

// Strips a leading BOS text a chat template wrote, for tokenizers that
// cannot read special tokens from text (llama2.c, SentencePiece): the
// tokenizer adds the BOS id instead.
bool StripBosText(const tokenizer::Tokenizer& tok, std::string* text) {
  const std::string& bos = tok.bos_token();
  if (bos.empty() || tok.kind() == tokenizer::TokenizerKind::kHuggingFace ||
      !absl::StartsWith(*text, bos)) {
    return false;
  }
  text->erase(0, bos.size());
  return true;
}

// A prompt of `bytes` is refused when it is longer than any prompt the
// model can take (Frontend::PromptByteLimit): before the tokenizer sees it.
std::optional<ApiError> CheckPromptBytes(const ServedTokenizer& served, const ModelInfo& model,
                                         uint64_t bytes, const char* param) {
  const int64_t limit = served.PromptByteLimit(model);
  if (bytes <= static_cast<uint64_t>(limit)) return std::nullopt;
  return BadRequest(
      absl::StrCat("the prompt is ", bytes, " bytes, more than any prompt this model can take: ",
                   "at most ", limit, " bytes (max_model_len ", model.max_model_len, " tokens x ",
                   served.max_token_bytes(),
                   " bytes, the longest token of the vocabulary); it was not tokenized"),
      param);
}

// The chat template's variables beyond messages and tokens: the tools
// (tool_choice "none") and documents, then chat_template_kwargs over them,
// as vLLM merges them. Both are defined, as none when the request has none:
// transformers renders with tools=None and documents=None, and a template
// may test `is not none` or `is defined`.
nlohmann::ordered_json TemplateVariables(const CompletionRequest& request) {
  nlohmann::ordered_json vars = {{"tools", request.tools}, {"documents", request.documents}};
  if (request.chat_template_kwargs.is_object()) vars.update(request.chat_template_kwargs);
  return vars;
}

// vLLM's SamplingParams.update_from_tokenizer.
std::optional<ApiError> TokenizeBadWords(const tokenizer::Tokenizer& tok,
                                         const std::vector<std::string>& words, int32_t vocab_size,
                                         std::vector<std::vector<int32_t>>* out) {
  for (const std::string& word : words) {
    const std::string stripped = tokenizer::PythonLstrip(word);
    for (const bool prefix_space : {false, true}) {
      absl::StatusOr<std::vector<int32_t>> ids =
          tok.Encode(prefix_space ? " " + stripped : stripped, {.add_special_tokens = false});
      if (!ids.ok()) return BadRequest(std::string(ids.status().message()), "bad_words");
      if (ids->empty()) {
        if (prefix_space) continue;
        return BadRequest(
            absl::StrCat("bad_words entry \"", word, "\" must tokenize to at least one token"),
            "bad_words");
      }
      for (int32_t id : *ids) {
        if (id >= vocab_size) {
          return BadRequest(
              absl::StrCat("bad_words entry \"", word, "\" has token ", id,
                           ", outside the model's vocabulary (size ", vocab_size, ")"),
              "bad_words");
        }
      }
      if (prefix_space &&
          (ids->front() == out->back().front() || ids->size() != out->back().size())) {
        continue;
      }
      out->push_back(*std::move(ids));
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> PreparePrompts(const ServedTokenizer& served,
                                       const CompletionRequest& request, const ModelInfo& model,
                                       PreparedPrompts* out, bool check_context) {
  const tokenizer::Tokenizer& tok = served.tokenizer();
  if (auto e = TokenizeBadWords(tok, request.bad_words, model.vocab_size, &out->bad_words)) {
    return e;
  }
  // /v1/responses runs as chat: its messages come from `input`.
  const char* param = request.endpoint == Endpoint::kChat        ? "messages"
                      : request.endpoint == Endpoint::kResponses ? "input"
                                                                 : "prompt";
  if (request.endpoint != Endpoint::kCompletions) {
    uint64_t content_bytes = 0;
    for (const auto& m : request.messages) {
      auto content = m.find("content");
      if (content == m.end() || !content->is_array()) continue;
      for (const auto& part : *content) {
        content_bytes += part["text"].get_ref<const std::string&>().size();
      }
    }
    if (auto e = CheckPromptBytes(served, model, content_bytes, param)) return e;
    // The request's own template comes first, as vLLM's
    // resolve_hf_chat_template takes it (Frontend::ApplyServerOptions
    // refused it unless the server trusts requests' templates).
    std::optional<tokenizer::ChatTemplate> requested;
    if (request.chat_template) {
      absl::StatusOr<tokenizer::ChatTemplate> parsed =
          tokenizer::ChatTemplate::Parse(*request.chat_template);
      if (!parsed.ok()) {
        return BadRequest(absl::StrCat("the request's chat_template: ", parsed.status().message()),
                          "chat_template");
      }
      requested = *std::move(parsed);
    } else if (!served.chat_template()) {
      return BadRequest(
          "this server has no chat template for its model; start tandem-frontend "
          "with --chat-template",
          param);
    }
    // With tools, the tokenizer's "tool_use" template when it names one, as
    // transformers (and so vLLM) picks it.
    const tokenizer::ChatTemplate* chat_template =
        requested ? &*requested : &*served.chat_template();
    if (!request.tools.is_null() && !requested) {
      if (!served.tool_use_chat_template().ok()) {
        return BadRequest(std::string(served.tool_use_chat_template().status().message()), "tools");
      }
      if (*served.tool_use_chat_template()) chat_template = &**served.tool_use_chat_template();
    }
    tokenizer::ChatTemplateInputs inputs{.messages = internal::MessagesForTemplate(
                                             request.messages, chat_template->content_format()),
                                         .add_generation_prompt = request.add_generation_prompt,
                                         .continue_final_message = request.continue_final_message,
                                         .bos_token = tok.bos_token(),
                                         .eos_token = tok.eos_token(),
                                         .extra_context = TemplateVariables(request)};
    absl::StatusOr<std::string> rendered = chat_template->Render(inputs);
    if (!rendered.ok()) {
      return BadRequest(absl::StrCat("chat template: ", rendered.status().message()),
                        requested ? "chat_template" : param);
    }
    std::string text = *std::move(rendered);
    if (auto e = CheckPromptBytes(served, model, text.size(), param)) return e;
    bool add_special = request.add_special_tokens.value_or(false);
    if (StripBosText(tok, &text)) add_special = true;
    absl::StatusOr<std::vector<int32_t>> ids =
        tok.Encode(text, {.add_special_tokens = add_special});
    if (!ids.ok()) return BadRequest(std::string(ids.status().message()), param);
    out->ids.push_back(*std::move(ids));
    out->texts.push_back(std::move(text));
  } else {
    for (const PromptInput& p : request.prompts) {
      if (p.text) {
        if (auto e = CheckPromptBytes(served, model, p.text->size(), "prompt")) return e;
        absl::StatusOr<std::vector<int32_t>> ids =
            tok.Encode(*p.text, {.add_special_tokens = request.add_special_tokens.value_or(true)});
        if (!ids.ok()) return BadRequest(std::string(ids.status().message()), "prompt");
        out->ids.push_back(*std::move(ids));
        out->texts.push_back(*p.text);
        continue;
      }
      for (size_t i = 0; i < p.token_ids.size(); ++i) {
        if (p.token_ids[i] >= model.vocab_size) {
          return BadRequest(
              absl::StrCat("prompt token id ", p.token_ids[i], " at position ", i,
                           " is outside the vocabulary (size ", model.vocab_size, ")"),
              "prompt");
        }
      }
      out->ids.push_back(p.token_ids);
      std::string text;
      if (request.echo) {
        absl::StatusOr<std::string> decoded = tok.Decode(p.token_ids);
        if (decoded.ok()) text = *std::move(decoded);
      }
      out->texts.push_back(std::move(text));
    }
  }
  if (request.truncate_prompt_tokens) {
    // As vLLM: the last N tokens of each prompt (BOS included in the count,
    // so a long prompt loses it); -1 means max_model_len.
    const int64_t keep =
        *request.truncate_prompt_tokens < 0 ? model.max_model_len : *request.truncate_prompt_tokens;
    if (keep > model.max_model_len) {
      return BadRequest(absl::StrCat("'truncate_prompt_tokens' (", keep,
                                     ") is greater than the model's context (max_model_len ",
                                     model.max_model_len, ")"),
                        "truncate_prompt_tokens");
    }
    for (size_t p = 0; p < out->ids.size(); ++p) {
      std::vector<int32_t>& ids = out->ids[p];
      if (static_cast<int64_t>(ids.size()) <= keep) continue;
      ids.erase(ids.begin(), ids.end() - keep);
      // echo shows the prompt the model saw.
      absl::StatusOr<std::string> text =
          tok.Decode(ids, {.skip_special_tokens = request.skip_special_tokens});
      out->texts[p] = text.ok() ? *std::move(text) : std::string();
    }
  }
  for (const std::vector<int32_t>& ids : out->ids) {
    if (ids.empty()) return BadRequest("the prompt is empty (it has no tokens)", param);
    if (check_context && static_cast<int64_t>(ids.size()) >= model.max_model_len) {
      return ContextLengthError(
          absl::StrCat("This model's maximum context length is ", model.max_model_len,
                       " tokens. However, your prompt has ", ids.size(),
                       " tokens, which leaves no room for a completion."),
          param);
    }
  }
  return std::nullopt;
}

}  // namespace tandem::frontend
