// The CUDA runner's device clock (device_time.h): a timed CUDA event on the
// step stream before each ForwardSample's first device work and after its
// last, so a step's busy time and the idle since the step before are read
// on the GPU's own clock. Timing never fails a step: an event that cannot
// be made, recorded or read turns it off, with one warning.
#pragma once

#include "tandem/model/device_time.h"

namespace tandem::model::internal {

class StepEvents {
 public:
  StepEvents() = default;
  ~StepEvents();
  StepEvents(const StepEvents&) = delete;
  StepEvents& operator=(const StepEvents&) = delete;

  // Before the step's first device work on `stream`.
  void Begin(void* stream);
  // After device work that may be the step's last (the latest call counts).
  void MarkEnd(void* stream);
  // Once the step's work is done: adds it to `clock`. A step begun and never
  // finished (an error) leaves no previous end to measure the next idle from.
  void Finish(DeviceClock* clock);

 private:
  void Fail(const char* what, int err);

  void* start_[2] = {nullptr, nullptr};
  void* end_[2] = {nullptr, nullptr};
  int cur_ = 0;             // the pair of the step being run
  bool open_ = false;       // Begin called, Finish not yet
  bool have_prev_ = false;  // end_[cur_ ^ 1] holds the last finished step's end
  bool off_ = false;
};

}  // namespace tandem::model::internal
