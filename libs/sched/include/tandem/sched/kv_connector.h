// The scheduler role of a KV connector (DESIGN §5). The Scheduler calls it
// from its single thread; implementations must never block (the KV-store
// connector polls futures of RPCs it started earlier).
//
// Call sequence for one request:
//   GetNumNewMatchedTokens()  each step it is considered for admission until
//                             it is admitted (nullopt = not known yet: the
//                             request keeps its place and is asked again; an
//                             answer may be asked for again when the step had
//                             no room for the request, so keep it until
//                             UpdateStateAfterAlloc or RequestFinished);
//   UpdateStateAfterAlloc()   once when it is admitted (also with 0 external
//                             tokens: release the lookup's lease then);
//   BuildConnectorMeta()      every step, for the requests of that step;
//   OnLoadFinished()          when the worker reports its async load done;
//   RequestFinished()         once when it finishes or is aborted (also while
//                             waiting or loading: drop a pending lookup);
//                             may queue a last store (see there).
// After preemption a request is asked GetNumNewMatchedTokens() again.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>

#include "tandem/sched/request.h"
#include "tandem/sched/scheduler_output.h"

namespace tandem::sched {

struct ExternalMatch {
  // Tokens beyond the local hit that the store holds, in full blocks. The
  // scheduler clamps it to whole blocks within the prompt.
  int32_t num_external_tokens = 0;
  // The blocks arrive asynchronously: the request waits in
  // kWaitingForRemoteKv until the worker reports finished_recving. Tandem
  // treats every load this way (false is accepted and handled the same), so
  // the worker must report finished_recving for every load it is given.
  bool load_async = true;
};

// A request scheduled in the step being built; counters are those *before*
// the step advances them.
struct ScheduledRequestView {
  const Request* request = nullptr;
  int32_t num_scheduled_tokens = 0;
  // The step samples a token for it.
  bool will_sample = false;
  // Async mode and will_sample: the sampled token becomes a placeholder.
  bool adds_placeholder = false;

  // Known computed tokens once this step has run (KnownComputedTokens in
  // request.h): min(num_computed_tokens + n, num_tokens), from the counters
  // before the step's increments and equal to the bound after them. Stores
  // may cover full blocks up to this, never further.
  [[nodiscard]] int32_t num_storable_tokens() const {
    return KnownComputedTokens(request->num_computed_tokens + num_scheduled_tokens,
                               request->num_tokens());
  }
};

// Running totals and gauges of a scheduler role (read on its thread).
struct KvConnectorSchedulerStats {
  uint64_t lookups = 0;                // Lookup RPCs answered (or given up on)
  uint64_t lookups_with_hits = 0;      // ... with at least one leading hit
  uint64_t lookups_failed = 0;         // late (deadline) or failed: zero hits
  uint64_t lookup_hit_tokens = 0;      // tokens found beyond the local hit
  uint64_t lookup_latency_ns_sum = 0;  // send -> first poll that saw the answer
  uint64_t lookup_latency_ns_max = 0;
  uint64_t loads_started = 0;   // requests whose prefix is being loaded
  uint64_t loaded_tokens = 0;   // tokens that arrived valid
  uint64_t invalid_blocks = 0;  // blocks the worker could not load
  uint64_t stored_blocks = 0;   // store entries emitted (blocks)
  // Blocks of finished store entries that the worker reported failed
  // (dropped, not copied, rejected, RPC failed): forgotten, so a later
  // request stores them again.
  uint64_t stored_blocks_lost = 0;
  int32_t lookups_pending = 0;  // gauges
  int32_t loads_in_flight = 0;
  int32_t stores_in_flight = 0;  // KvStoreOp entries not yet reported sent
};

class KvConnectorScheduler {
 public:
  virtual ~KvConnectorScheduler() = default;

  // Tokens the external store can provide beyond `num_local_computed_tokens`
  // (the local prefix hit, whole blocks), or nullopt when not known yet.
  virtual std::optional<ExternalMatch> GetNumNewMatchedTokens(
      const Request& request, int32_t num_local_computed_tokens) = 0;

  // The request was admitted. `block_ids` are the destinations of the
  // external tokens (parallel to request.block_hashes starting at block
  // num_local_computed_tokens / block_size); empty when nothing is loaded.
  virtual void UpdateStateAfterAlloc(const Request& request, std::span<const int32_t> block_ids,
                                     int32_t num_external_tokens) = 0;

