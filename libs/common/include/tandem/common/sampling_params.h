// Sampling parameters of one request, shared by the scheduler (stop checks)
// and the model (sampler). Plain aggregate; build with designated initializers.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct SamplingParams {
  // 0 = greedy (argmax). Must be >= 0 and finite.
  float temperature = 0.0f;
  // Keep the k most likely tokens; 0 = off. Must be in [0, vocab_size].
  int32_t top_k = 0;
  // Nucleus sampling mass in (0, 1]; 1 = off.
  float top_p = 1.0f;
  // Drop tokens less likely than min_p times the most likely one, in [0, 1];
  // 0 = off (vLLM's min_p; kernels/sampling.h says the order of filters).
  float min_p = 0.0f;
  // vLLM's penalties (its apply_penalties), applied to the logits before
  // temperature and the filters, greedy or not: repetition_penalty divides
  // the positive logit and multiplies the negative one of every token in
  // the prompt or the output; then frequency_penalty times a token's count
  // in the output, and presence_penalty for every token in it, are
  // subtracted (OpenAI's definition). The defaults are off.
  float presence_penalty = 0.0f;    // [-2, 2]
  float frequency_penalty = 0.0f;   // [-2, 2]
  float repetition_penalty = 1.0f;  // > 0, finite
  // OpenAI's logit_bias: each (token id, bias) adds the bias to that token's
  // logit before the penalties, greedy or not (vLLM's LogitBiasLogitsProcessor
  // runs before its apply_penalties). Sorted by id, each id once, ids in the
  // vocabulary, biases finite; the OpenAI layer clamps them to [-100, 100]
  // as vLLM does. Log-probabilities stay those of the model's logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's bad_words as the token sequences its tokenizer gives them (its
  // _bad_words_token_ids; the OpenAI layer tokenizes them as vLLM does).
  // The last token of a sequence is never drawn where the output ends with
  // the rest of it (BadWordBans); a one-token sequence is never drawn.
  // Greedy or not; log-probabilities stay the model's. Each sequence
  // non-empty, ids in the vocabulary.
  std::vector<std::vector<int32_t>> bad_words;
  // vLLM's allowed_token_ids: when not empty, only these ids are ever drawn
  // (every other logit counts as -inf, as vLLM's mask sets it), greedy or
  // not; log-probabilities stay the model's. Ids in the vocabulary; an id
  // may repeat. Empty = every id (the OpenAI layer refuses an empty list,
  // as vLLM does).
  std::vector<int32_t> allowed_token_ids;
  // Structured outputs: when not empty, the JSON text of a JSON schema every
  // output is a document of (libs/grammar/json_schema.h says which keywords
  // it holds; OpenAI's JSON mode is {"type": "object",
  // "additionalProperties": true}). Each token is drawn from those whose
  // bytes the schema's grammar takes next, the EOS ids (and stop_token_ids)
  // only once the document is complete, and nothing but them once it is
  // closed; greedy or not; log-probabilities stay the model's. The
  // scheduler compiles it at admission (sched::Scheduler::ValidateRequest);
  // the worker applies it. Not with ignore_eos, min_tokens, bad_words or
  // allowed_token_ids (each could leave no token to draw).
  std::string json_schema;
  // Structured outputs as vLLM's structured_outputs.choice: when not empty,
  // every output is exactly one of these strings, as raw text
  // (grammar::CompileChoices says which lists it holds), drawn as a
  // json_schema's document is. Not with json_schema, nor with what cannot go
  // with one (JsonSchemaConflict).
  std::vector<std::string> choice;
  // Structured outputs as vLLM's structured_outputs.regex: when not empty,
  // every output is raw text the pattern matches whole
  // (libs/grammar/include/tandem/grammar/regex.h says which patterns are
  // held), drawn as a json_schema's document is. Not with json_schema or
  // choice, nor with what cannot go with one (JsonSchemaConflict).
  std::string regex;
  // Structured outputs as vLLM's structured_outputs.grammar: when not
  // empty, every output is raw text of this grammar, in xgrammar's EBNF
  // with the root rule "root" (libs/grammar/include/tandem/grammar/ebnf.h
  // says which grammars are held), drawn as a json_schema's document is.
  // Not with json_schema, choice or regex, nor with what cannot go with one
  // (JsonSchemaConflict).
  std::string grammar;
  // vLLM's structured_outputs.disable_any_whitespace (xgrammar's
  // any_whitespace=False): json_schema's document is written as Python's
  // json.dumps writes it, ", " between members and items, ": " after a key,
  // no other whitespace outside strings. Only with json_schema.
  bool disable_any_whitespace = false;
  // When set, the grammar (json_schema, choice or regex) holds only the output
  // after this token's first occurrence; the output up to it (and the
  // token) is free, EOS included. The OpenAI layer sets it to "</think>"
  // for a model whose thinking --reasoning-parser splits out (vLLM starts a
  // request's grammar where its reasoning ends). An id in the vocabulary;
  // only with a grammar.
  std::optional<int32_t> json_schema_after_token;
  // Seed of the counter-based generator: tokens depend only on
  // (seed, output position), never on the batch. nullopt: the client gave
  // none; the scheduler then uses its own (--seed, else random) when it
  // admits the request (rpc::FromProto's default_seed), so a worker always
  // gets one. The sampler reads nullopt as 0.
  std::optional<uint64_t> seed;
  // Maximum number of output tokens; >= 1.
  int32_t max_tokens = 16;
  // Stop conditions other than max_tokens are ignored until this many output
  // tokens exist; 0 <= min_tokens <= max_tokens.
  int32_t min_tokens = 0;
  // Do not stop on the model's EOS token.
  bool ignore_eos = false;
  // Extra token ids that stop generation; the stop token is kept in the
  // output. (The EOS token is not: llama2.c drops it, and so do we.)
  std::vector<int32_t> stop_token_ids;
  // Log-probabilities (TokenLogprobs) of each output token with its
  // `logprobs` most likely alternatives; -1 = none, 0 = the token's own only
  // (vLLM's logprobs). At most the vocabulary size here; the scheduler
  // bounds it by its --max-logprobs.
  int32_t logprobs = -1;
  // The same for every prompt token after the first (vLLM's
  // prompt_logprobs); -1 = none. A request with them skips the prefix
  // caches, so that every prompt token is computed.
  int32_t prompt_logprobs = -1;

  // Checks every field; `vocab_size` bounds top_k and stop tokens. The message
  // names the field and the bad value.
  [[nodiscard]] absl::Status Validate(int32_t vocab_size) const;
  // Whether a grammar holds the output (json_schema, choice, regex or
  // grammar).
  [[nodiscard]] bool HasGrammar() const {
    return !json_schema.empty() || !choice.empty() || !regex.empty() || !grammar.empty();
  }
  // The field the grammar comes from, for messages: "json_schema", "choice",
  // "regex" or "grammar".
  [[nodiscard]] const char* GrammarField() const {
    return !json_schema.empty() ? "json_schema"
           : !choice.empty()    ? "choice"
           : !regex.empty()     ? "regex"
                                : "grammar";
  }
  // Whether any penalty is on (the sampler then needs the token history).
  [[nodiscard]] bool HasPenalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  // Whether the sampler rewrites some logits (penalties, logit_bias or
  // allowed_token_ids), so that even a greedy draw goes through the
  // sampling program.
  [[nodiscard]] bool AdjustsLogits() const {
    return HasPenalties() || !logit_bias.empty() || !allowed_token_ids.empty();
  }
};

