// The bf16 CUDA ops (cuda_bf16_ops.h) against CPU references computed in
// double or fp32 on the same bf16-rounded inputs, so the tolerances below
// cover accumulation order and the final bf16 rounding only (bf16 has an
// 8-bit mantissa: relative steps of 2^-8). Skipped without a device.
#include "tandem/kernels/cuda_bf16_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "kernel_test_util.h"
#include "tandem/kernels/attention_plan.h"
#include "tandem/kernels/cpu_ops.h"
#include "tandem/kernels/sampling.h"
#include "tandem/model/checkpoint.h"

#if defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA

namespace tandem::kernels {
namespace {

using cuda::Bf16;
using model::BFloat16ToFloat;
using model::FloatToBFloat16;
using testing::AttentionProblem;
using testing::DeviceVector;
using testing::ExpectNear;
using testing::MakeAttentionProblem;
using testing::RandomVector;
using CudaBf16Test = testing::CudaTest;

// One bf16 rounding step of a result, plus accumulation-order noise.
constexpr testing::Tolerance kBf16OutTol{2e-3, 1.0 / 128};

std::vector<Bf16> ToBf16(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBFloat16(v[i]);
  return out;
}
std::vector<float> ToFloat(const std::vector<Bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = BFloat16ToFloat(v[i]);
  return out;
}
std::vector<float> RoundToBf16(const std::vector<float>& v) { return ToFloat(ToBf16(v)); }

TEST_F(CudaBf16Test, EmbeddingGatherIsExact) {
  const int32_t dim = 300;
  const auto table = ToBf16(RandomVector(40 * dim, 1));
  const std::vector<int32_t> tokens = {5, 39, 0, 5};
  std::vector<float> ref;
  for (int32_t t : tokens) {
    for (int32_t j = 0; j < dim; ++j) ref.push_back(BFloat16ToFloat(table[t * dim + j]));
  }
  DeviceVector<Bf16> d_table(table);
  DeviceVector<int32_t> d_tokens(tokens);
  DeviceVector<float> d_out(ref.size());
  CUDA_OK(cuda::EmbeddingGatherBf16(d_table.get(), dim, d_tokens.get(), 4, d_out.get(), nullptr));
  EXPECT_EQ(d_out.ToHost(), ref);
}

TEST_F(CudaBf16Test, RmsNormMatchesCpuWithAndWithoutRowIndex) {
  for (int32_t dim : {8, 64, 300, 2048, 4096}) {
    const int32_t rows = 5;
    const auto x = RandomVector(rows * dim, 2, 3.0f), w = RandomVector(dim, 3);
    std::vector<float> ref(x.size());
    cpu::RmsNorm(x.data(), w.data(), rows, dim, 1e-5f, ref.data());
    DeviceVector<float> dx(x), dw(w);
    DeviceVector<Bf16> dout(x.size());
    CUDA_OK(cuda::RmsNormBf16(dx.get(), nullptr, dw.get(), rows, dim, 1e-5f, dout.get(), nullptr));
    ExpectNear(ToFloat(dout.ToHost()), ref, kBf16OutTol, "rmsnorm dim " + std::to_string(dim));
    // Gathered rows 4 and 1.
    const std::vector<int32_t> index = {4, 1};
    DeviceVector<int32_t> dindex(index);
    DeviceVector<Bf16> dgather(2 * dim);
    CUDA_OK(
        cuda::RmsNormBf16(dx.get(), dindex.get(), dw.get(), 2, dim, 1e-5f, dgather.get(), nullptr));
    std::vector<float> want(ref.begin() + 4 * dim, ref.begin() + 5 * dim);
    want.insert(want.end(), ref.begin() + 1 * dim, ref.begin() + 2 * dim);
    ExpectNear(ToFloat(dgather.ToHost()), want, kBf16OutTol, "gathered rmsnorm");
  }
}

TEST_F(CudaBf16Test, MatmulAccumulatesInFp32AndFoldsTheResidual) {
  cuda::BlasHandle* blas = nullptr;
  CUDA_OK(cuda::CreateBlas(&blas));
  for (auto [out_dim, in_dim, rows] : std::vector<std::tuple<int32_t, int32_t, int32_t>>{
           {64, 64, 1},
           {172, 64, 7},
           {512, 2048, 32},
           {33, 130, 3},
           {1000, 256, 256},
           // The GEMV kernel (rows <= kGemvMaxRows, in_dim % 8 == 0): an output
           // count that leaves a block part empty, runs past its unrolled loop,
           // a row shorter than one warp's load.
           {2051, 2048, 1},
           {100, 1032, 2},
           {9, 8192, 3},
           {37, 8, 4},
           {300, 776, 4}}) {
    const auto w = RoundToBf16(RandomVector(out_dim * in_dim, 4));
    const auto x = RoundToBf16(RandomVector(rows * in_dim, 5));
    const auto y0 = RandomVector(rows * out_dim, 6);
    std::vector<double> ref(static_cast<size_t>(rows) * out_dim);
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t o = 0; o < out_dim; ++o) {
        double acc = 0;
        for (int32_t i = 0; i < in_dim; ++i) acc += double{w[o * in_dim + i]} * x[r * in_dim + i];
        ref[r * out_dim + o] = acc + y0[r * out_dim + o];
      }
    }
    DeviceVector<Bf16> dw(ToBf16(w)), dx(ToBf16(x));
    // gemv_max_rows 0 (bench_cuda --gemv-max-rows 0): cuBLAS for every row count.
    for (const int32_t gemv_max_rows : {cuda::kGemvMaxRows, 0}) {
      DeviceVector<float> dy(y0);
      CUDA_OK(cuda::MatmulBf16(blas, dw.get(), out_dim, in_dim, dx.get(), rows, dy.get(), 1.0f,
                               false, gemv_max_rows));
      // fp32 accumulation of in_dim products of magnitude <= 1.
      ExpectNear(dy.ToHost(), ref, {1e-4 * std::sqrt(double(in_dim)), 1e-5},
                 "matmul, gemv_max_rows " + std::to_string(gemv_max_rows));
    }
  }
  cuda::DestroyBlas(blas);
}

