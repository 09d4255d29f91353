// WaitFor, for tests across the tree: state that another thread or process
// settles (a lease released, a connection closed, a counter reached).
#pragma once

#include <chrono>
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

}  // namespace tandem::testing