// The field that cannot go with a json_schema, or nullptr: ignore_eos,
// min_tokens > 0, bad_words or allowed_token_ids (each could leave a
// document no token to go on with). SamplingParams::Validate refuses it;
// the OpenAI layer names it first.
const char* JsonSchemaConflict(bool ignore_eos, int32_t min_tokens, bool has_bad_words,
                               bool has_allowed_token_ids);

// The tokens `bad_words` bans after `output` (the output tokens so far, not
// the prompt), appended to `banned`: as vLLM's apply_bad_words, the last
// token of each sequence at most one longer than the output whose other
// tokens are the output's last ones.
void BadWordBans(std::span<const std::vector<int32_t>> bad_words, std::span<const int32_t> output,
                 std::vector<int32_t>* banned);

// A model's sampling defaults (its generation_config.json, which the worker
// reads with the model and the scheduler reports in GetModelInfo). As with
// vLLM's `--generation-config auto`, tandem-frontend gives an OpenAI request
// that leaves temperature, top_p, top_k or min_p unset the model's value, and only
// without one OpenAI's default (frontend::EffectiveSampling); a request's own
// value always wins. gRPC Generate callers send every field and get none.
// nullopt = the model gives no default for the field.
struct GenerationDefaults {
  std::optional<float> temperature;  // >= 0, finite; 0 = greedy
  std::optional<float> top_p;        // (0, 1]
  std::optional<int32_t> top_k;      // <= vocab_size; <= 0 = off
  std::optional<float> min_p;        // [0, 1]; 0 = off
  std::optional<float> repetition_penalty;  // > 0, finite; 1 = off
  // max_new_tokens (vLLM's max_tokens default): an OpenAI request that gives
  // no max_tokens gets at most this many (chat; completions' default is 16).
  std::optional<int32_t> max_new_tokens;  // >= 1

  [[nodiscard]] bool empty() const {
    return !temperature && !top_p && !top_k && !min_p && !repetition_penalty && !max_new_tokens;
  }
  // Checks the ranges above (`vocab_size` bounds top_k); the message names
  // the field and the bad value.
  [[nodiscard]] absl::Status Validate(int32_t vocab_size) const;
};

}  // namespace tandem
