// Token sampling shared by the CPU and CUDA backends: greedy, temperature,
// min-p, top-k and top-p, with a counter-based generator keyed by (seed,
// output position) so a seeded request samples the same tokens in any batch.
//
// One program (SampleRowProgram) serves both: a CUDA block of kSampleLanes
// threads runs it on the GPU, and the CPU runs the same phases one lane
// after another (ForSampleLanes). Every floating-point operation is an
// explicitly rounded add, multiply or divide, and exp is our own polynomial
// (SampleExp), so both give the same bits and the same token.
//
// What is drawn (vLLM's filters, in its order: its MinP logits processor,
// then apply_top_k_top_p; each filter is a threshold on the value, so ties
// with the last kept token stay, as in vLLM's top-k):
//  - logit_bias and vLLM's penalties on the logits (Penalize), then s_i = logit_i /
//    temperature; banned ids, with an allowed list every id not on it,
//    and with a token mask every id it does not allow, count as -inf;
//    m = max s;
//    e_i = exp(s_i - m), so the top token has e = 1.
//  - min-p keeps e_i >= min_p (its share of the top token's probability);
//  - top-k keeps e_i >= the k-th largest e of what min-p kept;
//  - top-p keeps e_i >= v for the largest v whose kept mass reaches
//    top_p times the mass min-p and top-k kept (renormalized, as vLLM);
//  - the token: r = u * (kept mass), found by descending the tree of lane
//    sums, then walking the lane's kept tokens.
// Sums are fixed-order: lane t adds the kept e_i with i = t (mod
// kSampleLanes) in increasing i, then a binary tree adds neighbouring lanes.
// Nothing sorts the vocabulary: each threshold is a bisection over the
// float's bits with one counting or summing pass per step.
#pragma once

#include <cfloat>
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
  // For a batch launch (cuda::Sample): the row of logits this draws from,
  // and its banned ids, banned[banned_begin, banned_begin + num_banned) of
  // the launch's list (their logits count as -inf).
  int32_t row = 0;
  int32_t banned_begin = 0;
  int32_t num_banned = 0;
  // vLLM's allowed_token_ids: when num_allowed > 0, the num_allowed ids
  // that follow the row's banned ids in the list are the only ones drawn
  // (every other logit counts as -inf).
  int32_t num_allowed = 0;
  // A token mask (structured outputs; vLLM's bitmask): when
  // num_mask_words > 0, the words that follow the allowed ids in the list
  // hold one bit per id (bit id % 32 of word id / 32, as uint32_t), and an
  // id whose bit is clear, or past the words, counts as -inf. A grammar
  // that allows a few ids of a 128k vocabulary bans the rest in 4,008
  // words instead of a list of 128k ids.
  int32_t num_mask_words = 0;
  // vLLM's penalties (SamplingParams in tandem/common/sampling_params.h),
  // over the row's history, and its logit_bias: penalties[penalty_begin,
  // + num_penalties) of the launch's list, each token id once.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t penalty_begin = 0;
  int32_t num_penalties = 0;
};