  // This step's loads and stores. Called after `output` is complete and
  // before the counters of `scheduled` advance.
  virtual KvConnectorMetadata BuildConnectorMeta(
      const SchedulerOutput& output, std::span<const ScheduledRequestView> scheduled) = 0;

  // The request finished or was aborted; `block_ids` is its table. Returns
  // true to keep the blocks allocated until the worker reports the request
  // in finished_sending.
  //
  // `num_storable_tokens`: the full blocks below it (of request.block_hashes
  // and `block_ids`) hold KV of known tokens that is written by the time the
  // next step runs; a connector may store the ones its earlier stores did
  // not cover, in the next step's metadata with KvStoreOp::before_forward set
  // (the scheduler frees the blocks now, so that step may reuse them). In
  // async mode a request often ends before any step covers its last full
  // block: its last tokens become known only with the outputs that end it.
  // It is the known computed tokens before the ending output's tokens were
  // appended (so sync and async runs store the same blocks), and 0 for an
  // abort or an error.
  virtual bool RequestFinished(const Request& request, std::span<const int32_t> block_ids,
                               int32_t num_storable_tokens) = 0;

  // The worker reported the request's load done; `num_loaded_tokens` is what
  // survived invalid_block_ids (may be less than asked).
  virtual void OnLoadFinished(const Request& /*request*/, int32_t /*num_loaded_tokens*/) {}

  // Every ModelRunnerOutput's report, before the scheduler acts on it.
  virtual void OnConnectorReport(const KvConnectorReport& /*report*/) {}

  // Totals plus the gauges as of now. The engine reads stores_in_flight:
  // while it is above zero with nothing scheduled, an empty step now and then
  // collects the worker's finished stores.
  [[nodiscard]] virtual KvConnectorSchedulerStats stats() const { return {}; }
};

// The worker role (DESIGN §5). Runs on the worker's one step thread, around
// each step's forward pass, so its copies are ordered against the
// neighbouring steps.
class KvConnectorWorker {
 public:
  virtual ~KvConnectorWorker() = default;

  // Before the forward pass: copies out the store entries marked
  // before_forward, begins the step's loads and finishes the loads that
  // have arrived (FinishLoads). A load may finish in a later step than the
  // one that carries it: the scheduler keeps its request waiting
  // (kWaitingForRemoteKv) and its blocks held until finished_recving.
  virtual void LoadBlocks(const KvConnectorMetadata& meta, KvConnectorReport* report) = 0;
  // Copies into the KV cache the loads whose blocks have arrived since the
  // last call, and appends to `report` each one's request id
  // (finished_recving), the blocks that did not arrive (invalid_block_ids)
  // and their counts by reason. With `wait` positive, loads in flight and
  // none arrived, first waits up to `wait` for one, unless a step is
  // queued behind this one (SetStepQueued).
  // Runs on the step thread, between steps' forward passes.
  virtual void FinishLoads(KvConnectorReport* /*report*/, std::chrono::microseconds /*wait*/) {}
  // Whether a step is queued behind the one running: true ends (or skips)
  // FinishLoads' wait. The worker sets it true when a step arrives and,
  // each time it takes a step, to whether more are queued, under the lock
  // of its queue (so no arrival is missed). Any thread.
  virtual void SetStepQueued(bool /*queued*/) {}
  // The scheduler's stream ended: loads in flight are never copied into
  // the cache nor reported (the next scheduler knows nothing of them).
  virtual void ForgetLoads() {}
  // After the forward pass: reads the step's other store entries' blocks
  // (before a later step can overwrite them). A step that failed before
  // this never calls it; its entries finish as failed.
  virtual void SnapshotStores(const KvConnectorMetadata& meta) = 0;
  // Appends the store entries that completed since the last call
  // (finished_sending; failed_sending for those that did not store all).
  virtual void TakeFinishedSending(KvConnectorReport* report) = 0;
};

// No external store: every lookup is a miss, nothing is loaded or stored.
class NoopKvConnector final : public KvConnectorScheduler {
 public:
  std::optional<ExternalMatch> GetNumNewMatchedTokens(const Request&, int32_t) override {
    return ExternalMatch{};
  }
  void UpdateStateAfterAlloc(const Request&, std::span<const int32_t>, int32_t) override {}
  KvConnectorMetadata BuildConnectorMeta(const SchedulerOutput&,
                                         std::span<const ScheduledRequestView>) override {
    return {};
  }
  bool RequestFinished(const Request&, std::span<const int32_t>, int32_t) override { return false; }
};

}  // namespace tandem::sched
