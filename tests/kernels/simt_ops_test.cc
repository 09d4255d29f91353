// The float32 kernels' block-wide programs (cuda_ops.cu) on the CPU
// through the SIMT emulator (simt/simt.h): sampling.h's and logprobs.h's
// GPU branches (a block of kSampleLanes threads, barriers, the gather's
// atomic slots) against the same programs run lane after lane
// (cpu::Sample, cpu::Logprobs), and the float32 attention's block per
// (row, head) against AttendRowHead. Every one to the bit: the emulator
// runs the same operations in the same order, as the device does except
// where nvcc contracts a multiply and an add (the attention; sampling.h
// rounds each operation on its own).
// The emulator's macros come before the kernels.
// clang-format off
#define TANDEM_SIMT 1
#include "simt/simt.h"
#include "../../kernels/cuda_ops.cu"
// clang-format on

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernel_test_util.h"
#include "tandem/kernels/cpu_ops.h"
#include "tandem/kernels/logprobs.h"
#include "tandem/kernels/sampling.h"

namespace tandem::kernels {
namespace {

using testing::RandomVector;

std::vector<uint32_t> Bits(const float* v, size_t n) {
  std::vector<uint32_t> out(n);
  std::memcpy(out.data(), v, n * sizeof(float));
  return out;
}

// Rows of a test model's vocabulary and of Llama 3's: random, many ties,
// -inf entries, and one whose top lies in the first 40 lanes (each lane's
// ids above the next lane's), so that for n = 40 at 128k the ids at or
// before tau pass kLogprobCandidates and the rounds over the row take over.
TEST(SimtOpsTest, LogprobsOnTheBlockGiveTheLaneByLanePrograms) {
  for (const int32_t vocab : {1000, 128256}) {
    const int32_t rows = 4;
    auto logits = RandomVector(static_cast<size_t>(rows) * vocab, 21 + vocab, 8.0f);
    for (int32_t i = 0; i < vocab; ++i) {
      logits[static_cast<size_t>(vocab) + i] = std::round(logits[static_cast<size_t>(vocab) + i]);
      if (i % 7 == 0) logits[static_cast<size_t>(2) * vocab + i] = -INFINITY;
      if (i % kSampleLanes < 40) {
        logits[static_cast<size_t>(3) * vocab + i] = 100.0f - static_cast<float>(i % kSampleLanes);
      }
    }
    std::vector<LogprobJob> jobs;
    int32_t top_total = 0;
    for (int32_t j = 0; j < 8; ++j) {
      const int32_t top_n = std::vector<int32_t>{0, 1, 5, 20, 40}[j % 5];
      jobs.push_back(
          {.row = j % rows, .token = (j * 7919) % vocab, .top_n = top_n, .top_begin = top_total});
      top_total += top_n;
    }
    jobs.push_back({.row = 3, .token = 5, .top_n = 40, .top_begin = top_total});
    top_total += 40;
    const int32_t n = static_cast<int32_t>(jobs.size());
    std::vector<LogprobResult> want(jobs.size()), got(jobs.size());
    std::vector<int32_t> want_ids(static_cast<size_t>(top_total)), got_ids(want_ids.size(), -7);
    std::vector<float> want_values(want_ids.size()), got_values(want_ids.size());
    cpu::Logprobs(logits.data(), vocab, jobs.data(), n, want.data(), want_ids.data(),
                  want_values.data());
    // Warps that run ahead to each barrier, backward: a phase that reads
    // what another lane wrote in the same phase reads it unwritten.
    simt::SetSchedule({.warps_run_ahead = true, .reverse = vocab > 1000});
    simt::Launch(simt::Dim3{static_cast<unsigned>(n), 1, 1}, simt::Dim3{kSampleLanes, 1, 1}, 0,
                 [&] {
                   cuda::LogprobsKernel(logits.data(), vocab, jobs.data(), got.data(),
                                        got_ids.data(), got_values.data());
                 });
    for (int32_t j = 0; j < n; ++j) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " job " << j);
      EXPECT_EQ(Bits(&got[j].logprob, 1), Bits(&want[j].logprob, 1));
      EXPECT_EQ(got[j].rank, want[j].rank);
    }
    EXPECT_EQ(got_ids, want_ids) << "vocab " << vocab;
    EXPECT_EQ(Bits(got_values.data(), got_values.size()),
              Bits(want_values.data(), want_values.size()))
        << "vocab " << vocab;
  }
}

