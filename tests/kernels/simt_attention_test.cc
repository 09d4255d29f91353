// The tensor-core attention kernels (prefill, and decode on tensor cores)
// run on the CPU through the SIMT emulator (simt/simt.h), against
// NaiveAttention: the logic of kernels that only a lent GPU can time, on
// every machine. The GPU's own tests (cuda_bf16_ops_test.cc) cover more
// cases and the instructions' real bits; these are smaller, since each
// emulated warp instruction switches 32 fibers.
// The emulator's macros come before the kernels.
// clang-format off
#define TANDEM_SIMT 1
#include "simt/simt.h"
// The kernels, as host C++ (TANDEM_SIMT leaves their launch code out).
#include "../../kernels/cuda_decode_attention.cu"
#include "../../kernels/cuda_decode_attention_tc.cu"
#include "../../kernels/cuda_prefill_attention.cu"
// clang-format on

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernel_test_util.h"
#include "tandem/kernels/attention_plan.h"
#include "tandem/kernels/attention_split.h"
#include "tandem/kernels/cpu_ops.h"
#include "tandem/model/checkpoint.h"

namespace tandem::kernels {
namespace {

using cuda::Bf16;
using testing::AttentionProblem;
using testing::MakeAttentionProblem;

// The GPU tests' tolerances: the split-K kernel's one bf16 step, and the
// tensor-core kernels' two (Q and P rounded to bf16).
constexpr testing::Tolerance kSplitKTol{2e-3, 1.0 / 128};
constexpr testing::Tolerance kTensorCoreTol{4e-3, 1.0 / 64};

struct Case {
  int32_t heads, kv_heads, hs, block;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (context, first query position)
  int32_t window = 0;
  float softcap = 0.0f;
};

// Each run takes the next of the emulator's adversarial schedules: copies
// at once while warps run ahead (a stage refilled before every warp is done
// with it), or copies at their wait while threads take turns (a stage read
// before its copies' wait), forward and backward in turn. RunPrefill and
// RunDecodeTc run each case under both.
simt::Schedule NextSchedule() {
  static int next = 0;
  const int i = next++;
  const simt::Schedule s{
      .copies_at_wait = i % 2 == 1, .warps_run_ahead = i % 2 == 0, .reverse = i / 2 % 2 == 1};
  simt::SetSchedule(s);
  return s;
}

std::string Describe(const Case& c) {
  std::string s = "heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " hs " +
                  std::to_string(c.hs) + " block " + std::to_string(c.block) + " window " +
                  std::to_string(c.window) + " softcap " + std::to_string(c.softcap) + " seqs";
  for (const auto& [len, first] : c.seqs)
    s += " " + std::to_string(len) + "/" + std::to_string(first);
  return s;
}

// The problem with bf16 K/V, its reference, and the cache as the GPU holds
// it: bf16, NaN in every slot no token was written to.
struct Prepared {
  AttentionProblem p;
  std::vector<double> ref;
  std::vector<Bf16> cache;
  std::vector<Bf16> out;
  cuda::Bf16AttentionArgs args;
  simt::Schedule schedule;
  // The split-K scratch for the rows' longest context.
  int32_t max_context = 0;
  int32_t splits = 0;
  std::vector<float> scratch;
};

Prepared Prepare(const Case& c, uint32_t seed) {
  Prepared r;
  r.schedule = NextSchedule();
  AttentionProblem& p = r.p;
  p = MakeAttentionProblem(c.heads, c.kv_heads, c.hs, c.block, c.seqs, seed);
  p.window = c.window;
  p.softcap = c.softcap;
  auto round = [](std::vector<float>& v) {
    for (float& x : v) x = model::BFloat16ToFloat(model::FloatToBFloat16(x));
  };
  for (auto* kv : {&p.seq_k, &p.seq_v}) {
    for (auto& s : *kv) round(s);
  }
  round(p.all_k);
  round(p.all_v);
  // The reference of a (case, seed), computed once: the runs under other
  // schedules and split choices reuse it.
  static std::map<std::string, std::vector<double>> references;
  const std::string key = Describe(c) + " seed " + std::to_string(seed);
  auto known = references.find(key);
  if (known == references.end()) known = references.emplace(key, testing::NaiveAttention(p)).first;
  r.ref = known->second;
  std::fill(p.cache.begin(), p.cache.end(), std::numeric_limits<float>::quiet_NaN());
  cpu::KvWrite(p.cache.data(), p.shape, 1, p.all_k.data(), p.all_v.data(),
               static_cast<int32_t>(p.slots.size()), p.slots.data());
  r.cache.resize(p.cache.size());
  for (size_t i = 0; i < p.cache.size(); ++i) r.cache[i] = model::FloatToBFloat16(p.cache[i]);
  r.out.assign(p.q.size(), model::FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()));
  for (const int32_t pos : p.row_pos) r.max_context = std::max(r.max_context, pos + 1);
  r.splits = cuda::AttentionSplits(r.max_context);
  r.scratch.resize(static_cast<size_t>(cuda::AttentionScratchFloats(
      static_cast<int32_t>(p.row_pos.size()), c.heads, c.hs, r.max_context)));
  r.args = cuda::Bf16AttentionArgs{.q = p.q.data(),
                                   .q_stride = c.heads * c.hs,
                                   .out = r.out.data(),
                                   .cache = r.cache.data(),
                                   .shape = p.shape,
                                   .layer = 1,
                                   .num_heads = c.heads,
                                   .num_rows = static_cast<int32_t>(p.row_pos.size()),
                                   .row_pos = p.row_pos.data(),
                                   .row_table_offset = p.row_table_offset.data(),
                                   .block_tables = p.block_tables.data(),
                                   .window = c.window,
                                   .softcap = c.softcap};
  return r;
}

// Rows `rows` of the output against the reference.
void ExpectRowsNear(const Prepared& r, const std::vector<int32_t>& rows, const Case& c,
                    const testing::Tolerance& tol = kTensorCoreTol) {
  SCOPED_TRACE(::testing::Message()
               << "copies at wait " << r.schedule.copies_at_wait << ", warps run ahead "
               << r.schedule.warps_run_ahead << ", reversed " << r.schedule.reverse);
  const int32_t width = c.heads * c.hs;
  int64_t checked = 0;
  for (const int32_t row : rows) {
    for (int32_t i = 0; i < width; ++i) {
      const size_t at = static_cast<size_t>(row) * width + i;
      const double got = model::BFloat16ToFloat(r.out[at]), want = r.ref[at];
      ASSERT_LE(std::fabs(got - want), tol.abs_tol + std::fabs(want) * tol.rel_tol)
          << "row " << row << " element " << i << ": got " << got << " want " << want;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

template <int D, bool kCap, bool kWide>
void LaunchPrefill(const cuda::Bf16AttentionArgs& a, const AttentionPlan& plan) {
  const int32_t group = a.num_heads / a.shape.num_kv_heads;
  const int32_t block_heads = TensorCoreBlockHeads(D, group, kWide);
  const int32_t head_chunks = (group + block_heads - 1) / block_heads;
  const simt::Dim3 grid{static_cast<unsigned>(plan.num_tiles()),
                        static_cast<unsigned>(a.shape.num_kv_heads * head_chunks), 1};
  simt::Launch(grid, simt::Dim3{cuda::kThreads, 1, 1}, cuda::kSharedBytes<D, kWide>, [&] {
    cuda::PrefillAttentionKernel<D, kCap, kWide>(a, KvLayerRows(a.shape, a.layer),
                                                 plan.tiles.data(), head_chunks);
  });
}

// The prefill chunks PlanAttention gives the tensor cores, through the
// emulated PrefillAttentionKernel; the rows it leaves to the split-K
// kernel are not checked here.
// wide: PlanAttention's and the kernel's wide block (head size 128).
void RunPrefill(const Case& c, uint32_t seed, bool wide = false) {
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(Describe(c) + (wide ? " (wide block)" : ""));
    Prepared r = Prepare(c, seed);
    const AttentionPlan plan = PlanAttention(r.p.row_pos, r.p.row_table_offset, c.hs,
                                             c.heads / c.kv_heads, /*tensor_cores=*/true, wide);
    ASSERT_GT(plan.num_tiles(), 0) << "the case must reach the tensor-core kernel";
    simt::WithConstant<32, 64, 96, 128, 256>(c.hs, [&](auto d) {
      constexpr int D = decltype(d)::value;
      auto launch = [&](auto wide_const) {
        constexpr bool kWide = decltype(wide_const)::value;
        c.softcap > 0 ? LaunchPrefill<D, true, kWide>(r.args, plan)
                      : LaunchPrefill<D, false, kWide>(r.args, plan);
      };
      wide ? launch(std::true_type{}) : launch(std::false_type{});
    });
    std::vector<int32_t> rows;
    for (int32_t t = 0; t < plan.num_tiles(); ++t) {
      for (int32_t i = 0; i < plan.tiles[2 * t + 1]; ++i) rows.push_back(plan.tiles[2 * t] + i);
    }
    ExpectRowsNear(r, rows, c);
  }
}

template <int D, bool kCap>
void LaunchDecodeTc(const cuda::Bf16AttentionArgs& a, int32_t splits, float* scratch) {
  const int32_t group = a.num_heads / a.shape.num_kv_heads;
  const int32_t head_chunks = (group + 15) / 16;
  const int64_t blocks = int64_t{a.num_rows} * a.shape.num_kv_heads * head_chunks * splits;
  simt::Launch(simt::Dim3{static_cast<unsigned>(blocks), 1, 1},
               simt::Dim3{cuda::kTcWarps * 32, 1, 1}, 0,
               [&] { cuda::DecodeAttentionTcKernel<D, kCap>(a, splits, head_chunks, scratch); });
}

// Every row through the emulated DecodeAttentionTcKernel, and the splits of
// rows longer than one combined as CombineAttentionSplits does (m, l and
// the weighted sums of each split in the scratch).
void RunDecodeTc(const Case& c, uint32_t seed) {
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(Describe(c));
    Prepared r = Prepare(c, seed);
    const int32_t splits = r.splits;
    std::vector<float>& scratch = r.scratch;
    const bool cap = c.softcap > 0;
    simt::WithConstant<32, 64, 96, 128>(c.hs, [&](auto d) {
      constexpr int D = decltype(d)::value;
      cap ? LaunchDecodeTc<D, true>(r.args, splits, scratch.data())
          : LaunchDecodeTc<D, false>(r.args, splits, scratch.data());
    });
    const int32_t stride = c.hs + 2;
    for (int32_t row = 0; row < r.args.num_rows; ++row) {
      const int32_t n = cuda::AttentionSplits(r.p.row_pos[row] + 1);
      if (n == 1) continue;  // the kernel wrote the output
      for (int32_t h = 0; h < c.heads; ++h) {
        const float* base = scratch.data() + (int64_t{row} * c.heads + h) * splits * stride;
        float mx = -FLT_MAX;
        for (int32_t s = 0; s < n; ++s) mx = std::max(mx, base[s * stride]);
        for (int32_t d = 0; d < c.hs; ++d) {
          float lsum = 0.0f, asum = 0.0f;
          for (int32_t s = 0; s < n; ++s) {
            const float w = std::exp(base[s * stride] - mx);
            lsum += base[s * stride + 1] * w;
            asum += base[s * stride + 2 + d] * w;
          }
          r.out[(int64_t{row} * c.heads + h) * c.hs + d] = model::FloatToBFloat16(asum / lsum);
        }
      }
    }
    std::vector<int32_t> rows(static_cast<size_t>(r.args.num_rows));
    for (int32_t i = 0; i < r.args.num_rows; ++i) rows[i] = i;
    ExpectRowsNear(r, rows, c);
  }
}

template <int L, int kG, bool kCap>
void LaunchSplitK(const cuda::Bf16AttentionArgs& a, int32_t splits, int32_t spb, float* scratch) {
  const int32_t group = a.num_heads / a.shape.num_kv_heads;
  const unsigned row_blocks =
      static_cast<unsigned>(a.num_rows * a.shape.num_kv_heads * ((group + kG - 1) / kG));
  const KvLayerRows rows(a.shape, a.layer);
  if (spb <= 1) {
    simt::Launch(simt::Dim3{row_blocks, static_cast<unsigned>(splits), 1},
                 simt::Dim3{cuda::kAttnThreads, 1, 1},
                 sizeof(float) * cuda::kAttnWarps * kG * (a.shape.head_size + 2),
                 [&] { cuda::PagedAttentionKernel<L, kG, kCap>(a, rows, splits, scratch); });
  } else {
    simt::Launch(simt::Dim3{row_blocks, static_cast<unsigned>((splits + spb - 1) / spb), 1},
                 simt::Dim3{cuda::kAttnThreads, 1, 1}, cuda::kPipelinedSharedBytes<L, kG>, [&] {
                   cuda::PagedAttentionPipelinedKernel<L, kG, kCap>(a, rows, splits, spb, scratch);
                 });
  }
}

template <int L, bool kCap>
void LaunchSplitKForGroup(const cuda::Bf16AttentionArgs& a, int32_t splits, int32_t spb,
                          float* scratch) {
  static_assert(cuda::kMaxGroup == 8, "BlockHeads' largest");
  simt::WithConstant<1, 2, 4, 8>(cuda::BlockHeads(a.num_heads / a.shape.num_kv_heads), [&](auto g) {
    LaunchSplitK<L, decltype(g)::value, kCap>(a, splits, spb, scratch);
  });
}

// PagedAttentionBf16 through the emulator: the per-split kernel (spb 1) or
// the pipelined one (spb > 1, head sizes of L * 8), then the combine where
// a row has several splits and no block took them all.
std::vector<Bf16> RunSplitK(const Case& c, uint32_t seed, int32_t spb) {
  Prepared r = Prepare(c, seed);
  const int32_t splits = r.splits;
  std::vector<float>& scratch = r.scratch;
  const int32_t lanes = c.hs <= 32 ? 4 : c.hs <= 64 ? 8 : c.hs <= 128 ? 16 : 32;
  if (c.hs != lanes * cuda::kMaxE) spb = 1;  // the pipelined kernel's head sizes only
  spb = spb == 0 ? splits : std::min(spb, splits);
  const bool cap = c.softcap > 0;
  auto launch = [&](auto lanes_const) {
    constexpr int L = decltype(lanes_const)::value;
    cap ? LaunchSplitKForGroup<L, true>(r.args, splits, spb, scratch.data())
        : LaunchSplitKForGroup<L, false>(r.args, splits, spb, scratch.data());
  };
  simt::WithConstant<4, 8, 16, 32>(lanes, launch);
  if (splits > 1 && spb != splits) {
    simt::Launch(simt::Dim3{static_cast<unsigned>(r.args.num_rows * c.heads), 1, 1},
                 simt::Dim3{c.hs <= 64 ? 64u : 128u, 1, 1}, 0,
                 [&] { cuda::CombineSplitsKernel(r.args, splits, scratch.data()); });
  }
  std::vector<int32_t> rows(static_cast<size_t>(r.args.num_rows));
  for (int32_t i = 0; i < r.args.num_rows; ++i) rows[i] = i;
  ExpectRowsNear(r, rows, c, kSplitKTol);
  return r.out;
}

// The split-K kernels (every decode row by default): against NaiveAttention,
// and the same bits however a row's splits are taken (one block each, or
// pipelined two, three or all to a block). Head sizes 8 to 256 (lanes 4 to
// 32), GQA 1 to 16, block sizes 16 and 32, windows and the softcap.
TEST(SimtAttentionTest, SplitKAttentionMatchesNaiveAttentionAndKeepsItsBits) {
  std::vector<Case> cases = {
      {8, 4, 8, 16, {{37, 36}, {40, 21}, {16, 0}}},             // stories260K's shape
      {7, 7, 64, 16, {{1, 0}, {300, 299}, {17, 13}}},           // GQA 1, 3 splits
      {12, 3, 64, 32, {{257, 255}, {33, 32}}},                  // GQA 4, split edges
      {32, 4, 128, 16, {{260, 258}}},                           // GQA 8, head 128
      {16, 1, 256, 32, {{140, 139}}},                           // GQA 16, head 256
      {5, 5, 40, 16, {{45, 44}}},                               // head size not / 8 lanes
      {8, 4, 32, 16, {{300, 299}, {20, 10}}, 0, 2.0f},          // Gemma 2's softcap
      {8, 2, 64, 16, {{300, 299}, {129, 128}, {40, 39}}, 100},  // a sliding window
  };
  uint32_t seed = 91;
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c));
    const std::vector<Bf16> per_split = RunSplitK(c, seed, 1);
    for (const int32_t spb : {0, 2}) {
      EXPECT_EQ(RunSplitK(c, seed, spb), per_split) << "splits per block " << spb;
    }
    ++seed;
  }
}

