// The bf16 decode kernels of cuda_bf16_ops.cu and cuda_gemm_tc.cu on the CPU
// through the SIMT emulator (simt/simt.h): the GEMV and the tensor-core
// GEMM against a double-precision product and to the same bits for a row
// whatever rows run with it, RMSNorm against the CPU's norm, the MLP's
// activation to the bit, RoPE and the KV write against the CPU's, and the
// argmax to the CPU's index.
// The emulator's macros come before the kernels.
// clang-format off
#define TANDEM_SIMT 1
#include "simt/simt.h"
#include "../../kernels/cuda_bf16_ops.cu"
#include "../../kernels/cuda_gemm_tc.cu"
// clang-format on

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernel_test_util.h"
#include "tandem/kernels/cpu_ops.h"
#include "tandem/model/checkpoint.h"

namespace tandem::kernels {
namespace {

using cuda::Bf16;
using testing::RandomVector;

std::vector<Bf16> ToBf16(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = model::FloatToBFloat16(v[i]);
  return out;
}

template <int R>
void Gemv(const std::vector<Bf16>& w, int32_t out_dim, int32_t in_dim, const Bf16* x, float* y,
          float beta) {
  const unsigned blocks =
      static_cast<unsigned>((out_dim + cuda::kGemvWarps - 1) / cuda::kGemvWarps);
  simt::Launch(simt::Dim3{blocks, 1, 1}, simt::Dim3{cuda::kGemvWarps * 32, 1, 1}, 0,
               [&] { cuda::GemvBf16Kernel<R, false>(w.data(), out_dim, in_dim, x, y, beta); });
}

// The GEMV's sum for one output of one row in the order its kernel adds:
// lane l takes the 16-byte runs l, l + 32, l + 64, ... of the row in turn,
// the 8 products of each in turn, then the warp's butterfly (xor 16, 8, 4,
// 2, 1) leaves the total in lane 0. A product of two bf16 values is exact
// in fp32, so the GPU's fused multiply-adds round as these adds do: the
// order fixes the bits, on the emulator and on the device alike.
float GemvInLaneOrder(const Bf16* w_row, const Bf16* x_row, int32_t in_dim) {
  float lane[32] = {};
  for (int32_t l = 0; l < 32; ++l) {
    for (int32_t k = l; k < in_dim / 8; k += 32) {
      for (int32_t e = 0; e < 8; ++e) {
        lane[l] +=
            model::BFloat16ToFloat(w_row[k * 8 + e]) * model::BFloat16ToFloat(x_row[k * 8 + e]);
      }
    }
  }
  for (int32_t off = 16; off > 0; off /= 2) {
    float next[32];
    for (int32_t l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ off];
    std::copy(next, next + 32, lane);
  }
  return lane[0];
}

// Outputs that leave a block part empty, rows longer than the unrolled
// loop and shorter than one warp's load, rows whose lanes end on a part of
// the unrolled loop (TinyLlama's 5,632), 1 to 4 rows, the residual folded
// in (beta 1) and y never read (beta 0, NaN there); each output to the bit
// of the lane order above (how the loads are batched may change, the order
// of the adds may not), and each row of a 4-row launch equals the same row
// alone, to the bit.
TEST(SimtBf16OpsTest, GemvMatchesTheProductAndKeepsEachRowsBits) {
  for (auto [out_dim, in_dim] : std::vector<std::pair<int32_t, int32_t>>{
           {13, 2048}, {100, 1032}, {9, 8192}, {37, 8}, {30, 776}, {11, 5632}, {10, 2056}}) {
    SCOPED_TRACE(::testing::Message() << out_dim << " x " << in_dim);
    const auto wf = RandomVector(static_cast<size_t>(out_dim) * in_dim, 4);
    const auto xf = RandomVector(static_cast<size_t>(4) * in_dim, 5);
    const auto w = ToBf16(wf), x = ToBf16(xf);
    const auto y0 = RandomVector(static_cast<size_t>(4) * out_dim, 6);
    std::vector<float> y4 = y0;
    simt::SetSchedule({.warps_run_ahead = out_dim % 2 == 0, .reverse = in_dim % 3 == 0});
    Gemv<4>(w, out_dim, in_dim, x.data(), y4.data(), 1.0f);
    for (int32_t r = 0; r < 4; ++r) {
      for (int32_t o = 0; o < out_dim; ++o) {
        double acc = y0[static_cast<size_t>(r) * out_dim + o];
        for (int32_t i = 0; i < in_dim; ++i) {
          acc += double{model::BFloat16ToFloat(w[static_cast<size_t>(o) * in_dim + i])} *
                 model::BFloat16ToFloat(x[static_cast<size_t>(r) * in_dim + i]);
        }
        ASSERT_NEAR(y4[static_cast<size_t>(r) * out_dim + o], acc, 1e-4 * std::sqrt(double(in_dim)))
            << "row " << r << " output " << o;
      }
      std::vector<float> alone(static_cast<size_t>(out_dim),
                               std::numeric_limits<float>::quiet_NaN());
      Gemv<1>(w, out_dim, in_dim, x.data() + static_cast<size_t>(r) * in_dim, alone.data(), 0.0f);
      for (int32_t o = 0; o < out_dim; ++o) {
        ASSERT_EQ(alone[static_cast<size_t>(o)],
                  GemvInLaneOrder(w.data() + static_cast<size_t>(o) * in_dim,
                                  x.data() + static_cast<size_t>(r) * in_dim, in_dim))
            << "row " << r << " output " << o;
        // The same sum with the residual added after: y4 - y0 is not exact,
        // so compare y4 with alone + y0 as the kernel computes it.
        ASSERT_EQ(y4[static_cast<size_t>(r) * out_dim + o],
                  alone[static_cast<size_t>(o)] + 1.0f * y0[static_cast<size_t>(r) * out_dim + o])
            << "row " << r << " output " << o;
      }
    }
  }
}

// y = x W^T + beta y through TcGemmKernel (and the reduce of its splits'
// partial sums) for `rows` rows of x.
std::vector<float> TcGemm(const std::vector<Bf16>& w, int32_t out_dim, int32_t in_dim,
                          const Bf16* x, int32_t rows, std::vector<float> y, float beta,
                          int32_t splits) {
  std::vector<float> partial(static_cast<size_t>(splits) * rows * out_dim);
  const simt::Dim3 grid{
      static_cast<unsigned>((out_dim + cuda::kBlockOutputs - 1) / cuda::kBlockOutputs),
      static_cast<unsigned>(splits), 1};
  const simt::Dim3 block{cuda::kTcGemmThreads, 1, 1};
  auto run = [&](auto nt) {
    constexpr int kNT = decltype(nt)::value;
    simt::Launch(grid, block, 0, [&] {
      cuda::TcGemmKernel<kNT>(w.data(), out_dim, in_dim, x, rows, y.data(), beta, splits,
                              partial.data());
    });
  };
  simt::WithConstant<1, 2, 5, 8>((rows + 7) / 8, run);
  if (splits > 1) {
    const int64_t n = int64_t{rows} * out_dim;
    simt::Launch(simt::Dim3{static_cast<unsigned>((n + 255) / 256), 1, 1}, simt::Dim3{256, 1, 1}, 0,
                 [&] { cuda::TcGemmReduceKernel(partial.data(), splits, n, y.data(), beta); });
  }
  return y;
}

// Batches of 5 to 64 rows (n-tiles left part empty), outputs that leave a
// block part empty, the reduction in one slice or split 3 and 8 ways
// (slices of unequal chunks), the residual folded in (beta 1) and y never
// read (beta 0, NaN there); each row of a 64-row launch equals the same row
// in a 5-row launch, to the bit.
TEST(SimtBf16OpsTest, TensorCoreGemmMatchesTheProductAndKeepsEachRowsBits) {
  for (auto [out_dim, in_dim, splits] : std::vector<std::tuple<int32_t, int32_t, int32_t>>{
           {64, 512, 1}, {100, 320, 3}, {37, 512, 8}, {130, 64, 1}}) {
    SCOPED_TRACE(::testing::Message() << out_dim << " x " << in_dim << ", " << splits << " splits");
    const int32_t rows = 64;
    const auto w = ToBf16(RandomVector(static_cast<size_t>(out_dim) * in_dim, 14));
    const auto x = ToBf16(RandomVector(static_cast<size_t>(rows) * in_dim, 15));
    const auto y0 = RandomVector(static_cast<size_t>(rows) * out_dim, 16);
    simt::SetSchedule({.copies_at_wait = splits != 1,
                       .warps_run_ahead = splits != 3,
                       .reverse = out_dim % 2 == 0});
    const std::vector<float> all = TcGemm(w, out_dim, in_dim, x.data(), rows, y0, 1.0f, splits);
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t o = 0; o < out_dim; ++o) {
        double acc = y0[static_cast<size_t>(r) * out_dim + o];
        for (int32_t i = 0; i < in_dim; ++i) {
          acc += double{model::BFloat16ToFloat(w[static_cast<size_t>(o) * in_dim + i])} *
                 model::BFloat16ToFloat(x[static_cast<size_t>(r) * in_dim + i]);
        }
        ASSERT_NEAR(all[static_cast<size_t>(r) * out_dim + o], acc,
                    1e-4 * std::sqrt(double(in_dim)))
            << "row " << r << " output " << o;
      }
    }
    // Rows 16 .. 20 as a batch of 5, y never read (NaN), then + y0 as the
    // kernel adds it.
    const std::vector<float> nan(static_cast<size_t>(5) * out_dim,
                                 std::numeric_limits<float>::quiet_NaN());
    const std::vector<float> five = TcGemm(
        w, out_dim, in_dim, x.data() + static_cast<size_t>(16) * in_dim, 5, nan, 0.0f, splits);
    for (int32_t r = 0; r < 5; ++r) {
      for (int32_t o = 0; o < out_dim; ++o) {
        const size_t at = static_cast<size_t>(16 + r) * out_dim + o;
        ASSERT_EQ(all[at], five[static_cast<size_t>(r) * out_dim + o] + 1.0f * y0[at])
            << "row " << 16 + r << " output " << o;
      }
    }
  }
}

// The norm of each row (and of gathered rows) against cpu::RmsNorm, at the
// block sizes the launch picks (64, 256 and 1024 threads).
TEST(SimtBf16OpsTest, RmsNormMatchesTheCpusNorm) {
  for (const int32_t dim : {96, 512, 2048}) {
    const int32_t rows = 3;
    const auto x = RandomVector(static_cast<size_t>(rows) * dim, 7, 3.0f);
    const auto w = RandomVector(static_cast<size_t>(dim), 8);
    std::vector<float> want(x.size());
    cpu::RmsNorm(x.data(), w.data(), rows, dim, 1e-5f, want.data());
    const std::vector<int32_t> index = {2, 0, 1};
    std::vector<Bf16> got(x.size());
    simt::SetSchedule({.warps_run_ahead = true, .reverse = dim == 512});
    simt::Launch(simt::Dim3{static_cast<unsigned>(rows), 1, 1},
                 simt::Dim3{static_cast<unsigned>(cuda::RmsNormThreads(dim)), 1, 1}, 0, [&] {
                   cuda::RmsNormKernel(x.data(), index.data(), w.data(), dim, 1e-5f, got.data());
                 });
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t j = 0; j < dim; ++j) {
        const float ref = want[static_cast<size_t>(index[r]) * dim + j];
        ASSERT_NEAR(model::BFloat16ToFloat(got[static_cast<size_t>(r) * dim + j]), ref,
                    2e-3 + std::fabs(ref) / 128)
            << "dim " << dim << " row " << r << " element " << j;
      }
    }
  }
}

