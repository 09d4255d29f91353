#include "tandem/common/sampling_params.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/status.h"

namespace tandem {
namespace {

// `what` names the list in the message ("stop token id 7 is outside ...").
absl::Status IdsInVocabulary(std::span<const int32_t> ids, const char* what, int32_t vocab_size) {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SamplingParams::Validate(int32_t vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be a finite number >= 0, got ", temperature));
  }
  if (top_k < 0 || top_k > vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be in [0, ", vocab_size, "], got ", top_k));
  }
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (!std::isfinite(min_p) || min_p < 0.0f || min_p > 1.0f) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", min_p));
  }
  for (const auto& [name, value] : {std::pair{"presence_penalty", presence_penalty},
                                    {"frequency_penalty", frequency_penalty}}) {
    if (!std::isfinite(value) || value < -2.0f || value > 2.0f) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be in [-2, 2], got ", value));
    }
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be a finite number > 0, got ", repetition_penalty));
  }
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_tokens must be in [0, max_tokens=", max_tokens, "], got ", min_tokens));
  }
  if (logprobs < -1 || logprobs > vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs must be in [0, ", vocab_size, "] (or unset), got ", logprobs));
  }
  if (prompt_logprobs < -1 || prompt_logprobs > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs must be in [0, ", vocab_size,
                                                   "] (or unset), got ", prompt_logprobs));
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto [id, bias] = logit_bias[i];
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (!std::isfinite(bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias of token ", id, " must be finite, got ", bias));
    }
    if (i > 0 && logit_bias[i - 1].first >= id) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias must list each token id once, in increasing order; ",
                       logit_bias[i - 1].first, " comes before ", id));
    }
  }
  for (size_t i = 0; i < bad_words.size(); ++i) {
    if (bad_words[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("bad_words sequence ", i, " is empty"));
    }
    TANDEM_RETURN_IF_ERROR(IdsInVocabulary(bad_words[i], "bad_words token", vocab_size));
  }
  TANDEM_RETURN_IF_ERROR(IdsInVocabulary(allowed_token_ids, "allowed_token_ids token", vocab_size));
  if (int grammars = !json_schema.empty() + !choice.empty() + !regex.empty() + !grammar.empty();
      grammars > 1) {
    return absl::InvalidArgumentError(
        "more than one of json_schema, choice, regex and grammar constrains the output; send "
        "one");
  }
  if (disable_any_whitespace && json_schema.empty()) {
    return absl::InvalidArgumentError("disable_any_whitespace needs a json_schema");
  }
  if (HasGrammar()) {
    if (const char* name = JsonSchemaConflict(ignore_eos, min_tokens, !bad_words.empty(),
                                              !allowed_token_ids.empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is not supported with structured outputs (", GrammarField(), ")"));
    }
  }
  if (json_schema_after_token) {
    if (!HasGrammar()) {
      return absl::InvalidArgumentError(
          "json_schema_after_token needs a json_schema, a choice, a regex or a grammar");
    }
    TANDEM_RETURN_IF_ERROR(IdsInVocabulary(std::span<const int32_t>(&*json_schema_after_token, 1),
                                           "json_schema_after_token token", vocab_size));
  }
  return IdsInVocabulary(stop_token_ids, "stop token", vocab_size);
}

absl::Status GenerationDefaults::Validate(int32_t vocab_size) const {
  if (temperature && (!std::isfinite(*temperature) || *temperature < 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation default temperature must be a finite number >= 0, got ", *temperature));
  }
  if (top_p && (!std::isfinite(*top_p) || *top_p <= 0.0f || *top_p > 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation default top_p must be in (0, 1], got ", *top_p));
  }
  if (top_k && *top_k > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation default top_k must be <= the vocabulary size ", vocab_size, ", got ", *top_k));
  }
  if (min_p && (!std::isfinite(*min_p) || *min_p < 0.0f || *min_p > 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation default min_p must be in [0, 1], got ", *min_p));
  }
  if (repetition_penalty && (!std::isfinite(*repetition_penalty) || *repetition_penalty <= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation default repetition_penalty must be a finite number > 0, got ",
                     *repetition_penalty));
  }
  if (max_new_tokens && *max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation default max_new_tokens must be >= 1, got ", *max_new_tokens));
  }
  return absl::OkStatus();
}

const char* JsonSchemaConflict(bool ignore_eos, int32_t min_tokens, bool has_bad_words,
                               bool has_allowed_token_ids) {
  if (ignore_eos) return "ignore_eos";
  if (min_tokens > 0) return "min_tokens";
  if (has_bad_words) return "bad_words";
  if (has_allowed_token_ids) return "allowed_token_ids";
  return nullptr;
}

void BadWordBans(std::span<const std::vector<int32_t>> bad_words, std::span<const int32_t> output,
                 std::vector<int32_t>* banned) {
  for (const std::vector<int32_t>& word : bad_words) {
    if (word.size() > output.size() + 1) continue;
    const size_t prefix = word.size() - 1;
    if (std::equal(word.begin(), word.end() - 1, output.end() - static_cast<ptrdiff_t>(prefix))) {
      banned->push_back(word.back());
    }
  }
}

}  // namespace tandem