// beta = 0 writes y without reading it (NaN there must not leak in), and up
// to kGemvMaxRows a row's result is the same bits whatever rows run with it
// (a decode graph padded to its bucket gives the eager step's logits).
TEST_F(CudaBf16Test, MatmulWithBetaZeroIgnoresYAndSmallBatchesAreRowInvariant) {
  cuda::BlasHandle* blas = nullptr;
  CUDA_OK(cuda::CreateBlas(&blas));
  const int32_t out_dim = 777, in_dim = 2048;
  const auto w = RoundToBf16(RandomVector(out_dim * in_dim, 12));
  const auto x = RoundToBf16(RandomVector(8 * in_dim, 13));
  DeviceVector<Bf16> dw(ToBf16(w)), dx(ToBf16(x));
  std::vector<float> first_row;
  for (int32_t rows : {1, 2, 3, 4, 8}) {
    DeviceVector<float> dy(std::vector<float>(rows * out_dim, std::nanf("")));
    CUDA_OK(cuda::MatmulBf16(blas, dw.get(), out_dim, in_dim, dx.get(), rows, dy.get(), 0.0f));
    const std::vector<float> y = dy.ToHost();
    for (float v : y) {
      ASSERT_FALSE(std::isnan(v)) << rows << " rows";
    }
    const std::vector<float> row0(y.begin(), y.begin() + out_dim);
    if (rows == 1) first_row = row0;
    if (rows <= cuda::kGemvMaxRows) {
      EXPECT_EQ(row0, first_row) << rows << " rows";
    }
  }
  cuda::DestroyBlas(blas);
}

// A GEMV launched as a programmatic dependent (MatmulBf16's
// dependent_launch) starts while the RMSNorm before it runs (RMSNorm lets
// dependents launch first thing), and must still read what that RMSNorm
// writes: each round normalizes new inputs, and the dependent GEMV's outputs
// are the plain launch's, bit for bit. A GEMV that did not wait would read
// the round before's input. Compute capability 9.0 and above.
TEST_F(CudaBf16Test, DependentLaunchGemvReadsWhatTheKernelBeforeWrote) {
  if (!cuda::DeviceHasDependentLaunch(0)) GTEST_SKIP() << "compute capability below 9.0";
  void* stream = nullptr;
  CUDA_OK(cuda::StreamCreate(&stream));
  cuda::BlasHandle* blas = nullptr;
  CUDA_OK(cuda::CreateBlas(&blas));
  DeviceVector<float> workspace(size_t{1} << 20);  // 4 MiB
  CUDA_OK(cuda::SetBlasStream(blas, stream, workspace.get(), sizeof(float) << 20));
  const int32_t out_dim = 4099, in_dim = 8192, rows = 3;
  const auto w = RoundToBf16(RandomVector(out_dim * in_dim, 21));
  const auto norm = RandomVector(in_dim, 22);
  DeviceVector<Bf16> dw(ToBf16(w)), dxn(rows * in_dim);
  DeviceVector<float> dnorm(norm), dx(rows * in_dim), dplain(rows * out_dim),
      ddependent(rows * out_dim);
  for (int32_t round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto x = RandomVector(rows * in_dim, 100 + round, 3.0f);
    CUDA_OK(cuda::CopyToDevice(dx.get(), x.data(), x.size() * sizeof(float)));
    // Dependent first: what it would read without waiting is the input the
    // round before left.
    for (bool dependent : {true, false}) {
      CUDA_OK(cuda::RmsNormBf16(dx.get(), nullptr, dnorm.get(), rows, in_dim, 1e-5f, dxn.get(),
                                stream));
      CUDA_OK(cuda::MatmulBf16(blas, dw.get(), out_dim, in_dim, dxn.get(), rows,
                               (dependent ? ddependent : dplain).get(), 0.0f, dependent));
    }
    CUDA_OK(cuda::StreamSynchronize(stream));
    const std::vector<float> plain = dplain.ToHost(), got = ddependent.ToHost();
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      differ += std::memcmp(&got[i], &plain[i], sizeof(float)) != 0;
    }
    EXPECT_EQ(differ, 0) << "of " << got.size() << " outputs";
  }
  cuda::DestroyBlas(blas);
  cuda::StreamDestroy(stream);
}

