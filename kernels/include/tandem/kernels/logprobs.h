// Log-probabilities shared by the CPU and CUDA backends (vLLM's default
// raw_logprobs: the log-softmax of the raw logits), in sampling.h's lane
// program, so the device computes them where the logits are and the host
// downloads a few numbers per row instead of the row.
//
// log Z = m + log(sum_i exp(l_i - m)), m = max l: the sum is fixed-order as
// sampling.h's (lane t adds i = t mod kSampleLanes in increasing i, then the
// binary tree), exp is SampleExp and log is LogRn below, every operation
// rounded once, so the CPU and the GPU give the same bits. A token's logprob
// is l - log Z. Its rank is 1 + the ids before it, and the top-n list is
// the n first ids, in the order "larger logit first, the lower id on ties"
// (the greedy argmax's): a strict order, so any exact method gives the same
// list. The program finds it from candidates: each lane's first id (found
// in the pass that counts the rank and takes the lanes' maxima for log Z),
// and tau, the n-th of those lanes' firsts by n block-wide rounds. Every id
// of the row's first n is tau or before it (n distinct ids are: the n
// lanes' firsts), and every such id lies in one of those n lanes, so a third
// pass over the row gathers at most n * ceil(vocab / kSampleLanes) of them,
// and n rounds over the gathered ids give the list. Past
// kLogprobCandidates gathered ids (a row built to put its top in a few
// lanes), or for n above the lanes, n rounds of "best after the last" over
// the whole row give it instead.
//
// Measured on an H200 (2026-11-30, prompt logprobs 20 over 2,048
// positions of a 128k vocabulary, PyTorch's log-softmax and topk 5.1 ms in
// the same run): one pass over the row per top-n round, 23 in all, cost
// 11.7 ms; each lane keeping its own n best in the rank's pass (sorted
// insertions in local memory, every comparison a load) 17.4 ms. This
// program reads the row three times and keeps no per-lane list; it has not
// run on a GPU yet.
#pragma once

#include <cfloat>
#include <cstdint>

#include "tandem/kernels/hd.h"
#include "tandem/kernels/sampling.h"

