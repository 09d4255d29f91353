// Scheduler's handling of a worker step that failed or was rejected unread
// (DESIGN §9, DESIGN-NOTES "Steps the worker cannot read"): split from
// scheduler.cc along that seam. UpdateOldestStepInto calls these.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched {

void Scheduler::FailSteps(const std::string& error, std::vector<RequestOutput>* outputs,
                          size_t* num_outputs) {
  // The oldest step in flight failed; the later ones were built before that
  // was known and build on it: they fail with it, now (their outputs are
  // only read for their connector reports). The blocks whose KV these steps
  // were to write are not in the cache.
  absl::flat_hash_set<int32_t> unwritten;
  std::vector<Request*> affected;
  absl::flat_hash_set<const Request*> seen;
  absl::flat_hash_set<const Request*> in_failed_step;  // of the step that failed itself
  for (StepRecord& rec : in_flight_) {
    if (rec.failed) continue;  // failed with an earlier step: handled then
    rec.failed = true;
    for (int32_t b : rec.published) {
      kv_.pool().Uncache(b);
      unwritten.insert(b);
    }
    for (const StepEntry& e : rec.entries) {
      if (e.request->epoch != e.epoch) continue;  // aborted, finished or preempted since
      if (&rec == &in_flight_.front()) in_failed_step.insert(e.request);
      if (seen.insert(e.request).second) affected.push_back(e.request);
    }
  }
  auto holds_unwritten = [&](const Request* r) {
    if (unwritten.empty()) return false;
    return std::any_of(r->block_ids.begin(), r->block_ids.end(),
                       [&](int32_t b) { return unwritten.contains(b); });
  };
  // A running request can hold such a block only through a step in flight:
  // it got it as a hit when it was admitted, in one of them.
  for (const Request* r : running_) {
    TANDEM_DCHECK(seen.contains(r) || !holds_unwritten(r)) << r->request_id;
  }
  for (Request* r : waiting_) {
    if (!holds_unwritten(r)) continue;
    if (r->state == RequestState::kWaitingForRemoteKv) {
      r->preempt_when_loaded = true;  // its load writes the blocks now
    } else {
      affected.push_back(r);  // holds KV of a finished load
    }
  }
  // Preempted requests go to the front of the queue one by one: the latest
  // arrival first, so that they line up in arrival order (FCFS).
  std::sort(affected.begin(), affected.end(),
            [](const Request* a, const Request* b) { return a->arrival_seq > b->arrival_seq; });
  for (Request* r : affected) {
    if (r->state == RequestState::kRunning) {
      running_.erase(std::find(running_.begin(), running_.end(), r));
    }
    // Only the step that failed counts against a request, not the later
    // ones that fail with it.
    if (in_failed_step.contains(r) && ++r->num_step_failures >= config_.max_step_failures) {
      if (*num_outputs == outputs->size()) outputs->emplace_back();
      RequestOutput& o = (*outputs)[(*num_outputs)++];
      ClearTokens(&o);
      Finish(r, RequestState::kFinishedError);
      FillOutput(r, &o);
      o.error = absl::StrCat("the worker failed ", r->num_step_failures,
                             " steps that ran this request; the last: ", error);
      continue;
    }
    Preempt(r, nullptr, PreemptionReason::kStepFailed);
  }
}

void Scheduler::UndoRejectedStep(const StepRecord& rec, KvConnectorReport* report) {
  for (const StepEntry& e : rec.entries) {
    // Whatever happened to it since (slots are reused, but a reused one was
    // sent as new in a later step, if at all).
    if (e.request->new_in_step == rec.step_id) e.request->known_to_worker = false;
  }
  // The worker never dropped them. An id live again that the worker knows
  // names a new request a later step sent, whose state replaced the old.
  for (const std::string& id : rec.finished_ids) {
    auto it = live_.find(id);
    if (it == live_.end() || !it->second->known_to_worker) pending_finished_ids_.push_back(id);
  }
  if (!rec.load_ids.empty() || !rec.store_ids.empty()) {
    TANDEM_LOG(WARNING) << "step " << rec.step_id << " was rejected by the worker: its "
                        << rec.load_ids.size() << " KV-store loads are recomputed and its "
                        << rec.store_ids.size() << " stores dropped";
  }
  // Every block of its loads is invalid: the requests recompute them.
  report->finished_recving.insert(report->finished_recving.end(), rec.load_ids.begin(),
                                  rec.load_ids.end());
  report->invalid_block_ids.insert(report->invalid_block_ids.end(), rec.load_block_ids.begin(),
                                   rec.load_block_ids.end());
  report->finished_sending.insert(report->finished_sending.end(), rec.store_ids.begin(),
                                  rec.store_ids.end());
  report->failed_sending.insert(report->failed_sending.end(), rec.store_ids.begin(),
                                rec.store_ids.end());
}

}  // namespace tandem::sched
