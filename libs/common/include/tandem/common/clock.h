// Time sources. Libraries that must stay deterministic (sched) take time as an
// argument; services read it from here.
#pragma once

#include <atomic>
#include <cstdint>

namespace tandem {

// Nanoseconds on a monotonic clock (CLOCK_MONOTONIC).
[[nodiscard]] int64_t MonotonicNanos();
// Microseconds/seconds variants for logs and metrics.
[[nodiscard]] inline double MonotonicSeconds() { return MonotonicNanos() * 1e-9; }

class Clock {
 public:
  virtual ~Clock() = default;
  [[nodiscard]] virtual int64_t NowNanos() const = 0;
};

class SystemClock final : public Clock {
 public:
  [[nodiscard]] int64_t NowNanos() const override { return MonotonicNanos(); }
  static SystemClock* Get();
};

// A clock tests advance by hand.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_nanos = 0) : now_(start_nanos) {}
  [[nodiscard]] int64_t NowNanos() const override { return now_.load(); }
  void AdvanceNanos(int64_t delta) { now_.fetch_add(delta); }
  void SetNanos(int64_t t) { now_.store(t); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace tandem
