// The scheduler core (DESIGN §3): continuous batching with chunked prefill,
// prefix caching, preemption by recompute, sync and async scheduling, and the
// scheduler role of a KV connector. Single-threaded and deterministic: no
// clock (time is an argument), no randomness, no I/O.
//
// Engine loop, sync mode:   out = Schedule(); run; UpdateFromOutput(out, r)
// Engine loop, async mode:  Schedule() for step N+1 before UpdateFromOutput()
//                           of step N; at most two steps in flight; outputs
//                           are processed in step order.
//
// Stop checks, per sampled token, after it is appended to the output (as
// vLLM appends, then checks): EOS, i.e. eos_token_id or any of
// extra_eos_token_ids (unless ignore_eos), or a stop token, then
// max_tokens / max_model_len. The token that stops a request is streamed
// and counted like any other; the frontend leaves its text out. EOS and stop tokens count only for
// a token at output index >= min_tokens; the worker never samples them before then (vLLM's
// min-tokens processor, StepExecutorOptions::eos_token_ids), and a worker that did would have them
// taken as ordinary output tokens. EOS on the last allowed token therefore finishes as
// kFinishedStopped, not kFinishedLength.
//
// Preemption and progress (DESIGN §3, plus rules of Tandem's that make every
// workload that fits the cache drain). A running request R short of blocks
// frees them, in this order:
//   1. it preempts the request that comes last in the policy's order of who
//      keeps blocks, among the running requests after R and the waiting
//      requests that hold KV of a finished load (never one before R). FCFS:
//      the most recently admitted; every request holding a load counts as
//      admitted after every running one, so those go first. Priority: the
//      largest priority value, latest arrival. A preempted loaded request
//      frees its blocks (they stay in the prefix cache) and keeps its place;
//   2. if nobody is after R but blocks will come back by themselves (a load
//      in flight after R in that order, or a finished request whose KV
//      transfer the worker has not reported), R waits: it skips this step
//      and no waiting request is admitted in it. A load in flight cannot be
//      preempted (the worker writes its blocks); once it has finished, its
//      request is preemptable under rule 1;
//   3. otherwise R preempts itself (it is last in the order).
// Progress: a request is never the victim of one after it in the order, so
// the first request in the order never loses its blocks and finishes (it
// fits the pool alone, AddRequest checks that). tests/sched/ asserts a small
// bound on how often the same request preempts another
// (kMaxPreemptionsBySameRequest) over randomized workloads. The livelock
// these rules remove: DESIGN-NOTES.md, "The scheduler's progress rules".
// A request whose blocks the local prefix cache holds up to its last,
// full block (the hit is capped at num_tokens - 1) is not sent to the
// connector: it recomputes the last block instead of loading a copy of
// what the cache has.
//
// Admission order (DESIGN §3, plus one rule of Tandem's): requests whose
// async KV load has finished are admitted first, in queue order, skipping
// those that do not fit; then the waiting queue in order, until a request
// does not fit the budget or the pool. A finished load holds its blocks until
// its request runs, so letting the queue head (e.g. a request preempted for
// want of blocks) wait in front of it could stall the queue for good. The
// block gate for new loads reserves the rest of the prompt of every request
// holding a load, so once nothing runs every finished load fits.
//
// Block reuse and the worker (DESIGN §5 "Ordering"): the scheduler frees
// blocks as soon as a request finishes or is preempted, even with a later
// step in flight that still writes them. The worker therefore executes steps
// in order and orders a connector load into a block after the previous step's
// forward pass, and a store's read before the next step's.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "tandem/common/sampling_params.h"
#include "tandem/sched/config.h"
#include "tandem/sched/kv_cache_manager.h"
#include "tandem/sched/kv_connector.h"
#include "tandem/sched/request.h"
#include "tandem/sched/scheduler_output.h"
#include "tandem/sched/waiting_queue.h"

