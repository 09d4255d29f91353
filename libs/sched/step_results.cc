// The input side of a step: its ModelRunnerOutput applied to the requests
// it scheduled (sampled tokens, prompt logprobs, stops and finishes, the
// cached-token counts) and the KV connector's reports (loads and stores that
// ended). Scheduling is in scheduler.cc, the step's output in
// step_output.cc, failed steps in step_failures.cc.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched {

std::vector<RequestOutput> Scheduler::UpdateFromOutput(const SchedulerOutput& scheduled,
                                                       const ModelRunnerOutput& output) {
  std::vector<RequestOutput> outputs;
  UpdateFromOutputInto(scheduled, output, &outputs);
  return outputs;
}

void Scheduler::FillOutput(Request* r, RequestOutput* o) const {
  o->request_id = r->request_id;
  o->error.clear();
  o->finished = r->is_finished() ? std::optional<RequestState>(r->state) : std::nullopt;
  o->num_prompt_tokens = r->num_prompt_tokens;
  o->num_output_tokens = r->num_output_tokens();
  o->num_cached_tokens_local = r->num_cached_tokens_local;
  o->num_cached_tokens_external = r->num_cached_tokens_external;
  o->prompt_logprobs.clear();
  if (r->sampling.prompt_logprobs >= 0 && !r->prompt_logprobs_sent &&
      (!o->new_token_ids.empty() || o->finished)) {
    o->prompt_logprobs = std::move(r->prompt_logprobs);
    r->prompt_logprobs_sent = true;
  }
}

void Scheduler::ClearTokens(RequestOutput* o) {
  o->stopped_on_token = false;  // outputs are reused from step to step
  o->new_token_ids.clear();
  o->new_logprobs.clear();
  o->prompt_logprobs.clear();
}

void Scheduler::AppendPromptLogprobs(Request* r, const SampledTokens& st) {
  for (size_t j = 0; j < st.prompt_logprobs.size(); ++j) {
    // Positions from 1; a recomputation (after a preemption) repeats some.
    const int32_t pos = st.prompt_logprobs_start + static_cast<int32_t>(j);
    if (pos == static_cast<int32_t>(r->prompt_logprobs.size()) + 1 && pos < r->num_prompt_tokens) {
      r->prompt_logprobs.push_back(st.prompt_logprobs[j]);
    }
  }
}

bool Scheduler::IsEos(int32_t token) const {
  return (config_.eos_token_id >= 0 && token == config_.eos_token_id) ||
         std::find(config_.extra_eos_token_ids.begin(), config_.extra_eos_token_ids.end(), token) !=
             config_.extra_eos_token_ids.end();
}

void Scheduler::AppendTokens(Request* r, std::span<const int32_t> tokens,
                             std::span<const TokenLogprobs> logprobs, RequestOutput* o) {
  const SamplingParams& sp = r->sampling;
  // What a sync run has computed when this output ends the request: the
  // tokens known before it (see KvConnectorScheduler::RequestFinished).
  const int32_t num_storable = r->num_known_computed_tokens();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    // A token at output index j may stop the request only when j >= min_tokens
    // (the worker does not sample stop tokens before that: see the header).
    const bool may_stop = r->num_output_tokens() >= sp.min_tokens;
    // Appended before the checks, as vLLM does: EOS and a stop token are
    // output tokens (counted, with their logprobs); the frontend leaves
    // their text out.
    r->all_token_ids.push_back(t);
    o->new_token_ids.push_back(t);
    if (i < logprobs.size()) o->new_logprobs.push_back(logprobs[i]);
    if (may_stop && ((!sp.ignore_eos && IsEos(t)) ||
                     std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), t) !=
                         sp.stop_token_ids.end())) {
      o->stopped_on_token = true;
      Finish(r, RequestState::kFinishedStopped, num_storable);
      return;
    }
    if (r->num_output_tokens() >= sp.max_tokens || r->num_tokens() >= config_.max_model_len) {
      Finish(r, RequestState::kFinishedLength, num_storable);
      return;
    }
  }
  if (static_cast<int32_t>(r->block_hashes.size()) < r->num_tokens() / config_.block_size &&
      (config_.enable_prefix_caching || connector_ != nullptr)) {
    ExtendBlockHashes(r->root_hash, r->all_token_ids, config_.block_size, &r->block_hashes);
  }
}

