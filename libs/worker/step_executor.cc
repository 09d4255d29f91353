#include "tandem/worker/step_executor.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"

namespace tandem::worker {

StepExecutor::StepExecutor(StepBackend* backend, sched::KvConnectorWorker* kv_connector,
                           StepExecutorOptions options)
    : backend_(backend), kv_connector_(kv_connector), options_(std::move(options)) {
  if (options_.vocabulary != nullptr) {
    structured_ = std::make_unique<StructuredOutputs>(options_.vocabulary, options_.eos_token_ids,
                                                      options_.grammar_mask_cache_bytes);
  }
}

sched::ModelRunnerOutput StepExecutor::Execute(sched::SchedulerOutput step) {
  std::unique_ptr<Step> st = Prepare(std::move(step));
  Launch(*st, [] {});
  return Finish(std::move(st));
}

std::unique_ptr<StepExecutor::Step> StepExecutor::Prepare(sched::SchedulerOutput step) {
  auto st = std::make_unique<Step>();
  st->step_ = std::move(step);
  for (const std::string& id : st->step_.finished_req_ids) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) DropSeq(it, "finished");
  }
  st->status_ = ApplyDiff(st->step_, &st->batch_);
  if (st->status_.ok()) st->status_ = BuildInputs(st->step_, st->batch_, &st->inputs_);
  if (st->status_.ok()) {
    st->sample_.resize(st->batch_.seqs.size());
    PlanSampling(st->step_, st->batch_, &st->inputs_, &st->sample_, &st->banned_);
    st->want_logprobs_ = model::WantsLogprobs(st->sample_);
  }
  return st;
}

void StepExecutor::Launch(Step& st, std::function<void()> on_done) {
  const sched::SchedulerOutput& step = st.step_;
  // Prepared before the step it was built on had failed (overlap): it does
  // not run, as if ApplyDiff had stopped it.
  if (st.status_.ok() && step.last_processed_step_id < last_failed_step_id_) {
    st.status_ =
        absl::AbortedError(absl::StrCat("step ", step.step_id, " was built on step ",
                                        last_failed_step_id_, ", which failed; it is not run"));
  }
  // KV-store loads: those that arrived go into the cache before this
  // step's forward pass (and after every earlier step's: Launch follows the
  // previous Finish), and are reported in its output (even if the step
  // then fails), failed blocks as invalid_block_ids; this step's own begin.
  if (kv_connector_ != nullptr) {
    kv_connector_->LoadBlocks(step.kv_connector_metadata, &st.out_.kv_connector_report);
  }
  if (st.status_.ok() &&
      std::find(options_.debug_fail_steps.begin(), options_.debug_fail_steps.end(), step.step_id) !=
          options_.debug_fail_steps.end()) {
    st.status_ = absl::InternalError(
        absl::StrCat("step ", step.step_id, " failed (TEST-ONLY --debug-fail-steps)"));
  }
  if (st.status_.ok() && options_.debug_step_delay_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(options_.debug_step_delay_us));
  }
  if (st.status_.ok() && !st.inputs_.empty()) {
    BanBadWords(st);
    BanByGrammar(st);
    st.status_ = backend_->Launch(st.inputs_, st.sample_, st.want_logprobs_, on_done);
    if (st.status_.ok()) {
      st.launched_ = true;
      in_flight_ = true;
      RecordLaunch(st);
      return;
    }
  }
  on_done();
}

bool StepExecutor::LaunchReturnsAtOnce(const Step& st) const {
  return st.status_.ok() && !st.inputs_.empty() && backend_->launches_async(st.want_logprobs_);
}

sched::ModelRunnerOutput StepExecutor::Finish(std::unique_ptr<Step> st) {
  std::vector<int32_t> tokens;
  std::vector<model::SampleLogprobs> logprobs;
  if (st->launched_) {
    st->status_ = backend_->Finish(&tokens, &logprobs);
    in_flight_ = false;
  }
  if (!st->status_.ok()) {
    retired_.clear();
    return FailedStep(*st, st->status_);
  }
  sched::KvConnectorReport& report = st->out_.kv_connector_report;
  // Stores read their blocks now, before the next step can overwrite them.
  if (kv_connector_ != nullptr) {
    kv_connector_->SnapshotStores(st->step_.kv_connector_metadata);
    report.finished_sending.clear();
    report.failed_sending.clear();
    kv_connector_->TakeFinishedSending(&report);
    // Loads that arrived during the forward pass: reported a step sooner.
    kv_connector_->FinishLoads(&report, st->inputs_.empty() ? options_.empty_step_load_wait
                                                            : std::chrono::microseconds(0));
  }
  st->out_.step_id = st->step_.step_id;
  if (st->launched_) RecordSamples(*st, tokens, logprobs);
  retired_.clear();  // what dropped requests' rows pointed at is no longer read
  return std::move(st->out_);
}

