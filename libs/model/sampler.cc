#include "tandem/model/sampler.h"

#include <vector>

#include "tandem/kernels/sampling.h"

namespace tandem::model {

int32_t SampleToken(std::span<const float> logits, const SamplingParams& params,
                    int32_t output_position) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const kernels::SampleArgs args{.temperature = params.temperature,
                                 .top_k = params.top_k,
                                 .top_p = params.top_p,
                                 .min_p = params.min_p,
                                 .seed = params.seed,
                                 .position = output_position};
  if (args.temperature == 0.0f) return kernels::ArgMax(logits.data(), vocab);
  thread_local std::vector<float> probs;
  thread_local std::vector<int32_t> idx;
  probs.resize(logits.size());
  idx.resize(logits.size());
  return kernels::SampleRow(logits.data(), vocab, args, probs.data(), idx.data());
}

void SampleRows(std::span<const float> logits, int32_t vocab,
                std::span<const SampleRequest> sample, std::vector<int32_t>* tokens) {
  const size_t v = static_cast<size_t>(vocab);
  tokens->assign(sample.size(), -1);
  for (size_t i = 0; i < sample.size(); ++i) {
    if (sample[i].params == nullptr) continue;
    (*tokens)[i] = SampleToken(logits.subspan(i * v, v), *sample[i].params,
                               sample[i].output_position);
  }
}

}  // namespace tandem::model
