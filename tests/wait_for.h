// WaitFor and Gate, for tests across the tree: state that another thread or
// process settles (a lease released, a connection closed, a counter
// reached), and threads held at a point until the test lets them go.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace tandem::testing {

// Polls `pred` every 5 ms until it holds or `timeout` passes; returns its
// last value.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// A gate threads stop at (Pass) until the test opens it.
class Gate {
 public:
  ~Gate() { Open(); }
  // Waits until the gate is open.
  void Pass() {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // True once `n` threads have reached the gate (counting those that have
  // passed it since), within `within`.
  bool Reached(int n = 1, std::chrono::milliseconds within = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, within, [&] { return waiting_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int waiting_ = 0;
};

}  // namespace tandem::testing
