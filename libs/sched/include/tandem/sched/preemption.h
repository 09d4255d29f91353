// Who keeps its KV blocks when the pool runs short, as small const functors:
// `Order{}(a, b)` is true when `a` goes before `b`, i.e. `b` is preempted
// first. The candidates are the running requests and the waiting requests
// that hold KV of a finished load (Scheduler, "Preemption and progress").
// Preemption is by recompute: the victim's blocks are freed (hashed blocks
// stay cached) and it returns to (or stays in) the waiting queue.
#pragma once

#include "tandem/sched/request.h"

namespace tandem::sched {

// FCFS: admission order, the most recently admitted preempted first. A
// request holding a load counts as admitted after every running one (it
// runs later); among themselves, by arrival.
struct FcfsPreemptionOrder {
  bool operator()(const Request& a, const Request& b) const {
    const bool a_running = a.state == RequestState::kRunning;
    const bool b_running = b.state == RequestState::kRunning;
    if (a_running != b_running) return a_running;
    return a_running ? a.admit_seq < b.admit_seq : a.arrival_seq < b.arrival_seq;
  }
};

// Priority: smaller priority value first, then earlier arrival; the least
// important request, latest arrival among equals, is preempted first.
struct PriorityPreemptionOrder {
  bool operator()(const Request& a, const Request& b) const {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.arrival_time_ns != b.arrival_time_ns) return a.arrival_time_ns < b.arrival_time_ns;
    return a.arrival_seq < b.arrival_seq;
  }
};

}  // namespace tandem::sched
