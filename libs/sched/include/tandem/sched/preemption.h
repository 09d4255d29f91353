// Preemption victims as small const functors over the running list (in
// admission order). Preemption is by recompute: the victim's blocks are freed
// (hashed blocks stay cached) and it returns to the waiting queue.
#pragma once

#include <cstddef>
#include <span>

#include "tandem/sched/request.h"

namespace tandem::sched {

// FCFS: the most recently admitted request (the tail of the running list).
struct FcfsPreemption {
  size_t operator()(std::span<Request* const> running) const { return running.size() - 1; }
};

// Priority: the least important request (largest priority value), latest
// arrival among equals.
struct PriorityPreemption {
  size_t operator()(std::span<Request* const> running) const {
    size_t victim = 0;
    for (size_t i = 1; i < running.size(); ++i) {
      const Request& a = *running[i];
      const Request& v = *running[victim];
      if (a.priority > v.priority ||
          (a.priority == v.priority &&
           (a.arrival_time_ns > v.arrival_time_ns ||
            (a.arrival_time_ns == v.arrival_time_ns && a.arrival_seq > v.arrival_seq)))) {
        victim = i;
      }
    }
    return victim;
  }
};

}  // namespace tandem::sched
