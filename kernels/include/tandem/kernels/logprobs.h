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
// list. For n up to kLaneTopN (vLLM's default --max-logprobs is 20) each
// lane keeps its own n best in the pass that counts the rank, and n rounds
// of a block-wide "best of the lanes' next" merge them, reading no more of
// the row. A larger n takes n rounds of a block-wide "best after the last",
// each a pass over the row. (On an H200 the rounds made prompt logprobs 20
// over 2,048 positions of a 128k vocabulary cost 11.7 ms, PyTorch's log-
// softmax and topk 6.2 ms: 23 passes over each row against 3 now.)
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

// The largest top-n a lane's own list serves (see the top).
inline constexpr int32_t kLaneTopN = 32;

// One lane's best ids of its share of the row, best first, and how many of
// them the merge has taken. A CUDA thread holds its own (LogprobLanes(1));
// the CPU, which runs the lanes in turn, kSampleLanes of them.
struct LaneTop {
  int32_t size;
  int32_t head;
  int32_t ids[kLaneTopN];
};

TANDEM_HD inline LaneTop& LaneTopOf(LaneTop* lanes, int32_t t) {
#if defined(__CUDA_ARCH__)
  (void)t;
  return lanes[0];
#else
  return lanes[t];
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

// log Z of logits[0, vocab) (see the top); every lane gets it.
TANDEM_HD inline float LogNormalizerProgram(SampleShared& sh, const float* logits, int32_t vocab) {
  FoldLanes(
      vocab, -FLT_MAX, [&](float acc, int32_t i) { return logits[i] > acc ? logits[i] : acc; },
      [&](int32_t t, float acc) { sh.sum[kSampleLanes + t] = acc; });
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

// Whether id a comes before id b: the larger logit, the lower id on ties.
TANDEM_HD inline bool LogprobBefore(const float* logits, int32_t a, int32_t b) {
  return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

// sh.index[1] = the first of the lanes' ids at sh.index[kSampleLanes + t]
// (-1: none).
TANDEM_HD inline void ReduceBestId(SampleShared& sh, const float* logits) {
  ReduceLanes([&](int32_t node) {
    const int32_t l = sh.index[2 * node], r = sh.index[2 * node + 1];
    sh.index[node] = r >= 0 && (l < 0 || LogprobBefore(logits, r, l)) ? r : l;
  });
}

// The top_n ids by n rounds of "the first id after round k - 1's" over the
// whole row (any n).
TANDEM_HD inline void TopByRounds(SampleShared& sh, const float* logits, int32_t vocab, int32_t n,
                                  float log_z, int32_t* top_ids, float* top_logprobs) {
  int32_t last = -1;
  for (int32_t k = 0; k < n; ++k) {
    FoldLanes(
        vocab, int32_t{-1},
        [&](int32_t best, int32_t i) {
          const bool eligible = last < 0 || LogprobBefore(logits, last, i);
          return eligible && (best < 0 || LogprobBefore(logits, i, best)) ? i : best;
        },
        [&](int32_t t, int32_t best) { sh.index[kSampleLanes + t] = best; });
    ReduceBestId(sh, logits);
    last = sh.index[1];
    ForSampleLanes(1, [&](int32_t) {
      top_ids[k] = last;
      top_logprobs[k] = AddRn(logits[last], -log_z);
    });
  }
}

// One job over logits[0, vocab): its result, and its top_n ids and logprobs
// at top_ids / top_logprobs (already offset to the job's top_begin). Every
// lane calls it; `lanes` is kSampleLanes LaneTops on the CPU,
// the thread's own one on the GPU.
TANDEM_HD inline void LogprobRowProgram(SampleShared& sh, const float* logits, int32_t vocab,
                                        const LogprobJob& job, LogprobResult* result,
                                        int32_t* top_ids, float* top_logprobs, LaneTop* lanes) {
  const float log_z = LogNormalizerProgram(sh, logits, vocab);
  const int32_t n = job.top_n < vocab ? job.top_n : vocab;
  const bool lane_lists = n <= kLaneTopN;
  // The rank's count, and (for a small n) each lane's n best of its ids,
  // which come in increasing order: a later id goes after an equal logit.
  ForSampleLanes(kSampleLanes, [&](int32_t t) {
    LaneTop& mine = LaneTopOf(lanes, t);
    mine.size = 0;
    mine.head = 0;
    int32_t before = 0;
    for (int32_t i = t; i < vocab; i += kSampleLanes) {
      before += LogprobBefore(logits, i, job.token) ? 1 : 0;
      if (!lane_lists || n == 0) continue;
      if (mine.size == n && !LogprobBefore(logits, i, mine.ids[n - 1])) continue;
      int32_t j = mine.size < n ? mine.size++ : n - 1;
      for (; j > 0 && LogprobBefore(logits, i, mine.ids[j - 1]); --j) mine.ids[j] = mine.ids[j - 1];
      mine.ids[j] = i;
    }
    sh.index[kSampleLanes + t] = before;
  });
  ReduceLanes([&](int32_t node) { sh.index[node] = sh.index[2 * node] + sh.index[2 * node + 1]; });
  ForSampleLanes(1, [&](int32_t) {
    *result = LogprobResult{.logprob = AddRn(logits[job.token], -log_z), .rank = 1 + sh.index[1]};
  });
  if (!lane_lists) {
    TopByRounds(sh, logits, vocab, n, log_z, top_ids, top_logprobs);
    return;
  }
  // Round k: each lane offers its first id not yet taken; the block's best
  // is the k-th of the row (every id of the row's first n is among its
  // lane's first n).
  int32_t last = -1;
  for (int32_t k = 0; k < n; ++k) {
    ForSampleLanes(kSampleLanes, [&](int32_t t) {
      LaneTop& mine = LaneTopOf(lanes, t);
      if (mine.head < mine.size && mine.ids[mine.head] == last) ++mine.head;
      sh.index[kSampleLanes + t] = mine.head < mine.size ? mine.ids[mine.head] : -1;
    });
    ReduceBestId(sh, logits);
    last = sh.index[1];
    ForSampleLanes(1, [&](int32_t) {
      top_ids[k] = last;
      top_logprobs[k] = AddRn(logits[last], -log_z);
    });
  }
}

}  // namespace tandem::kernels
