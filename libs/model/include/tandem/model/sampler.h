// Token sampling: greedy when temperature == 0, else temperature, top-k and
// top-p with a counter-based generator keyed by (params.seed,
// output_position), so a seeded request samples the same token at the same
// position in any batch (DESIGN §6).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/common/logprobs.h"
#include "tandem/common/sampling_params.h"
#include "tandem/kernels/sampling.h"

namespace tandem::model {

// `output_position`: index of the token being sampled among the request's
// output tokens (0 for the first). Greedy ties go to the lowest id.
// `banned_token_ids` are never drawn: their logits count as -inf (vLLM's
// min-tokens processor: EOS and stop tokens below min_tokens), nor any id
// outside params.allowed_token_ids when it lists some, nor, with a non-empty
// `allowed_mask` (one bit per id, grammar::TokenMask's layout), any id
// whose bit is clear or that lies past its words. `penalties`: the logits
// to rewrite (SampleAdjustments) when params adjusts any.
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params,
                    int32_t output_position, std::span<const int32_t> banned_token_ids = {},
                    std::span<const kernels::SamplePenalty> penalties = {},
                    std::span<const uint32_t> allowed_mask = {});

// The lowest temperature that is not greedy (vLLM's _MAX_TEMP): one in
// (0, it) samples at it.
inline constexpr float kMinSamplingTemperature = 0.01f;

// The kernels' arguments for one draw (kernels/sampling.h), with
// `num_banned` banned ids, params.allowed_token_ids after them in the row's
// list of ids, then `num_mask_words` words of a token mask, and
// `num_penalties` history entries; a temperature in
// (0, kMinSamplingTemperature) raised to it.
kernels::SampleArgs ToSampleArgs(const SamplingParams& params, int32_t output_position,
                                 size_t num_banned = 0, size_t num_penalties = 0,
                                 size_t num_mask_words = 0);

// Appends a row's list of ids as the kernels read it (SampleArgs): its
// banned ids, params.allowed_token_ids, then the mask's words.
void AppendSampleIds(const SamplingParams& params, std::span<const int32_t> banned_token_ids,
                     std::span<const uint32_t> allowed_mask, std::vector<int32_t>* out);

// Appends every token of `prompt` and `output` to *out once, with its count
// in `output` (what the penalties read), outputs first. O(n) in the history's length.
void PenaltyHistory(std::span<const int32_t> prompt, std::span<const int32_t> output,
                    std::vector<kernels::SamplePenalty>* out);

// Appends what the sampling program rewrites for one request, each id once:
// its history (PenaltyHistory) when it has penalties, and its logit_bias
// (an id of both carries its bias on its history entry; one of the bias
// alone has output_count -1).
void SampleAdjustments(const SamplingParams& params, std::span<const int32_t> prompt,
                       std::span<const int32_t> output, std::vector<kernels::SamplePenalty>* out);

// Log-probabilities of `token` under `logits` (TokenLogprobs: the raw
// log-softmax, before temperature or any filter) with the `top_n` most likely
// tokens: kernels/logprobs.h's definition (its log Z, the same bits as the
// CUDA kernel's), ranks and top lists breaking ties by the lower id.
TokenLogprobs ComputeLogprobs(std::span<const float> logits, int32_t token, int32_t top_n);

// Which sequences of a batch sample a token, and how.
struct SampleRequest {
  const SamplingParams* params = nullptr;  // nullptr: this sequence samples nothing
  int32_t output_position = 0;             // see SampleToken
  // See SampleToken; logprobs stay those of the raw logits.
  std::span<const int32_t> banned_token_ids;
  std::span<const uint32_t> allowed_mask;
  // With params that have penalties: the sequence's prompt and the output
  // tokens before this one.
  std::span<const int32_t> prompt_token_ids;
  std::span<const int32_t> output_token_ids;
  // With params: the sampled token's logprobs with this many alternatives;
  // -1 = none.
  int32_t num_logprobs = -1;
  // Prompt logprobs: prompt_targets[j] is scored against the logits after
  // row j of this sequence's chunk (the token at start_pos + j + 1), with
  // num_prompt_logprobs alternatives. Needs SequenceInput::all_logits when
  // it covers more than the last row; at most the chunk's length.
  std::span<const int32_t> prompt_targets;
  int32_t num_prompt_logprobs = 0;
};

// What ForwardSample adds for the sequences that asked (SampleRequest).
struct SampleLogprobs {
  std::vector<TokenLogprobs>
      sampled;  // one entry for a sequence that sampled with num_logprobs >= 0
  std::vector<TokenLogprobs> prompt;  // parallel to prompt_targets
};

// tokens[i] = SampleToken(row i of logits [rows][vocab], ...) for each
// request with params, -1 for the others; tokens gets sample.size() entries.
void SampleRows(std::span<const float> logits, int32_t vocab,
                std::span<const SampleRequest> sample, std::vector<int32_t>* tokens);

// The logprobs every request of `sample` asked for, after SampleRows gave
// `tokens` for `batch`. `row(r)` is row r of the logits, `vocab` wide, as
// ModelRunner::Forward lays them out (LogitsRowOf); it may fail, and so may
// this. logprobs gets sample.size() entries.
struct SequenceInput;
using LogitsRowFn = absl::FunctionRef<absl::StatusOr<std::span<const float>>(int32_t row)>;
absl::Status ComputeBatchLogprobs(std::span<const SequenceInput> batch,
                                  std::span<const SampleRequest> sample,
                                  std::span<const int32_t> tokens, int32_t vocab, LogitsRowFn row,
                                  std::vector<SampleLogprobs>* logprobs);
// One position whose logprobs a batch asks for: sequence `sequence`'s
// sampled token (prompt_index -1) or its prompt target prompt_index, scored
// on row `logits_row` of Forward's logits (LogitsRowOf).
struct LogprobTarget {
  int32_t sequence = 0;
  int32_t prompt_index = -1;
  int32_t logits_row = 0;
  int32_t token = 0;
  int32_t top_n = 0;  // in [0, vocab]
};
// Every target of the batch, in the order of SampleLogprobs' lists;
// INVALID_ARGUMENT for more prompt targets than a chunk has logits, or a
// token outside [0, vocab).
absl::StatusOr<std::vector<LogprobTarget>> LogprobTargets(std::span<const SequenceInput> batch,
                                                          std::span<const SampleRequest> sample,
                                                          std::span<const int32_t> tokens,
                                                          int32_t vocab);
// logprobs gets `sequences` entries, results[j] (target j's) in place.
void AssembleLogprobs(std::span<const LogprobTarget> targets, std::vector<TokenLogprobs> results,
                      size_t sequences, std::vector<SampleLogprobs>* logprobs);
// Whether any request of `sample` asked for logprobs.
bool WantsLogprobs(std::span<const SampleRequest> sample);

}  // namespace tandem::model