// amplitude: yarn's and longrope's attention factor (1.19: Phi-3.5's).
// MatmulBf16 with tc_gemm_max_rows (bench_cuda --tc-gemm-max-rows): the
// tensor-core GEMM for 5 to 64 rows, with the reduction split over the
// handle's workspace (777 outputs: about 13 blocks, so several splits).
// Against the double product, and row 0's bits whatever rows run with it.
TEST_F(CudaBf16Test, TensorCoreGemmMatchesTheProductAndKeepsEachRowsBits) {
  if (!cuda::DeviceHasTensorCoreAttention(0)) GTEST_SKIP() << "compute capability below 8.0";
  cuda::BlasHandle* blas = nullptr;
  CUDA_OK(cuda::CreateBlas(&blas));
  DeviceVector<float> workspace(size_t{8} << 20);  // 32 MiB, as the runner's
  CUDA_OK(cuda::SetBlasStream(blas, nullptr, workspace.get(), size_t{32} << 20));
  const int32_t out_dim = 777, in_dim = 2048;
  EXPECT_GT(cuda::TcGemmSplits(out_dim, in_dim, size_t{32} << 20), 1);
  const auto w = RoundToBf16(RandomVector(out_dim * in_dim, 22));
  const auto x = RoundToBf16(RandomVector(64 * in_dim, 23));
  const auto y0 = RandomVector(64 * out_dim, 24);
  DeviceVector<Bf16> dw(ToBf16(w)), dx(ToBf16(x));
  std::vector<float> first_row;
  for (int32_t rows : {5, 8, 13, 32, 64}) {
    DeviceVector<float> dy(std::vector<float>(y0.begin(), y0.begin() + rows * out_dim));
    CUDA_OK(cuda::MatmulBf16(blas, dw.get(), out_dim, in_dim, dx.get(), rows, dy.get(), 1.0f, false,
                             cuda::kGemvMaxRows, cuda::kTcGemmMaxRows));
    const std::vector<float> y = dy.ToHost();
    std::vector<double> ref(static_cast<size_t>(rows) * out_dim);
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t o = 0; o < out_dim; ++o) {
        double acc = y0[r * out_dim + o];
        for (int32_t i = 0; i < in_dim; ++i) acc += double{w[o * in_dim + i]} * x[r * in_dim + i];
        ref[r * out_dim + o] = acc;
      }
    }
    ExpectNear(y, ref, {1e-4 * std::sqrt(double(in_dim)), 1e-5}, std::to_string(rows) + " rows");
    const std::vector<float> row0(y.begin(), y.begin() + out_dim);
    if (first_row.empty()) first_row = row0;
    EXPECT_EQ(row0, first_row) << rows << " rows";
  }
  cuda::DestroyBlas(blas);
}