namespace tandem::sched {

struct RequestSpec {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
  // Priority policy: smaller is served first and preempted last.
  int32_t priority = 0;
  // Tenant salt for the block-hash root, set by the server (DESIGN §3).
  std::string cache_salt;
  // Output tokens an earlier scheduler already streamed for this request,
  // whose worker was lost (issue 16: a worker's death costs a pause). The
  // request continues after them, as after a preemption: they count against
  // max_tokens, the worker recomputes their KV, and sampling continues at
  // output position size() (the counter-based RNG gives the tokens a run
  // without the loss would have given). Fewer than max_tokens.
  std::vector<int32_t> resumed_output_token_ids;
};

// What UpdateFromOutput / AbortRequest produce for one client.
struct RequestOutput {
  std::string request_id;
  // Tokens to stream, the EOS or stop token that ends the request included.
  std::vector<int32_t> new_token_ids;
  // Parallel to new_token_ids when the request asked for logprobs.
  std::vector<TokenLogprobs> new_logprobs;
  // When it asked for prompt_logprobs, in its first output (tokens or the
  // end): prompt positions 1 .. num_prompt_tokens - 1.
  std::vector<TokenLogprobs> prompt_logprobs;
  // Set when the request finished in this update.
  std::optional<RequestState> finished;
  // Finished kFinishedStopped by the last of new_token_ids: EOS or a stop
  // token (counted and streamed; not part of the text).
  bool stopped_on_token = false;
  // Why, when finished is kFinishedError.
  std::string error;
  int32_t num_prompt_tokens = 0;
  int32_t num_output_tokens = 0;
  // Prompt tokens not computed for this request, of the admission whose
  // prefill produced its first output token (fixed from then on; an
  // admission before it, whose work a preemption or a failed step threw
  // away, does not count): found in this scheduler's prefix cache (local),
  // and loaded from the KV-store (external: valid blocks only, and never the
  // last prompt token, which is always computed). local + external <=
  // num_prompt_tokens - 1 for a request that had no output before.
  int32_t num_cached_tokens_local = 0;
  int32_t num_cached_tokens_external = 0;
};

enum class PreemptionReason {
  // A running request needed blocks and the pool had none.
  kKvCacheFull = 0,
  // The worker failed a step the request was in; it recomputes.
  kStepFailed = 1,
  // The worker was lost with the request's steps in flight; it recomputes.
  kWorkerLost = 2,
};
inline constexpr int kNumPreemptionReasons = 3;
[[nodiscard]] const char* PreemptionReasonName(PreemptionReason reason);

// What stopped admission in a step while requests still waited (metrics:
// which limit to raise). One per step at most: the first one hit.
enum class AdmissionLimit {
  kMaxNumSeqs = 0,     // running (+ loading, with limit_async_load_admission) = max_num_seqs
  kTokenBudget = 1,    // max_num_batched_tokens spent (or a whole prompt did not fit it)
  kKvBlocks = 2,       // no free blocks for the next request, or a running one waits for blocks
  kAsyncLoadGate = 3,  // a load would take blocks that running requests need (LoadGateAllows)
};
inline constexpr int kNumAdmissionLimits = 4;
[[nodiscard]] const char* AdmissionLimitName(AdmissionLimit limit);

// One preemption of the last Schedule() or FailSteps() (tests, logs).
struct PreemptionEvent {
  std::string victim_id;
  // The running request that needed the blocks (the victim itself when it
  // preempted itself); empty for kStepFailed and kWorkerLost.
  std::string preemptor_id;
  PreemptionReason reason = PreemptionReason::kKvCacheFull;
  // Computed tokens it loses (recomputed when it runs again).
  int32_t num_computed_tokens = 0;
};

// Snapshot taken at the end of every Schedule() (gauges) plus running totals
// (counters, never reset).
struct SchedulerStats {
  uint64_t num_steps = 0;
  // Gauges after the step was scheduled.
  int32_t num_running = 0;
  int32_t num_waiting = 0;               // all waiting requests, by reason:
  int32_t num_waiting_for_capacity = 0;  //   budgets, blocks or queue order
  int32_t num_waiting_for_lookup = 0;    //   connector lookup deferred in this step
  int32_t num_waiting_for_load = 0;      //   async KV load in progress
  int32_t num_scheduled_tokens = 0;      // in this step
  int32_t num_preemptions_step = 0;      // in this step
  double kv_cache_usage = 0.0;           // 0-1
  int32_t num_free_blocks = 0;
  // Counters.
  uint64_t num_preemptions_total = 0;
  uint64_t num_preemptions_by_reason[kNumPreemptionReasons] = {};
  uint64_t num_recomputed_tokens = 0;        // computed tokens lost to preemption
  uint64_t prefix_cache_queries_tokens = 0;  // prompt tokens looked up locally
  uint64_t prefix_cache_hits_tokens = 0;
  uint64_t external_cache_queries_tokens = 0;  // tokens asked of the connector
  uint64_t external_cache_hits_tokens = 0;     // tokens it matched
  uint64_t external_loaded_tokens = 0;         // tokens whose load succeeded
  uint64_t num_requests_finished = 0;
  // Waiting requests that became running (new, resumed after a preemption,
  // or after their KV load); a load's start is not an admission.
  uint64_t num_requests_admitted = 0;
  // Steps in which admission stopped with requests still waiting, by limit.
  uint64_t num_admission_blocked_steps[kNumAdmissionLimits] = {};
};

class Scheduler {
 public:
  // `config` must be valid (checked). `connector` may be null (no external
  // store); it must outlive the scheduler.
  Scheduler(SchedulerConfig config, KvConnectorScheduler* connector);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request: the one place a request's content is validated (the
  // services only convert). INVALID_ARGUMENT first, for an empty prompt, a
  // token id outside the vocabulary, bad sampling params, prompt +
  // max_tokens > max_model_len, or a request the KV pool could never hold;
  // then ALREADY_EXISTS for the id of a live request, or of a
  // finished one whose blocks are still held for a KV transfer the worker
  // has not reported (its report names the id, so the id cannot be reused
  // before);
  // RESOURCE_EXHAUSTED when max_waiting_requests wait, unless `resumed`
  // (a request accepted before, back after a worker loss: the limit is for
  // new work).
  absl::Status AddRequest(RequestSpec spec, int64_t arrival_time_ns, bool resumed = false);
  // AddRequest's content checks (the INVALID_ARGUMENT ones) for a scheduler
  // with `config` and `num_total_blocks` usable KV blocks.
  [[nodiscard]] static absl::Status ValidateRequest(const RequestSpec& spec,
                                                    const SchedulerConfig& config,
                                                    int32_t num_total_blocks);