// Every filter, banned ids and penalties, at a test model's vocabulary and
// Llama 3's.
TEST(SimtOpsTest, SamplingOnTheBlockGivesTheLaneByLaneProgram) {
  for (const int32_t vocab : {512, 128256}) {
    const int32_t rows = 4;
    const auto logits = RandomVector(static_cast<size_t>(rows) * vocab, 9 + vocab, 6.0f);
    const auto [banned, history, args] = testing::MakeSamplingCase(vocab, rows, 8);
    const int32_t n = static_cast<int32_t>(args.size());
    std::vector<int32_t> want(n), got(n, -1);
    cpu::Sample(logits.data(), n, vocab, args.data(), banned.data(), history.data(), want.data());
    std::vector<float> scratch(static_cast<size_t>(n) * vocab);
    simt::SetSchedule({.warps_run_ahead = true, .reverse = vocab > 1000});
    simt::Launch(simt::Dim3{static_cast<unsigned>(n), 1, 1}, simt::Dim3{kSampleLanes, 1, 1}, 0,
                 [&] {
                   cuda::SampleKernel(logits.data(), vocab, args.data(), banned.data(),
                                      history.data(), got.data(), scratch.data());
                 });
    EXPECT_EQ(got, want) << "vocab " << vocab;
  }
}

// The float32 mode's attention, a block of threads per (row, head), gives
// AttendRowHead's values: contexts past the block's 128 threads, a head
// size past them too, GQA, a window and the softcap.
TEST(SimtOpsTest, Float32AttentionOnTheBlockGivesAttendRowHead) {
  struct Case {
    int32_t heads, kv_heads, hs, block;
    std::vector<std::pair<int32_t, int32_t>> seqs;
    int32_t window;
    float softcap;
  };
  const std::vector<Case> cases = {
      {8, 4, 8, 16, {{37, 36}, {40, 21}, {300, 299}}, 0, 0.0f},
      {4, 2, 160, 16, {{200, 190}}, 0, 0.0f},
      {6, 6, 32, 32, {{260, 259}, {9, 0}}, 100, 0.0f},
      {8, 2, 16, 16, {{150, 149}}, 0, 30.0f},
  };
  uint32_t seed = 5;
  for (const Case& c : cases) {
    testing::AttentionProblem p =
        testing::MakeAttentionProblem(c.heads, c.kv_heads, c.hs, c.block, c.seqs, seed++);
    p.window = c.window;
    p.softcap = c.softcap;
    int32_t max_context = 0;
    for (const int32_t pos : p.row_pos) max_context = std::max(max_context, pos + 1);
    const int32_t rows = static_cast<int32_t>(p.row_pos.size());
    std::vector<float> want(p.q.size()), got(p.q.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> scores(static_cast<size_t>(max_context));
    const PagedAttentionArgs want_args = p.Args(want.data());
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t h = 0; h < c.heads; ++h) AttendRowHead(want_args, r, h, scores.data());
    }
    std::vector<float> scratch(static_cast<size_t>(rows) * c.heads * max_context);
    const PagedAttentionArgs args = p.Args(got.data());
    simt::SetSchedule({.warps_run_ahead = seed % 2 == 0, .reverse = true});
    simt::Launch(simt::Dim3{static_cast<unsigned>(rows * c.heads), 1, 1},
                 simt::Dim3{cuda::kAttnThreads, 1, 1}, 0,
                 [&] { cuda::AttentionKernel(args, scratch.data(), max_context); });
    EXPECT_EQ(Bits(got.data(), got.size()), Bits(want.data(), want.size()))
        << "heads " << c.heads << " hs " << c.hs;
  }
}

}  // namespace
}  // namespace tandem::kernels
