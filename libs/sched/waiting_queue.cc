#include "tandem/sched/waiting_queue.h"

#include <algorithm>
#include <tuple>

#include "tandem/common/logging.h"

namespace tandem::sched {
namespace {
auto Key(const Request* r) { return std::tuple(r->priority, r->arrival_time_ns, r->arrival_seq); }
}  // namespace

void WaitingQueue::InsertByPriority(Request* request) {
  auto it = std::upper_bound(queue_.begin(), queue_.end(), request,
                             [](const Request* a, const Request* b) { return Key(a) < Key(b); });
  queue_.insert(it, request);
}

void WaitingQueue::Add(Request* request) {
  switch (policy_) {
    case SchedulingPolicy::kFcfs:
      queue_.push_back(request);
      return;
    case SchedulingPolicy::kPriority:
      InsertByPriority(request);
      return;
  }
}

void WaitingQueue::AddPreempted(Request* request) {
  switch (policy_) {
    case SchedulingPolicy::kFcfs:
      queue_.insert(queue_.begin(), request);
      return;
    case SchedulingPolicy::kPriority:
      InsertByPriority(request);
      return;
  }
}

void WaitingQueue::Remove(const Request* request) {
  auto it = std::find(queue_.begin(), queue_.end(), request);
  TANDEM_CHECK(it != queue_.end()) << "request not in the waiting queue";
  queue_.erase(it);
}

void WaitingQueue::RemoveMarked(const std::vector<bool>& marked) {
  size_t out = 0;
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (i < marked.size() && marked[i]) continue;
    queue_[out++] = queue_[i];
  }
  queue_.resize(out);
}

}  // namespace tandem::sched
