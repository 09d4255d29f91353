// The worker's side of the step contract (DESIGN §1, §4), free of gRPC:
// StepExecutor takes a sched::SchedulerOutput and gives back a
// sched::ModelRunnerOutput. services/worker only converts the protos, feeds
// the steps in order from one thread and exports the metrics.
//
// Batch state per request: every token id it knows (the prompt, then each
// token it sampled itself: in async mode the scheduler's placeholders are
// filled from here), its block table (new_block_ids appended; replaced for a
// request resumed after preemption, whose token ids are then replaced by the
// scheduler's all_token_ids), and num_computed_tokens. A step samples for a
// request when its chunk reaches the last known token; the sampling position
// is the number of output tokens so far.
//
// Placeholder check (async scheduling): per request the executor remembers
// the steps in which it sampled a token. Those after the step's
// last_processed_step_id are tokens the scheduler has not seen yet, so their
// number must equal the step's num_output_placeholders for the request; a
// mismatch fails the step (the two sides would feed different tokens).
//
// KV-store loads (the connector) begin in the step that carries them and
// arrive in a later one: each step first copies in the loads that have
// arrived, and again after its forward pass (a step with nothing to
// compute waits for one: StepExecutorOptions::empty_step_load_wait).
//
// A failed step: the loads that arrived are reported, its stores dropped,
// nothing is sampled. A step built before the scheduler had processed a failed step's
// output (its last_processed_step_id is older) builds on that step's
// samples and KV: it is failed too, after its loads and before its forward
// pass, so it never computes (or stores in the KV-store) KV from a context
// that was never written. The scheduler recomputes those requests.
//
// Each request's batch state ends with one log line (id, why, prompt and
// computed tokens, tokens sampled here, steps, preemptions, time held).
//
// Overlap (issue 31: "the host prepares step N+1's inputs while step N
// runs"): a step runs in three calls. Prepare applies its batch diff and
// builds its inputs and sampling plan; Launch copies in the loads that
// arrived and begins the forward pass and sampling on the backend; Finish
// waits for them and gives the output. The worker calls Prepare(N+1)
// between Launch(N) and Finish(N), so the host's work for the next step
// runs while the device computes. That is exact because Launch(N) already
// does N's bookkeeping (computed tokens, the steps that sampled, a slot in
// token_ids for each token N samples): Prepare(N+1) sees the state it would
// have seen after N, except the sampled tokens' values, which Finish(N)
// writes into those slots before Launch(N+1) reads them (the inputs and
// penalty histories are spans over token_ids). Requests that finish while
// a step that holds them runs are kept until it is finished. Launch(N+1)
// comes after Finish(N): with one device stream, the steps (and the KV
// stores of N against the loads of N+1) stay in order. Execute is the
// three calls back to back.
//
// Not thread-safe: one thread runs the steps, in order. Because they run
// strictly in order, a block the scheduler freed after step N and reused in
// step N+1 is never written by both at once (DESIGN §5 "Ordering").
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tandem/common/sampling_params.h"
#include "tandem/model/model_runner.h"
#include "tandem/model/sampler.h"
#include "tandem/sched/kv_connector.h"
#include "tandem/sched/scheduler_output.h"
#include "tandem/worker/step_backend.h"
#include "tandem/worker/structured_outputs.h"