sched::ModelRunnerOutput StepExecutor::FailedStep(Step& st, const absl::Status& why) {
  TANDEM_LOG(ERROR) << "step " << st.step_.step_id << " failed: " << why;
  // Loads already done are still reported: the scheduler must learn that
  // those requests' blocks arrived (or failed), or they would wait for them
  // forever. Its stores after the forward pass never ran: the connector
  // reports them failed with a later step (KvConnectorWorker::
  // SnapshotStores), once; reporting them here too made the scheduler
  // count the second report against the request's next store.
  return Failed(st.step_.step_id, st.step_.last_processed_step_id, why,
                std::move(st.out_.kv_connector_report));
}

sched::ModelRunnerOutput StepExecutor::Reject(uint64_t step_id, const absl::Status& why) {
  TANDEM_LOG(ERROR) << "step " << step_id << " rejected: " << why;
  // Nothing of it was applied, so whatever the scheduler built on it before
  // it learns of the rejection cannot run, even when this step was itself
  // built on an earlier failed one (the scheduler fails them all with it).
  last_failed_step_id_ = std::max(last_failed_step_id_, step_id);
  sched::ModelRunnerOutput out{.step_id = step_id, .error = std::string(why.message())};
  out.rejected = true;
  return out;
}

sched::ModelRunnerOutput StepExecutor::Failed(uint64_t step_id, uint64_t last_processed_step_id,
                                              const absl::Status& why,
                                              sched::KvConnectorReport report) {
  if (last_processed_step_id >= last_failed_step_id_) {
    last_failed_step_id_ = step_id;  // failed by itself
  }
  return sched::ModelRunnerOutput{.step_id = step_id,
                                  .kv_connector_report = std::move(report),
                                  .error = std::string(why.message())};
}

void StepExecutor::Reset(const char* why) {
  while (!seqs_.empty()) DropSeq(seqs_.begin(), why);
  retired_.clear();
  if (kv_connector_ != nullptr) kv_connector_->ForgetLoads();
  last_failed_step_id_ = 0;
}

absl::Status StepExecutor::ApplyDiff(sched::SchedulerOutput& step, Batch* batch) {
  // A preempted request keeps its entry (its prompt length fixes the sampling
  // positions) but loses its blocks; it comes back resumed_from_preemption.
  for (const std::string& id : step.preempted_req_ids) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) {
      it->second->block_table.clear();
      it->second->num_computed_tokens = 0;
      ++it->second->num_preemptions;
    }
  }

  batch->seqs.reserve(step.num_scheduled_tokens.size());
  batch->ids.reserve(step.num_scheduled_tokens.size());
  const int64_t now_ns = MonotonicNanos();
  for (sched::NewRequestData& r : step.scheduled_new_reqs) {
    std::unique_ptr<SeqState>& state = seqs_[r.request_id];
    if (state == nullptr) {
      state = std::make_unique<SeqState>();
    } else if (in_flight_) {
      // The launched step may still write a token into the old state.
      auto fresh = std::make_unique<SeqState>(*state);
      Retire(std::exchange(state, std::move(fresh)));
    }
    SeqState& s = *state;
    if (r.sampling.HasGrammar() && structured_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step.step_id, ": request ", r.request_id, " has a ", r.sampling.GrammarField(),
          ", but this worker has no vocabulary for structured outputs "
          "(tandem-worker --tokenizer)"));
    }
    // Its grammar compiled and its first mask made now, while the step
    // before runs, rather than at its first launch.
    if (r.sampling.HasGrammar() && r.output_token_ids.empty()) structured_->Warm(r.sampling);
    if (s.first_step_ns == 0) s.first_step_ns = now_ns;
    s.unconfirmed_sample_steps.clear();
    s.num_prompt_tokens = static_cast<int32_t>(r.prompt_token_ids.size());
    s.token_ids = std::move(r.prompt_token_ids);
    s.token_ids.insert(s.token_ids.end(), r.output_token_ids.begin(), r.output_token_ids.end());
    s.sampling = std::move(r.sampling);
    s.block_table = std::move(r.block_ids);
    s.num_computed_tokens = r.num_computed_tokens;
    batch->seqs.push_back(&s);
    batch->ids.push_back(&r.request_id);
  }
  // New requests are registered even in a step that does not run (the
  // scheduler knows them as sent), but a step built on a failed one stops
  // here, before its diffs are checked against state the failure left.
  if (step.last_processed_step_id < last_failed_step_id_) {
    return absl::AbortedError(absl::StrCat("step ", step.step_id, " was built on step ",
                                           last_failed_step_id_, ", which failed; it is not run"));
  }
  for (sched::CachedRequestData& r : step.scheduled_cached_reqs) {
    auto it = seqs_.find(r.request_id);
    if (it == seqs_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step.step_id, ": cached request ", r.request_id, " is unknown to this worker"));
    }
    SeqState& s = *it->second;
    if (r.resumed_from_preemption) {
      // Tokens this worker sampled that the scheduler dropped are forgotten.
      s.token_ids = std::move(r.all_token_ids);
      s.block_table = std::move(r.new_block_ids);
      s.unconfirmed_sample_steps.clear();
    } else {
      s.block_table.insert(s.block_table.end(), r.new_block_ids.begin(), r.new_block_ids.end());
    }
    while (!s.unconfirmed_sample_steps.empty() &&
           s.unconfirmed_sample_steps.front() <= step.last_processed_step_id) {
      s.unconfirmed_sample_steps.pop_front();
    }
    if (static_cast<int32_t>(s.unconfirmed_sample_steps.size()) != r.num_output_placeholders) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step.step_id, ": request ", r.request_id, " has ", r.num_output_placeholders,
          " output placeholders on the scheduler, but this worker sampled ",
          s.unconfirmed_sample_steps.size(), " tokens for it after step ",
          step.last_processed_step_id, ", the last step the scheduler had processed"));
    }
    s.num_computed_tokens = r.num_computed_tokens;
    batch->seqs.push_back(&s);
    batch->ids.push_back(&r.request_id);
  }
  if (batch->seqs.size() != step.num_scheduled_tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step.step_id, " schedules ", batch->seqs.size(), " requests but has ",
                     step.num_scheduled_tokens.size(), " token counts"));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::BuildInputs(const sched::SchedulerOutput& step, const Batch& batch,
                                       std::vector<model::SequenceInput>* inputs) {
  inputs->reserve(batch.seqs.size());
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    SeqState& s = *batch.seqs[i];
    const int32_t n = step.num_scheduled_tokens[i];
    // In async mode the last n tokens may be ones this worker sampled itself
    // (the scheduler's placeholders); they are already in token_ids.
    if (n <= 0 || s.num_computed_tokens + n > static_cast<int32_t>(s.token_ids.size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step.step_id, ": request ", *batch.ids[i], " schedules ", n,
                       " tokens from position ", s.num_computed_tokens, " but the worker knows ",
                       s.token_ids.size(), " tokens"));
    }
    inputs->push_back({
        .token_ids = std::span<const int32_t>(s.token_ids).subspan(s.num_computed_tokens, n),
        .start_pos = s.num_computed_tokens,
        .block_table = s.block_table,
    });
  }

  return absl::OkStatus();
}

void StepExecutor::PlanSampling(const sched::SchedulerOutput& step, const Batch& batch,
                                std::vector<model::SequenceInput>* inputs,
                                std::vector<model::SampleRequest>* sample,
                                std::vector<std::vector<int32_t>>* banned) const {
  // A prefill chunk that does not reach the last known token samples nothing.
  // Prompt logprobs: the chunk's rows score the prompt tokens after them.
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqState& s = *batch.seqs[i];
    model::SampleRequest& row = (*sample)[i];
    const int32_t known = static_cast<int32_t>(s.token_ids.size());
    const int32_t start = s.num_computed_tokens, n = step.num_scheduled_tokens[i];
    if (s.sampling.prompt_logprobs >= 0 && start + 1 < s.num_prompt_tokens) {
      const int32_t last = std::min(start + n, s.num_prompt_tokens - 1);  // last target position
      row.prompt_targets =
          std::span<const int32_t>(s.token_ids)
              .subspan(static_cast<size_t>(start + 1), static_cast<size_t>(last - start));
      row.num_prompt_logprobs = s.sampling.prompt_logprobs;
      (*inputs)[i].all_logits = n > 1;
    }
    if (start + n < known) continue;
    row.params = &s.sampling;
    row.output_position = known - s.num_prompt_tokens;
    if (s.sampling.HasPenalties()) {  // the history: prompt, then every output token so far
      const std::span<const int32_t> all(s.token_ids);
      row.prompt_token_ids = all.first(static_cast<size_t>(s.num_prompt_tokens));
      row.output_token_ids = all.subspan(static_cast<size_t>(s.num_prompt_tokens));
    }
    row.num_logprobs = s.sampling.logprobs;
    // Below min_tokens no stop condition counts: EOS and stop tokens are
    // not drawn (the scheduler does not stop on them there either). EOS
    // even with ignore_eos, as vLLM's min-tokens processor bans its
    // all_stop_token_ids, which hold EOS whatever ignore_eos says.
    if (row.output_position < s.sampling.min_tokens) {
      if (banned->empty()) banned->resize(batch.seqs.size());
      (*banned)[i] = options_.eos_token_ids;
      (*banned)[i].insert((*banned)[i].end(), s.sampling.stop_token_ids.begin(),
                          s.sampling.stop_token_ids.end());
      row.banned_token_ids = (*banned)[i];
    }
  }
}

void StepExecutor::BanBadWords(Step& st) {
  for (size_t i = 0; i < st.sample_.size(); ++i) {
    model::SampleRequest& row = st.sample_[i];
    if (row.params == nullptr || row.params->bad_words.empty()) continue;
    const SeqState& s = *st.batch_.seqs[i];
    const std::span<const int32_t> output = std::span<const int32_t>(s.token_ids)
                                                .subspan(static_cast<size_t>(s.num_prompt_tokens),
                                                         static_cast<size_t>(row.output_position));
    if (st.banned_.empty()) st.banned_.resize(st.sample_.size());
    BadWordBans(row.params->bad_words, output, &st.banned_[i]);
    row.banned_token_ids = st.banned_[i];
  }
}

void StepExecutor::BanByGrammar(Step& st) {
  if (structured_ == nullptr) return;
  for (size_t i = 0; i < st.sample_.size(); ++i) {
    model::SampleRequest& row = st.sample_[i];
    if (row.params == nullptr || !row.params->HasGrammar()) continue;
    SeqState& s = *st.batch_.seqs[i];
    const std::span<const int32_t> output = std::span<const int32_t>(s.token_ids)
                                                .subspan(static_cast<size_t>(s.num_prompt_tokens),
                                                         static_cast<size_t>(row.output_position));
    if (st.masks_.empty()) st.masks_.resize(st.sample_.size());
    structured_->Mask(*st.batch_.ids[i], *row.params, output, &s.grammar, &st.masks_[i]);
    row.allowed_mask = st.masks_[i];
    if (s.grammar.broken()) {
      if (st.errors_.empty()) st.errors_.resize(st.sample_.size());
      st.errors_[i] = s.grammar.error;
    }
  }
}

void StepExecutor::RecordLaunch(Step& st) {
  const sched::SchedulerOutput& step = st.step_;
  const Batch& batch = st.batch_;
  sched::ModelRunnerOutput& out = st.out_;
  out.sampled.reserve(batch.seqs.size());
  st.slots_.assign(batch.seqs.size(), -1);
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    SeqState& s = *batch.seqs[i];
    s.num_computed_tokens += step.num_scheduled_tokens[i];
    ++s.num_steps;
    sched::SampledTokens& sampled = out.sampled.emplace_back();
    sampled.request_id = *batch.ids[i];
    sampled.prompt_logprobs_start = s.num_computed_tokens - step.num_scheduled_tokens[i] + 1;
    if (!st.errors_.empty()) sampled.error = st.errors_[i];
    if (st.sample_[i].params == nullptr) continue;
    // The token's value comes with Finish; the next step's inputs may point
    // at its slot before then.
    st.slots_[i] = std::ssize(s.token_ids);
    s.token_ids.push_back(-1);
    s.unconfirmed_sample_steps.push_back(step.step_id);
    ++s.num_sampled;
  }
}

void StepExecutor::RecordSamples(Step& st, const std::vector<int32_t>& tokens,
                                 std::vector<model::SampleLogprobs>& logprobs) {
  for (size_t i = 0; i < st.batch_.seqs.size(); ++i) {
    sched::SampledTokens& sampled = st.out_.sampled[i];
    if (!logprobs.empty()) {
      sampled.prompt_logprobs = std::move(logprobs[i].prompt);
      sampled.logprobs = std::move(logprobs[i].sampled);
    } else {
      sampled.prompt_logprobs_start = 0;
    }
    if (st.slots_[i] < 0) continue;
    const int32_t token = tokens[i];
    st.batch_.seqs[i]->token_ids[static_cast<size_t>(st.slots_[i])] = token;
    sampled.token_ids.push_back(token);
  }
}

void StepExecutor::Retire(std::unique_ptr<SeqState> seq) {
  if (in_flight_) retired_.push_back(std::move(seq));
}

void StepExecutor::DropSeq(SeqMap::iterator it, const char* why) {
  const SeqState& s = *it->second;
  TANDEM_LOG(INFO) << "request " << it->first << " dropped: reason=" << why
                   << " prompt_tokens=" << s.num_prompt_tokens
                   << " computed_tokens=" << s.num_computed_tokens
                   << " sampled_tokens=" << s.num_sampled << " steps=" << s.num_steps
                   << " preemptions=" << s.num_preemptions << " held_ms="
                   << (s.first_step_ns > 0 ? (MonotonicNanos() - s.first_step_ns) * 1e-6 : 0.0);
  Retire(std::move(it->second));
  seqs_.erase(it);
}

}  // namespace tandem::worker