namespace tandem::kernels {

// One row to score: logits row `row` of the launch, the token to score,
// top_n alternatives written at top_ids / top_logprobs[top_begin, + top_n).
struct LogprobJob {
  int32_t row = 0;
  int32_t token = 0;
  int32_t top_n = 0;
  int32_t top_begin = 0;
};

struct LogprobResult {
  float logprob = 0.0f;
  int32_t rank = 0;
};

// The gathered candidates the block's shared memory holds (16 KiB).
inline constexpr int32_t kLogprobCandidates = 4096;

// The top-n's shared memory beside SampleShared: each lane's first id
// (-1 for a lane past the vocabulary), then the gathered candidates.
struct LogprobShared {
  int32_t lane_first[kSampleLanes];
  int32_t count;
  int32_t candidates[kLogprobCandidates];
};

// A slot of `count` for the calling lane (an atomic on the GPU, where the
// lanes run at once; the slots' order differs, the set does not).
TANDEM_HD inline int32_t TakeSlot(int32_t* count) {
#if defined(TANDEM_LANES_ARE_THREADS)
  return atomicAdd(count, 1);
#else
  return (*count)++;
#endif
}

// log(x) for a normal x > 0 in basic operations only (Cephes' logf: x =
// 2^e * f with f in [sqrt(1/2), sqrt(2)), a degree-8 polynomial in f - 1,
// e ln 2 split in two; relative error at most 2e-7 over [1, 2^24],
// logprobs_program_test): the same bits on every device, unlike logf.
TANDEM_HD inline float LogRn(float x) {
  const uint32_t bits = FloatBits(x);
  int32_t e = static_cast<int32_t>((bits >> 23) & 0xffu) - 126;  // x = 2^e * f, f in [0.5, 1)
  float f = BitsFloat((bits & 0x007fffffu) | 0x3f000000u);
  if (f < 0.707106781186547524f) {
    e -= 1;
    f = AddRn(AddRn(f, f), -1.0f);
  } else {
    f = AddRn(f, -1.0f);
  }
  const float z = MulRn(f, f);
  float y = 7.0376836292e-2f;
  y = AddRn(MulRn(y, f), -1.1514610310e-1f);
  y = AddRn(MulRn(y, f), 1.1676998740e-1f);
  y = AddRn(MulRn(y, f), -1.2420140846e-1f);
  y = AddRn(MulRn(y, f), 1.4249322787e-1f);
  y = AddRn(MulRn(y, f), -1.6668057665e-1f);
  y = AddRn(MulRn(y, f), 2.0000714765e-1f);
  y = AddRn(MulRn(y, f), -2.4999993993e-1f);
  y = AddRn(MulRn(y, f), 3.3333331174e-1f);
  y = MulRn(MulRn(y, f), z);
  const float fe = static_cast<float>(e);
  y = AddRn(y, MulRn(fe, -2.12194440e-4f));
  y = AddRn(y, MulRn(-0.5f, z));
  return AddRn(AddRn(f, y), MulRn(fe, 0.693359375f));
}

// log Z of logits[0, vocab) from the lanes' maxima at sh.sum's leaves
// (each lane's fold of "the larger" from -FLT_MAX); every lane gets it.
TANDEM_HD inline float LogNormalizerFromLaneMaxima(SampleShared& sh, const float* logits,
                                                   int32_t vocab) {
  ReduceLanes([&](int32_t n) {
    sh.sum[n] = sh.sum[2 * n + 1] > sh.sum[2 * n] ? sh.sum[2 * n + 1] : sh.sum[2 * n];
  });
  // Every lane reads the root before the next fold's barrier; only the last
  // reduction after it rewrites the root.
  const float m = sh.sum[1];
  FoldLanes(
      vocab, 0.0f, [&](float acc, int32_t i) { return AddRn(acc, SampleExp(AddRn(logits[i], -m))); },
      [&](int32_t t, float acc) { sh.sum[kSampleLanes + t] = acc; });
  ReduceLanes([&](int32_t n) { sh.sum[n] = AddRn(sh.sum[2 * n], sh.sum[2 * n + 1]); });
  return AddRn(m, LogRn(sh.sum[1]));  // the sum is >= 1: the top logit adds exp(0)
}

// log Z of logits[0, vocab) (see the top); every lane gets it.
TANDEM_HD inline float LogNormalizerProgram(SampleShared& sh, const float* logits, int32_t vocab) {
  FoldLanes(
      vocab, -FLT_MAX, [&](float acc, int32_t i) { return logits[i] > acc ? logits[i] : acc; },
      [&](int32_t t, float acc) { sh.sum[kSampleLanes + t] = acc; });
  return LogNormalizerFromLaneMaxima(sh, logits, vocab);
}

// Whether id a (logit la) comes before id b (logit lb): the larger logit,
// the lower id on ties.
TANDEM_HD inline bool LogprobBefore(float la, int32_t a, float lb, int32_t b) {
  return la > lb || (la == lb && a < b);
}
TANDEM_HD inline bool LogprobBefore(const float* logits, int32_t a, int32_t b) {
  return LogprobBefore(logits[a], a, logits[b], b);
}

// sh.index[1] = the first of the lanes' ids at sh.index[kSampleLanes + t]
// (-1: none).
TANDEM_HD inline void ReduceBestId(SampleShared& sh, const float* logits) {
  ReduceLanes([&](int32_t node) {
    const int32_t l = sh.index[2 * node], r = sh.index[2 * node + 1];
    sh.index[node] = r >= 0 && (l < 0 || LogprobBefore(logits, r, l)) ? r : l;
  });
}

// n rounds of "the first id after round k - 1's" among id_of(j) for j in
// [0, count) (-1: no id; at least n others): the n-th id, which every lane
// gets, and the n ids and their logprobs at top_ids / top_logprobs unless
// top_ids is null.
template <typename IdOf>
TANDEM_HD inline int32_t TopRounds(SampleShared& sh, const float* logits, int32_t count,
                                   const IdOf& id_of, int32_t n, float log_z, int32_t* top_ids,
                                   float* top_logprobs) {
  int32_t last = -1;
  for (int32_t k = 0; k < n; ++k) {
    FoldLanes(
        count, int32_t{-1},
        [&](int32_t best, int32_t j) {
          const int32_t c = id_of(j);
          const bool eligible = c >= 0 && (last < 0 || LogprobBefore(logits, last, c));
          return eligible && (best < 0 || LogprobBefore(logits, c, best)) ? c : best;
        },
        [&](int32_t t, int32_t best) { sh.index[kSampleLanes + t] = best; });
    ReduceBestId(sh, logits);
    last = sh.index[1];
    if (top_ids == nullptr) continue;
    ForSampleLanes(1, [&](int32_t) {
      top_ids[k] = last;
      top_logprobs[k] = AddRn(logits[last], -log_z);
    });
  }
  return last;
}

// One lane's share of the first pass: the largest logit (LogNormalizerProgram's
// fold), its first id, and how many of its ids come before the token.
struct LaneScan {
  float max;
  float first_logit;
  int32_t first;
  int32_t before;
};

// One job over logits[0, vocab): its result, and its top_n ids and logprobs
// at top_ids / top_logprobs (already offset to the job's top_begin). Every
// lane calls it with the block's shared memory.
TANDEM_HD inline void LogprobRowProgram(SampleShared& sh, LogprobShared& ls, const float* logits,
                                        int32_t vocab, const LogprobJob& job, LogprobResult* result,
                                        int32_t* top_ids, float* top_logprobs) {
  const float token_logit = logits[job.token];
  // Pass one.
  FoldLanes(
      vocab, LaneScan{.max = -FLT_MAX, .first_logit = 0.0f, .first = -1, .before = 0},
      [&](LaneScan s, int32_t i) {
        const float l = logits[i];
        s.max = l > s.max ? l : s.max;
        if (s.first < 0 || LogprobBefore(l, i, s.first_logit, s.first)) {
          s.first = i;
          s.first_logit = l;
        }
        s.before += LogprobBefore(l, i, token_logit, job.token) ? 1 : 0;
        return s;
      },
      [&](int32_t t, const LaneScan& s) {
        sh.sum[kSampleLanes + t] = s.max;
        sh.index[kSampleLanes + t] = s.before;
        ls.lane_first[t] = s.first;
      });
  ReduceLanes([&](int32_t node) { sh.index[node] = sh.index[2 * node] + sh.index[2 * node + 1]; });
  // Every lane reads the count before the next write to sh.index's root,
  // which comes after LogNormalizerFromLaneMaxima's barriers.
  const int32_t before = sh.index[1];
  const float log_z = LogNormalizerFromLaneMaxima(sh, logits, vocab);  // pass two
  ForSampleLanes(1, [&](int32_t) {
    *result = LogprobResult{.logprob = AddRn(token_logit, -log_z), .rank = 1 + before};
  });
  const int32_t n = job.top_n < vocab ? job.top_n : vocab;
  if (n <= 0) return;
  const int32_t lanes = vocab < kSampleLanes ? vocab : kSampleLanes;  // those with an id
  auto every_id = [](int32_t j) { return j; };
  if (n > lanes) {
    TopRounds(sh, logits, vocab, every_id, n, log_z, top_ids, top_logprobs);
    return;
  }
  // tau: the n-th of the lanes' first ids.
  const int32_t tau = TopRounds(
      sh, logits, kSampleLanes, [&](int32_t j) { return ls.lane_first[j]; }, n, log_z, nullptr,
      nullptr);
  const float tau_logit = logits[tau];
  // Pass three: the ids at or before tau.
  ForSampleLanes(1, [&](int32_t) { ls.count = 0; });
  ForSampleLanes(kSampleLanes, [&](int32_t t) {
    for (int32_t i = t; i < vocab; i += kSampleLanes) {
      if (i != tau && !LogprobBefore(logits[i], i, tau_logit, tau)) continue;
      const int32_t slot = TakeSlot(&ls.count);
      if (slot < kLogprobCandidates) ls.candidates[slot] = i;
    }
  });
  const int32_t count = ls.count;
  if (count > kLogprobCandidates) {
    TopRounds(sh, logits, vocab, every_id, n, log_z, top_ids, top_logprobs);
    return;
  }
  TopRounds(
      sh, logits, count, [&](int32_t j) { return ls.candidates[j]; }, n, log_z, top_ids,
      top_logprobs);
}

}  // namespace tandem::kernels