  // Builds the next step; step ids increase by one from 1.
  SchedulerOutput Schedule();
  // Same, reusing `out`'s storage (hot path).
  void ScheduleInto(SchedulerOutput* out);

  // Processes the oldest step in flight: `scheduled` must be that step's
  // output, `output` the worker's answer. Output of requests aborted or
  // preempted since is dropped.
  //
  // A failed step (output.error set) is the worker's loss of the step's KV
  // writes, not the requests' fault (DESIGN §9; the reliability rules of
  // issue 16): the blocks whose hashes the step published lose them, here
  // and for good (a later request never "hits" KV that was never written),
  // and every live request that was in the step or holds such a block is
  // preempted for recompute (PreemptionReason::kStepFailed; a request whose
  // load is still running, once the load is reported). Every later step in
  // flight counts as failed too: it was built on the failed one (the worker
  // does not run it either, see SchedulerOutput::last_processed_step_id). A
  // request in config.max_step_failures failed steps ends with
  // kFinishedError (RequestOutput::error says why). A request whose
  // SampledTokens::error is set (the worker cannot go on with it alone) ends
  // with kFinishedError and that message; the step's other requests go on.
  std::vector<RequestOutput> UpdateFromOutput(const SchedulerOutput& scheduled,
                                              const ModelRunnerOutput& output);
  // Same, overwriting `outputs` (reuses its elements' storage).
  void UpdateFromOutputInto(const SchedulerOutput& scheduled, const ModelRunnerOutput& output,
                            std::vector<RequestOutput>* outputs);
  // Same, for the oldest step in flight: the scheduler keeps every step it
  // built until its output is processed, so an engine need not keep them too
  // (EngineCore checks output.step_id against oldest_step_in_flight()).
  void UpdateOldestStepInto(const ModelRunnerOutput& output, std::vector<RequestOutput>* outputs);
  // The step the next output must answer; 0 when none is in flight.
  [[nodiscard]] uint64_t oldest_step_in_flight() const {
    return in_flight_.empty() ? 0 : in_flight_.front().step_id;
  }

  // Aborts a waiting, loading or running request: nullopt when unknown or
  // already finished. The worker is told in the next step's finished_req_ids.
  std::optional<RequestOutput> AbortRequest(std::string_view request_id);

  // True while another step is needed: requests waiting or running, finished
  // ids the worker has not been sent, or blocks held for KV transfers the
  // worker has not reported.
  [[nodiscard]] bool HasUnfinishedRequests() const;
  [[nodiscard]] int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  [[nodiscard]] int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  [[nodiscard]] int32_t num_free_blocks() const { return kv_.pool().num_free_blocks(); }
  // Usable blocks (the null block excluded).
  [[nodiscard]] int32_t num_total_blocks() const { return kv_.pool().num_usable_blocks(); }
  [[nodiscard]] int32_t num_steps_in_flight() const {
    return static_cast<int32_t>(in_flight_.size());
  }
  [[nodiscard]] const SchedulerStats& stats() const { return stats_; }
  // The preemptions of the last Schedule() or UpdateFromOutput().
  [[nodiscard]] const std::vector<PreemptionEvent>& last_preemptions() const {
    return preemption_events_;
  }
  [[nodiscard]] const SchedulerConfig& config() const { return config_; }

  // For tests and connectors: the live request (waiting, loading, running or
  // held for a KV transfer), or null.
  [[nodiscard]] const Request* FindRequest(std::string_view request_id) const;
  [[nodiscard]] const BlockPool& block_pool() const { return kv_.pool(); }
  // Checks every invariant (counters, budgets, block reference counts, free
  // queue); the message names the first one broken. For tests.
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  struct StepEntry {
    Request* request;
    uint64_t epoch;
    int32_t num_scheduled_tokens;
    bool will_sample;
  };
  struct StepRecord {
    uint64_t step_id = 0;
    std::vector<StepEntry> entries;
    // Blocks hashed in the prefix cache because this step writes their KV.
    std::vector<int32_t> published;
    // An earlier step failed: this one is handled as failed too.
    bool failed = false;
    // Its KV-store loads (request ids, and their destination blocks in
    // order) and stores: failed by the scheduler if the worker rejects it.
    std::vector<std::string> load_ids;
    std::vector<int32_t> load_block_ids;
    std::vector<std::string> store_ids;
    // Its finished_req_ids: sent again if the worker rejects it.
    std::vector<std::string> finished_ids;
  };
  // The oldest step in flight failed (see UpdateFromOutput): it and every
  // later step in flight fail (those already failed with an earlier step
  // were handled then). Appends outputs of the requests that end with an
  // error.
  void FailSteps(const std::string& error, std::vector<RequestOutput>* outputs,
                 size_t* num_outputs);
  // The worker rejected the oldest step in flight unread (see
  // ModelRunnerOutput::rejected): its new requests are unknown to the
  // worker again, the finished requests it named are named again in the
  // next step, and its loads and stores are reported failed in `report`.
  void UndoRejectedStep(const StepRecord& rec, KvConnectorReport* report);

