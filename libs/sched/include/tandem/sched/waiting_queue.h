// The waiting queue. Iteration does not pop: a request that cannot be decided
// this step (deferred lookup, load in progress) keeps its place, and admitted
// requests are removed in one pass at the end of the step.
#pragma once

#include <cstddef>
#include <vector>

#include "tandem/sched/config.h"
#include "tandem/sched/request.h"

namespace tandem::sched {

class WaitingQueue {
 public:
  explicit WaitingQueue(SchedulingPolicy policy) : policy_(policy) {}

  // FCFS: at the tail. Priority: after every request with a smaller
  // (priority, arrival_time_ns, arrival_seq).
  void Add(Request* request);
  // A preempted request: FCFS at the head; priority by its key as in Add.
  void AddPreempted(Request* request);
  // Removes the given request (abort); O(n).
  void Remove(const Request* request);
  // Removes every entry with `marked` set in the given mask (parallel to the
  // queue order).
  void RemoveMarked(const std::vector<bool>& marked);

  [[nodiscard]] size_t size() const { return queue_.size(); }
  [[nodiscard]] bool empty() const { return queue_.empty(); }
  [[nodiscard]] Request* operator[](size_t i) const { return queue_[i]; }
  [[nodiscard]] auto begin() const { return queue_.begin(); }
  [[nodiscard]] auto end() const { return queue_.end(); }

 private:
  void InsertByPriority(Request* request);
  SchedulingPolicy policy_;
  std::vector<Request*> queue_;
};

}  // namespace tandem::sched
