// Sampling parameters of one request, shared by the scheduler (stop checks)
// and the model (sampler). Plain aggregate; build with designated initializers.
#pragma once

#include <cstdint>
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
  // Seed of the counter-based generator: tokens depend only on
  // (seed, output position), never on the batch.
  uint64_t seed = 0;
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

  // Checks every field; `vocab_size` bounds top_k and stop tokens. The message
  // names the field and the bad value.
  [[nodiscard]] absl::Status Validate(int32_t vocab_size) const;
};

}  // namespace tandem