  Request* NewRequest();
  void ReleaseRequest(Request* request);
  // What a running request that is short of blocks does (see the header).
  struct Victim {
    Request* request = nullptr;  // null: wait for a transfer to free blocks
    bool running = false;        // else a waiting request holding loaded KV
    size_t index = 0;            // in running_ when running
  };
  [[nodiscard]] Victim PickVictim(const Request* r) const;
  // Whether `a` goes before `b` in the policy's order of who keeps blocks.
  [[nodiscard]] bool KeepsBlocksBefore(const Request& a, const Request& b) const;
  // Preempts a running request (its caller removes it from running_) or a
  // waiting request holding loaded KV.
  void Preempt(Request* victim, const Request* preemptor, PreemptionReason reason);
  // kSkip: not decidable now (its load runs, or was just admitted);
  // kDeferred: the connector's lookup is not known yet; kStop: the budget
  // cannot hold it; kNoBlocks: the pool cannot hold it.
  // kStop: the token budget; kNoBlocks: the pool; kLoadGated: the load gate.
  enum class Admit { kAdmitted, kSkip, kDeferred, kStop, kNoBlocks, kLoadGated };
  Admit TryAdmit(Request* request, int32_t* token_budget);
  bool LoadGateAllows(const Request& request, const PrefixHit& hit) const;
  // The hit stops one block short of the whole prompt (the cap of
  // num_tokens - 1) and the cache holds that last block too: recompute it
  // rather than load a copy from the connector.
  [[nodiscard]] bool LocalCacheHoldsWholePrompt(const Request& request, const PrefixHit& hit) const;
  // A waiting request whose async load has finished: it holds blocks that
  // only its admission (or its end) frees.
  [[nodiscard]] static bool HoldsLoadedKv(const Request& request) {
    return (request.state == RequestState::kWaiting || request.state == RequestState::kPreempted) &&
           !request.block_ids.empty();
  }
  // eos_token_id or one of extra_eos_token_ids.
  [[nodiscard]] bool IsEos(int32_t token) const;
  // `logprobs`: parallel to tokens, or empty.
  void AppendTokens(Request* request, std::span<const int32_t> tokens,
                    std::span<const TokenLogprobs> logprobs, RequestOutput* out);
  // Keeps the prompt logprobs of a step's output that extend the request's.
  static void AppendPromptLogprobs(Request* request, const SampledTokens& sampled);
  // Empties an output about to be refilled (outputs are reused).
  static void ClearTokens(RequestOutput* out);
  // Ends a request in any live state: frees or holds its blocks.
  // `num_storable_tokens`: see KvConnectorScheduler::RequestFinished.
  void Finish(Request* request, RequestState state, int32_t num_storable_tokens = 0);
  void MaybeRelease(Request* request);
  void HandleConnectorReport(const KvConnectorReport& report);
  // Sets the cached-token counts of an admission (RequestOutput); a no-op
  // once the request has output.
  static void NoteCachedTokens(Request* r, int32_t num_local, int32_t num_external);
  void FillOutput(Request* request, RequestOutput* out) const;
  void ComputeStats(int32_t num_scheduled_tokens, int32_t num_preempted, int32_t num_deferred);
  // ScheduleInto's four phases, in order.
  struct StepBudget {
    int32_t token_budget = 0;
    int32_t num_preempted = 0;
    bool short_of_blocks = false;  // a running request waits for blocks
  };
  void ScheduleRunning(StepBudget* budget);
  int32_t AdmitWaiting(StepBudget* budget);
  StepRecord BuildStepOutput(SchedulerOutput* out);
  void AdvanceCounters(const StepRecord& record);

  SchedulerConfig config_;
  KvConnectorScheduler* connector_;
  KvCacheManager kv_;
  WaitingQueue waiting_;
  std::vector<Request*> running_;  // admission order
  // Requests that finished but hold blocks for a KV transfer, by id. Ids are
  // unique across live_ and held_.
  absl::flat_hash_map<std::string, Request*> held_;
  int32_t num_loading_ = 0;  // waiting requests in kWaitingForRemoteKv
  int32_t num_loaded_ = 0;   // waiting requests for which HoldsLoadedKv()

  // Requests live in chunks (stable addresses, hot fields close together);
  // finished ones are reused from free_slots_.
  std::deque<Request> slab_;
  std::vector<Request*> free_slots_;
  absl::flat_hash_map<std::string, Request*> live_;

  uint64_t next_step_id_ = 1;
  uint64_t last_processed_step_id_ = 0;
  uint64_t next_arrival_seq_ = 0;
  uint64_t next_admit_seq_ = 0;
  std::deque<StepRecord> in_flight_;
  std::vector<StepRecord> spare_records_;
  std::vector<std::string> pending_finished_ids_;

  // Per-step scratch, reused.
  std::vector<StepEntry> scheduled_;  // in output order
  std::vector<ScheduledRequestView> views_;
  std::vector<bool> admitted_mask_;
  std::vector<Request*> preempted_;
  std::vector<PreemptionEvent> preemption_events_;
  std::vector<int32_t> published_;  // blocks this step's Schedule() published
  PrefixHit hit_scratch_;

  SchedulerStats stats_;
};

}  // namespace tandem::sched