TEST_F(CudaBf16Test, RopeAndKvWriteMatchCpu) {
  for (const RopeKind kind : testing::kRopeKinds) {
    for (const auto& dims : testing::kRopeKvShapes) {
      const testing::RopeKvCase c = testing::MakeRopeKvCase(kind, dims, 0.0f);
      DeviceVector<float> dqkv(c.qkv);
      DeviceVector<int32_t> dpos(c.pos);
      DeviceVector<int64_t> dslots(c.slots);
      DeviceVector<Bf16> dcache(c.want_cache.size());  // zeros
      CUDA_OK(cuda::RopeKvWriteBf16(dqkv.get(), c.stride, c.rows, dpos.get(), c.heads, c.shape,
                                    kind, 10000.0f, dcache.get(), 1, dslots.get(), nullptr, nullptr,
                                    c.amplitude, c.rotary_dim));
      const std::vector<float> got_qkv = dqkv.ToHost();
      std::vector<float> got_q;
      for (int32_t r = 0; r < c.rows; ++r) {
        got_q.insert(got_q.end(), got_qkv.begin() + r * c.stride,
                     got_qkv.begin() + r * c.stride + c.heads * c.hs);
      }
      ExpectNear(got_q, c.want_q, {1e-4, 1e-4}, "rope q");
      ExpectNear(ToFloat(dcache.ToHost()), c.want_cache, kBf16OutTol, "kv cache");
    }
  }
}

struct AttentionCase {
  int32_t heads, kv_heads, hs, block;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (context, first query position)
  int32_t window = 0;                             // sliding window (0: none)
  float softcap = 0.0f;                           // score softcap (0: none)
};

std::string Describe(const AttentionCase& c) {
  return "heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " hs " +
         std::to_string(c.hs) + " block " + std::to_string(c.block) + " seqs " +
         std::to_string(c.seqs.size()) + " window " + std::to_string(c.window) + " softcap " +
         std::to_string(c.softcap);
}

// Llama-3.2-1B's attention shape, `batch` decode rows of contexts drawn
// from 1 .. max_len.
AttentionCase DecodeBatch(int32_t batch, uint32_t seed, int32_t max_len) {
  AttentionCase c{32, 8, 64, 16, {}};
  std::mt19937 rng(seed);
  for (int32_t i = 0; i < batch; ++i) {
    const int32_t len = 1 + static_cast<int32_t>(rng() % max_len);
    c.seqs.push_back({len, len - 1});
  }
  return c;
}

// Runs one case as the runner does: PlanAttention routes the rows (with
// tensor_cores, chunks of kMinTileRows or more go to PrefillAttentionBf16,
// the rest to PagedAttentionBf16 by row list; without, every row goes to
// PagedAttentionBf16 unlisted; with decode_tc, DecodeAttentionTcBf16 takes
// PagedAttentionBf16's rows), then compares with NaiveAttention. Leaves
// the plan in *plan so the caller can check which kernels ran, and the
// output's bits in *bits when given.
void RunAttentionCase(const AttentionCase& c, uint32_t seed, bool tensor_cores,
                      const testing::Tolerance& tol, AttentionPlan* plan_out,
                      int32_t splits_per_block = cuda::kAutoSplitsPerBlock,
                      std::vector<Bf16>* bits = nullptr, bool decode_tc = false,
                      bool wide = false) {
  AttentionProblem p = MakeAttentionProblem(c.heads, c.kv_heads, c.hs, c.block, c.seqs, seed);
  p.window = c.window;
  p.softcap = c.softcap;
  // The reference sees what the GPU sees: bf16 K/V.
  for (auto* kv : {&p.seq_k, &p.seq_v}) {
    for (auto& s : *kv) s = RoundToBf16(s);
  }
  p.all_k = RoundToBf16(p.all_k);
  p.all_v = RoundToBf16(p.all_v);
  // The reference of a (case, seed), computed once: the tests run each case
  // through several kernels and choices, and the double-precision loops
  // over thousands of positions were most of this binary's minutes.
  static std::map<std::string, std::vector<double>> references;
  std::string key = Describe(c) + " seed " + std::to_string(seed);
  for (const auto& [len, first] : c.seqs)
    key += " " + std::to_string(len) + "/" + std::to_string(first);
  auto known = references.find(key);
  if (known == references.end()) {
    known = references.emplace(key, testing::NaiveAttention(p)).first;
  }
  const std::vector<double>& ref = known->second;
  // Write the cache through cpu::KvWrite (fp32), then convert it. Every
  // slot no token was written to holds NaN: a kernel that lets one reach a
  // result (a stale slot in a row's last block, read and weighted by 0)
  // fails.
  std::fill(p.cache.begin(), p.cache.end(), std::numeric_limits<float>::quiet_NaN());
  const int32_t n = static_cast<int32_t>(p.slots.size());
  cpu::KvWrite(p.cache.data(), p.shape, 1, p.all_k.data(), p.all_v.data(), n, p.slots.data());
  DeviceVector<Bf16> d_cache(ToBf16(p.cache)), d_out(p.q.size());
  DeviceVector<float> d_q(p.q);
  DeviceVector<int32_t> d_pos(p.row_pos), d_off(p.row_table_offset), d_tables(p.block_tables);
  const int32_t rows = static_cast<int32_t>(p.row_pos.size());
  AttentionPlan& plan = *plan_out;
  plan =
      PlanAttention(p.row_pos, p.row_table_offset, c.hs, c.heads / c.kv_heads, tensor_cores, wide);
  DeviceVector<int32_t> d_single(plan.single_rows.empty() ? std::vector<int32_t>{0}
                                                          : plan.single_rows);
  DeviceVector<int32_t> d_tiles(plan.tiles.empty() ? std::vector<int32_t>{0} : plan.tiles);
  DeviceVector<float> scratch(static_cast<size_t>(std::max<int64_t>(
      1, cuda::AttentionScratchFloats(rows, c.heads, c.hs, plan.single_max_context))));
  cuda::Bf16AttentionArgs args{.q = d_q.get(),
                               .q_stride = c.heads * c.hs,
                               .out = d_out.get(),
                               .cache = d_cache.get(),
                               .shape = p.shape,
                               .layer = 1,
                               .num_heads = c.heads,
                               .num_rows = plan.num_single_rows(),
                               .row_pos = d_pos.get(),
                               .row_table_offset = d_off.get(),
                               .block_tables = d_tables.get(),
                               .rows = tensor_cores ? d_single.get() : nullptr,
                               .window = c.window,
                               .softcap = c.softcap};
  if (!tensor_cores) {
    EXPECT_EQ(plan.num_single_rows(), rows);
  }
  CUDA_OK(cuda::PrefillAttentionBf16(args, d_tiles.get(), plan.num_tiles(), nullptr, wide));
  EXPECT_EQ(decode_tc
                ? cuda::DecodeAttentionTcBf16(args, plan.single_max_context, scratch.get(), nullptr)
                : cuda::PagedAttentionBf16(args, plan.single_max_context, scratch.get(), nullptr,
                                           splits_per_block),
            0);
  const std::vector<Bf16> out = d_out.ToHost();
  ExpectNear(ToFloat(out), ref, tol, "attention");
  if (bits != nullptr) *bits = out;
}

