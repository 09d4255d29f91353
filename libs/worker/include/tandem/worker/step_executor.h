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
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tandem/common/sampling_params.h"
#include "tandem/model/model_runner.h"
#include "tandem/model/sampler.h"
#include "tandem/sched/kv_connector.h"
#include "tandem/sched/scheduler_output.h"

namespace tandem::worker {

// The forward pass and sampling of one batch: the model runner (cpu, cuda)
// or the sim backend, behind one interface. A GPU path plugs in here.
class StepBackend {
 public:
  virtual ~StepBackend() = default;
  // tokens->at(i): the token sampled for sequence i, -1 where sample[i]
  // has no params (a prefill chunk that does not reach the last token);
  // logprobs->at(i): what sample[i] asked for (ModelRunner::ForwardSample).
  virtual absl::Status ForwardSample(std::span<const model::SequenceInput> batch,
                                     std::span<const model::SampleRequest> sample,
                                     std::vector<int32_t>* tokens,
                                     std::vector<model::SampleLogprobs>* logprobs) = 0;
  // ForwardSample in two halves, so that the host can work while the device
  // computes: Launch begins the step and returns once it has read its
  // arguments (they need not outlive the call). Finish gives the launched
  // step's results, waiting for them. One step at a time: Launch, then
  // Finish, then the next Launch. `on_done` is a wake-up for a caller that
  // waits for other work meanwhile: it runs at most once, on any thread,
  // once Finish would not wait; it may run after Finish has returned (even
  // after the next Launch), or not at all once Finish has, so it must tell
  // its step from the next. It must not call back into the backend.
  // A step whose Launch fails was not launched (on_done is not called).
  // This implementation runs ForwardSample within Launch (its error is
  // Launch's) and calls `on_done` before it returns.
  virtual absl::Status Launch(std::span<const model::SequenceInput> batch,
                              std::span<const model::SampleRequest> sample, bool want_logprobs,
                              std::function<void()> on_done);
  virtual absl::Status Finish(std::vector<int32_t>* tokens,
                              std::vector<model::SampleLogprobs>* logprobs);
  // The steps so far on the device's own clock (model/device_time.h); a
  // backend that keeps none reports zeros.
  virtual model::DeviceTime device_time() const { return {}; }

 private:
  model::ImmediateStep immediate_;  // Launch's default
};

// The real model (owned elsewhere; must outlive the backend).
class RunnerBackend final : public StepBackend {
 public:
  explicit RunnerBackend(model::ModelRunner* runner) : runner_(runner) {}
  absl::Status ForwardSample(std::span<const model::SequenceInput> batch,
                             std::span<const model::SampleRequest> sample,
                             std::vector<int32_t>* tokens,
                             std::vector<model::SampleLogprobs>* logprobs) override {
    return runner_->ForwardSample(batch, sample, tokens, logprobs);
  }
  absl::Status Launch(std::span<const model::SequenceInput> batch,
                      std::span<const model::SampleRequest> sample, bool want_logprobs,
                      std::function<void()> on_done) override {
    return runner_->LaunchSample(batch, sample, want_logprobs, std::move(on_done));
  }
  absl::Status Finish(std::vector<int32_t>* tokens,
                      std::vector<model::SampleLogprobs>* logprobs) override {
    return runner_->FinishSample(tokens, logprobs);
  }
  model::DeviceTime device_time() const override { return runner_->device_time(); }

 private:
  model::ModelRunner* const runner_;
};

// No math: deterministic fake logits (one token gets all the mass, chosen
// from the sequence's last token and length, never one of `eos_token_ids`
// unless every id is one) after step_us per step plus token_us per token;
// for scheduler scale tests. Launch models a device: it computes the
// results at once and returns, and the step is done (on_done, Finish)
// once its delay has passed, counted from its launch or from the end of
// the step before, whichever is later.
class SimBackend final : public StepBackend {
 public:
  SimBackend(int32_t vocab_size, std::vector<int32_t> eos_token_ids, int32_t step_us,
             int32_t token_us);
  ~SimBackend() override;
  absl::Status ForwardSample(std::span<const model::SequenceInput> batch,
                             std::span<const model::SampleRequest> sample,
                             std::vector<int32_t>* tokens,
                             std::vector<model::SampleLogprobs>* logprobs) override;
  absl::Status Launch(std::span<const model::SequenceInput> batch,
                      std::span<const model::SampleRequest> sample, bool want_logprobs,
                      std::function<void()> on_done) override;
  absl::Status Finish(std::vector<int32_t>* tokens,
                      std::vector<model::SampleLogprobs>* logprobs) override;
  // The modelled device: busy for each step's delay, by the monotonic clock.
  model::DeviceTime device_time() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return clock_.time();
  }

 private:
  [[nodiscard]] bool IsEos(int32_t token) const;
  // Writes the fake logits after `token` at position end - 1 to row.
  void FakeLogits(int32_t token, int64_t end, std::span<float> row) const;
  // The tokens (and logprobs) of a batch, at once.
  absl::Status Compute(std::span<const model::SequenceInput> batch,
                       std::span<const model::SampleRequest> sample, std::vector<int32_t>* tokens,
                       std::vector<model::SampleLogprobs>* logprobs) const;
  std::chrono::microseconds Delay(std::span<const model::SequenceInput> batch) const;
  // Calls each launched step's on_done once its end has passed.
  void NotifyLoop();

  const int32_t vocab_size_;
  const std::vector<int32_t> eos_token_ids_;
  const int32_t step_us_, token_us_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  model::DeviceClock clock_;
  // The launched step.
  double end_s_ = 0;               // MonotonicSeconds when it is done
  std::function<void()> on_done_;  // null once called, or once Finish has run
  absl::Status status_;
  std::vector<int32_t> tokens_;
  std::vector<model::SampleLogprobs> logprobs_;
  bool stopping_ = false;
  std::thread notifier_;
};

struct StepExecutorOptions {
  // The model's EOS ids (ModelConfig::EosTokenIds): with a request's stop
  // token ids, never sampled before its min_tokens (vLLM's min-tokens
  // processor), unless ignore_eos (for the EOS ids).
  std::vector<int32_t> eos_token_ids;
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
  SeqMap seqs_;
  // Dropped while a launched step still points at them.
  std::vector<std::unique_ptr<SeqState>> retired_;
  bool in_flight_ = false;  // a step is launched and not finished
  // The last step of this stream that failed by itself (not because it was
  // built on a failed one); 0: none.
  uint64_t last_failed_step_id_ = 0;
};

}  // namespace tandem::worker
