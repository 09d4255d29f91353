// Every CUDA op against the CPU op, with per-dtype tolerance; skipped when
// the build has no CUDA or no device is present.
#include "tandem/kernels/cuda_ops.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"
#include "tandem/kernels/cpu_ops.h"

#if defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA

namespace tandem::kernels {
namespace {

using CudaOpsTest = testing::CudaTest;
using testing::AttentionProblem;
using testing::DeviceVector;
using testing::ExpectNear;
using testing::kF32Tol;
using testing::MakeAttentionProblem;
using testing::RandomVector;

TEST_F(CudaOpsTest, EmbeddingGatherMatchesCpu) {
  const int32_t dim = 300;
  const auto table = RandomVector(40 * dim, 1);
  const std::vector<int32_t> tokens = {5, 39, 0, 5};
  std::vector<float> ref(tokens.size() * dim);
  cpu::EmbeddingGather(table.data(), dim, tokens, ref.data());
  DeviceVector<float> d_table(table), d_out(ref.size());
  DeviceVector<int32_t> d_tokens(tokens);
  CUDA_OK(cuda::EmbeddingGather(d_table.get(), dim, d_tokens.get(), 4, d_out.get()));
  EXPECT_EQ(d_out.ToHost(), ref);
}

TEST_F(CudaOpsTest, RmsNormMatchesCpu) {
  for (int32_t dim : {8, 64, 4096}) {
    const auto x = RandomVector(5 * dim, 2, 3.0f), w = RandomVector(dim, 3);
    std::vector<float> ref(x.size());
    cpu::RmsNorm(x.data(), w.data(), 5, dim, 1e-5f, ref.data());
    DeviceVector<float> dx(x), dw(w), dout(x.size());
    CUDA_OK(cuda::RmsNorm(dx.get(), dw.get(), 5, dim, 1e-5f, dout.get()));
    ExpectNear(dout.ToHost(), ref, kF32Tol, "rmsnorm");
  }
}

TEST_F(CudaOpsTest, MatmulMatchesCpu) {
  cuda::BlasHandle* blas = nullptr;
  CUDA_OK(cuda::CreateBlas(&blas));
  for (auto [out_dim, in_dim, rows] : std::vector<std::tuple<int32_t, int32_t, int32_t>>{
           {64, 64, 1}, {172, 64, 7}, {512, 64, 32}, {33, 130, 3}}) {
    const auto w = RandomVector(out_dim * in_dim, 4), x = RandomVector(rows * in_dim, 5);
    std::vector<float> ref(rows * out_dim);
    cpu::Matmul(w.data(), out_dim, in_dim, x.data(), rows, ref.data());
    DeviceVector<float> dw(w), dx(x), dy(ref.size());
    CUDA_OK(cuda::Matmul(blas, dw.get(), out_dim, in_dim, dx.get(), rows, dy.get()));
    ExpectNear(dy.ToHost(), ref, {1e-5, 1e-4}, "matmul");
  }
  cuda::DestroyBlas(blas);
}

TEST_F(CudaOpsTest, RopeMatchesCpu) {
  for (RopeKind kind : {RopeKind::kAdjacentPairs, RopeKind::kRotateHalf}) {
    const float amplitude = kind == RopeKind::kRotateHalf ? 1.19f : 1.0f;  // yarn's, longrope's
    for (int32_t hs : {8, 128}) {
      const int32_t rotary_dim = hs == 128 ? 96 : 0;  // Phi-4-mini's partial_rotary_factor 0.75
      const std::vector<int32_t> pos = {0, 3, 511};
      auto v = RandomVector(3 * 4 * hs, 6);
      DeviceVector<float> dv(v);
      DeviceVector<int32_t> dpos(pos);
      cpu::Rope(v.data(), 3, pos.data(), 4, hs, kind, 10000.0f, nullptr, amplitude, rotary_dim);
      CUDA_OK(cuda::Rope(dv.get(), 3, dpos.get(), 4, hs, kind, 10000.0f, nullptr, amplitude,
                         rotary_dim));
      ExpectNear(dv.ToHost(), v, {1e-4, 1e-4}, "rope");
    }
  }
}

// Short contexts, and (the last two shapes) contexts and a head size past
// the kernel's 128 threads a (row, head).
TEST_F(CudaOpsTest, KvWriteAndPagedAttentionMatchCpu) {
  uint32_t seed = 3;
  using Seqs = std::vector<std::pair<int32_t, int32_t>>;
  const Seqs short_seqs = {{37, 36}, {40, 21}, {16, 0}}, long_seqs = {{300, 299}, {200, 150}};
  for (auto [heads, kv_heads, hs, block, seqs] :
       std::vector<std::tuple<int, int, int, int, Seqs>>{{8, 4, 8, 16, short_seqs},
                                                         {4, 1, 128, 4, short_seqs},
                                                         {6, 2, 64, 8, short_seqs},
                                                         {8, 2, 64, 16, long_seqs},
                                                         {4, 2, 256, 16, long_seqs}}) {
    AttentionProblem p = MakeAttentionProblem(heads, kv_heads, hs, block, seqs, seed++);
    DeviceVector<float> d_cache(p.cache), d_k(p.all_k), d_v(p.all_v), d_q(p.q), d_out(p.q.size());
    DeviceVector<int64_t> d_slots(p.slots);
    const int32_t n = static_cast<int32_t>(p.slots.size());
    cpu::KvWrite(p.cache.data(), p.shape, 1, p.all_k.data(), p.all_v.data(), n, p.slots.data());
    CUDA_OK(cuda::KvWrite(d_cache.get(), p.shape, 1, d_k.get(), d_v.get(), n, d_slots.get()));
    EXPECT_EQ(d_cache.ToHost(), p.cache) << "kv write";
    DeviceVector<int32_t> d_pos(p.row_pos), d_off(p.row_table_offset), d_tables(p.block_tables);
    for (int32_t window : {0, 1, 7, 16}) {  // 0: none; the others slide (Mistral's rule)
      p.window = window;
      std::vector<float> ref(p.q.size());
      cpu::PagedAttention(p.Args(ref.data()));
      PagedAttentionArgs args = p.Args(d_out.get());
      args.q = d_q.get();
      args.cache = d_cache.get();
      args.row_pos = d_pos.get();
      args.row_table_offset = d_off.get();
      args.block_tables = d_tables.get();
      const int32_t max_context = *std::max_element(p.row_pos.begin(), p.row_pos.end()) + 1;
      DeviceVector<float> scratch(p.row_pos.size() * heads * max_context);
      CUDA_OK(cuda::PagedAttention(args, scratch.get(), max_context));
      ExpectNear(d_out.ToHost(), ref, {2e-5, 1e-4}, "attention, window " + std::to_string(window));
    }
  }
}

TEST_F(CudaOpsTest, SiluMulResidualAddMatchCpu) {
  const int64_t n = 1000;
  const auto g = RandomVector(n, 7, 6.0f), u = RandomVector(n, 8);
  std::vector<float> ref(n);
  cpu::SiluMul(g.data(), u.data(), n, ref.data());
  DeviceVector<float> dg(g), du(u), dout(n);
  CUDA_OK(cuda::SiluMul(dg.get(), du.get(), n, dout.get()));
  ExpectNear(dout.ToHost(), ref, kF32Tol, "silu");
  auto x = g;
  cpu::ResidualAdd(x.data(), u.data(), n);
  CUDA_OK(cuda::ResidualAdd(dg.get(), du.get(), n));
  ExpectNear(dg.ToHost(), x, {0, 0}, "residual");
}

// The device runs sampling.h's program to the bit: every filter, banned
// ids, penalties, rows drawn from any row of the logits, vocabularies of a
// test model and of Llama 3 (128,256), peaked and flat logits.
TEST_F(CudaOpsTest, SampleMatchesCpu) {
  for (const int32_t vocab : {512, 32000, 128256}) {
    for (const float scale : {1.0f, 6.0f}) {
      const int32_t rows = 12;
      const auto logits = RandomVector(static_cast<size_t>(rows) * vocab, 9 + vocab, scale);
      const auto [banned, history, args] = testing::MakeSamplingCase(vocab, rows, 24);
      const int32_t n = static_cast<int32_t>(args.size());
      std::vector<int32_t> ref(n);
      cpu::Sample(logits.data(), n, vocab, args.data(), banned.data(), history.data(), ref.data());
      DeviceVector<float> d_logits(logits), scratch(static_cast<size_t>(n) * vocab);
      DeviceVector<SampleArgs> d_args(args);
      DeviceVector<int32_t> d_banned(banned), d_out(n);
      DeviceVector<SamplePenalty> d_history(history);
      CUDA_OK(cuda::Sample(d_logits.get(), n, vocab, d_args.get(), d_banned.get(), d_history.get(),
                           d_out.get(), scratch.get()));
      EXPECT_EQ(d_out.ToHost(), ref) << "vocab " << vocab << " scale " << scale;
    }
  }
}

// The device runs logprobs.h's program to the bit: log Z, ranks and top-n
// lists (ties by the lower id) for rows of a test model's vocabulary and of
// Llama 3's, rows with many ties and rows with -inf entries, top-n from 0 to
// 20, jobs on any row of the logits.
TEST_F(CudaOpsTest, LogprobsMatchCpu) {
  for (const int32_t vocab : {512, 32000, 128256}) {
    const int32_t rows = 6;
    auto logits = RandomVector(static_cast<size_t>(rows) * vocab, 21 + vocab, 8.0f);
    for (int32_t i = 0; i < vocab; ++i) {
      float& tied = logits[static_cast<size_t>(vocab) + i];  // row 1: many ties
      tied = std::round(tied);
      if (i % 7 == 0) logits[static_cast<size_t>(2) * vocab + i] = -INFINITY;  // row 2
    }
    std::vector<LogprobJob> jobs;
    int32_t top_total = 0;
    for (int32_t j = 0; j < 20; ++j) {
      const int32_t top_n = std::vector<int32_t>{0, 1, 5, 20}[j % 4];
      jobs.push_back({.row = (j * 5) % rows,
                      .token = (j * 7919) % vocab,
                      .top_n = top_n,
                      .top_begin = top_total});
      top_total += top_n;
    }
    const int32_t n = static_cast<int32_t>(jobs.size());
    std::vector<LogprobResult> ref(jobs.size());
    std::vector<int32_t> ref_ids(static_cast<size_t>(top_total));
    std::vector<float> ref_values(static_cast<size_t>(top_total));
    cpu::Logprobs(logits.data(), vocab, jobs.data(), n, ref.data(), ref_ids.data(),
                  ref_values.data());
    DeviceVector<float> d_logits(logits), d_values(static_cast<size_t>(top_total));
    DeviceVector<LogprobJob> d_jobs(jobs);
    DeviceVector<LogprobResult> d_results(jobs.size());
    DeviceVector<int32_t> d_ids(static_cast<size_t>(top_total));
    CUDA_OK(cuda::Logprobs(d_logits.get(), vocab, d_jobs.get(), n, d_results.get(), d_ids.get(),
                           d_values.get()));
    const std::vector<LogprobResult> got = d_results.ToHost();
    for (int32_t j = 0; j < n; ++j) {
      EXPECT_EQ(got[j].rank, ref[j].rank) << "vocab " << vocab << " job " << j;
      EXPECT_EQ(std::memcmp(&got[j].logprob, &ref[j].logprob, sizeof(float)), 0)
          << "vocab " << vocab << " job " << j << ": " << got[j].logprob << " vs "
          << ref[j].logprob;
    }
    EXPECT_EQ(d_ids.ToHost(), ref_ids) << "vocab " << vocab;
    const std::vector<float> values = d_values.ToHost();
    EXPECT_EQ(std::memcmp(values.data(), ref_values.data(), values.size() * sizeof(float)), 0)
        << "vocab " << vocab;
  }
}

TEST_F(CudaOpsTest, BlockGatherScatterMatchCpu) {
  const int64_t bf = 2048;
  const auto cache = RandomVector(6 * bf, 10);
  const std::vector<int32_t> ids = {4, 1, 5};
  std::vector<float> ref(ids.size() * bf);
  cpu::BlockGather(cache.data(), bf, ids, ref.data());
  DeviceVector<float> d_cache(cache), d_staging(ref.size());
  DeviceVector<int32_t> d_ids(ids);
  CUDA_OK(cuda::BlockGather(d_cache.get(), bf, d_ids.get(), 3, d_staging.get()));
  EXPECT_EQ(d_staging.ToHost(), ref);
  DeviceVector<float> d_cache2(std::vector<float>(cache.size(), 0.0f));
  std::vector<float> cache2(cache.size(), 0.0f);
  cpu::BlockScatter(cache2.data(), bf, ids, ref.data());
  CUDA_OK(cuda::BlockScatter(d_cache2.get(), bf, d_ids.get(), 3, d_staging.get()));
  EXPECT_EQ(d_cache2.ToHost(), cache2);
}

}  // namespace
}  // namespace tandem::kernels

#else

TEST(CudaOpsTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif
