// The plain structs that cross the scheduler <-> worker boundary (DESIGN §4).
// libs/rpc converts them to and from tandem.v1 protos; nothing here knows
// about protobuf.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/common/block_hash.h"
#include "tandem/common/logprobs.h"
#include "tandem/common/sampling_params.h"

namespace tandem::sched {

// A request the worker has not seen (or must rebuild): sent in full.
struct NewRequestData {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  // Output tokens it already has: a request resumed on this worker after
  // another was lost (RequestSpec::resumed_output_token_ids); usually empty.
  std::vector<int32_t> output_token_ids;
  SamplingParams sampling;
  std::vector<int32_t> block_ids;   // the whole block table
  int32_t num_computed_tokens = 0;  // prefix hit: tokens whose KV is already there
};

// A request the worker already holds: only what changed.
struct CachedRequestData {
  std::string request_id;
  // Resumed after preemption: new_block_ids *replace* the table and
  // all_token_ids carries every token id the scheduler knows.
  bool resumed_from_preemption = false;
  std::vector<int32_t> new_block_ids;
  std::vector<int32_t> all_token_ids;  // only when resumed_from_preemption
  int32_t num_computed_tokens = 0;     // before this step
  // Tokens still placeholders on the scheduler's side (async mode), before
  // this step: sampled by earlier steps whose output the scheduler has not
  // processed. The worker feeds them from the tokens it sampled itself.
  int32_t num_output_placeholders = 0;
};

struct KvLoad {
  std::string request_id;
  std::vector<BlockHash> block_hashes;
  std::vector<int32_t> block_ids;  // destinations, parallel to block_hashes
};

struct KvStoreOp {
  std::string request_id;
  std::vector<int32_t> block_ids;  // sources
  std::vector<BlockHash> block_hashes;
  // The worker reads the blocks before this step's loads and forward pass
  // (instead of after its forward pass): they hold KV of a request that
  // finished before the step was built, whose blocks the scheduler has
  // already freed, so this step may reuse them. Such entries come first.
  bool before_forward = false;
};

struct KvConnectorMetadata {
  std::vector<KvLoad> loads;
  std::vector<KvStoreOp> stores;
  [[nodiscard]] bool empty() const { return loads.empty() && stores.empty(); }
};

struct SchedulerOutput {
  uint64_t step_id = 0;
  // The step_id of the last ModelRunnerOutput the scheduler had processed
  // when it built this step (0: none). Tokens the worker sampled in later
  // steps are exactly the scheduler's placeholders (the worker checks it),
  // and a step built before the scheduler processed a failed step's output
  // must not run (it builds on the failed one).
  uint64_t last_processed_step_id = 0;
  std::vector<NewRequestData> scheduled_new_reqs;
  std::vector<CachedRequestData> scheduled_cached_reqs;
  // Parallel to scheduled_new_reqs followed by scheduled_cached_reqs.
  std::vector<int32_t> num_scheduled_tokens;
  int32_t total_num_scheduled_tokens = 0;
  // Finished or aborted since the last step: the worker drops their state.
  std::vector<std::string> finished_req_ids;
  std::vector<std::string> preempted_req_ids;
  KvConnectorMetadata kv_connector_metadata;
};

struct KvConnectorReport {
  std::vector<std::string> finished_recving;
  std::vector<std::string> finished_sending;
  // Of finished_sending, the ids of store entries that did not store all
  // their blocks (dropped, not copied out, rejected or the RPC failed).
  std::vector<std::string> failed_sending;
  std::vector<int32_t> invalid_block_ids;
  // Of invalid_block_ids, by reason (for the scheduler's stats).
  int32_t num_load_failed_not_found = 0;  // the store did not have the block
  int32_t num_load_failed_checksum = 0;   // it failed verification
  int32_t num_load_failed_rpc = 0;        // timeout, store down, stream broken
  [[nodiscard]] bool empty() const {
    return finished_recving.empty() && finished_sending.empty() && failed_sending.empty() &&
           invalid_block_ids.empty() && num_load_failed_not_found == 0 &&
           num_load_failed_checksum == 0 && num_load_failed_rpc == 0;
  }
};

struct SampledTokens {
  std::string request_id;
  std::vector<int32_t> token_ids;  // empty for a prefill chunk that does not sample
  // Parallel to token_ids when the request asked for logprobs.
  std::vector<TokenLogprobs> logprobs;
  // When it asked for prompt_logprobs: the prompt tokens at positions
  // prompt_logprobs_start, prompt_logprobs_start + 1, ... that this step's
  // chunk scored (each from the logits after the token before it).
  std::vector<TokenLogprobs> prompt_logprobs;
  int32_t prompt_logprobs_start = 0;
  // Non-empty: the worker cannot go on with this request (its grammar has
  // no token left to allow); the scheduler ends it with kFinishedError and
  // this message, its token_ids unread. The step's other requests go on.
  std::string error;
};

struct ModelRunnerOutput {
  uint64_t step_id = 0;
  std::vector<SampledTokens> sampled;
  KvConnectorReport kv_connector_report;
  // Non-empty: the step failed on the worker. Its KV may not have been
  // written and nothing was sampled; its connector report still counts
  // (loads done before the failure).
  std::string error;
  // With `error`: the worker could not even read the step and applied none
  // of it. Its new requests are unknown to the worker, its loads and stores
  // never ran (the scheduler fails them), and every later step built before
  // the scheduler processed this output fails with it.
  bool rejected = false;
};

}  // namespace tandem::sched
