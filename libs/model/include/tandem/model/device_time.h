// What the device itself saw of the steps run on it (DESIGN §8's "GPU idle
// between steps"; issue 31 asks for it on the GPU's clock, not the worker's
// wall clock): busy from the start of a step's first device work to the
// end of its last, idle from one step's end to the next one's start. The
// CUDA runner times its steps with CUDA events, the CPU runner (whose
// device is the CPU) and the worker's sim backend with a monotonic clock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "tandem/common/clock.h"

namespace tandem::model {

struct DeviceTime {
  double busy_s = 0;
  // Between consecutive steps, whatever kept the device waiting: the host's
  // work between them, or no work at all.
  double idle_between_s = 0;
  int64_t steps = 0;
};

// Sums the steps of one device.
class DeviceClock {
 public:
  // A step from start_s to end_s on one monotonic clock (seconds).
  void Step(double start_s, double end_s) {
    Step(time_.steps > 0 ? std::optional<double>(start_s - last_end_s_) : std::nullopt,
         end_s - start_s);
    last_end_s_ = end_s;
  }
  // A step measured as intervals (device events): its busy time, and the
  // idle since the previous step's end (nullopt: no previous step to measure
  // from, e.g. the first).
  void Step(std::optional<double> idle_s, double busy_s) {
    if (idle_s.has_value()) time_.idle_between_s += std::max(0.0, *idle_s);
    time_.busy_s += std::max(0.0, busy_s);
    ++time_.steps;
  }
  const DeviceTime& time() const { return time_; }

  // Adds the scope it lives in as one step, by MonotonicSeconds (a device
  // that is the host's own thread, or a model of one).
  class Scope {
   public:
    explicit Scope(DeviceClock* clock) : clock_(clock), start_s_(MonotonicSeconds()) {}
    ~Scope() { clock_->Step(start_s_, MonotonicSeconds()); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    DeviceClock* const clock_;
    const double start_s_;
  };

 private:
  DeviceTime time_;
  double last_end_s_ = 0;
};

}  // namespace tandem::model
