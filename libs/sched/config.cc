#include "tandem/sched/config.h"

#include "absl/strings/str_cat.h"

namespace tandem::sched {
namespace {
absl::Status Positive(const char* name, int32_t v) {
  if (v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("SchedulerConfig.", name, " must be > 0, got ", v));
}
}  // namespace

absl::Status SchedulerConfig::Validate() const {
  for (auto [name, v] :
       {std::pair{"max_num_batched_tokens", max_num_batched_tokens},
        std::pair{"max_num_seqs", max_num_seqs}, std::pair{"max_model_len", max_model_len},
        std::pair{"block_size", block_size},
        std::pair{"max_waiting_requests", max_waiting_requests},
        std::pair{"max_step_failures", max_step_failures}}) {
    if (absl::Status s = Positive(name, v); !s.ok()) return s;
  }
  if (max_logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SchedulerConfig.max_logprobs must be >= 0, got ", max_logprobs));
  }
  if (num_gpu_blocks < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SchedulerConfig.num_gpu_blocks must be >= 2 (block 0 is the null block), got ",
        num_gpu_blocks));
  }
  if (!enable_chunked_prefill && max_num_batched_tokens < max_model_len) {
    // A prompt (or a preempted request) longer than the budget could never be
    // scheduled and would block the waiting queue for good.
    return absl::InvalidArgumentError(absl::StrCat(
        "SchedulerConfig.max_num_batched_tokens (", max_num_batched_tokens,
        ") must be >= max_model_len (", max_model_len,
        ") when enable_chunked_prefill is off: a longer request could never be scheduled"));
  }
  if (long_prefill_token_threshold < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SchedulerConfig.long_prefill_token_threshold must be >= 0, got ",
                     long_prefill_token_threshold));
  }
  if (vocab_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SchedulerConfig.vocab_size must be >= 0, got ", vocab_size));
  }
  if (vocab_size > 0 && eos_token_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("SchedulerConfig.eos_token_id ", eos_token_id,
                                                   " is outside the vocabulary [0, ", vocab_size,
                                                   ")"));
  }
  for (int32_t id : extra_eos_token_ids) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SchedulerConfig.extra_eos_token_ids holds ", id, ", a negative id"));
    }
    if (vocab_size > 0 && id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("SchedulerConfig.extra_eos_token_ids holds ",
                                                     id, ", outside the vocabulary [0, ",
                                                     vocab_size, ")"));
    }
  }
  if (hash_root.block_size != block_size) {
    return absl::InvalidArgumentError(absl::StrCat("SchedulerConfig.hash_root.block_size (",
                                                   hash_root.block_size,
                                                   ") must equal block_size (", block_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::sched
