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
// Not thread-safe: one thread runs the steps, in order. Because they run
// strictly in order, a block the scheduler freed after step N and reused in
// step N+1 is never written by both at once (DESIGN §5 "Ordering").
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
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
  // The steps so far on the device's own clock (model/device_time.h); a
  // backend that keeps none reports zeros.
  virtual model::DeviceTime device_time() const { return {}; }
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
  model::DeviceTime device_time() const override { return runner_->device_time(); }

 private:
  model::ModelRunner* const runner_;
};

// No math: deterministic fake logits (one token gets all the mass, chosen
// from the sequence's last token and length, never one of `eos_token_ids`
// unless every id is one) after step_us per step plus token_us per token;
// for scheduler scale tests.
class SimBackend final : public StepBackend {
 public:
  SimBackend(int32_t vocab_size, std::vector<int32_t> eos_token_ids, int32_t step_us,
             int32_t token_us)
      : vocab_size_(vocab_size),
        eos_token_ids_(std::move(eos_token_ids)),
        step_us_(step_us),
        token_us_(token_us) {}
  absl::Status ForwardSample(std::span<const model::SequenceInput> batch,
                             std::span<const model::SampleRequest> sample,
                             std::vector<int32_t>* tokens,
                             std::vector<model::SampleLogprobs>* logprobs) override;
  // The modelled device: busy for the step's delay and its fake logits and
  // sampling (what a GPU step would run), by the monotonic clock.
  model::DeviceTime device_time() const override { return clock_.time(); }

 private:
  [[nodiscard]] bool IsEos(int32_t token) const;
  // Writes the fake logits after `token` at position end - 1 to row.
  void FakeLogits(int32_t token, int64_t end, std::span<float> row) const;

  const int32_t vocab_size_;
  const std::vector<int32_t> eos_token_ids_;
  const int32_t step_us_, token_us_;
  model::DeviceClock clock_;
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

  // Runs one step: applies its batch diff, checks the placeholders, runs its
  // KV loads, the forward pass and sampling, and snapshots its KV stores.
  // Always returns the step's output: on failure `error` is set, nothing is
  // sampled and the loads done are still reported.
  sched::ModelRunnerOutput Execute(sched::SchedulerOutput step);
  // A step that could not even be read (the adapter's conversion failed):
  // answered as rejected (nothing of it applied), and every later step built
  // before the scheduler processed that answer fails too.
  sched::ModelRunnerOutput Reject(uint64_t step_id, const absl::Status& why);
  // The scheduler's stream ended: every request's batch state is dropped,
  // the loads in flight are forgotten and step ids start again.
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
  using SeqMap = std::unordered_map<std::string, SeqState>;

  // The step's requests, in the order of its num_scheduled_tokens.
  struct Batch {
    std::vector<SeqState*> seqs;
    std::vector<const std::string*> ids;
  };

  // On error the batch state of the step's requests may be partly updated;
  // the scheduler fails them. Run's phases follow.
  absl::Status Run(sched::SchedulerOutput& step, sched::ModelRunnerOutput* out);
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
  // The step's results into the batch state and the output.
  void RecordSamples(const sched::SchedulerOutput& step, const Batch& batch,
                     const std::vector<model::SampleRequest>& sample,
                     const std::vector<int32_t>& tokens,
                     std::vector<model::SampleLogprobs>& logprobs, sched::ModelRunnerOutput* out);
  sched::ModelRunnerOutput Failed(uint64_t step_id, uint64_t last_processed_step_id,
                                  const absl::Status& why, sched::KvConnectorReport report);
  // Drops a request's batch state with its log line.
  void DropSeq(SeqMap::iterator it, const char* why);

  StepBackend* const backend_;
  sched::KvConnectorWorker* const kv_connector_;
  const StepExecutorOptions options_;
  SeqMap seqs_;
  // The last step of this stream that failed by itself (not because it was
  // built on a failed one); 0: none.
  uint64_t last_failed_step_id_ = 0;
};

}  // namespace tandem::worker