// Odd head counts, GQA ratios 1/4/8 (and 16: two blocks per KV head), block
// sizes 16/32, head sizes 8..256, contexts that cross block and split
// boundaries, prefill chunks starting mid-block, and decode batches of 1..256.
TEST_F(CudaBf16Test, PagedAttentionMatchesNaiveAttention) {
  std::vector<AttentionCase> cases = {
      {8, 4, 8, 16, {{37, 36}, {40, 21}, {16, 0}}},           // stories260K's shape
      {7, 7, 64, 16, {{1, 0}, {300, 299}, {17, 3}}},          // odd heads, GQA 1
      {12, 3, 64, 32, {{257, 250}, {513, 512}, {33, 32}}},    // GQA 4, split edges
      {32, 4, 128, 16, {{1000, 990}, {256, 255}, {90, 60}}},  // GQA 8, 4 splits
      {16, 1, 256, 32, {{70, 0}, {600, 599}}},                // GQA 16, head 256
      {5, 5, 40, 16, {{45, 44}}},                             // head size not / 32
      {8, 4, 32, 16, {{300, 299}, {20, 10}}, 0, 2.0f},        // Gemma 2's softcap
  };
  for (int32_t batch : {1, 64, 256})
    cases.push_back(DecodeBatch(batch, batch, 700));  // mixed lengths
  uint32_t seed = 11;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(Describe(c));
    AttentionPlan plan;
    RunAttentionCase(c, seed++, /*tensor_cores=*/false, kBf16OutTol, &plan);
  }
}

