// The served model as clients see it (tandem.v1.GetModelInfoResponse; libs/rpc
// converts): what the engine core reports and what the frontend learns from
// each scheduler replica.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/common/sampling_params.h"

namespace tandem {

struct ModelInfo {
  bool ready = false;      // a worker served (the engine core's view)
  std::string model_name;  // served_model_name, else the worker's
  std::string model_fingerprint;
  int32_t vocab_size = 0;
  int32_t max_model_len = 0;  // the smaller of the scheduler's option and the worker's
  int32_t block_size = 0;
  int32_t num_kv_blocks = 0;
  int32_t eos_token_id = -1;
  // More ids that end a request as eos_token_id does (Llama 3's list).
  std::vector<int32_t> extra_eos_token_ids;
  // The model's sampling defaults (generation_config.json). Not applied by
  // the scheduler (a gRPC request cannot leave a field unset): the frontend
  // applies them to the OpenAI requests that leave a field unset
  // (frontend::EffectiveSampling).
  GenerationDefaults generation;
  // The most logprobs or prompt_logprobs a request may ask for
  // (SchedulerConfig::max_logprobs).
  int32_t max_logprobs = 0;
};

}  // namespace tandem
