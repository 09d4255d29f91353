// The forward pass and sampling behind StepExecutor (step_executor.h): the
// model runner's (cpu, cuda) or the sim backend's, behind one interface,
// each a step at a time, in one call (ForwardSample) or in two (Launch,
// Finish) so that the host can prepare the next step while the device
// runs this one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tandem/model/device_time.h"
#include "tandem/model/model_runner.h"
#include "tandem/model/sampler.h"

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
  // Whether Launch returns before a step (that asks for logprobs or not)
  // is done; this implementation runs the step.
  virtual bool launches_async(bool /*want_logprobs*/) const { return false; }
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
  bool launches_async(bool want_logprobs) const override {
    return runner_->launches_async(want_logprobs);
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
  bool launches_async(bool) const override { return true; }
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

}  // namespace tandem::worker