// The emulator's own rules: a barrier orders every thread's shared writes
// before any read after it, a shuffle reads the partner lane's value, a
// vote sees every lane, and the blocks of a 2-D grid each run once.
TEST(SimtAttentionTest, TheEmulatorKeepsBarriersShufflesAndVotes) {
  std::vector<int32_t> seen(2 * 3 * 64, -1);
  simt::Launch(simt::Dim3{2, 3, 1}, simt::Dim3{64, 1, 1}, 64 * sizeof(int32_t), [&] {
    auto* shared = reinterpret_cast<int32_t*>(simt::DynamicShared());
    const int t = static_cast<int>(threadIdx.x);
    shared[t] = t * 10;
    __syncthreads();
    const int neighbour = shared[(t + 1) % 64];  // written by another fiber before the barrier
    const int partner = __shfl_xor_sync(0xffffffffu, t, 5);
    const bool all_small = __all_sync(0xffffffffu, t < 64) != 0;
    const bool all_even = __all_sync(0xffffffffu, t % 2 == 0) != 0;
    const int block = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x);
    seen[static_cast<size_t>(block * 64 + t)] = (neighbour == ((t + 1) % 64) * 10) +
                                                2 * (partner == (t ^ 5)) + 4 * all_small +
                                                8 * !all_even;
  });
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 15) << "thread " << i % 64;
}

