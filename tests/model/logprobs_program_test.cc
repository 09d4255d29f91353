// kernels/logprobs.h's program, which the CUDA runner runs on the device:
// its log against the C library's in double, its log Z against a long
// double log-sum-exp, and the whole program run lane by lane on the CPU
// (cpu::Logprobs: the ids at or before the n-th of the lanes' first ids
// gathered and ranked, block-wide rounds over the row past
// kLogprobCandidates of them or for n above the lanes, a count for the rank)
// against ComputeLogprobs, which selects with std::partial_sort and
// counts directly: the same ids, ranks and bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/kernels/cpu_ops.h"
#include "tandem/kernels/logprobs.h"
#include "tandem/kernels/sampling.h"
#include "tandem/model/sampler.h"

namespace tandem::model {
namespace {

using kernels::LogprobJob;
using kernels::LogprobResult;

TEST(LogprobsProgramTest, LogRnIsTheLogWithinTwoUlps) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::vector<float> xs = {1.0f, 1.0000001f, 1.4142135f, 1.4142137f, 2.0f, 3.0f, 128256.0f,
                           16777216.0f};
  for (int i = 0; i < 200000; ++i) xs.push_back(std::ldexp(mant(rng), static_cast<int>(rng() % 24)));
  double worst = 0;
  for (float x : xs) {
    const double want = std::log(static_cast<double>(x));
    const float got = kernels::LogRn(x);
    // In units of the result's last place (at least 2^-24 near 1, where
    // log x is tiny but x - 1 carries only float's precision).
    const double ulp = std::max(std::ldexp(1.0, std::ilogb(std::max(want, 1e-30)) - 23),
                                std::ldexp(1.0, -24));
    worst = std::max(worst, std::fabs(got - want) / ulp);
  }
  EXPECT_LE(worst, 2.0) << "ulps";
}

// log Z in long double, independently of the program.
long double ReferenceLogZ(const std::vector<float>& logits) {
  long double max = logits[0];
  for (float l : logits) max = std::max<long double>(max, l);
  long double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<long double>(l) - max);
  return max + std::log(sum);
}

TEST(LogprobsProgramTest, LogNormalizerIsTheLogSumExp) {
  std::mt19937 rng(5);
  for (int32_t vocab : {2, 1000, 32000, 128256}) {
    for (float scale : {0.1f, 4.0f, 30.0f}) {
      std::normal_distribution<float> dist(0.0f, scale);
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (float& l : logits) l = dist(rng);
      const long double want = ReferenceLogZ(logits);
      const float got = kernels::cpu::LogNormalizer(logits.data(), vocab);
      // A few roundings of log Z's size, and the sum's: relative 2^-20.
      EXPECT_NEAR(got, static_cast<double>(want), std::fabs(static_cast<double>(want)) * 1e-6 + 1e-6)
          << "vocab " << vocab << " scale " << scale;
    }
  }
}

// The floats' bits, to compare them exactly (-0 and NaN included).
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) std::memcpy(&out[i], &v[i], sizeof(float));
  return out;
}