// act(gate) * up for every element of every row, each written once, to
// the bit of the per-element arithmetic (the emulator's __expf): widths
// that take 16-byte loads (700, Llama's 8,192) and one that does not (702),
// both activations, and more rows than the grid has (the row loop).
TEST(SimtBf16OpsTest, SiluMulWritesEveryElementOnce) {
  for (const int32_t hidden : {700, 702, 8192}) {
    for (const ActKind kind : {ActKind::kSilu, ActKind::kGeluTanh}) {
      SCOPED_TRACE(::testing::Message()
                   << "hidden " << hidden << " gelu " << (kind == ActKind::kGeluTanh));
      const int32_t rows = 5;
      const auto gu = RandomVector(static_cast<size_t>(rows) * 2 * hidden, 9, 6.0f);
      std::vector<Bf16> got(static_cast<size_t>(rows) * hidden,
                            model::FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()));
      const int v = hidden % 4 == 0 ? 4 : 1;
      const simt::Dim3 grid{static_cast<unsigned>((hidden + 256 * v - 1) / (256 * v)), 2, 1};
      simt::Launch(grid, simt::Dim3{256, 1, 1}, 0, [&] {
        v == 4 ? cuda::SiluMulKernel<4>(gu.data(), hidden, rows, got.data(), kind)
               : cuda::SiluMulKernel<1>(gu.data(), hidden, rows, got.data(), kind);
      });
      for (int32_t r = 0; r < rows; ++r) {
        for (int32_t c = 0; c < hidden; ++c) {
          const float g = gu[static_cast<size_t>(r) * 2 * hidden + c];
          const float u = gu[static_cast<size_t>(r) * 2 * hidden + hidden + c];
          const float want =
              kind == ActKind::kGeluTanh ? GeluTanhMul(g, u) : g / (1.0f + __expf(-g)) * u;
          ASSERT_EQ(got[static_cast<size_t>(r) * hidden + c], model::FloatToBFloat16(want))
              << "row " << r << " column " << c;
        }
      }
    }
  }
}

