// Configuration of the scheduler core (DESIGN §3). A plain aggregate: build it
// with designated initializers and call Validate(). Nothing here can change at
// run time; a Scheduler copies its config at construction.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "tandem/common/block_hash.h"

namespace tandem::sched {

// Which waiting request is admitted first and which running request is
// preempted when the KV cache is full.
enum class SchedulingPolicy {
  // Arrival order; preempts the most recently admitted running request.
  kFcfs,
  // Lower `priority` value first, then arrival; preempts the running request
  // with the highest priority value (least important), latest arrival first.
  kPriority,
};

struct SchedulerConfig {
  // Token budget of one step: prefill chunks plus decodes. > 0.
  int32_t max_num_batched_tokens = 2048;
  // Running requests at most (plus async loads when limit_async_load_admission). > 0.
  int32_t max_num_seqs = 128;
  // Prompt + output tokens of one request at most. > 0.
  int32_t max_model_len = 512;
  // The most logprobs or prompt_logprobs a request may ask for (vLLM's
  // --max-logprobs, whose default is 20); >= 0.
  int32_t max_logprobs = 20;
  // Whether the worker applies structured outputs (it holds the model's
  // vocabulary as bytes: WorkerDescription::structured_outputs); without
  // it a request with a json_schema or a choice is refused.
  bool structured_outputs = false;
  // Tokens per KV block. > 0; must equal hash_root.block_size.
  int32_t block_size = 16;
  // KV blocks of the worker's cache, including block 0, the null block that is
  // never handed out. Must be set (>= 2): the service sizes it from the
  // worker's Describe.
  int32_t num_gpu_blocks = 0;
  // Look up and cache full blocks by their chained hash (DESIGN §3).
  bool enable_prefix_caching = true;
  // Split a prompt over several steps when it does not fit the token budget.
  // Off: a prompt over the remaining budget blocks the waiting queue, and
  // max_num_batched_tokens must be >= max_model_len.
  bool enable_chunked_prefill = true;
  // Cap on the tokens one prefill chunk may take in a step; 0 = off.
  int32_t long_prefill_token_threshold = 0;
  // Async scheduling: Schedule() for step N+1 runs before UpdateFromOutput()
  // of step N; at most two steps in flight; sampled tokens are placeholders
  // until their output arrives. Off: at most one step in flight.
  bool async_scheduling = true;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // AddRequest() returns RESOURCE_EXHAUSTED once this many requests wait. > 0.
  int32_t max_waiting_requests = 4096;
  // Tandem (DESIGN §3 "Admission of async KV loads"): a request whose prefix
  // is being loaded counts against max_num_seqs and against the token budget
  // of the step that admits the load. Off: only the block reservation gate
  // applies (vLLM's behaviour).
  bool limit_async_load_admission = true;
  // The model's end-of-sequence token; it stops a request (unless
  // ignore_eos) and is never part of the output. < 0 = the model has none.
  int32_t eos_token_id = 1;
  // More end-of-sequence tokens, each acting exactly as eos_token_id (Llama 3
  // ends a turn with any of 128001, 128008, 128009). Each in [0, vocab_size).
  std::vector<int32_t> extra_eos_token_ids;
  // A request in this many failed worker steps ends with kFinishedError;
  // before that each failure preempts it for recompute. > 0.
  int32_t max_step_failures = 3;
  // Token ids must be in [0, vocab_size); 0 = unknown, only ids >= 0 are
  // checked.
  int32_t vocab_size = 0;
  // Root of every block-hash chain. cache_salt is replaced per request by
  // RequestSpec::cache_salt; block_size must equal `block_size`.
  HashRootParams hash_root;

  // Checks every field; the message names the bad field and value.
  [[nodiscard]] absl::Status Validate() const;
};

}  // namespace tandem::sched
