// Token sampling: greedy when temperature == 0, else temperature, top-k and
// top-p with a counter-based generator keyed by (params.seed,
// output_position), so a seeded request samples the same token at the same
// position in any batch (DESIGN §6).
#pragma once

#include <cstdint>
#include <span>

#include "tandem/common/sampling_params.h"

namespace tandem::model {

// `output_position`: index of the token being sampled among the request's
// output tokens (0 for the first). Greedy ties go to the lowest id.
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params,
                    int32_t output_position);

}  // namespace tandem::model
