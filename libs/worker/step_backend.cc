#include "tandem/worker/step_backend.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/clock.h"
#include "tandem/common/status.h"

namespace tandem::worker {

bool SimBackend::IsEos(int32_t token) const {
  return std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

void SimBackend::FakeLogits(int32_t last, int64_t end, std::span<float> row) const {
  int32_t token = static_cast<int32_t>(
      (static_cast<uint64_t>(last) * 2654435761ull + static_cast<uint64_t>(end) * 40503ull) %
      static_cast<uint64_t>(vocab_size_));
  for (int32_t tries = 1; IsEos(token) && tries < vocab_size_; ++tries) {
    token = (token + 1) % vocab_size_;
  }
  std::fill(row.begin(), row.end(), 0.0f);
  row[static_cast<size_t>(token)] = 10.0f;
}

absl::Status StepBackend::Launch(std::span<const model::SequenceInput> batch,
                                 std::span<const model::SampleRequest> sample, bool want_logprobs,
                                 std::function<void()> on_done) {
  return immediate_.Launch(
      want_logprobs,
      [&](std::vector<int32_t>* tokens, std::vector<model::SampleLogprobs>* logprobs) {
        return ForwardSample(batch, sample, tokens, logprobs);
      },
      on_done);
}

absl::Status StepBackend::Finish(std::vector<int32_t>* tokens,
                                 std::vector<model::SampleLogprobs>* logprobs) {
  return immediate_.Finish(tokens, logprobs);
}

SimBackend::SimBackend(int32_t vocab_size, std::vector<int32_t> eos_token_ids, int32_t step_us,
                       int32_t token_us)
    : vocab_size_(vocab_size),
      eos_token_ids_(std::move(eos_token_ids)),
      step_us_(step_us),
      token_us_(token_us),
      notifier_([this] { NotifyLoop(); }) {}

SimBackend::~SimBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  notifier_.join();
}

std::chrono::microseconds SimBackend::Delay(std::span<const model::SequenceInput> batch) const {
  int64_t total = 0;
  for (const model::SequenceInput& in : batch) total += std::ssize(in.token_ids);
  return std::chrono::microseconds(step_us_ + token_us_ * total);
}

absl::Status SimBackend::ForwardSample(std::span<const model::SequenceInput> batch,
                                       std::span<const model::SampleRequest> sample,
                                       std::vector<int32_t>* tokens,
                                       std::vector<model::SampleLogprobs>* logprobs) {
  // The modelled device, waited for at once.
  TANDEM_RETURN_IF_ERROR(Launch(batch, sample, logprobs != nullptr, [] {}));
  std::vector<model::SampleLogprobs> got;
  TANDEM_RETURN_IF_ERROR(Finish(tokens, &got));
  if (logprobs != nullptr) *logprobs = std::move(got);
  return absl::OkStatus();
}

absl::Status SimBackend::Launch(std::span<const model::SequenceInput> batch,
                                std::span<const model::SampleRequest> sample, bool want_logprobs,
                                std::function<void()> on_done) {
  // The device starts the step once it is launched and the one before is
  // done, and computes it (here, at once, on the host) within its delay.
  const double launch_s = MonotonicSeconds();
  std::vector<int32_t> tokens;
  std::vector<model::SampleLogprobs> logprobs;
  const absl::Status status = Compute(batch, sample, &tokens, want_logprobs ? &logprobs : nullptr);
  const double delay_s = std::chrono::duration<double>(Delay(batch)).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The clock gets the step at once (Finish waits for its end).
    const double start_s = std::max(launch_s, end_s_);
    end_s_ = std::max(start_s + delay_s, MonotonicSeconds());
    clock_.Step(start_s, end_s_);
    status_ = status;
    tokens_ = std::move(tokens);
    logprobs_ = std::move(logprobs);
    on_done_ = std::move(on_done);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status SimBackend::Finish(std::vector<int32_t>* tokens,
                                std::vector<model::SampleLogprobs>* logprobs) {
  std::unique_lock<std::mutex> lock(mu_);
  // A sleep up to shortly before the end, then a spin, as CUDA's event
  // synchronization spins: a timed wake-up alone comes 50-100 us late on a
  // loaded host, which the device clock would count as idle that a GPU's
  // host does not have.
  constexpr double kSpinS = 200e-6;
  for (double now = MonotonicSeconds(); now < end_s_ - kSpinS; now = MonotonicSeconds()) {
    cv_.wait_for(lock, std::chrono::duration<double>(end_s_ - kSpinS - now));
  }
  while (MonotonicSeconds() < end_s_) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  on_done_ = nullptr;  // the caller knows now
  *tokens = std::move(tokens_);
  *logprobs = std::move(logprobs_);
  return std::exchange(status_, absl::OkStatus());
}

void SimBackend::NotifyLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (on_done_ == nullptr) {
      cv_.wait(lock);
      continue;
    }
    const double now = MonotonicSeconds();
    if (now < end_s_) {
      cv_.wait_for(lock, std::chrono::duration<double>(end_s_ - now));
      continue;
    }
    const std::function<void()> done = std::exchange(on_done_, nullptr);
    lock.unlock();
    done();
    lock.lock();
  }
}

absl::Status SimBackend::Compute(std::span<const model::SequenceInput> batch,
                                 std::span<const model::SampleRequest> sample,
                                 std::vector<int32_t>* tokens,
                                 std::vector<model::SampleLogprobs>* logprobs) const {
  const size_t v = static_cast<size_t>(vocab_size_);
  std::vector<float> logits(batch.size() * v);
  for (size_t i = 0; i < batch.size(); ++i) {
    FakeLogits(batch[i].token_ids.back(), batch[i].start_pos + std::ssize(batch[i].token_ids),
               std::span<float>(logits).subspan(i * v, v));
  }
  model::SampleRows(logits, vocab_size_, sample, tokens);
  if (logprobs == nullptr) return absl::OkStatus();
  std::vector<float> row(v);
  return model::ComputeBatchLogprobs(
      batch, sample, *tokens, vocab_size_,
      [&](int32_t r) -> absl::StatusOr<std::span<const float>> {
        if (static_cast<size_t>(r) < batch.size()) {
          return std::span<const float>(logits).subspan(static_cast<size_t>(r) * v, v);
        }
        // An all_logits row: find its sequence and token.
        int32_t extra = static_cast<int32_t>(batch.size());
        for (const model::SequenceInput& in : batch) {
          const int32_t n = static_cast<int32_t>(in.token_ids.size());
          if (!in.all_logits) continue;
          if (r < extra + n - 1) {
            const int32_t j = r - extra;
            FakeLogits(in.token_ids[static_cast<size_t>(j)], in.start_pos + j + 1, row);
            return std::span<const float>(row);
          }
          extra += n - 1;
        }
        return absl::InternalError(absl::StrCat("no logits row ", r));
      },
      logprobs);
}

}  // namespace tandem::worker
