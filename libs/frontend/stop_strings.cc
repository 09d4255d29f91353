#include "tandem/frontend/stop_strings.h"

#include <algorithm>

namespace tandem::frontend {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) max_len_ = std::max(max_len_, s.size());
}

StopStringMatcher::Step StopStringMatcher::Push(std::string_view delta, bool may_stop) {
  Step step;
  if (stopped_) return step;
  pending_.append(delta);
  if (!may_stop) no_stop_end_ = pending_.size();
  // The match that completes first wins (the earliest end): it is the one a
  // reader of the text one character at a time meets first, whatever the
  // deltas were. At the same end, the longest (earliest start).
  size_t best_end = std::string::npos;
  size_t best = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& s : stops_) {
    // The first occurrence that ends past no_stop_end_.
    const size_t from = no_stop_end_ + 1 > s.size() ? no_stop_end_ + 1 - s.size() : 0;
    const size_t pos = s.empty() ? std::string::npos : pending_.find(s, from);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < best)) {
      best_end = end;
      best = pos;
      matched = &s;
    }
  }
  if (matched != nullptr) {
    step.text = pending_.substr(0, best);
    step.stopped = true;
    step.matched = *matched;
    stopped_ = true;
    pending_.clear();
    return step;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  for (size_t k = std::min(pending_.size(), max_len_ == 0 ? 0 : max_len_ - 1); k > 0; --k) {
    const std::string_view tail = std::string_view(pending_).substr(pending_.size() - k);
    const bool prefix = std::any_of(stops_.begin(), stops_.end(), [&](const std::string& s) {
      return s.size() > k && std::string_view(s).substr(0, k) == tail;
    });
    if (prefix) {
      hold = k;
      break;
    }
  }
  step.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  no_stop_end_ -= std::min(no_stop_end_, step.text.size());
  return step;
}

std::string StopStringMatcher::Finish() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace tandem::frontend