void Scheduler::Finish(Request* r, RequestState state, int32_t num_storable_tokens) {
  const RequestState prior = r->state;
  if (HoldsLoadedKv(*r)) --num_loaded_;
  r->state = state;
  ++r->epoch;  // drop its output still in flight
  if (prior == RequestState::kWaitingForRemoteKv) {
    --num_loading_;
    r->awaiting_recv = true;  // the worker may still write the blocks
  }
  if (r->known_to_worker || r->awaiting_recv) pending_finished_ids_.push_back(r->request_id);
  if (connector_ != nullptr) {
    r->awaiting_send =
        connector_->RequestFinished(*r, r->block_ids, num_storable_tokens) && !r->block_ids.empty();
  }
  live_.erase(r->request_id);
  ++stats_.num_requests_finished;
  MaybeRelease(r);
}

void Scheduler::MaybeRelease(Request* r) {
  if (r->awaiting_recv || r->awaiting_send) {
    held_.try_emplace(r->request_id, r);
    return;
  }
  if (!held_.empty()) held_.erase(r->request_id);
  kv_.FreeBlocks(r);
  ReleaseRequest(r);
}

void Scheduler::UpdateFromOutputInto(const SchedulerOutput& scheduled,
                                     const ModelRunnerOutput& output,
                                     std::vector<RequestOutput>* outputs) {
  TANDEM_CHECK(!in_flight_.empty()) << "UpdateFromOutput without a step in flight";
  TANDEM_CHECK_EQ(in_flight_.front().step_id, scheduled.step_id)
      << "outputs must be processed in step order; oldest in flight is "
      << in_flight_.front().step_id;
  UpdateOldestStepInto(output, outputs);
}

void Scheduler::UpdateOldestStepInto(const ModelRunnerOutput& output,
                                     std::vector<RequestOutput>* outputs) {
  TANDEM_CHECK(!in_flight_.empty()) << "UpdateFromOutput without a step in flight";
  StepRecord& rec = in_flight_.front();
  preemption_events_.clear();
  last_processed_step_id_ = rec.step_id;
  if (rec.failed || !output.error.empty()) {
    size_t num_outputs = 0;
    if (output.rejected) {
      // Even when it had failed with an earlier step: the worker fails every
      // later step built before this output, which it could not when it
      // skipped this one's new requests.
      KvConnectorReport report = output.kv_connector_report;
      UndoRejectedStep(rec, &report);
      FailSteps(output.error, outputs, &num_outputs);
      outputs->resize(num_outputs);
      HandleConnectorReport(report);
    } else {
      // A step that failed with an earlier one was handled with it.
      if (!rec.failed) FailSteps(output.error, outputs, &num_outputs);
      outputs->resize(num_outputs);
      HandleConnectorReport(output.kv_connector_report);
    }
    spare_records_.push_back(std::move(rec));
    in_flight_.pop_front();
    return;
  }
  // Blocks that become known below and that a later step in flight writes
  // are that step's to un-publish if it fails.
  std::vector<int32_t>* later_published =
      in_flight_.size() > 1 ? &in_flight_.back().published : nullptr;
  const std::vector<SampledTokens>& sampled = output.sampled;
  absl::flat_hash_map<absl::string_view, size_t> index;  // only if the order differs
  size_t k = 0;
  bool any_finished = false;
  const size_t num_entries = rec.entries.size();
  for (size_t i = 0; i < num_entries; ++i) {
    // Thousands of requests do not fit the caches: fetch ahead the request
    // and the tail of its token ids, which this loop appends to.
    if (i + 8 < num_entries) __builtin_prefetch(rec.entries[i + 8].request);
    if (i + 4 < num_entries) {
      const Request* ahead = rec.entries[i + 4].request;
      __builtin_prefetch(ahead->all_token_ids.data() + ahead->all_token_ids.size(), 1);
    }
    const StepEntry& e = rec.entries[i];
    Request* r = e.request;
    if (r->epoch != e.epoch) continue;  // aborted, finished or preempted since
    r->num_in_flight_tokens -= e.num_scheduled_tokens;
    const bool scores_prompt = r->needs_prompt_logprobs();
    if (!e.will_sample && !scores_prompt) continue;
    if (e.will_sample && config_.async_scheduling) {
      --r->num_output_placeholders;
      TANDEM_CHECK_GE(r->num_output_placeholders, 0) << r->request_id;
    }
    const SampledTokens* st = nullptr;
    if (i < sampled.size() && sampled[i].request_id == r->request_id) {
      st = &sampled[i];
    } else {
      if (index.empty()) {
        for (size_t j = 0; j < sampled.size(); ++j) index.emplace(sampled[j].request_id, j);
      }
      auto it = index.find(r->request_id);
      if (it != index.end()) st = &sampled[it->second];
    }
    if (scores_prompt && st != nullptr) AppendPromptLogprobs(r, *st);
    if (!e.will_sample) continue;
    if (k == outputs->size()) outputs->emplace_back();
    RequestOutput& o = (*outputs)[k++];
    ClearTokens(&o);
    const bool worker_failed_it = st != nullptr && !st->error.empty();
    if (st == nullptr || st->token_ids.empty() || worker_failed_it) {
      if (!worker_failed_it) {
        TANDEM_LOG(ERROR) << "step " << rec.step_id << ": no sampled token for request "
                          << r->request_id;
      }
      FillOutput(r, &o);
      Finish(r, RequestState::kFinishedError);
      o.finished = RequestState::kFinishedError;
      o.error =
          worker_failed_it
              ? st->error
              : absl::StrCat("the worker sampled no token for the request in step ", rec.step_id);
      any_finished = true;
      continue;
    }
    AppendTokens(r, st->token_ids, st->logprobs, &o);
    FillOutput(r, &o);
    if (o.finished) {
      any_finished = true;
      continue;
    }
    // Blocks whose ids became known: written ones, then those a later step
    // in flight writes.
    kv_.CacheBlocks(r, r->num_written_tokens());
    kv_.CacheBlocks(r, r->num_computed_tokens, later_published);
  }
  outputs->resize(k);
  if (any_finished) {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const Request* r) { return r->is_finished(); }),
                   running_.end());
  }
  HandleConnectorReport(output.kv_connector_report);
  spare_records_.push_back(std::move(rec));
  in_flight_.pop_front();
}

