// One tandem.v1.Generation/Generate call as plain structs: what a client
// (tandem-frontend's completion job) asks and each message it gets back.
// libs/rpc converts them (service_convert.h), so code that drives
// generations need not see generation.pb.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/common/finish_reason.h"
#include "tandem/common/logprobs.h"
#include "tandem/common/sampling_params.h"

namespace tandem {

struct GenerateRequest {
  std::string request_id;  // "": the server assigns one
  std::vector<int32_t> prompt_token_ids;
  // sampling.seed nullopt: the server's own seed (its --seed), as a
  // Generate call without has_seed gets.
  SamplingParams sampling;
  int32_t priority = 0;    // lower = more important (priority policy)
  std::string cache_salt;  // honoured only when the server allows it
};

// tandem.v1.Usage: set on a call's last message.
struct GenerateUsage {
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  int32_t cached_tokens_local = 0;     // the scheduler's prefix cache
  int32_t cached_tokens_external = 0;  // loaded from the KV-store
};

// One message of a Generate stream: the tokens of one or more steps; the
// last has finish_reason set (kNone before it) and usage, unless the request
// ended without a last output (an abort before any step).
struct GenerateResponse {
  std::vector<int32_t> token_ids;
  // Parallel to token_ids when the request asked for logprobs.
  std::vector<TokenLogprobs> logprobs;
  // In the first message (with the first tokens, or the last one when there
  // are none) when the request asked: prompt positions 1 .. P-1.
  std::vector<TokenLogprobs> prompt_logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  // The last of token_ids is the EOS or stop token that ended the request
  // (finish_reason kStop): counted in output_tokens, not part of the text.
  bool last_token_stops = false;
  // The counts so far, in every message the scheduler sends (the cached
  // counts are fixed from the first token on; output_tokens is final in
  // the last message).
  std::optional<GenerateUsage> usage;
};

}  // namespace tandem
