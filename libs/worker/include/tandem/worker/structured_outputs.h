// Structured outputs on the worker (SamplingParams::json_schema and
// SamplingParams::choice): each
// request's grammar over the output tokens it has, and the ids it may not
// draw next, which StepExecutor adds to the row's banned ids at Launch (where
// the previous step's sampled tokens are known), so both backends apply
// them as they apply min_tokens' bans.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "tandem/common/sampling_params.h"
#include "tandem/grammar/json_matcher.h"
#include "tandem/grammar/token_mask.h"

namespace tandem::worker {

// The model's vocabulary as the grammar reads it: the bytes of each id of the
// tokenizer at `path` (tokenizer::VocabularyBytes), none for its special
// tokens, none for the ids past it up to the model's `vocab_size` (padded
// embeddings). FAILED_PRECONDITION when the tokenizer has more ids than the
// model; the loader's error when it cannot be read.
[[nodiscard]] absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> LoadVocabulary(
    const std::string& path, int32_t vocab_size);

// One request's document so far.
struct GrammarState {
  std::optional<grammar::JsonMatcher> matcher;
  std::vector<int32_t> fed;  // the output tokens it has taken
  // Why it cannot go on (logged once); empty while it can.
  std::string error;
  bool broken() const { return !error.empty(); }
};

class StructuredOutputs {
 public:
  // `eos_token_ids`: the model's, allowed once a document is complete.
  // `mask_cache_bytes`: the token masks kept by grammar state
  // (grammar::TokenMaskCache), shared by every request.
  StructuredOutputs(std::shared_ptr<const grammar::TokenVocabulary> vocabulary,
                    std::vector<int32_t> eos_token_ids, size_t mask_cache_bytes);

  // The masks made so far: kept ones reused, walks of the vocabulary, and
  // the host time both took (on the step's path, before its launch).
  struct Stats {
    int64_t masks_kept = 0;
    int64_t masks_walked = 0;
    double mask_seconds = 0;
    size_t cache_bytes = 0;
  };
  Stats stats() const;

  // Sets `allowed` to the mask (one bit per id of the vocabulary,
  // grammar::TokenMask) of the ids request `id` may draw after `output`
  // (its output tokens so far): those whose bytes its grammar takes next,
  // and the EOS ids and params.stop_token_ids once the document is
  // complete. The sampler draws no id whose bit is clear
  // (model::SampleRequest's allowed_mask), as vLLM applies xgrammar's
  // bitmask. `state` follows `output`: tokens it has not taken are fed, and
  // an output that is not its history any more (the scheduler replaced it)
  // starts it again. When nothing can follow (an output token the grammar
  // refused, which the masks never allow, or a document whose readings
  // passed grammar::kMaxAlternatives) state->error says why (the step
  // reports it: SampledTokens::error, and the scheduler ends the request
  // with it) and only the EOS ids and stop tokens are allowed, so that the
  // row still draws a token. The grammar is params.choice's when it has
  // one, else params.json_schema's. With params.json_schema_after_token the
  // document is the output after that token's first occurrence; until it
  // comes `allowed` is left empty (no mask: every id may be drawn).
  void Mask(const std::string& id, const SamplingParams& params, std::span<const int32_t> output,
            GrammarState* state, grammar::TokenMask* allowed);

  // Compiles a new request's grammar and makes the mask of its first state,
  // so that its first Mask finds both kept. StepExecutor calls it as it
  // prepares a step, while the step before runs on the device; Mask at the
  // launch is then off that path.
  void Warm(const SamplingParams& params);

 private:
  // The grammar of `params`' json_schema, choice or regex
  // (grammar::CompileGrammarKept: the requests of one grammar share its
  // Schema, and so its masks); nullptr when it does not compile.
  std::shared_ptr<const grammar::Schema> Compile(const SamplingParams& params);

  std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;
  std::vector<int32_t> eos_token_ids_;
  grammar::TokenMaskCache masks_;
  double mask_seconds_ = 0;
};

}  // namespace tandem::worker