namespace tandem::worker {

struct StepExecutorOptions {
  // The model's EOS ids (ModelConfig::EosTokenIds): with a request's stop
  // token ids, never sampled before its min_tokens (vLLM's min-tokens
  // processor), ignore_eos or not.
  std::vector<int32_t> eos_token_ids;
  // The model's vocabulary as bytes (LoadVocabulary), for structured
  // outputs; null: this worker has none, and a step that brings a request
  // with a json_schema or a choice fails (the scheduler refuses them for it).
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary;
  // Bytes of token masks kept by grammar state (grammar::TokenMaskCache).
  size_t grammar_mask_cache_bytes = size_t{256} << 20;
  // TEST-ONLY: step ids (of each scheduler stream) that fail after their
  // loads and batch diff, before the forward pass.
  std::vector<uint64_t> debug_fail_steps;
  // TEST-ONLY: every step sleeps this long before its forward pass.
  int32_t debug_step_delay_us = 0;
  // A step with nothing to compute, while KV-store loads are in flight,
  // waits this long for one to arrive before it answers (less when the
  // next step arrives: KvConnectorWorker::SetStepQueued). So an engine
  // whose only work is loads learns of each within a round trip, without
  // sending empty steps as fast as they come back; in sync scheduling a
  // request that arrives meanwhile waits at most this long for its step.
  std::chrono::microseconds empty_step_load_wait{10'000};
};

class StepExecutor {
 public:
  // `backend` must outlive the executor; `kv_connector` may be null (no
  // KV-store) and must outlive it too.
  StepExecutor(StepBackend* backend, sched::KvConnectorWorker* kv_connector,
               StepExecutorOptions options = {});

  // A step between Prepare and Finish.
  class Step;

  // Runs one step: applies its batch diff, checks the placeholders, runs its
  // KV loads, the forward pass and sampling, and snapshots its KV stores.
  // Always returns the step's output: on failure `error` is set, nothing is
  // sampled and the loads done are still reported. Prepare, Launch and
  // Finish back to back.
  sched::ModelRunnerOutput Execute(sched::SchedulerOutput step);

  // Execute in three calls (see "Overlap" above). The order is Prepare(N),
  // Launch(N), [Prepare(N+1)], Finish(N), Launch(N+1), ...: at most one step
  // is launched and not finished, and Prepare(N+1) may come before or
  // after Finish(N).
  // The host's work: finished requests, the batch diff and placeholder
  // check, the inputs and the sampling plan. A failure is kept for Finish.
  std::unique_ptr<Step> Prepare(sched::SchedulerOutput step);
  // Copies in the loads that arrived and begins the forward pass and
  // sampling. `on_done` as StepBackend::Launch's (when nothing was
  // launched, it runs before this returns).
  void Launch(Step& step, std::function<void()> on_done);
  // Whether Launch would return before the step is done (the backend's
  // launches_async for it; false for a step with nothing to compute).
  [[nodiscard]] bool LaunchReturnsAtOnce(const Step& step) const;
  // Waits for the step, snapshots its KV stores, reports its loads and
  // gives its output.
  sched::ModelRunnerOutput Finish(std::unique_ptr<Step> step);

  // A step that could not even be read (the adapter's conversion failed):
  // answered as rejected (nothing of it applied), and every later step built
  // before the scheduler processed that answer fails too. Not while a step
  // is launched and not finished.
  sched::ModelRunnerOutput Reject(uint64_t step_id, const absl::Status& why);
  // The scheduler's stream ended: every request's batch state is dropped,
  // the loads in flight are forgotten and step ids start again. Not while a
  // step is launched and not finished.
  void Reset(const char* why);

  [[nodiscard]] int32_t num_requests() const { return static_cast<int32_t>(seqs_.size()); }
  // Structured outputs' masks so far (zeros without a vocabulary).
  [[nodiscard]] StructuredOutputs::Stats structured_stats() const {
    return structured_ != nullptr ? structured_->stats() : StructuredOutputs::Stats{};
  }

 private:
  struct SeqState {
    std::vector<int32_t> token_ids;  // prompt + every output token known here
    int32_t num_prompt_tokens = 0;
    SamplingParams sampling;
    std::vector<int32_t> block_table;
    int32_t num_computed_tokens = 0;
    // Steps that sampled a token the scheduler may not have processed yet
    // (oldest first; at most two with async scheduling).
    std::deque<uint64_t> unconfirmed_sample_steps;
    // For the log line when the state is dropped.
    int64_t first_step_ns = 0;
    int32_t num_steps = 0;
    int32_t num_sampled = 0;
    int32_t num_preemptions = 0;
    // With a grammar (json_schema or choice): its document so far (StructuredOutputs::Ban).
    GrammarState grammar;
  };
  // By pointer: a launched step's rows point at their states, which must
  // stay where they are while the map changes (and outlive a drop until the
  // step is finished: retired_).
  using SeqMap = std::unordered_map<std::string, std::unique_ptr<SeqState>>;

