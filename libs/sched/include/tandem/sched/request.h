// One request as the scheduler sees it, with the explicit counters of
// DESIGN §3. Owned by the Scheduler; connectors and tests read it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/common/block_hash.h"
#include "tandem/common/logprobs.h"
#include "tandem/common/sampling_params.h"

namespace tandem::sched {

enum class RequestState {
  kWaiting,
  // Its prefix is being loaded from the KV-store (async load admitted).
  kWaitingForRemoteKv,
  kRunning,
  // Preempted (recompute) and back in the waiting queue.
  kPreempted,
  kFinishedStopped,  // EOS or a stop token
  kFinishedLength,   // max_tokens or max_model_len
  kFinishedAborted,
  kFinishedError,
};

[[nodiscard]] bool IsFinished(RequestState state);

// Known computed tokens (DESIGN §3), the one definition: the leading tokens
// whose ids are known and whose KV is written or being written by a sent
// step, given `num_computed_tokens` (C) and `num_tokens` (T, known ids).
//
// Positions [T, T + P) are the P output placeholders. Every placeholder but
// the newest may already be in C (a later step computes its KV, fed by the
// worker's own sample); the newest never is. So C <= T + P - 1 when P > 0,
// and the known computed tokens are exactly min(C, T): never a placeholder,
// never one short. In sync mode P == 0 and C <= T, so it is C.
//
// Tandem's earlier bound, C - P, was one token short whenever P > 0: it
// subtracted the newest placeholder, which C never counts (measured: C=8,
// P=1, T=8 gave 7). In async mode the last full block of a request that
// ended within about two steps of filling it was never stored.
//
// The review of the upstream (vLLM) change got one thing wrong: it called
// the connector building its metadata from counters snapshotted *before*
// the step's increments a bug. Under these counter rules it is not: the
// bound for a scheduled request is evaluated as min(C + n, T) from the
// snapshot (ScheduledRequestView::num_storable_tokens), which equals the
// bound after the increments, since the increments add n to C and at most
// one placeholder that is never a known token. The error was the
// subtraction, not the snapshot.
[[nodiscard]] inline int32_t KnownComputedTokens(int32_t num_computed_tokens, int32_t num_tokens) {
  return num_computed_tokens < num_tokens ? num_computed_tokens : num_tokens;
}
[[nodiscard]] const char* RequestStateName(RequestState state);

// Fields are grouped hot first: a step touches the counters, token ids and
// block table of every running request.
struct Request {
  // ---- counters (DESIGN §3) ----
  RequestState state = RequestState::kWaiting;
  // Leading tokens whose KV is in the block table or being computed by a step
  // already sent (optimistic). Includes output placeholders.
  int32_t num_computed_tokens = 0;
  // Async only: tokens a sent step will sample, ids not known yet.
  int32_t num_output_placeholders = 0;
  // Tokens scheduled in steps whose output has not been processed.
  int32_t num_in_flight_tokens = 0;
  // Tokens being loaded by an async KV load; not in num_computed_tokens until
  // the worker reports finished_recving.
  int32_t num_pending_external_tokens = 0;
  int32_t num_prompt_tokens = 0;
  // Leading blocks already considered for the prefix cache (hashed and
  // published, or left out as duplicates).
  int32_t num_cached_blocks = 0;
  // block_ids[0, num_blocks_sent) were already sent to the worker.
  int32_t num_blocks_sent = 0;
  // Bumped whenever in-flight output must be dropped (preemption, finish).
  uint64_t epoch = 0;
  // The worker holds this request's state (it was sent as a new request).
  bool known_to_worker = false;
  // Resumed after preemption: the next CachedRequestData sends the whole
  // table and all token ids.
  bool resumed_pending = false;
  // Finished but its blocks are held for the worker (load or store running).
  bool awaiting_recv = false;
  bool awaiting_send = false;
  // Its load runs, but a block it holds from the prefix cache turned out
  // never written (a failed step): preempted once the load is reported.
  bool preempt_when_loaded = false;
  // Failed worker steps it was in (Scheduler::FailSteps).
  int32_t num_step_failures = 0;
  // The step that last sent it as a new request (0: never): if the worker
  // rejects that step unread, it does not know the request after all.
  uint64_t new_in_step = 0;

  // ---- tokens and blocks ----
  // Prompt followed by the output tokens whose ids are known. EOS that stopped
  // the request is not appended.
  std::vector<int32_t> all_token_ids;
  // The block table (ids into the worker's cache), in token order.
  std::vector<int32_t> block_ids;
  // Hashes of the full blocks of all_token_ids (only tokens with known ids).
  std::vector<BlockHash> block_hashes;

  // ---- identity (fixed at AddRequest) ----
  std::string request_id;
  SamplingParams sampling;
  int32_t priority = 0;
  int64_t arrival_time_ns = 0;
  // Order of AddRequest calls: breaks arrival-time ties deterministically.
  uint64_t arrival_seq = 0;
  // Order of admission to the running set.
  uint64_t admit_seq = 0;
  // Root of this request's hash chain (includes its cache salt).
  BlockHash root_hash;

  // ---- async load ----
  // First block of the load and how many leading loaded blocks are still
  // valid (invalid_block_ids truncate it).
  int32_t load_first_block = 0;
  int32_t load_num_blocks = 0;
  int32_t load_num_valid_blocks = 0;

  // ---- accounting for the client (RequestOutput) ----
  int32_t num_cached_tokens_local = 0;
  int32_t num_cached_tokens_external = 0;
  int32_t num_preemptions = 0;
  // Output tokens it came with (RequestSpec::resumed_output_token_ids): its
  // cached tokens are fixed by the first token it samples here, not before.
  int32_t num_resumed_output_tokens = 0;
  // Prompt logprobs (sampling.prompt_logprobs >= 0) of positions 1, 2, ...
  // as the worker scored them, until they go out with the request's first
  // output (then prompt_logprobs_sent).
  std::vector<TokenLogprobs> prompt_logprobs;
  bool prompt_logprobs_sent = false;

  [[nodiscard]] int32_t num_tokens() const { return static_cast<int32_t>(all_token_ids.size()); }
  // Prompt logprobs asked for and not all scored yet: the prefix caches are
  // skipped (every prompt token is computed, and scored).
  [[nodiscard]] bool needs_prompt_logprobs() const {
    return sampling.prompt_logprobs >= 0 && !prompt_logprobs_sent &&
           static_cast<int32_t>(prompt_logprobs.size()) < num_prompt_tokens - 1;
  }
  [[nodiscard]] int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  [[nodiscard]] std::span<const int32_t> prompt_token_ids() const {
    return std::span<const int32_t>(all_token_ids).first(num_prompt_tokens);
  }
  // Tokens with known ids whose KV is computed or being computed by a sent
  // step: the bound for hashing and storing (DESIGN §3 "known computed
  // tokens"). See KnownComputedTokens().
  [[nodiscard]] int32_t num_known_computed_tokens() const {
    return KnownComputedTokens(num_computed_tokens, num_tokens());
  }
  // Tokens whose KV has really been written.
  [[nodiscard]] int32_t num_written_tokens() const {
    return num_computed_tokens - num_in_flight_tokens;
  }
  [[nodiscard]] bool is_finished() const { return IsFinished(state); }
};

}  // namespace tandem::sched