// Random rows, some quantized so that many logits tie, one with -inf
// entries, one whose largest logits all lie in the first lanes (lane t
// holds ids t mod kSampleLanes: n of them hold n * vocab / kSampleLanes ids
// at or before tau, past kLogprobCandidates for the largest n at 128k, so
// the rounds over the row take over); tokens anywhere (ties included);
// top-n of 0, 1, 5, 20, 32, 40, every lane, one more, and more than the
// vocabulary.
TEST(LogprobsProgramTest, TheProgramGivesComputeLogprobsExactly) {
  std::mt19937 rng(11);
  for (int32_t vocab : {7, 1000, 32000, 128256}) {
    const int32_t rows = 4;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (size_t i = 0; i < logits.size(); ++i) {
      const float l = dist(rng);
      const int32_t row = static_cast<int32_t>(i / vocab);
      const int32_t id = static_cast<int32_t>(i % vocab);
      logits[i] = row == 1 ? std::round(l) : l;  // row 1: many ties
      if (row == 2 && i % 5 == 0) logits[i] = -INFINITY;
      // Row 3: the first 40 lanes above every other lane, lane t's ids all
      // above lane t + 1's.
      if (row == 3 && id % kernels::kSampleLanes < 40) {
        logits[i] = 100.0f - static_cast<float>(id % kernels::kSampleLanes) + 0.5f * std::tanh(l);
      }
    }
    std::vector<LogprobJob> jobs;
    int32_t top_total = 0;
    const std::vector<int32_t> top_ns = {0, 1, 5, 20, 32, 40, kernels::kSampleLanes,
                                         kernels::kSampleLanes + 1,
                                         // (rounds over the row: 128k of them take minutes)
                                         vocab <= 32000 ? vocab + 3 : 2 * kernels::kSampleLanes};
    for (int32_t j = 0; j < 36; ++j) {
      const int32_t top_n = top_ns[static_cast<size_t>(j) % top_ns.size()];
      const int32_t n = std::min(top_n, vocab);
      jobs.push_back({.row = j % rows,
                      .token = static_cast<int32_t>(rng() % vocab),
                      .top_n = n,
                      .top_begin = top_total});
      top_total += n;
    }
    std::vector<LogprobResult> results(jobs.size());
    std::vector<int32_t> top_ids(static_cast<size_t>(top_total), -7);
    std::vector<float> top_values(static_cast<size_t>(top_total));
    kernels::cpu::Logprobs(logits.data(), vocab, jobs.data(), static_cast<int32_t>(jobs.size()),
                           results.data(), top_ids.data(), top_values.data());
    for (size_t j = 0; j < jobs.size(); ++j) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " job " << j);
      const LogprobJob& job = jobs[j];
      const TokenLogprobs want = ComputeLogprobs(
          std::span<const float>(logits).subspan(static_cast<size_t>(job.row) * vocab, vocab),
          job.token, job.top_n);
      EXPECT_EQ(Bits({results[j].logprob}), Bits({want.logprob}))
          << results[j].logprob << " vs " << want.logprob;
      EXPECT_EQ(results[j].rank, want.rank);
      const auto first = top_ids.begin() + job.top_begin;
      EXPECT_EQ(std::vector<int32_t>(first, first + job.top_n), want.top_token_ids);
      const auto vfirst = top_values.begin() + job.top_begin;
      EXPECT_EQ(Bits({vfirst, vfirst + job.top_n}), Bits(want.top_logprobs));
    }
  }
}

// The gather's bound: tau is the n-th of the lanes' best ids, so the ids at
// or before it lie in n lanes, at most n * ceil(vocab / kSampleLanes) of
// them, however the row is laid out; here the lowest ids (a lane's first)
// hold the smallest logits, which a tau from any other n ids would not
// survive.
TEST(LogprobsProgramTest, TheGatherStaysWithinNLanes) {
  const int32_t vocab = 128256, n = 20;
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (int32_t i = 0; i < vocab; ++i) {
    logits[i] = i < kernels::kSampleLanes ? -100.0f - static_cast<float>(i) : dist(rng);
  }
  const LogprobJob job{.row = 0, .token = 5, .top_n = n, .top_begin = 0};
  LogprobResult result;
  std::vector<int32_t> ids(n);
  std::vector<float> values(n);
  kernels::cpu::Logprobs(logits.data(), vocab, &job, 1, &result, ids.data(), values.data());
  const int32_t gathered = kernels::cpu::LogprobCandidatesOfLastJob();
  EXPECT_GE(gathered, n);
  EXPECT_LE(gathered, n * ((vocab + kernels::kSampleLanes - 1) / kernels::kSampleLanes));
  const TokenLogprobs want = ComputeLogprobs(logits, job.token, n);
  EXPECT_EQ(ids, want.top_token_ids);
}

}  // namespace
}  // namespace tandem::model