  // The step's requests, in the order of its num_scheduled_tokens.
  struct Batch {
    std::vector<SeqState*> seqs;
    std::vector<const std::string*> ids;
  };

 public:
  class Step {
   public:
    uint64_t step_id() const { return step_.step_id; }

   private:
    friend class StepExecutor;
    sched::SchedulerOutput step_;
    sched::ModelRunnerOutput out_;
    absl::Status status_;  // a failure before the forward pass
    Batch batch_;
    std::vector<model::SequenceInput> inputs_;
    std::vector<model::SampleRequest> sample_;
    std::vector<std::vector<int32_t>> banned_;  // sized only when a request bans tokens
    // Structured outputs' token masks; sized only when a request has a grammar.
    std::vector<grammar::TokenMask> masks_;
    // Per row, why its request cannot go on (SampledTokens::error); sized
    // only when one cannot.
    std::vector<std::string> errors_;
    bool want_logprobs_ = false;                // model::WantsLogprobs(sample_)
    bool launched_ = false;                     // the backend has it
    // Per row that samples: where its token goes in the row's token_ids
    // (-1: the row samples nothing).
    std::vector<int64_t> slots_;
  };

 private:
  // Applies the step's diff (preempted, new and cached requests) to the
  // batch state, checks the placeholders, and lists the batch.
  absl::Status ApplyDiff(sched::SchedulerOutput& step, Batch* batch);
  // The forward pass's rows; FAILED_PRECONDITION for tokens not known here.
  absl::Status BuildInputs(const sched::SchedulerOutput& step, const Batch& batch,
                           std::vector<model::SequenceInput>* inputs);
  // What each row samples and scores; `banned` backs the rows' banned ids.
  void PlanSampling(const sched::SchedulerOutput& step, const Batch& batch,
                    std::vector<model::SequenceInput>* inputs,
                    std::vector<model::SampleRequest>* sample,
                    std::vector<std::vector<int32_t>>* banned) const;
  // vLLM's bad_words: the tokens each row's output so far bans, added to its
  // banned ids. At Launch, not Prepare: the previous step's sampled tokens,
  // which the bans read, are written into token_ids at its Finish.
  static void BanBadWords(Step& st);
  // Structured outputs: the ids each row's grammar does not allow after
  // its output so far, added to its banned ids. At Launch, as BanBadWords.
  void BanByGrammar(Step& st);
  // A launched step's bookkeeping, before the next step is prepared: its
  // computed tokens, a slot in token_ids for each token it samples, and
  // the output's rows.
  void RecordLaunch(Step& st);
  // The sampled tokens into their slots and the output.
  void RecordSamples(Step& st, const std::vector<int32_t>& tokens,
                     std::vector<model::SampleLogprobs>& logprobs);
  // The output of a step that failed with `why`.
  sched::ModelRunnerOutput FailedStep(Step& st, const absl::Status& why);
  sched::ModelRunnerOutput Failed(uint64_t step_id, uint64_t last_processed_step_id,
                                  const absl::Status& why, sched::KvConnectorReport report);
  // Drops a request's batch state with its log line.
  void DropSeq(SeqMap::iterator it, const char* why);
  // Keeps `seq` alive until the launched step is finished (when one is).
  void Retire(std::unique_ptr<SeqState> seq);

  StepBackend* const backend_;
  sched::KvConnectorWorker* const kv_connector_;
  const StepExecutorOptions options_;
  std::unique_ptr<StructuredOutputs> structured_;  // null without a vocabulary
  SeqMap seqs_;
  // Dropped while a launched step still points at them.
  std::vector<std::unique_ptr<SeqState>> retired_;
  bool in_flight_ = false;  // a step is launched and not finished
  // The last step of this stream that failed by itself (not because it was
  // built on a failed one); 0: none.
  uint64_t last_failed_step_id_ = 0;
};

}  // namespace tandem::worker