// Tiles of GQA 1, 4, 7, 8 and 16 (one or two head chunks), head sizes 32 to
// 256 (256: Q from shared memory, 32 keys a step), block sizes 16 and 32,
// chunks that start at 0, mid-block and past earlier context; key steps
// wholly seen (the unmasked path), on the diagonal, and cut by windows of 1
// to past the context; Gemma 2's softcap, with and without a window.
TEST(SimtAttentionTest, PrefillOnTensorCoresMatchesNaiveAttention) {
  const std::vector<Case> cases = {
      {8, 8, 64, 16, {{16, 0}}},     {8, 2, 64, 16, {{64, 0}, {150, 64}}},
      {7, 7, 32, 32, {{50, 17}}},    {12, 3, 96, 16, {{80, 40}}},
      {32, 4, 128, 32, {{100, 70}}}, {14, 2, 64, 32, {{90, 40}}},
      {16, 1, 64, 16, {{40, 10}}},
  };
  uint32_t seed = 41;
  for (const Case& c : cases) RunPrefill(c, seed++);
  // A long prompt of Llama-3.2-1B's attention shape (its tiles' later key
  // steps all unmasked), and one of TinyLlama's GQA 8.
  RunPrefill({32, 8, 64, 16, {{600, 0}}}, seed++);
  RunPrefill({32, 4, 64, 16, {{400, 250}}}, seed++);
  for (const int32_t window : {1, 20, 64, 100, 400}) {
    Case c{8, 2, 64, 16, {{200, 100}, {70, 0}}};
    c.window = window;
    RunPrefill(c, seed++);
  }
  // Gemma's head size 256: Gemma 2 2B's GQA 2, Gemma 3 1B's GQA 4 (one KV
  // head), a chunk past earlier context, a window of 50.
  RunPrefill({4, 2, 256, 16, {{150, 0}, {40, 20}}}, seed++);
  RunPrefill({4, 1, 256, 32, {{100, 60}}}, seed++);
  RunPrefill({4, 2, 256, 16, {{130, 0}}, 50}, seed++);
  // Softcapped scores (Gemma 2: cap 2 as its test checkpoint, 50 as it
  // ships), with a window, at head sizes 32, 128 and 256.
  RunPrefill({8, 4, 32, 16, {{120, 0}, {30, 10}}, 0, 2.0f}, seed++);
  RunPrefill({8, 4, 32, 16, {{150, 0}}, 20, 2.0f}, seed++);
  RunPrefill({8, 2, 128, 16, {{90, 0}}, 0, 50.0f}, seed++);
  RunPrefill({4, 2, 256, 16, {{80, 0}}, 0, 2.0f}, seed++);
}

