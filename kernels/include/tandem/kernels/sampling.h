// Token sampling shared by the CPU and CUDA backends: greedy, temperature,
// min-p, top-k and top-p, with a counter-based generator keyed by (seed,
// output position) so a seeded request samples the same tokens in any batch.
// The filters apply in vLLM's order and semantics (its MinP logits processor,
// then apply_top_k_top_p): after temperature, min-p drops the tokens whose
// probability is below min_p times the top token's; top-k keeps the k most
// likely of the rest; top-p keeps the fewest most likely tokens whose mass,
// renormalized over what min-p and top-k kept, reaches top_p.
#pragma once

#include <cmath>
#include <cstdint>

#include "tandem/kernels/hd.h"

namespace tandem::kernels {

struct SampleArgs {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest index on ties)
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
  int32_t position = 0;  // output position of the token being sampled
};

TANDEM_HD inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1), a pure function of (seed, position).
TANDEM_HD inline float CounterUniform(uint64_t seed, int32_t position) {
  const uint64_t h =
      SplitMix64(SplitMix64(seed) ^
                 (static_cast<uint64_t>(static_cast<uint32_t>(position)) * 0xD6E8FEB86659FD93ull));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

TANDEM_HD inline int32_t ArgMax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// True when token a ranks before token b: higher probability, then lower id.
TANDEM_HD inline bool RanksBefore(const float* p, int32_t a, int32_t b) {
  return p[a] > p[b] || (p[a] == p[b] && a < b);
}

// Heap sort of idx[0..n) by RanksBefore (a total order: any sort agrees).
TANDEM_HD inline void SortByRank(const float* p, int32_t* idx, int32_t n) {
  auto sift = [&](int32_t root, int32_t end) {
    while (true) {
      int32_t child = 2 * root + 1;
      if (child >= end) return;
      // Max-heap of "ranks last" so the array ends up in rank order.
      if (child + 1 < end && RanksBefore(p, idx[child], idx[child + 1])) ++child;
      if (!RanksBefore(p, idx[root], idx[child])) return;
      const int32_t tmp = idx[root];
      idx[root] = idx[child];
      idx[child] = tmp;
      root = child;
    }
  };
  for (int32_t i = n / 2 - 1; i >= 0; --i) sift(i, n);
  for (int32_t end = n - 1; end > 0; --end) {
    const int32_t tmp = idx[0];
    idx[0] = idx[end];
    idx[end] = tmp;
    sift(0, end);
  }
}

// Samples one token from `logits`. Scratch: probs[vocab], idx[vocab].
TANDEM_HD inline int32_t SampleRow(const float* logits, int32_t vocab, const SampleArgs& a,
                                   float* probs, int32_t* idx) {
  if (a.temperature == 0.0f) return ArgMax(logits, vocab);
  const int32_t top = ArgMax(logits, vocab);
  const float max_val = logits[top] / a.temperature;
  float sum = 0.0f;
  for (int32_t i = 0; i < vocab; ++i) {
    probs[i] = expf(logits[i] / a.temperature - max_val);
    sum += probs[i];
  }
  for (int32_t i = 0; i < vocab; ++i) probs[i] /= sum;
  const float u = CounterUniform(a.seed, a.position);
  const bool filter = (a.top_k > 0 && a.top_k < vocab) || a.top_p < 1.0f || a.min_p > 0.0f;
  if (!filter) {
    float cdf = 0.0f;
    for (int32_t i = 0; i < vocab; ++i) {
      cdf += probs[i];
      if (u < cdf) return i;
    }
    return vocab - 1;  // rounding: u beyond the summed mass
  }
  for (int32_t i = 0; i < vocab; ++i) idx[i] = i;
  SortByRank(probs, idx, vocab);
  int32_t n = vocab;
  if (a.min_p > 0.0f) {  // the kept tokens are a prefix of the ranking
    const float threshold = a.min_p * probs[idx[0]];
    int32_t keep = 1;
    while (keep < n && probs[idx[keep]] >= threshold) ++keep;
    n = keep;
  }
  if (a.top_k > 0 && a.top_k < n) n = a.top_k;
  float mass = 0.0f;
  for (int32_t i = 0; i < n; ++i) mass += probs[idx[i]];
  if (a.top_p < 1.0f) {
    const float target = a.top_p * mass;
    float cum = 0.0f;
    for (int32_t i = 0; i < n; ++i) {
      cum += probs[idx[i]];
      if (cum >= target) {
        n = i + 1;
        mass = cum;
        break;
      }
    }
  }
  const float r = u * mass;
  float cdf = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    cdf += probs[idx[i]];
    if (r < cdf) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace tandem::kernels