// A token whose logit the program rewrites (SampleArgs' penalties): one of
// the row's history, or of its logit_bias, or both.
struct SamplePenalty {
  int32_t id;
  // Times it is in the output; 0: in the prompt only; -1: not in the
  // history (a logit_bias entry alone), so no penalty applies.
  int32_t output_count;
  float bias = 0.0f;  // logit_bias, added first
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

// Single rounding, never fused into a multiply-add: nvcc contracts a * b + c
// unless told not to, and the host side is built with -ffp-contract=off.
TANDEM_HD inline float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TANDEM_HD inline float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TANDEM_HD inline float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// A float's bits and back (which order non-negative floats as their values).
#if defined(__CUDA_ARCH__)
TANDEM_HD inline uint32_t FloatBits(float f) { return __float_as_uint(f); }
TANDEM_HD inline float BitsFloat(uint32_t u) { return __uint_as_float(u); }
#else
TANDEM_HD inline uint32_t FloatBits(float f) { return __builtin_bit_cast(uint32_t, f); }
TANDEM_HD inline float BitsFloat(uint32_t u) { return __builtin_bit_cast(float, u); }
#endif

// exp(x) for x <= 0 in basic operations only (Cephes' expf: Cody-Waite
// reduction by ln 2, a degree-7 polynomial; relative error at most 8e-8
// over [-86, 0], sampling_program_test):
// the same bits on every device, unlike expf. exp(0) is exactly 1; below
// -86 it is 0 (the smallest e that can change a sum next to the top
// token's 1 is about e^-17).
TANDEM_HD inline float SampleExp(float x_in) {
  const bool tiny = !(x_in > -86.0f);  // also -inf and NaN; no branch, so it vectorizes
  const float x = tiny ? -86.0f : x_in;
  // k = round(x / ln 2), as -floor(0.5 - x log2 e): the truncation of a
  // positive float is its floor on every device.
  const int32_t k = -static_cast<int32_t>(AddRn(0.5f, -MulRn(x, 1.44269504088896341f)));
  const float kf = static_cast<float>(k);
  float r = AddRn(x, -MulRn(kf, 0.693359375f));  // exact: ln 2's first 9 bits
  r = AddRn(r, MulRn(kf, 2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = AddRn(MulRn(p, r), 1.3981999507e-3f);
  p = AddRn(MulRn(p, r), 8.3334519073e-3f);
  p = AddRn(MulRn(p, r), 4.1665795894e-2f);
  p = AddRn(MulRn(p, r), 1.6666665459e-1f);
  p = AddRn(MulRn(p, r), 5.0000001201e-1f);
  const float y = AddRn(AddRn(MulRn(p, MulRn(r, r)), r), 1.0f);
  // 2^k with k >= -125: a normal float.
  const float result = MulRn(y, BitsFloat(static_cast<uint32_t>(k + 127) << 23));
  return tiny ? 0.0f : result;
}

// A logit after vLLM's logit bias and then its apply_penalties: the bias is
// added; for a token of the prompt or the output, repetition next (divides
// a positive logit, multiplies another), then frequency times the output
// count and presence are subtracted.
TANDEM_HD inline float Penalize(float logit, const SamplePenalty& p, const SampleArgs& a) {
  float l = p.bias != 0.0f ? AddRn(logit, p.bias) : logit;
  if (p.output_count < 0) return l;
  l = l > 0.0f ? DivRn(l, a.repetition_penalty) : MulRn(l, a.repetition_penalty);
  if (p.output_count > 0) {
    l = AddRn(l, -MulRn(a.frequency_penalty, static_cast<float>(p.output_count)));
    l = AddRn(l, -a.presence_penalty);
  }
  return l;
}

inline constexpr int32_t kSampleLanes = 1024;

// The lanes are a block's threads on the GPU, and in the CPU emulator of
// thread blocks (tests/kernels/simt), which runs the GPU's branches below;
// the CPU backend runs them one after another.
#if defined(__CUDA_ARCH__) || defined(TANDEM_SIMT)
#define TANDEM_LANES_ARE_THREADS 1
#endif

// The block's shared memory: heap-ordered trees over the lanes (leaf t at
// kSampleLanes + t, node n = 2n + 2n+1, the root at 1).
struct SampleShared {
  float sum[2 * kSampleLanes];
  int32_t index[2 * kSampleLanes];
  int32_t token;
};

// f(t) for every lane t < n, then a barrier. On the GPU lane t is thread t
// of a kSampleLanes-thread block; on the CPU the lanes run in turn.
template <typename F>
TANDEM_HD inline void ForSampleLanes(int32_t n, const F& f) {
#if defined(TANDEM_LANES_ARE_THREADS)
  if (static_cast<int32_t>(threadIdx.x) < n) f(static_cast<int32_t>(threadIdx.x));
  __syncthreads();
#else
  for (int32_t t = 0; t < n; ++t) f(t);
#endif
}

// f(i) for every i < n: element-wise work, in any order (on the CPU in
// increasing i), then a barrier.
template <typename F>
TANDEM_HD inline void ForSampleElements(int32_t n, const F& f) {
#if defined(TANDEM_LANES_ARE_THREADS)
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < n; i += kSampleLanes) f(i);
  __syncthreads();
#else
  for (int32_t i = 0; i < n; ++i) f(i);
#endif
}

// store(t, acc) with acc the fold acc = f(acc, i) over i = t (mod
// kSampleLanes), i < n, in increasing i, from `init`. The CPU walks the
// same sequence per lane a row of lanes at a time (contiguous, so the loop
// vectorizes).
template <typename T, typename F, typename Store>
TANDEM_HD inline void FoldLanes(int32_t n, T init, const F& f, const Store& store) {
#if defined(TANDEM_LANES_ARE_THREADS)
  ForSampleLanes(kSampleLanes, [&](int32_t t) {
    T acc = init;
    for (int32_t i = t; i < n; i += kSampleLanes) acc = f(acc, i);
    store(t, acc);
  });
#else
  T acc[kSampleLanes];
  for (int32_t t = 0; t < kSampleLanes; ++t) acc[t] = init;
  for (int32_t base = 0; base < n; base += kSampleLanes) {
    const int32_t m = n - base < kSampleLanes ? n - base : kSampleLanes;
    for (int32_t t = 0; t < m; ++t) acc[t] = f(acc[t], base + t);
  }
  for (int32_t t = 0; t < kSampleLanes; ++t) store(t, acc[t]);
#endif
}

// Fills the tree's inner nodes from its leaves, a level per phase:
// node(n) computes node n from nodes 2n and 2n + 1.
template <typename F>
TANDEM_HD inline void ReduceLanes(const F& node) {
  for (int32_t s = kSampleLanes / 2; s >= 1; s /= 2) {
    ForSampleLanes(s, [&](int32_t t) { node(s + t); });
  }
}

// The kept mass at threshold v: the fixed-order sum of e_i >= v. Leaves the
// whole tree in sh.sum.
TANDEM_HD inline float SampleMass(SampleShared& sh, const float* e, int32_t vocab, float v) {
  FoldLanes(
      vocab, 0.0f, [&](float acc, int32_t i) { return AddRn(acc, e[i] >= v ? e[i] : 0.0f); },
      [&](int32_t t, float acc) { sh.sum[kSampleLanes + t] = acc; });
  ReduceLanes([&](int32_t n) { sh.sum[n] = AddRn(sh.sum[2 * n], sh.sum[2 * n + 1]); });
  return sh.sum[1];
}

// How many e_i >= v.
TANDEM_HD inline int32_t SampleCount(SampleShared& sh, const float* e, int32_t vocab, float v) {
  FoldLanes(
      vocab, int32_t{0}, [&](int32_t acc, int32_t i) { return acc + (e[i] >= v ? 1 : 0); },
      [&](int32_t t, int32_t acc) { sh.index[kSampleLanes + t] = acc; });
  ReduceLanes([&](int32_t n) { sh.index[n] = sh.index[2 * n] + sh.index[2 * n + 1]; });
  return sh.index[1];
}

// The largest v in [lo, 1] with keep(v), given keep(lo) and keep falling as
// v grows: a bisection over the bits, which order non-negative floats.
template <typename Keep>
TANDEM_HD inline float LargestKept(float lo_value, const Keep& keep) {
  uint32_t lo = FloatBits(lo_value), hi = FloatBits(1.0f);
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo + 1) / 2;
    if (keep(BitsFloat(mid))) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return BitsFloat(lo);
}

// Samples one token from logits[0, vocab) (see the top of this file);
// banned[0, num_banned) count as -inf, and with num_allowed > 0 so does
// every id not in banned[num_banned, num_banned + num_allowed), and with
// num_mask_words > 0 every id the mask after them does not allow;
// penalties[0, num_penalties) are the row's history. Scratch: e[vocab].
// Every lane (GPU thread) calls it and gets the token.
TANDEM_HD inline int32_t SampleRowProgram(SampleShared& sh, const float* logits, int32_t vocab,
                                          const SampleArgs& a, const int32_t* banned,
                                          const SamplePenalty* penalties, float* e) {
  const bool greedy = a.temperature == 0.0f;
  // An allowed list marks its ids in e (0, every other -inf), and the first
  // pass below reads the mark before it writes the id's value: no list of
  // the row's ids is sorted or searched.
  const bool masked = a.num_allowed > 0;
  if (masked) {
    ForSampleElements(vocab, [&](int32_t i) { e[i] = -INFINITY; });
    ForSampleElements(a.num_allowed, [&](int32_t j) {  // an id twice: two equal writes
      const int32_t id = banned[a.num_banned + j];
      if (id >= 0 && id < vocab) e[id] = 0.0f;
    });
  }
  // The token mask's words (num_mask_words > 0) follow the allowed ids;
  // an id past them is not allowed.
  const int32_t* mask = a.num_mask_words > 0 ? banned + a.num_banned + a.num_allowed : nullptr;
  const auto mask_bans = [&](int32_t i) {
    return mask != nullptr && ((i >> 5) >= a.num_mask_words ||
                               (static_cast<uint32_t>(mask[i >> 5]) >> (i & 31) & 1u) == 0);
  };
  auto logit = [&](int32_t i) {
    return (masked && e[i] != 0.0f) || mask_bans(i) ? -INFINITY : logits[i];
  };
  if (a.num_penalties == 0) {
    ForSampleElements(
        vocab, [&](int32_t i) { e[i] = greedy ? logit(i) : DivRn(logit(i), a.temperature); });
  } else {
    ForSampleElements(vocab, [&](int32_t i) { e[i] = logit(i); });
    ForSampleElements(a.num_penalties, [&](int32_t j) {  // each id once: no two lanes meet
      const SamplePenalty p = penalties[j];
      if (p.id >= 0 && p.id < vocab) e[p.id] = Penalize(e[p.id], p, a);
    });
    if (!greedy) ForSampleElements(vocab, [&](int32_t i) { e[i] = DivRn(e[i], a.temperature); });
  }
  if (a.num_banned > 0) {
    ForSampleElements(a.num_banned, [&](int32_t j) {
      if (banned[j] >= 0 && banned[j] < vocab) e[banned[j]] = -INFINITY;
    });
  }
  // The largest s, the lowest index on ties (kernels::ArgMax; all -inf: 0).
  struct Best {
    float value;
    int32_t index;
  };
  FoldLanes(
      vocab, Best{-FLT_MAX, INT32_MAX},
      [&](Best b, int32_t i) {
        return e[i] > b.value ? Best{e[i], i} : b;
      },
      [&](int32_t t, Best b) {
        sh.sum[kSampleLanes + t] = b.value;
        sh.index[kSampleLanes + t] = b.index;
      });
  ReduceLanes([&](int32_t n) {
    const int32_t l = 2 * n, r = 2 * n + 1;
    const bool right =
        sh.sum[r] > sh.sum[l] || (sh.sum[r] == sh.sum[l] && sh.index[r] < sh.index[l]);
    sh.sum[n] = sh.sum[right ? r : l];
    sh.index[n] = sh.index[right ? r : l];
  });
  const float m = sh.sum[1];
  const int32_t top = sh.index[1] == INT32_MAX ? 0 : sh.index[1];
  if (greedy) return top;
  ForSampleElements(vocab, [&](int32_t i) { e[i] = SampleExp(AddRn(e[i], -m)); });
  float v = 0.0f;  // keep e_i >= v
  if (a.min_p > 0.0f) v = a.min_p;
  if (a.top_k > 0 && a.top_k < vocab && SampleCount(sh, e, vocab, v) > a.top_k) {
    v = LargestKept(v, [&](float x) { return SampleCount(sh, e, vocab, x) >= a.top_k; });
  }
  if (a.top_p < 1.0f) {
    const float target = MulRn(a.top_p, SampleMass(sh, e, vocab, v));
    v = LargestKept(v, [&](float x) { return SampleMass(sh, e, vocab, x) >= target; });
  }
  const float mass = SampleMass(sh, e, vocab, v);
  if (!(mass > 0.0f)) return top;
  const float u = CounterUniform(a.seed, a.position);
  ForSampleLanes(1, [&](int32_t) {
    float r = MulRn(u, mass);
    int32_t n = 1;
    while (n < kSampleLanes) {  // into a child with mass, r within it
      const float left = sh.sum[2 * n];
      if (r < left || !(sh.sum[2 * n + 1] > 0.0f)) {
        n = 2 * n;
      } else {
        r = AddRn(r, -left);
        n = 2 * n + 1;
      }
    }
    // The lane's kept tokens in its summing order; rounding past its mass
    // takes its last token with mass.
    float cum = 0.0f;
    int32_t token = -1;
    for (int32_t i = n - kSampleLanes; i < vocab; i += kSampleLanes) {
      if (!(e[i] >= v)) continue;
      cum = AddRn(cum, e[i]);
      if (e[i] > 0.0f) token = i;
      if (r < cum) break;
    }
    sh.token = token < 0 ? top : token;
  });
  return sh.token;
}

}  // namespace tandem::kernels
