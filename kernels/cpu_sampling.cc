// cpu::SampleRow and cpu::Sample: sampling.h's program run lane after lane;
// cpu::LogNormalizer and cpu::Logprobs: logprobs.h's.
// Built at -O3 without trapping math (kernels/CMakeLists.txt), so that the
// lanes' folds and SampleExp vectorize; neither changes a result (no
// contraction, no fast-math: each operation still rounds once).
#include <vector>

#include "tandem/kernels/cpu_ops.h"
#include "tandem/kernels/logprobs.h"
#include "tandem/kernels/sampling.h"

namespace tandem::kernels::cpu {

int32_t SampleRow(const float* logits, int32_t vocab, const SampleArgs& args, const int32_t* banned,
                  const SamplePenalty* penalties) {
  thread_local std::vector<float> e;
  thread_local SampleShared shared;
  e.resize(static_cast<size_t>(vocab));
  return SampleRowProgram(shared, logits, vocab, args, banned, penalties, e.data());
}

void Sample(const float* logits, int32_t rows, int32_t vocab, const SampleArgs* args,
            const int32_t* banned, const SamplePenalty* penalties, int32_t* out_tokens) {
  for (int32_t r = 0; r < rows; ++r) {
    const SampleArgs& a = args[r];
    out_tokens[r] = SampleRow(logits + int64_t{a.row} * vocab, vocab, a,
                              banned == nullptr ? nullptr : banned + a.banned_begin,
                              penalties == nullptr ? nullptr : penalties + a.penalty_begin);
  }
}

float LogNormalizer(const float* logits, int32_t vocab) {
  thread_local SampleShared shared;
  return LogNormalizerProgram(shared, logits, vocab);
}

namespace {
LogprobShared& ThreadLogprobShared() {
  thread_local LogprobShared top;
  return top;
}
}  // namespace

int32_t LogprobCandidatesOfLastJob() { return ThreadLogprobShared().count; }

void Logprobs(const float* logits, int32_t vocab, const LogprobJob* jobs, int32_t n,
              LogprobResult* results, int32_t* top_ids, float* top_logprobs) {
  thread_local SampleShared shared;
  LogprobShared& top = ThreadLogprobShared();
  for (int32_t j = 0; j < n; ++j) {
    const LogprobJob& job = jobs[j];
    top.count = 0;
    LogprobRowProgram(shared, top, logits + int64_t{job.row} * vocab, vocab, job, &results[j],
                      top_ids + job.top_begin, top_logprobs + job.top_begin);
  }
}

}  // namespace tandem::kernels::cpu
