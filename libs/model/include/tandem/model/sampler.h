// Token sampling: greedy when temperature == 0, else temperature, top-k and
// top-p with a counter-based generator keyed by (params.seed,
// output_position), so a seeded request samples the same token at the same
// position in any batch (DESIGN §6).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/common/sampling_params.h"

namespace tandem::model {

// `output_position`: index of the token being sampled among the request's
// output tokens (0 for the first). Greedy ties go to the lowest id.
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params,
                    int32_t output_position);

// Which sequences of a batch sample a token, and how.
struct SampleRequest {
  const SamplingParams* params = nullptr;  // nullptr: this sequence samples nothing
  int32_t output_position = 0;             // see SampleToken
};

// tokens[i] = SampleToken(row i of logits [rows][vocab], ...) for each
// request with params, -1 for the others; tokens gets sample.size() entries.
void SampleRows(std::span<const float> logits, int32_t vocab,
                std::span<const SampleRequest> sample, std::vector<int32_t>* tokens);

}  // namespace tandem::model
