// Log-probabilities at one position of a sequence (tandem.v1.TokenLogprobs):
// what the sampler computes for a request that asks (SamplingParams::logprobs
// and prompt_logprobs) and the scheduler streams with the token.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

// vLLM's default logprobs_mode "raw_logprobs": the log-softmax of the model's
// logits before temperature, top-k, top-p or min-p.
struct TokenLogprobs {
  int32_t token_id = -1;  // the token at this position (sampled, or the prompt's)
  float logprob = 0.0f;
  int32_t rank = 0;  // 1 = the most likely; ties go to the lower id first
  // The N most likely tokens, most likely first (ties: the lower id first).
  std::vector<int32_t> top_token_ids;
  std::vector<float> top_logprobs;  // parallel to top_token_ids

  bool operator==(const TokenLogprobs&) const = default;
};

}  // namespace tandem