// The wide block at head size 128 (two tiles a warp, Q from shared memory,
// 32 keys a step): GQA 1, 4, 6 (Qwen2.5's: 6 of 8 head slots), 8 and 16
// (two head chunks), block sizes 16 and 32, chunks past earlier context, a
// window, and the softcap; its tiles hold twice the rows of the default.
TEST(SimtAttentionTest, PrefillInTheWideBlockMatchesNaiveAttention) {
  EXPECT_EQ(TensorCoreTilePositions(128, 4, /*wide=*/true), 2 * TensorCoreTilePositions(128, 4));
  uint32_t seed = 141;
  RunPrefill({4, 4, 128, 16, {{100, 0}}}, seed++, true);
  RunPrefill({8, 2, 128, 32, {{150, 60}, {40, 0}}}, seed++, true);
  RunPrefill({12, 2, 128, 16, {{90, 10}}}, seed++, true);
  RunPrefill({32, 4, 128, 16, {{70, 40}}}, seed++, true);
  RunPrefill({16, 1, 128, 16, {{50, 0}}}, seed++, true);
  RunPrefill({8, 2, 128, 16, {{200, 0}}, 37}, seed++, true);
  RunPrefill({8, 4, 128, 16, {{100, 20}}, 0, 2.0f}, seed++, true);
}