void Scheduler::NoteCachedTokens(Request* r, int32_t num_local, int32_t num_external) {
  // Fixed by the prefill of the first token it samples here.
  if (r->num_output_tokens() > r->num_resumed_output_tokens) return;
  r->num_cached_tokens_local = std::min(num_local, r->num_prompt_tokens);
  r->num_cached_tokens_external =
      std::min(num_local + num_external, r->num_prompt_tokens) - r->num_cached_tokens_local;
}

void Scheduler::HandleConnectorReport(const KvConnectorReport& report) {
  if (connector_ == nullptr) return;
  connector_->OnConnectorReport(report);
  auto for_each_loading = [this](auto&& fn) {
    for (Request* r : waiting_) {
      if (r->state == RequestState::kWaitingForRemoteKv) fn(r);
    }
    for (const auto& [id, r] : held_) {
      if (r->awaiting_recv) fn(r);
    }
  };
  if (!report.invalid_block_ids.empty()) {
    absl::flat_hash_set<int32_t> invalid(report.invalid_block_ids.begin(),
                                         report.invalid_block_ids.end());
    for_each_loading([&](Request* r) {
      for (int32_t j = 0; j < r->load_num_valid_blocks; ++j) {
        if (invalid.contains(r->block_ids[r->load_first_block + j])) {
          r->load_num_valid_blocks = j;  // keep only the blocks before it
          break;
        }
      }
    });
  }
  for (const std::string& id : report.finished_recving) {
    auto it = live_.find(id);
    if (it != live_.end() && it->second->state == RequestState::kWaitingForRemoteKv) {
      Request* r = it->second;
      const int32_t loaded = r->load_num_valid_blocks * config_.block_size;
      const int32_t local = r->num_computed_tokens;
      r->num_computed_tokens += loaded;
      r->num_pending_external_tokens = 0;
      --num_loading_;
      ++num_loaded_;
      r->state = r->num_preemptions > 0 ? RequestState::kPreempted : RequestState::kWaiting;
      // Only the valid loaded blocks are published; the rest is recomputed.
      kv_.CacheBlocks(r, r->num_computed_tokens);
      // A full-prompt hit still computes its last token (its logits are needed).
      if (r->num_computed_tokens == r->num_tokens()) --r->num_computed_tokens;
      NoteCachedTokens(r, local, r->num_computed_tokens - local);
      stats_.external_loaded_tokens += static_cast<uint64_t>(loaded);
      connector_->OnLoadFinished(*r, loaded);
      if (r->preempt_when_loaded) {  // it holds a block a failed step never wrote
        r->preempt_when_loaded = false;
        Preempt(r, nullptr, PreemptionReason::kStepFailed);
      }
      continue;
    }
    if (auto h = held_.find(id); h != held_.end() && h->second->awaiting_recv) {
      Request* r = h->second;
      r->awaiting_recv = false;
      MaybeRelease(r);
    }
  }
  for (const std::string& id : report.finished_sending) {
    if (auto h = held_.find(id); h != held_.end() && h->second->awaiting_send) {
      Request* r = h->second;
      r->awaiting_send = false;
      MaybeRelease(r);
    }
  }
}

}  // namespace tandem::sched
