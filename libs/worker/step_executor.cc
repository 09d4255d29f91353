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

bool SimBackend::IsEos(int32_t token) const {
  return std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

void SimBackend::FakeLogits(int32_t last, int64_t end, std::span<float> row) const {
  int32_t token = static_cast<int32_t>(
      (static_cast<uint64_t>(last) * 2654435761ull + static_cast<uint64_t>(end) * 40503ull) %
      static_cast<uint64_t>(vocab_size_));
  for (int32_t tries = 1; IsEos(token) && tries < vocab_size_; ++tries) {
    token = (token + 1) % vocab_size_;
  }
  std::fill(row.begin(), row.end(), 0.0f);
  row[static_cast<size_t>(token)] = 10.0f;
}

absl::Status SimBackend::ForwardSample(std::span<const model::SequenceInput> batch,
                                       std::span<const model::SampleRequest> sample,
                                       std::vector<int32_t>* tokens,
                                       std::vector<model::SampleLogprobs>* logprobs) {
  const model::DeviceClock::Scope step(&clock_);
  int64_t total = 0;
  for (const model::SequenceInput& in : batch) total += std::ssize(in.token_ids);
  std::this_thread::sleep_for(std::chrono::microseconds(step_us_ + token_us_ * total));
  const size_t v = static_cast<size_t>(vocab_size_);
  std::vector<float> logits(batch.size() * v);
  for (size_t i = 0; i < batch.size(); ++i) {
    FakeLogits(batch[i].token_ids.back(), batch[i].start_pos + std::ssize(batch[i].token_ids),
               std::span<float>(logits).subspan(i * v, v));
  }
  model::SampleRows(logits, vocab_size_, sample, tokens);
  if (logprobs == nullptr) return absl::OkStatus();
  std::vector<float> row(v);
  return model::ComputeBatchLogprobs(
      batch, sample, *tokens, vocab_size_,
      [&](int32_t r) -> absl::StatusOr<std::span<const float>> {
        if (static_cast<size_t>(r) < batch.size()) {
          return std::span<const float>(logits).subspan(static_cast<size_t>(r) * v, v);
        }
        // An all_logits row: find its sequence and token.
        int32_t extra = static_cast<int32_t>(batch.size());
        for (const model::SequenceInput& in : batch) {
          const int32_t n = static_cast<int32_t>(in.token_ids.size());
          if (!in.all_logits) continue;
          if (r < extra + n - 1) {
            const int32_t j = r - extra;
            FakeLogits(in.token_ids[static_cast<size_t>(j)], in.start_pos + j + 1, row);
            return std::span<const float>(row);
          }
          extra += n - 1;
        }
        return absl::InternalError(absl::StrCat("no logits row ", r));
      },
      logprobs);
}

StepExecutor::StepExecutor(StepBackend* backend, sched::KvConnectorWorker* kv_connector,
                           StepExecutorOptions options)
    : backend_(backend), kv_connector_(kv_connector), options_(std::move(options)) {}

sched::ModelRunnerOutput StepExecutor::Execute(sched::SchedulerOutput step) {
  sched::ModelRunnerOutput out;
  const absl::Status s = Run(step, &out);
  if (s.ok()) return out;
  TANDEM_LOG(ERROR) << "step " << step.step_id << " failed: " << s;
  // Loads already done are still reported: the scheduler must learn that
  // those requests' blocks arrived (or failed), or they would wait for them
  // forever. Its stores after the forward pass never ran: reported as
  // failed, so the scheduler forgets them instead of counting them stored.
  if (kv_connector_ != nullptr) {
    for (const sched::KvStoreOp& st : step.kv_connector_metadata.stores) {
      if (st.before_forward) continue;
      out.kv_connector_report.finished_sending.push_back(st.request_id);
      out.kv_connector_report.failed_sending.push_back(st.request_id);
    }
  }
  return Failed(step.step_id, step.last_processed_step_id, s, std::move(out.kv_connector_report));
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
  if (kv_connector_ != nullptr) kv_connector_->ForgetLoads();
  last_failed_step_id_ = 0;
}

absl::Status StepExecutor::Run(sched::SchedulerOutput& step, sched::ModelRunnerOutput* out) {
  for (const std::string& id : step.finished_req_ids) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) DropSeq(it, "finished");
  }
  // KV-store loads: those that arrived go into the cache before this
  // step's forward pass (and after every earlier step's: steps run in order
  // on this thread), and are reported in its output (even if the step then
  // fails), failed blocks as invalid_block_ids; this step's own begin.
  // Loads need no batch state, so they come first.
  sched::KvConnectorReport& report = out->kv_connector_report;
  if (kv_connector_ != nullptr) kv_connector_->LoadBlocks(step.kv_connector_metadata, &report);

  Batch batch;
  TANDEM_RETURN_IF_ERROR(ApplyDiff(step, &batch));
  if (std::find(options_.debug_fail_steps.begin(), options_.debug_fail_steps.end(), step.step_id) !=
      options_.debug_fail_steps.end()) {
    return absl::InternalError(
        absl::StrCat("step ", step.step_id, " failed (TEST-ONLY --debug-fail-steps)"));
  }
  if (options_.debug_step_delay_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(options_.debug_step_delay_us));
  }

  std::vector<model::SequenceInput> inputs;
  TANDEM_RETURN_IF_ERROR(BuildInputs(step, batch, &inputs));
  std::vector<model::SampleRequest> sample(batch.seqs.size());
  std::vector<std::vector<int32_t>> banned;  // sized only when a request bans tokens
  PlanSampling(step, batch, &inputs, &sample, &banned);
  std::vector<int32_t> tokens;
  std::vector<model::SampleLogprobs> logprobs;
  if (!inputs.empty()) {
    TANDEM_RETURN_IF_ERROR(backend_->ForwardSample(
        inputs, sample, &tokens, model::WantsLogprobs(sample) ? &logprobs : nullptr));
  }
  // Stores read their blocks now, before the next step can overwrite them.
  if (kv_connector_ != nullptr) {
    kv_connector_->SnapshotStores(step.kv_connector_metadata);
    report.finished_sending.clear();
    report.failed_sending.clear();
    kv_connector_->TakeFinishedSending(&report);
    // Loads that arrived during the forward pass: reported a step sooner.
    kv_connector_->FinishLoads(
        &report, inputs.empty() ? options_.empty_step_load_wait : std::chrono::microseconds(0));
  }
  RecordSamples(step, batch, sample, tokens, logprobs, out);
  return absl::OkStatus();
}

absl::Status StepExecutor::ApplyDiff(sched::SchedulerOutput& step, Batch* batch) {
  // A preempted request keeps its entry (its prompt length fixes the sampling
  // positions) but loses its blocks; it comes back resumed_from_preemption.
  for (const std::string& id : step.preempted_req_ids) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) {
      it->second.block_table.clear();
      it->second.num_computed_tokens = 0;
      ++it->second.num_preemptions;
    }
  }

  batch->seqs.reserve(step.num_scheduled_tokens.size());
  batch->ids.reserve(step.num_scheduled_tokens.size());
  const int64_t now_ns = MonotonicNanos();
  for (sched::NewRequestData& r : step.scheduled_new_reqs) {
    SeqState& s = seqs_[r.request_id];
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
    SeqState& s = it->second;
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
    // not drawn (the scheduler does not stop on them there either).
    if (row.output_position < s.sampling.min_tokens) {
      if (banned->empty()) banned->resize(batch.seqs.size());
      if (!s.sampling.ignore_eos) (*banned)[i] = options_.eos_token_ids;
      (*banned)[i].insert((*banned)[i].end(), s.sampling.stop_token_ids.begin(),
                          s.sampling.stop_token_ids.end());
      row.banned_token_ids = (*banned)[i];
    }
  }
}

void StepExecutor::RecordSamples(const sched::SchedulerOutput& step, const Batch& batch,
                                 const std::vector<model::SampleRequest>& sample,
                                 const std::vector<int32_t>& tokens,
                                 std::vector<model::SampleLogprobs>& logprobs,
                                 sched::ModelRunnerOutput* out) {
  out->step_id = step.step_id;
  out->sampled.reserve(batch.seqs.size());
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    SeqState& s = *batch.seqs[i];
    s.num_computed_tokens += step.num_scheduled_tokens[i];
    ++s.num_steps;
    sched::SampledTokens& sampled = out->sampled.emplace_back();
    sampled.request_id = *batch.ids[i];
    if (!logprobs.empty()) {
      sampled.prompt_logprobs = std::move(logprobs[i].prompt);
      sampled.prompt_logprobs_start = s.num_computed_tokens - step.num_scheduled_tokens[i] + 1;
      sampled.logprobs = std::move(logprobs[i].sampled);
    }
    if (sample[i].params == nullptr) continue;
    const int32_t token = tokens[i];
    s.token_ids.push_back(token);
    s.unconfirmed_sample_steps.push_back(step.step_id);
    ++s.num_sampled;
    sampled.token_ids.push_back(token);
  }
}

void StepExecutor::DropSeq(SeqMap::iterator it, const char* why) {
  const SeqState& s = it->second;
  TANDEM_LOG(INFO) << "request " << it->first << " dropped: reason=" << why
                   << " prompt_tokens=" << s.num_prompt_tokens
                   << " computed_tokens=" << s.num_computed_tokens
                   << " sampled_tokens=" << s.num_sampled << " steps=" << s.num_steps
                   << " preemptions=" << s.num_preemptions << " held_ms="
                   << (s.first_step_ns > 0 ? (MonotonicNanos() - s.first_step_ns) * 1e-6 : 0.0);
  seqs_.erase(it);
}

}  // namespace tandem::worker