// Decode rows and prefill rows of one to three splits, GQA 1 to 32, head
// sizes 32 to 128, block sizes 16 and 32, windows and Gemma 2's softcap.
TEST(SimtAttentionTest, DecodeOnTensorCoresMatchesNaiveAttention) {
  const std::vector<Case> cases = {
      {8, 2, 64, 16, {{1, 0}, {16, 15}, {17, 16}, {128, 127}, {129, 128}, {300, 299}}},
      {7, 7, 64, 16, {{1, 0}, {140, 139}, {17, 13}}},
      {12, 3, 96, 32, {{257, 255}}},
      {32, 4, 128, 16, {{200, 198}}},
      {14, 2, 64, 32, {{129, 127}}},
      {32, 1, 32, 16, {{70, 69}}},
  };
  uint32_t seed = 71;
  for (const Case& c : cases) RunDecodeTc(c, seed++);
  // A decode batch of Llama-3.2-1B's shape, contexts of 1 to 700.
  Case batch{32, 8, 64, 16, {}};
  std::mt19937 rng(5);
  for (int32_t i = 0; i < 64; ++i) {
    const int32_t len = 1 + static_cast<int32_t>(rng() % 700);
    batch.seqs.push_back({len, len - 1});
  }
  RunDecodeTc(batch, seed++);
  for (const int32_t window : {1, 100, 129}) {
    Case c{8, 2, 64, 16, {{300, 299}, {40, 39}, {129, 128}}};
    c.window = window;
    RunDecodeTc(c, seed++);
  }
  Case cap{8, 4, 32, 16, {{150, 149}, {20, 19}}};
  cap.softcap = 2.0f;
  RunDecodeTc(cap, seed++);
}

}  // namespace
}  // namespace tandem::kernels