// RoPE on q and k in place and k/v into the bf16 cache, against cpu::Rope
// and cpu::KvWrite: both RoPE layouts, Llama 3's amplitude, partial RoPE
// (Phi-4-mini's 0.75 of 128: the elements it leaves must still reach the
// cache), GQA, a row without a slot (nothing written), and a cache that is
// NaN wherever no slot is written (a stray write shows).
TEST(SimtBf16OpsTest, RopeAndKvWriteMatchTheCpu) {
  for (const RopeKind kind : testing::kRopeKinds) {
    for (const auto& dims : testing::kRopeKvShapes) {
      SCOPED_TRACE(::testing::Message()
                   << "heads " << dims[0] << "/" << dims[1] << " hs " << dims[2]);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      testing::RopeKvCase c = testing::MakeRopeKvCase(kind, dims, nan);
      const std::vector<float>& want = c.want_cache;
      std::vector<Bf16> cache(want.size(), model::FloatToBFloat16(nan));
      const int32_t pairs = (c.heads + 2 * c.shape.num_kv_heads) * (c.hs / 2);
      simt::Launch(
          simt::Dim3{static_cast<unsigned>(c.rows),
                     static_cast<unsigned>((pairs + cuda::kRopeThreads - 1) / cuda::kRopeThreads),
                     1},
          simt::Dim3{cuda::kRopeThreads, 1, 1}, 0, [&] {
            cuda::RopeKvWriteKernel(c.qkv.data(), c.stride, c.pos.data(), c.heads, c.shape, kind,
                                    10000.0f, nullptr, c.amplitude, c.rotary_dim, cache.data(), 1,
                                    c.slots.data());
          });
      for (int32_t r = 0; r < c.rows; ++r) {
        for (int32_t i = 0; i < c.heads * c.hs; ++i) {
          ASSERT_NEAR(c.qkv[static_cast<size_t>(r) * c.stride + i],
                      c.want_q[static_cast<size_t>(r) * c.heads * c.hs + i], 1e-4)
              << "row " << r << " q element " << i;
        }
      }
      for (size_t i = 0; i < want.size(); ++i) {
        const float got = model::BFloat16ToFloat(cache[i]);
        if (std::isnan(want[i])) {
          ASSERT_TRUE(std::isnan(got)) << "cache float " << i << " written, no slot holds it";
        } else {
          ASSERT_NEAR(got, want[i], 2e-3 + std::fabs(want[i]) / 128) << "cache float " << i;
        }
      }
    }
  }
}

// The lowest index of the largest logit, as kernels::ArgMax: ties, -inf
// rows (0), a NaN, rows that are not 16-byte aligned and vocabularies that
// are not a multiple of 4.
TEST(SimtBf16OpsTest, ArgMaxIsTheCpusArgMax) {
  for (const int32_t vocab : {7, 1000, 32001, 128256}) {
    const int32_t rows = 4;
    auto logits = RandomVector(static_cast<size_t>(rows) * vocab, 9, 4.0f);
    for (int32_t i = 0; i < vocab; ++i) {
      logits[static_cast<size_t>(vocab) + i] = std::round(logits[static_cast<size_t>(vocab) + i]);
      logits[static_cast<size_t>(2) * vocab + i] = -INFINITY;
    }
    logits[static_cast<size_t>(3) * vocab + vocab / 2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<int32_t> got(rows, -1);
    simt::SetSchedule({.warps_run_ahead = vocab % 2 == 0, .reverse = true});
    simt::Launch(simt::Dim3{static_cast<unsigned>(rows), 1, 1}, simt::Dim3{1024, 1, 1}, 0,
                 [&] { cuda::ArgMaxKernel(logits.data(), vocab, got.data()); });
    for (int32_t r = 0; r < rows; ++r) {
      EXPECT_EQ(got[r], ArgMax(logits.data() + static_cast<size_t>(r) * vocab, vocab))
          << "vocab " << vocab << " row " << r;
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
