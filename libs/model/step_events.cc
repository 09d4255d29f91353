#include "step_events.h"

#include "tandem/common/logging.h"
#include "tandem/kernels/cuda_ops.h"

namespace tandem::model::internal {

namespace kd = ::tandem::kernels::cuda;

StepEvents::~StepEvents() {
  for (void* e : {start_[0], start_[1], end_[0], end_[1]}) kd::EventDestroy(e);
}

void StepEvents::Fail(const char* what, int err) {
  off_ = true;
  TANDEM_LOG(WARNING) << "CUDA runner: device step timing off (" << what << ": CUDA error " << err
                      << "); steps are unaffected";
}

void StepEvents::Begin(void* stream) {
  if (off_) return;
  if (start_[0] == nullptr) {
    for (void** e : {&start_[0], &start_[1], &end_[0], &end_[1]}) {
      if (const int err = kd::TimedEventCreate(e); err != 0) return Fail("event", err);
    }
  }
  if (open_) have_prev_ = false;  // the step before ended in an error
  if (const int err = kd::EventRecord(start_[cur_], stream); err != 0) return Fail("record", err);
  open_ = true;
}

void StepEvents::MarkEnd(void* stream) {
  if (off_ || !open_) return;
  if (const int err = kd::EventRecord(end_[cur_], stream); err != 0) Fail("record", err);
}

void StepEvents::Finish(DeviceClock* clock) {
  if (off_ || !open_) return;
  open_ = false;
  double busy = 0, idle = 0;
  if (const int err = kd::EventSynchronize(end_[cur_]); err != 0) return Fail("synchronize", err);
  if (const int err = kd::EventElapsedSeconds(start_[cur_], end_[cur_], &busy); err != 0) {
    return Fail("elapsed", err);
  }
  if (have_prev_) {
    if (const int err = kd::EventElapsedSeconds(end_[cur_ ^ 1], start_[cur_], &idle); err != 0) {
      return Fail("elapsed", err);
    }
  }
  clock->Step(have_prev_ ? std::optional<double>(idle) : std::nullopt, busy);
  have_prev_ = true;
  cur_ ^= 1;
}

}  // namespace tandem::model::internal
