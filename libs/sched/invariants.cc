// Scheduler::CheckInvariants(): the consistency of the block tables, the
// queues and the counters that the randomized tests check after every call.
#include "tandem/sched/scheduler.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "tandem/common/status.h"

namespace tandem::sched {

absl::Status Scheduler::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  const int32_t bs = config_.block_size;
  if (num_running() > config_.max_num_seqs) {
    return fail("running ", num_running(), " > max_num_seqs ", config_.max_num_seqs);
  }
  int32_t loading = 0;
  int32_t loaded = 0;
  for (const Request* r : waiting_) {
    loading += r->state == RequestState::kWaitingForRemoteKv;
    loaded += HoldsLoadedKv(*r);
  }
  if (loading != num_loading_) return fail("num_loading_ ", num_loading_, " != ", loading);
  if (loaded != num_loaded_) return fail("num_loaded_ ", num_loaded_, " != ", loaded);
  if (config_.limit_async_load_admission && num_running() + loading > config_.max_num_seqs) {
    return fail("running ", num_running(), " + loading ", loading, " > max_num_seqs");
  }
  if (!in_flight_.empty()) {
    int32_t total = 0;
    for (const StepEntry& e : in_flight_.back().entries) total += e.num_scheduled_tokens;
    if (total > config_.max_num_batched_tokens) {
      return fail("step scheduled ", total, " tokens > budget ", config_.max_num_batched_tokens);
    }
  }
  std::vector<int32_t> refs(static_cast<size_t>(kv_.pool().num_blocks()), 0);
  refs[BlockPool::kNullBlock] = 1;
  auto check_request = [&](const Request* r, bool live) -> absl::Status {
    const std::string& id = r->request_id;
    if (r->num_output_placeholders < 0 || r->num_in_flight_tokens < 0 ||
        r->num_pending_external_tokens < 0 || r->num_computed_tokens < 0) {
      return fail(id, ": negative counter C=", r->num_computed_tokens,
                  " P=", r->num_output_placeholders, " F=", r->num_in_flight_tokens,
                  " E=", r->num_pending_external_tokens);
    }
    if (r->num_output_placeholders > (config_.async_scheduling ? 2 : 0)) {
      return fail(id, ": ", r->num_output_placeholders, " placeholders");
    }
    if (live) {
      if (r->num_computed_tokens > r->num_tokens() + r->num_output_placeholders) {
        return fail(id, ": computed ", r->num_computed_tokens, " > tokens ", r->num_tokens(),
                    " + placeholders ", r->num_output_placeholders);
      }
      if (r->num_in_flight_tokens > r->num_computed_tokens) {
        return fail(id, ": in flight ", r->num_in_flight_tokens, " > computed");
      }
      const int32_t covered = r->num_computed_tokens + r->num_pending_external_tokens;
      if (static_cast<int32_t>(r->block_ids.size()) < CeilDiv(covered, bs)) {
        return fail(id, ": ", r->block_ids.size(), " blocks do not cover ", covered, " tokens");
      }
      // A full-prompt load keeps its last block cached while recomputing its
      // last token.
      const bool full_prompt_load = r->num_computed_tokens == r->num_tokens() - 1 &&
                                    r->num_cached_blocks * bs == r->num_tokens();
      if (r->num_cached_blocks * bs > std::min(r->num_computed_tokens, r->num_tokens()) &&
          !full_prompt_load) {
        return fail(id, ": ", r->num_cached_blocks, " cached blocks beyond known computed tokens");
      }
    }
    for (int32_t b : r->block_ids) {
      if (b <= 0 || b >= kv_.pool().num_blocks()) return fail(id, ": bad block id ", b);
      ++refs[static_cast<size_t>(b)];
    }
    return absl::OkStatus();
  };
  for (const Request* r : running_) {
    if (r->state != RequestState::kRunning)
      return fail(r->request_id, " in running_ but ", RequestStateName(r->state));
    TANDEM_RETURN_IF_ERROR(check_request(r, true));
  }
  for (const Request* r : waiting_) {
    if (r->state != RequestState::kWaiting && r->state != RequestState::kPreempted &&
        r->state != RequestState::kWaitingForRemoteKv) {
      return fail(r->request_id, " in waiting_ but ", RequestStateName(r->state));
    }
    if (r->state != RequestState::kWaitingForRemoteKv && r->num_in_flight_tokens != 0) {
      return fail(r->request_id, ": waiting with tokens in flight");
    }
    TANDEM_RETURN_IF_ERROR(check_request(r, true));
  }
  for (const auto& [id, r] : held_) {
    if (id != r->request_id || !(r->awaiting_recv || r->awaiting_send) || !r->is_finished()) {
      return fail(id, ": held but not a finished request awaiting a KV transfer");
    }
    if (live_.contains(id)) return fail(id, ": both live and held");
    TANDEM_RETURN_IF_ERROR(check_request(r, false));
  }
  if (live_.size() != running_.size() + waiting_.size()) {
    return fail("live ", live_.size(), " != running ", running_.size(), " + waiting ",
                waiting_.size());
  }
  int32_t num_free = 0;
  for (int32_t b = 0; b < kv_.pool().num_blocks(); ++b) {
    if (refs[static_cast<size_t>(b)] != kv_.pool().ref_count(b)) {
      return fail("block ", b, ": ref count ", kv_.pool().ref_count(b), " but held by ",
                  refs[static_cast<size_t>(b)]);
    }
    num_free += refs[static_cast<size_t>(b)] == 0;
  }
  if (num_free != kv_.pool().num_free_blocks() ||
      static_cast<int32_t>(kv_.pool().FreeQueueForTest().size()) != num_free) {
    return fail("free blocks ", kv_.pool().num_free_blocks(), " but ", num_free, " unreferenced");
  }
  TANDEM_RETURN_IF_ERROR(kv_.pool().CheckCacheConsistency());
  if (live_.empty() && held_.empty() && num_free != num_total_blocks()) {
    return fail("no requests but only ", num_free, " of ", num_total_blocks(), " blocks free");
  }
  return absl::OkStatus();
}

}  // namespace tandem::sched
