#include "tandem/model/sampler.h"

#include <algorithm>
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
                    std::span<const kernels::SamplePenalty> penalties) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (params.temperature == 0.0f && banned_token_ids.empty() && penalties.empty()) {
    return kernels::ArgMax(logits.data(), vocab);
  }
  return kernels::cpu::SampleRow(
      logits.data(), vocab,
      ToSampleArgs(params, output_position, banned_token_ids.size(), penalties.size()),
      banned_token_ids.data(), penalties.data());
}

kernels::SampleArgs ToSampleArgs(const SamplingParams& params, int32_t output_position,
                                 size_t num_banned, size_t num_penalties) {
  return {.temperature = params.temperature,
          .top_k = params.top_k,
          .top_p = params.top_p,
          .min_p = params.min_p,
          .seed = params.seed.value_or(0),
          .position = output_position,
          .num_banned = static_cast<int32_t>(num_banned),
          .presence_penalty = params.presence_penalty,
          .frequency_penalty = params.frequency_penalty,
          .repetition_penalty = params.repetition_penalty,
          .num_penalties = static_cast<int32_t>(num_penalties)};
}

void PenaltyHistory(std::span<const int32_t> prompt, std::span<const int32_t> output,
                    std::vector<kernels::SamplePenalty>* out) {
  std::vector<int32_t> ids(output.begin(), output.end());
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    out->push_back({.id = ids[i], .output_count = static_cast<int32_t>(j - i)});
    i = j;
  }
  std::vector<int32_t> p(prompt.begin(), prompt.end());
  std::sort(p.begin(), p.end());
  p.erase(std::unique(p.begin(), p.end()), p.end());
  for (int32_t id : p) {
    if (!std::binary_search(ids.begin(), ids.end(), id)) {  // not counted above
      out->push_back({.id = id, .output_count = 0});
    }
  }
}

void SampleRows(std::span<const float> logits, int32_t vocab,
                std::span<const SampleRequest> sample, std::vector<int32_t>* tokens) {
  const size_t v = static_cast<size_t>(vocab);
  tokens->assign(sample.size(), -1);
  for (size_t i = 0; i < sample.size(); ++i) {
    if (sample[i].params == nullptr) continue;
    std::vector<kernels::SamplePenalty> history;
    if (sample[i].params->HasPenalties()) {
      PenaltyHistory(sample[i].prompt_token_ids, sample[i].output_token_ids, &history);
    }
    (*tokens)[i] = SampleToken(logits.subspan(i * v, v), *sample[i].params,
                               sample[i].output_position, sample[i].banned_token_ids, history);
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
      targets.push_back(
          {.sequence = seq, .logits_row = seq, .token = tokens[i], .top_n = r.num_logprobs});
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
                         .top_n = r.num_prompt_logprobs});
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
                                  std::span<const int32_t> tokens, LogitsRowFn row,
                                  std::vector<SampleLogprobs>* logprobs) {
  std::vector<LogprobTarget> targets;
  if (WantsLogprobs(sample)) {
    TANDEM_ASSIGN_OR_RETURN(std::span<const float> first, row(0));
    TANDEM_ASSIGN_OR_RETURN(
        targets, LogprobTargets(batch, sample, tokens, static_cast<int32_t>(first.size())));
  }
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
