// The output side of Scheduler::Schedule(): the SchedulerOutput the worker
// gets (new requests in full, the others as diffs, the connector's loads and
// stores) and the record the scheduler keeps of the step until its output
// arrives. The scheduling decisions are in scheduler.cc.
#include "tandem/sched/scheduler.h"

namespace tandem::sched {

// The output: new requests in full, then diffs, and the record of the step
// kept until its output arrives.
Scheduler::StepRecord Scheduler::BuildStepOutput(SchedulerOutput* out) {
  out->step_id = next_step_id_++;
  StepRecord record;
  if (!spare_records_.empty()) {
    record = std::move(spare_records_.back());
    spare_records_.pop_back();
  }
  out->last_processed_step_id = last_processed_step_id_;
  record.step_id = out->step_id;
  record.entries.clear();
  record.published.swap(published_);
  record.failed = false;
  size_t num_new = 0;
  for (const StepEntry& e : scheduled_) num_new += e.request->known_to_worker ? 0 : 1;
  out->scheduled_new_reqs.resize(num_new);
  out->scheduled_cached_reqs.resize(scheduled_.size() - num_new);
  out->num_scheduled_tokens.resize(scheduled_.size());
  record.entries.resize(scheduled_.size());
  int32_t total = 0;
  size_t next_new = 0;
  size_t next_cached = 0;
  for (const StepEntry& e : scheduled_) {
    Request* r = e.request;
    size_t slot;
    if (!r->known_to_worker) {
      slot = next_new;
      NewRequestData& d = out->scheduled_new_reqs[next_new++];
      d.request_id = r->request_id;
      d.prompt_token_ids.assign(r->all_token_ids.begin(),
                                r->all_token_ids.begin() + r->num_prompt_tokens);
      d.output_token_ids.assign(r->all_token_ids.begin() + r->num_prompt_tokens,
                                r->all_token_ids.end());
      d.sampling = r->sampling;
      d.block_ids = r->block_ids;
      d.num_computed_tokens = r->num_computed_tokens;
      r->known_to_worker = true;
      r->new_in_step = out->step_id;
    } else {
      slot = num_new + next_cached;
      CachedRequestData& d = out->scheduled_cached_reqs[next_cached++];
      d.request_id = r->request_id;
      d.resumed_from_preemption = r->resumed_pending;
      const int32_t from = r->resumed_pending ? 0 : r->num_blocks_sent;
      d.new_block_ids.assign(r->block_ids.begin() + from, r->block_ids.end());
      if (r->resumed_pending) {
        d.all_token_ids = r->all_token_ids;
      } else {
        d.all_token_ids.clear();
      }
      d.num_computed_tokens = r->num_computed_tokens;
      d.num_output_placeholders = r->num_output_placeholders;
    }
    r->resumed_pending = false;
    r->num_blocks_sent = static_cast<int32_t>(r->block_ids.size());
    record.entries[slot] = e;
    out->num_scheduled_tokens[slot] = e.num_scheduled_tokens;
    total += e.num_scheduled_tokens;
  }
  out->total_num_scheduled_tokens = total;
  out->finished_req_ids.swap(pending_finished_ids_);
  pending_finished_ids_.clear();
  record.finished_ids.assign(out->finished_req_ids.begin(), out->finished_req_ids.end());
  // Preempted since the last step (here or by a failed step's output).
  out->preempted_req_ids.resize(preempted_.size());
  for (size_t i = 0; i < preempted_.size(); ++i) {
    out->preempted_req_ids[i] = preempted_[i]->request_id;
  }
  preempted_.clear();

  if (connector_ != nullptr) {
    views_.clear();
    for (const StepEntry& e : record.entries) {
      views_.push_back(ScheduledRequestView{e.request, e.num_scheduled_tokens, e.will_sample,
                                            config_.async_scheduling && e.will_sample});
    }
    out->kv_connector_metadata = connector_->BuildConnectorMeta(*out, views_);
    record.load_ids.clear();
    record.load_block_ids.clear();
    record.store_ids.clear();
    for (const KvLoad& load : out->kv_connector_metadata.loads) {
      record.load_ids.push_back(load.request_id);
      record.load_block_ids.insert(record.load_block_ids.end(), load.block_ids.begin(),
                                   load.block_ids.end());
    }
    for (const KvStoreOp& store : out->kv_connector_metadata.stores) {
      record.store_ids.push_back(store.request_id);
    }
  } else {
    out->kv_connector_metadata.loads.clear();
    out->kv_connector_metadata.stores.clear();
  }
  return record;
}

}  // namespace tandem::sched