// However the split-K kernel's blocks take a row's splits (one block each,
// several through the pipelined kernel, a row to a block, or as the batch's
// size picks), every row comes out with the same bits: the splits are
// folded, merged and combined in the same order. Head sizes the pipelined
// kernel takes (32, 64, 128, 256) and one it does not (96: always per
// split), GQA 1 to 16, block sizes 16 and 32, rows of one split, of splits
// that end mid-block and of many splits, and batches large enough that the
// automatic choice pipelines (256 rows x 8 KV heads).
TEST_F(CudaBf16Test, SplitKBlocksOfAnySizeGiveTheSameBits) {
  std::vector<AttentionCase> cases = {
      {8, 2, 64, 16, {{1, 0}, {128, 127}, {129, 128}, {700, 699}, {2000, 1999}}},
      {7, 7, 32, 32, {{300, 299}, {5, 4}, {1025, 1024}}},
      {32, 4, 128, 16, {{1000, 999}, {256, 255}, {90, 89}, {385, 384}}},
      {16, 1, 256, 32, {{70, 69}, {600, 599}, {1300, 1299}}},
      {12, 3, 96, 16, {{513, 512}, {200, 199}}},
      {16, 2, 64, 16, {{40, 23}, {700, 600}, {260, 250}}},  // prefill rows too
  };
  for (int32_t batch : {64, 256}) cases.push_back(DecodeBatch(batch, batch + 7, 900));
  uint32_t seed = 301;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(Describe(c));
    AttentionPlan plan;
    std::vector<Bf16> per_split, got;
    RunAttentionCase(c, seed, /*tensor_cores=*/false, kBf16OutTol, &plan, 1, &per_split);
    for (int32_t spb : {0, 2, 3, 5, cuda::kAutoSplitsPerBlock}) {
      SCOPED_TRACE("splits per block " + std::to_string(spb));
      RunAttentionCase(c, seed, /*tensor_cores=*/false, kBf16OutTol, &plan, spb, &got);
      ASSERT_EQ(got.size(), per_split.size());
      int64_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] != per_split[i];
      EXPECT_EQ(differ, 0) << "of " << got.size() << " outputs";
    }
    ++seed;
  }
}

// The tensor-core route: Q and P are rounded to bf16 before their MMAs (a
// relative step of 2^-9 each, as in FlashAttention-2), so the tolerance is
// two bf16 steps where the split-K kernel's is one.
constexpr testing::Tolerance kBf16TensorCoreTol{4e-3, 1.0 / 64};

// Prefill chunks of every length class (under one tile, exact tiles, tiles
// plus a remainder, thousands of rows), starting at 0, mid-block and past
// earlier context, head sizes 32/64/96/128/256, GQA 1/4/7/8/16 (whole
// groups, groups that leave head slots empty, groups over two blocks), odd
// head counts, block sizes 16/32, Gemma 2's softcap, mixed with decode rows
// and short chunks that stay on the split-K kernel; head size 128 in both
// blocks.
TEST_F(CudaBf16Test, PrefillAttentionOnTensorCoresMatchesNaiveAttention) {
  if (!cuda::DeviceHasTensorCoreAttention(0)) GTEST_SKIP() << "compute capability below 8.0";
  std::vector<AttentionCase> cases = {
      {8, 8, 64, 16, {{16, 0}}},                                  // the smallest tile
      {8, 2, 64, 16, {{64, 0}, {128, 64}, {2000, 0}}},            // Llama 3.2 1B's GQA
      {7, 7, 32, 32, {{100, 17}, {5, 4}, {77, 0}}},               // odd heads, GQA 1
      {12, 3, 96, 16, {{300, 250}, {513, 512}, {65, 1}}},         // Phi-3's head size
      {32, 4, 128, 32, {{1100, 990}, {256, 255}, {90, 60}}},      // GQA 8, chunk mid-context
      {8, 2, 128, 16, {{2048, 0}}},                               // a long prompt
      {16, 2, 64, 16, {{40, 23}, {1, 0}, {700, 600}, {33, 32}}},  // mixed
      {14, 2, 64, 32, {{300, 0}, {2, 1}, {129, 97}}},             // GQA 7: 16-row head slots
      {28, 4, 128, 16, {{200, 120}, {50, 0}}},                    // GQA 7: two head chunks
      {16, 1, 64, 16, {{150, 100}}},                              // GQA 16: two head chunks
      {8, 4, 256, 16, {{1500, 0}, {100, 60}, {1, 0}}},            // Gemma 2 2B's heads
      {16, 8, 256, 32, {{300, 250}, {40, 0}}},                    // Gemma 2 9B's GQA 2
      {8, 4, 32, 16, {{300, 0}, {20, 19}}, 0, 2.0f},              // Gemma 2's softcap
      {8, 4, 256, 16, {{700, 300}}, 0, 50.0f},                    // Gemma 2 2B's, softcap 50
      {32, 16, 128, 16, {{400, 0}}, 0, 50.0f},                    // Gemma 2 27B's
      {8, 4, 256, 16, {{900, 0}}, 300, 50.0f},                    // and a window
  };
  uint32_t seed = 101;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(Describe(c));
    AttentionPlan plan;
    RunAttentionCase(c, seed, /*tensor_cores=*/true, kBf16TensorCoreTol, &plan);
    EXPECT_GT(plan.num_tiles(), 0) << "the case must reach the tensor-core kernel";
    if (c.hs == 128) {  // and in the wide block (ModelRunnerOptions::tensor_core_prefill_wide)
      SCOPED_TRACE("wide block");
      RunAttentionCase(c, seed, /*tensor_cores=*/true, kBf16TensorCoreTol, &plan,
                       cuda::kAutoSplitsPerBlock, nullptr, false, /*wide=*/true);
      EXPECT_GT(plan.num_tiles(), 0);
    }
    ++seed;
  }
}

