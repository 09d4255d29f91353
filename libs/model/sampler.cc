#include "tandem/model/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tandem/common/status.h"
#include "tandem/kernels/cpu_ops.h"
#include "tandem/kernels/logprobs.h"
#include "tandem/kernels/sampling.h"
#include "tandem/model/model_runner.h"

namespace tandem::model {

int32_t SampleToken(std::span<const float> logits, const SamplingParams& params,
                    int32_t output_position, std::span<const int32_t> banned_token_ids,
                    std::span<const kernels::SamplePenalty> penalties,
                    std::span<const uint32_t> allowed_mask) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (params.temperature == 0.0f && banned_token_ids.empty() && penalties.empty() &&
      params.allowed_token_ids.empty() && allowed_mask.empty()) {
    return kernels::ArgMax(logits.data(), vocab);
  }
  const kernels::SampleArgs args = ToSampleArgs(params, output_position, banned_token_ids.size(),
                                                penalties.size(), allowed_mask.size());
  if (params.allowed_token_ids.empty() && allowed_mask.empty()) {
    return kernels::cpu::SampleRow(logits.data(), vocab, args, banned_token_ids.data(),
                                   penalties.data());
  }
  thread_local std::vector<int32_t> ids;
  ids.clear();
  AppendSampleIds(params, banned_token_ids, allowed_mask, &ids);
  return kernels::cpu::SampleRow(logits.data(), vocab, args, ids.data(), penalties.data());
}

void AppendSampleIds(const SamplingParams& params, std::span<const int32_t> banned_token_ids,
                     std::span<const uint32_t> allowed_mask, std::vector<int32_t>* out) {
  out->insert(out->end(), banned_token_ids.begin(), banned_token_ids.end());
  out->insert(out->end(), params.allowed_token_ids.begin(), params.allowed_token_ids.end());
  for (uint32_t word : allowed_mask) out->push_back(std::bit_cast<int32_t>(word));
}

kernels::SampleArgs ToSampleArgs(const SamplingParams& params, int32_t output_position,
                                 size_t num_banned, size_t num_penalties, size_t num_mask_words) {
  // vLLM raises a temperature in (0, 0.01) to 0.01 (SamplingParams'
  // _MAX_TEMP): below it the scaled logits lose their differences, and
  // past about 1e-37 they overflow to inf.
  const float t = params.temperature;
  return {.temperature = t > 0.0f && t < kMinSamplingTemperature ? kMinSamplingTemperature : t,
          .top_k = params.top_k,
          .top_p = params.top_p,
          .min_p = params.min_p,
          .seed = params.seed.value_or(0),
          .position = output_position,
          .num_banned = static_cast<int32_t>(num_banned),
          .num_allowed = static_cast<int32_t>(params.allowed_token_ids.size()),
          .num_mask_words = static_cast<int32_t>(num_mask_words),
          .presence_penalty = params.presence_penalty,
          .frequency_penalty = params.frequency_penalty,
          .repetition_penalty = params.repetition_penalty,
          .num_penalties = static_cast<int32_t>(num_penalties)};
}

namespace {

// Appends entries to a list of SamplePenalty, each id once, finding an id's
// entry by a table over the ids, no sort: the history is rebuilt every step
// for every penalized request (Qwen2.5's generation_config makes that every
// request), and sorting a 2,000-token prompt each time cost 19 us, an
// 8,000-token one 350 us. The table remembers, per id, the list that last
// saw it (`stamp`) and its entry; one list at a time per thread.
class PenaltyTable {
 public:
  explicit PenaltyTable(std::vector<kernels::SamplePenalty>* out) : out_(out) {
    if (++call_ == 0) {  // wrapped: forget every stamp
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      call_ = 1;
    }
  }
  // The entry of `id`, added with `output_count` when new; nullptr for an id
  // that is never a token (the program skips ids outside the vocabulary).
  kernels::SamplePenalty* Find(int32_t id, int32_t output_count) {
    if (id < 0) return nullptr;
    const size_t i = static_cast<size_t>(id);
    if (i >= stamp_.size()) {
      stamp_.resize(i + 1, 0u);
      entry_.resize(i + 1, 0);
    }
    if (stamp_[i] != call_) {
      stamp_[i] = call_;
      entry_[i] = out_->size();
      out_->push_back({.id = id, .output_count = output_count});
    }
    return &(*out_)[entry_[i]];
  }

 private:
  std::vector<kernels::SamplePenalty>* out_;
  static thread_local std::vector<uint32_t> stamp_;
  static thread_local std::vector<size_t> entry_;
  static thread_local uint32_t call_;
};
thread_local std::vector<uint32_t> PenaltyTable::stamp_;
thread_local std::vector<size_t> PenaltyTable::entry_;
thread_local uint32_t PenaltyTable::call_ = 0;

void AddHistory(PenaltyTable& table, std::span<const int32_t> prompt,
                std::span<const int32_t> output) {
  for (int32_t id : output) {
    if (kernels::SamplePenalty* p = table.Find(id, 0)) ++p->output_count;
  }
  for (int32_t id : prompt) table.Find(id, 0);
}

}  // namespace

void PenaltyHistory(std::span<const int32_t> prompt, std::span<const int32_t> output,
                    std::vector<kernels::SamplePenalty>* out) {
  PenaltyTable table(out);
  AddHistory(table, prompt, output);
}

void SampleAdjustments(const SamplingParams& params, std::span<const int32_t> prompt,
                       std::span<const int32_t> output, std::vector<kernels::SamplePenalty>* out) {
  if (!params.AdjustsLogits()) return;  // most rows: nothing to list
  PenaltyTable table(out);
  if (params.HasPenalties()) AddHistory(table, prompt, output);
  for (const auto& [id, bias] : params.logit_bias) {
    if (kernels::SamplePenalty* p = table.Find(id, -1)) p->bias = bias;
  }
}

void SampleRows(std::span<const float> logits, int32_t vocab,
                std::span<const SampleRequest> sample, std::vector<int32_t>* tokens) {
  const size_t v = static_cast<size_t>(vocab);
  tokens->assign(sample.size(), -1);
  for (size_t i = 0; i < sample.size(); ++i) {
    if (sample[i].params == nullptr) continue;
    std::vector<kernels::SamplePenalty> history;
    SampleAdjustments(*sample[i].params, sample[i].prompt_token_ids, sample[i].output_token_ids,
                      &history);
    (*tokens)[i] =
        SampleToken(logits.subspan(i * v, v), *sample[i].params, sample[i].output_position,
                    sample[i].banned_token_ids, history, sample[i].allowed_mask);
  }
}

TokenLogprobs ComputeLogprobs(std::span<const float> logits, int32_t token, int32_t top_n) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const float log_z = kernels::cpu::LogNormalizer(logits.data(), vocab);
  auto logprob = [&](int32_t id) {
    return kernels::AddRn(logits[static_cast<size_t>(id)], -log_z);
  };
  auto before = [&](int32_t a, int32_t b) { return kernels::LogprobBefore(logits.data(), a, b); };
  TokenLogprobs out{.token_id = token, .logprob = logprob(token), .rank = 1};
  for (int32_t id = 0; id < vocab; ++id) out.rank += before(id, token) ? 1 : 0;
  const int32_t n = std::clamp(top_n, 0, vocab);
  if (n > 0) {
    thread_local std::vector<int32_t> ids;
    ids.resize(static_cast<size_t>(vocab));
    for (int32_t id = 0; id < vocab; ++id) ids[static_cast<size_t>(id)] = id;
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), before);
    out.top_token_ids.assign(ids.begin(), ids.begin() + n);
    out.top_logprobs.reserve(static_cast<size_t>(n));
    for (int32_t id : out.top_token_ids) out.top_logprobs.push_back(logprob(id));
  }
  return out;
}

bool WantsLogprobs(std::span<const SampleRequest> sample) {
  return std::any_of(sample.begin(), sample.end(), [](const SampleRequest& r) {
    return (r.params != nullptr && r.num_logprobs >= 0) || !r.prompt_targets.empty();
  });
}

absl::StatusOr<std::vector<LogprobTarget>> LogprobTargets(std::span<const SequenceInput> batch,
                                                          std::span<const SampleRequest> sample,
                                                          std::span<const int32_t> tokens,
                                                          int32_t vocab) {
  std::vector<LogprobTarget> targets;
  int32_t next_extra = static_cast<int32_t>(batch.size());
  for (size_t i = 0; i < sample.size(); ++i) {
    const SampleRequest& r = sample[i];
    const int32_t seq = static_cast<int32_t>(i);
    const int32_t n = static_cast<int32_t>(batch[i].token_ids.size());
    const int32_t extra = next_extra;
    if (batch[i].all_logits) next_extra += n - 1;
    if (r.params != nullptr && r.num_logprobs >= 0) {
      targets.push_back({.sequence = seq,
                         .logits_row = seq,
                         .token = tokens[i],
                         .top_n = std::clamp(r.num_logprobs, 0, vocab)});
    }
    const int32_t count = static_cast<int32_t>(r.prompt_targets.size());
    if (count > n || (count > 0 && n > 1 && !batch[i].all_logits)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, ": ", count, " prompt logprob targets for a chunk of ", n,
                       " tokens", batch[i].all_logits ? "" : " without all_logits"));
    }
    for (int32_t j = 0; j < count; ++j) {
      targets.push_back({.sequence = seq,
                         .prompt_index = j,
                         .logits_row = j == n - 1 ? seq : extra + j,
                         .token = r.prompt_targets[static_cast<size_t>(j)],
                         .top_n = std::clamp(r.num_prompt_logprobs, 0, vocab)});
    }
  }
  for (const LogprobTarget& t : targets) {
    if (t.token < 0 || t.token >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", t.sequence, ": logprob of token ",
                                                     t.token, " outside the vocabulary of ",
                                                     vocab));
    }
  }
  return targets;
}

void AssembleLogprobs(std::span<const LogprobTarget> targets, std::vector<TokenLogprobs> results,
                      size_t sequences, std::vector<SampleLogprobs>* logprobs) {
  logprobs->assign(sequences, SampleLogprobs{});
  for (size_t j = 0; j < targets.size(); ++j) {
    SampleLogprobs& out = (*logprobs)[static_cast<size_t>(targets[j].sequence)];
    (targets[j].prompt_index < 0 ? out.sampled : out.prompt).push_back(std::move(results[j]));
  }
}

absl::Status ComputeBatchLogprobs(std::span<const SequenceInput> batch,
                                  std::span<const SampleRequest> sample,
                                  std::span<const int32_t> tokens, int32_t vocab, LogitsRowFn row,
                                  std::vector<SampleLogprobs>* logprobs) {
  TANDEM_ASSIGN_OR_RETURN(const std::vector<LogprobTarget> targets,
                          LogprobTargets(batch, sample, tokens, vocab));
  std::vector<TokenLogprobs> results;
  results.reserve(targets.size());
  for (const LogprobTarget& t : targets) {
    TANDEM_ASSIGN_OR_RETURN(std::span<const float> logits, row(t.logits_row));
    results.push_back(ComputeLogprobs(logits, t.token, t.top_n));
  }
  AssembleLogprobs(targets, std::move(results), sample.size(), logprobs);
  return absl::OkStatus();
}

}  // namespace tandem::model