// Sliding windows on both kernels: windows of 1, under a split, across
// split and block edges, and at least the context; on the split-K kernel
// every way of taking a row's splits gives the same bits (splits wholly below
// a row's window fold nothing); on the tensor cores, tiles whose rows' windows
// start in different key steps, and key steps that mask all of some rows.
TEST_F(CudaBf16Test, SlidingWindowsMatchNaiveAttention) {
  const std::vector<AttentionCase> shapes = {
      {8, 2, 64, 16, {{1, 0}, {128, 127}, {129, 128}, {700, 699}, {2000, 1999}}},
      {32, 4, 128, 16, {{1000, 999}, {256, 255}, {90, 89}, {385, 384}}},
      {12, 3, 96, 16, {{300, 250}, {513, 512}, {65, 1}}},
      {16, 2, 64, 16, {{40, 23}, {700, 600}, {260, 250}, {2048, 0}}},  // prefill chunks
  };
  uint32_t seed = 501;
  for (AttentionCase c : shapes) {
    for (int32_t window : {1, 100, 128, 129, 300, 4096}) {
      c.window = window;
      SCOPED_TRACE(Describe(c));
      AttentionPlan plan;
      std::vector<Bf16> per_split, got;
      RunAttentionCase(c, seed, /*tensor_cores=*/false, kBf16OutTol, &plan, 1, &per_split);
      for (int32_t spb : {0, 3, cuda::kAutoSplitsPerBlock}) {
        RunAttentionCase(c, seed, /*tensor_cores=*/false, kBf16OutTol, &plan, spb, &got);
        EXPECT_EQ(got, per_split) << "splits per block " << spb;
      }
      if (cuda::DeviceHasTensorCoreAttention(0)) {
        RunAttentionCase(c, seed, /*tensor_cores=*/true, kBf16TensorCoreTol, &plan);
      }
    }
    ++seed;
  }
}

// The tensor-core decode attention on every row the split-K kernel takes:
// decode batches of 1 to 256 rows of mixed lengths (one split to six), GQA
// 1/4/7/8 (head rows left empty), 16 (a whole MMA) and 32 (two chunks of
// 16), head sizes 32/64/96/128, block sizes 16/32, prefill rows (one
// position after another), sliding windows under, across and over the
// splits, and Gemma 2's softcap. Each against NaiveAttention, at the
// prefill kernel's tolerance
// (Q and P rounded to bf16); and rows of a batch get the bits they get
// alone.
TEST_F(CudaBf16Test, DecodeAttentionOnTensorCoresMatchesNaiveAttention) {
  if (!cuda::DeviceHasTensorCoreAttention(0)) GTEST_SKIP() << "compute capability below 8.0";
  std::vector<AttentionCase> cases = {
      {8, 2, 64, 16, {{1, 0}, {16, 15}, {17, 16}, {128, 127}, {129, 128}, {700, 699}}},
      {7, 7, 64, 16, {{1, 0}, {300, 299}, {17, 3}}},          // GQA 1, prefill rows
      {12, 3, 96, 32, {{257, 250}, {513, 512}, {33, 32}}},    // head 96, block 32
      {32, 4, 128, 16, {{1000, 990}, {256, 255}, {90, 60}}},  // GQA 8
      {14, 2, 64, 32, {{300, 299}, {2, 1}, {129, 97}}},       // GQA 7
      {16, 1, 64, 16, {{150, 149}, {600, 590}}},              // GQA 16
      {32, 1, 32, 16, {{70, 69}, {385, 380}}},                // GQA 32: two chunks
  };
  for (int32_t batch : {1, 64, 256}) cases.push_back(DecodeBatch(batch, batch + 5, 700));
  uint32_t seed = 701;
  for (AttentionCase c : cases) {
    for (int32_t window : {0, 1, 100, 129, 300, -1}) {
      // -1: Gemma 2's softcap of 2 (no window), which lets few tokens dominate.
      c.window = std::max(window, 0);
      c.softcap = window < 0 ? 2.0f : 0.0f;
      SCOPED_TRACE(Describe(c));
      AttentionPlan plan;
      RunAttentionCase(c, seed, /*tensor_cores=*/false, kBf16TensorCoreTol, &plan,
                       cuda::kAutoSplitsPerBlock, nullptr, /*decode_tc=*/true);
    }
    ++seed;
  }
  // A row's bits do not depend on the rows around it (a decode graph's
  // bucket pads the batch) or on which cache blocks hold its context: the
  // first sequence alone (the same K, V and query from the same seed, other
  // blocks) against it among others.
  const AttentionCase batch{8, 2, 64, 16, {{300, 299}, {40, 39}, {129, 128}}};
  std::vector<Bf16> together, alone;
  AttentionPlan plan;
  RunAttentionCase(batch, 9, false, kBf16TensorCoreTol, &plan, 1, &together, true);
  RunAttentionCase({8, 2, 64, 16, {batch.seqs[0]}}, 9, false, kBf16TensorCoreTol, &plan, 1, &alone,
                   true);
  ASSERT_EQ(alone.size(), size_t{8 * 64});
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), together.begin()));
}

TEST_F(CudaBf16Test, PagedAttentionRejectsHeadSizesItCannotHold) {
  const cuda::Bf16AttentionArgs args{
      .shape = KvCacheShape{.num_blocks = 1, .num_layers = 1, .block_size = 16,
                            .num_kv_heads = 1, .head_size = 512},
      .num_heads = 1,
      .num_rows = 1};
  EXPECT_NE(cuda::PagedAttentionBf16(args, 1, nullptr, nullptr), 0);
  cuda::Bf16AttentionArgs fits = args;
  fits.shape.head_size = 64;
  EXPECT_NE(cuda::PagedAttentionBf16(fits, 1, nullptr, nullptr, -2), 0) << "splits per block -2";
  for (int32_t hs : {40, 256}) {  // the tensor-core decode attention's are TensorCoreHeadSize's
    fits.shape.head_size = hs;
    EXPECT_NE(cuda::DecodeAttentionTcBf16(fits, 1, nullptr, nullptr), 0) << "head size " << hs;
  }
}

// Widths of 16-byte loads (700) and of one element a thread (702).
TEST_F(CudaBf16Test, SiluMulMatchesCpu) {
  for (const int32_t hidden : {700, 702}) {
    const int32_t rows = 3;
    const auto gu = RandomVector(rows * 2 * hidden, 7, 6.0f);
    std::vector<float> ref;
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t i = 0; i < hidden; ++i) {
        ref.push_back(SiluMul(gu[r * 2 * hidden + i], gu[r * 2 * hidden + hidden + i]));
      }
    }
    DeviceVector<float> dgu(gu);
    DeviceVector<Bf16> dout(ref.size());
    CUDA_OK(cuda::SiluMulBf16(dgu.get(), rows, hidden, dout.get(), nullptr));
    ExpectNear(ToFloat(dout.ToHost()), ref, kBf16OutTol, "silu");
  }
}

// Greedy sampling on the GPU must pick exactly kernels::ArgMax's token,
// including the lowest index among ties.
TEST_F(CudaBf16Test, ArgMaxIsExactlyTheCpuArgMax) {
  const int32_t vocab = 128256, rows = 9;
  auto logits = RandomVector(size_t{rows} * vocab, 9, 4.0f);
  logits[1 * vocab + 70000] = logits[1 * vocab + 5] = logits[1 * vocab + 128255] = 9.0f;  // tie
  logits[2 * vocab + 128255] = 9.0f;                                                   // last
  logits[3 * vocab + 0] = 9.0f;                                                        // first
  for (int32_t i = 0; i < vocab; ++i) logits[4 * vocab + i] = -1.0f;                   // all equal
  // Ties whose lowest index is not held by the lowest thread (1024 threads
  // stride the row: thread 0 holds 1024, thread 1 holds 1, thread 40 holds 40).
  logits[5 * vocab + 1024] = logits[5 * vocab + 1] = 9.0f;
  logits[6 * vocab + 1024] = logits[6 * vocab + 40] = 9.0f;
  std::vector<int32_t> ref;
  for (int32_t r = 0; r < rows; ++r) ref.push_back(ArgMax(&logits[static_cast<size_t>(r) * vocab], vocab));
  ASSERT_EQ(ref[1], 5);
  ASSERT_EQ(ref[5], 1);
  ASSERT_EQ(ref[6], 40);
  DeviceVector<float> d_logits(logits);
  DeviceVector<int32_t> d_out(rows);
  CUDA_OK(cuda::ArgMaxRows(d_logits.get(), rows, vocab, d_out.get(), nullptr));
  EXPECT_EQ(d_out.ToHost(), ref);
}

}  // namespace
}  // namespace tandem::kernels

#else

TEST(CudaBf16Test, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif
