// Every CPU op against a naive loop on varied shapes.
#include "tandem/kernels/cpu_ops.h"

#include <cstring>

#include "gtest/gtest.h"
#include "kernel_test_util.h"

namespace tandem::kernels {
namespace {

using testing::AttentionProblem;
using testing::ExpectNear;
using testing::kF32Tol;
using testing::MakeAttentionProblem;
using testing::NaiveAttention;
using testing::RandomVector;

TEST(CpuOpsTest, EmbeddingGatherCopiesRows) {
  const int32_t vocab = 50, dim = 72;
  const auto table = RandomVector(vocab * dim, 1);
  const std::vector<int32_t> tokens = {3, 0, 49, 3, 17};
  std::vector<float> out(tokens.size() * dim);
  cpu::EmbeddingGather(table.data(), dim, tokens, out.data());
  for (size_t r = 0; r < tokens.size(); ++r) {
    for (int32_t j = 0; j < dim; ++j) ASSERT_EQ(out[r * dim + j], table[tokens[r] * dim + j]);
  }
}

TEST(CpuOpsTest, RmsNormMatchesNaive) {
  for (int32_t dim : {8, 64, 100, 4096}) {
    const int32_t rows = 3;
    const auto x = RandomVector(rows * dim, dim, 3.0f);
    const auto w = RandomVector(dim, dim + 1);
    std::vector<float> out(x.size());
    cpu::RmsNorm(x.data(), w.data(), rows, dim, 1e-5f, out.data());
    std::vector<double> ref(x.size());
    for (int32_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int32_t j = 0; j < dim; ++j) ss += double{x[r * dim + j]} * x[r * dim + j];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int32_t j = 0; j < dim; ++j) ref[r * dim + j] = w[j] * x[r * dim + j] * inv;
    }
    ExpectNear(out, ref, kF32Tol, "dim " + std::to_string(dim));
  }
}

TEST(CpuOpsTest, MatmulMatchesNaiveAndPackedMatchesMatmulBitwise) {
  for (auto [out_dim, in_dim] : std::vector<std::pair<int32_t, int32_t>>{
           {1, 1}, {8, 8}, {17, 64}, {64, 172}, {172, 64}, {512, 64}, {33, 130}}) {
    const auto w = RandomVector(out_dim * in_dim, out_dim * 7 + in_dim);
    for (int32_t rows : {1, 2, 3, 4, 5, 9, 32}) {
      const auto x = RandomVector(rows * in_dim, rows);
      std::vector<float> y(rows * out_dim), packed_y(rows * out_dim, -1.0f);
      cpu::Matmul(w.data(), out_dim, in_dim, x.data(), rows, y.data());
      std::vector<double> ref(y.size());
      for (int32_t r = 0; r < rows; ++r) {
        for (int32_t i = 0; i < out_dim; ++i) {
          double d = 0;
          for (int32_t j = 0; j < in_dim; ++j) d += double{w[i * in_dim + j]} * x[r * in_dim + j];
          ref[r * out_dim + i] = d;
        }
      }
      const std::string what =
          std::to_string(out_dim) + "x" + std::to_string(in_dim) + " rows " + std::to_string(rows);
      ExpectNear(y, ref, {1e-5, 1e-4}, what);
      cpu::PackedMatrix packed(w.data(), out_dim, in_dim);
      packed.Apply(x.data(), rows, packed_y.data());
      ASSERT_EQ(std::memcmp(y.data(), packed_y.data(), y.size() * sizeof(float)), 0) << what;
    }
  }
}

TEST(CpuOpsTest, MatmulSumsSequentiallyLikeRunC) {
  // 1 + 1e8 - 1e8 = 0 when summed left to right in float, 1 otherwise.
  const std::vector<float> w = {1.0f, 1e8f, -1e8f};
  const std::vector<float> x = {1.0f, 1.0f, 1.0f};
  float y = -1;
  cpu::Matmul(w.data(), 1, 3, x.data(), 1, &y);
  EXPECT_EQ(y, 0.0f);
  cpu::PackedMatrix(w.data(), 1, 3).Apply(x.data(), 1, &y);
  EXPECT_EQ(y, 0.0f);
}

std::vector<double> NaiveRope(const std::vector<float>& v, const std::vector<int32_t>& pos,
                              int32_t heads, int32_t hs, RopeKind kind, double theta) {
  std::vector<double> out(v.begin(), v.end());
  for (size_t r = 0; r < pos.size(); ++r) {
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t p = 0; p < hs / 2; ++p) {
        const double angle = pos[r] / std::pow(theta, 2.0 * p / hs);
        const size_t base = (r * heads + h) * hs;
        const size_t i0 = base + (kind == RopeKind::kAdjacentPairs ? 2 * p : p);
        const size_t i1 = base + (kind == RopeKind::kAdjacentPairs ? 2 * p + 1 : p + hs / 2);
        out[i0] = v[i0] * std::cos(angle) - v[i1] * std::sin(angle);
        out[i1] = v[i0] * std::sin(angle) + v[i1] * std::cos(angle);
      }
    }
  }
  return out;
}

TEST(CpuOpsTest, RopeMatchesNaiveForBothStyles) {
  for (int32_t hs : {8, 16, 64, 128}) {
    for (RopeKind kind : {RopeKind::kAdjacentPairs, RopeKind::kRotateHalf}) {
      const int32_t heads = 3;
      const std::vector<int32_t> pos = {0, 1, 17, 200, 511};
      auto v = RandomVector(pos.size() * heads * hs, hs);
      const auto ref = NaiveRope(v, pos, heads, hs, kind, 10000.0);
      cpu::Rope(v.data(), static_cast<int32_t>(pos.size()), pos.data(), heads, hs, kind, 10000.0f);
      // Angles up to 511 rad: float cos/sin arguments carry ~3e-5 absolute error.
      ExpectNear(v, ref, {1e-4, 1e-4}, "head_size " + std::to_string(hs));
    }
  }
}

TEST(CpuOpsTest, RotateHalfOnPermutedVectorEqualsAdjacentPairsBitwise) {
  const int32_t hs = 16, heads = 2;
  const std::vector<int32_t> pos = {5, 300};
  const auto v = RandomVector(pos.size() * heads * hs, 4);
  auto permute = [&](const std::vector<float>& a) {  // hf[s*hs/2 + p] = ll[2p + s]
    std::vector<float> b(a.size());
    for (size_t r = 0; r < pos.size() * heads; ++r) {
      for (int32_t p = 0; p < hs / 2; ++p) {
        for (int32_t s = 0; s < 2; ++s) b[r * hs + s * hs / 2 + p] = a[r * hs + 2 * p + s];
      }
    }
    return b;
  };
  auto adjacent = v;
  auto half = permute(v);
  cpu::Rope(adjacent.data(), 2, pos.data(), heads, hs, RopeKind::kAdjacentPairs, 10000.0f);
  cpu::Rope(half.data(), 2, pos.data(), heads, hs, RopeKind::kRotateHalf, 10000.0f);
  EXPECT_EQ(permute(adjacent), half);
}

// Partial RoPE (Phi-3's partial_rotary_factor, transformers' q[..., :rot]):
// each head's first rotary_dim elements turn as a head of rotary_dim would,
// to the bit, with cos and sin times the amplitude; the rest stay as they
// are.
TEST(CpuOpsTest, PartialRopeTurnsTheFirstRotaryDimElementsOnly) {
  const int32_t hs = 32, heads = 3;
  const std::vector<int32_t> pos = {0, 9, 4000};
  for (RopeKind kind : {RopeKind::kAdjacentPairs, RopeKind::kRotateHalf}) {
    for (int32_t rd : {2, 8, 24, 32}) {
      SCOPED_TRACE("rotary_dim " + std::to_string(rd));
      std::vector<float> inv_freq;  // a table of rd / 2 frequencies, as the runners pass
      for (int32_t p = 0; p < rd / 2; ++p) inv_freq.push_back(1.0f / (1.0f + 3.0f * p));
      const auto v = RandomVector(pos.size() * heads * hs, rd);
      std::vector<float> got = v;
      cpu::Rope(got.data(), static_cast<int32_t>(pos.size()), pos.data(), heads, hs, kind, 10000.0f,
                inv_freq.data(), 1.25f, rd);
      std::vector<float> front;  // [rows][heads][rd]
      for (size_t h = 0; h < pos.size() * heads; ++h) {
        front.insert(front.end(), v.begin() + h * hs, v.begin() + h * hs + rd);
      }
      cpu::Rope(front.data(), static_cast<int32_t>(pos.size()), pos.data(), heads, rd, kind,
                10000.0f, inv_freq.data(), 1.25f);
      for (size_t h = 0; h < pos.size() * heads; ++h) {
        for (int32_t i = 0; i < hs; ++i) {
          const float want = i < rd ? front[h * rd + i] : v[h * hs + i];
          ASSERT_EQ(got[h * hs + i], want) << "head " << h << " element " << i;
        }
      }
    }
  }
}

TEST(CpuOpsTest, KvWritePlacesEveryTokenInItsSlot) {
  const KvCacheShape shape{
      .num_blocks = 5, .num_layers = 3, .block_size = 4, .num_kv_heads = 2, .head_size = 8};
  std::vector<float> cache(shape.BlockFloats() * shape.num_blocks, 0.0f);
  const int32_t width = shape.num_kv_heads * shape.head_size;
  const std::vector<int64_t> slots = {13, 2, -1, 19, 4};  // -1: skipped
  const auto k = RandomVector(slots.size() * width, 1), v = RandomVector(slots.size() * width, 2);
  cpu::KvWrite(cache.data(), shape, 2, k.data(), v.data(), 5, slots.data());
  int64_t written = 0;
  for (size_t r = 0; r < slots.size(); ++r) {
    if (slots[r] < 0) continue;
    const int64_t block = slots[r] / 4, off = slots[r] % 4;
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t i = 0; i < 8; ++i) {
        // [block][layer][kv][slot][head][dim], spelled out.
        const int64_t kidx = ((((block * 3 + 2) * 2 + 0) * 4 + off) * 2 + h) * 8 + i;
        const int64_t vidx = ((((block * 3 + 2) * 2 + 1) * 4 + off) * 2 + h) * 8 + i;
        ASSERT_EQ(cache[kidx], k[r * width + h * 8 + i]);
        ASSERT_EQ(cache[vidx], v[r * width + h * 8 + i]);
        written += 2;
      }
    }
  }
  int64_t nonzero = 0;
  for (float x : cache) nonzero += x != 0.0f;
  EXPECT_EQ(nonzero, written) << "nothing else touched";
}

struct AttentionCase {
  int32_t num_heads, num_kv_heads, head_size, block_size;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (length, first query position)
};

std::vector<AttentionCase> AttentionCases() {
  return {
      // decode, one block, MHA
      {2, 2, 8, 16, {{1, 0}, {5, 4}}},
      // GQA 8:4, partial last block, decode + prefill chunk starting mid-block
      {8, 4, 8, 16, {{37, 36}, {40, 21}, {16, 0}}},
      // GQA 4:1 (MQA-like), head 128, many small blocks
      {4, 1, 128, 4, {{70, 69}, {33, 10}}},
      // head 64, block 8, whole prefill, many blocks
      {6, 2, 64, 8, {{100, 0}}},
      // head 32, block 1 (every token its own block)
      {4, 2, 32, 1, {{9, 3}, {2, 1}}},
  };
}

TEST(CpuOpsTest, PagedAttentionMatchesNaiveAttention) {
  uint32_t seed = 1;
  for (const AttentionCase& c : AttentionCases()) {
    AttentionProblem p = MakeAttentionProblem(c.num_heads, c.num_kv_heads, c.head_size,
                                              c.block_size, c.seqs, seed++);
    cpu::KvWrite(p.cache.data(), p.shape, 1, p.all_k.data(), p.all_v.data(),
                 static_cast<int32_t>(p.slots.size()), p.slots.data());
    std::vector<float> out(p.q.size()), shared(p.q.size());
    cpu::PagedAttention(p.Args(out.data()));
    cpu::PagedAttentionReference(p.Args(shared.data()));
    ASSERT_EQ(std::memcmp(out.data(), shared.data(), out.size() * sizeof(float)), 0)
        << "the CPU arrangement must equal the shared (GPU) code bit for bit";
    ExpectNear(out, NaiveAttention(p), {2e-5, 1e-4},
               "heads " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) +
                   " hs " + std::to_string(c.head_size) + " block " + std::to_string(c.block_size));
  }
}

// Sliding windows (Mistral's, Phi-3's, Qwen's): each row sees its last
// `window` positions, itself included; a window of 1 only itself, one at
// least the context everything, bit for bit as without a window. Windows
// that start mid-block, at a block's first slot, and within a prefill chunk
// whose rows start at different blocks.
TEST(CpuOpsTest, SlidingWindowsMatchNaiveAttention) {
  uint32_t seed = 40;
  for (const AttentionCase& c : AttentionCases()) {
    for (int32_t window : {1, 2, 5, 16, 17, 64}) {
      AttentionProblem p = MakeAttentionProblem(c.num_heads, c.num_kv_heads, c.head_size,
                                                c.block_size, c.seqs, seed);
      cpu::KvWrite(p.cache.data(), p.shape, 1, p.all_k.data(), p.all_v.data(),
                   static_cast<int32_t>(p.slots.size()), p.slots.data());
      std::vector<float> full(p.q.size()), out(p.q.size()), shared(p.q.size());
      cpu::PagedAttention(p.Args(full.data()));
      p.window = window;
      cpu::PagedAttention(p.Args(out.data()));
      cpu::PagedAttentionReference(p.Args(shared.data()));
      const std::string what = "hs " + std::to_string(c.head_size) + " block " +
                               std::to_string(c.block_size) + " window " + std::to_string(window);
      ASSERT_EQ(std::memcmp(out.data(), shared.data(), out.size() * sizeof(float)), 0) << what;
      ExpectNear(out, NaiveAttention(p), {2e-5, 1e-4}, what);
      // Rows whose context fits the window are untouched by it; the others
      // are not (random keys: some output moves).
      const int32_t hs = c.head_size * c.num_heads;
      for (size_t r = 0; r < p.row_pos.size(); ++r) {
        const bool fits = p.row_pos[r] < window;
        const int diff = std::memcmp(&out[r * hs], &full[r * hs], hs * sizeof(float));
        EXPECT_EQ(diff == 0, fits) << what << " row " << r << " at " << p.row_pos[r];
      }
    }
    ++seed;
  }
}

// KeySeen is WindowStart's rule, and KeysAllSeen (the prefill kernel's
// licence to skip its per-key mask for a step of keys) holds exactly when no
// pair of a key and a query position in the ranges is masked.
TEST(CpuOpsTest, KeysAllSeenExactlyWhenNoKeyIsMasked) {
  int32_t skippable = 0;
  for (const int32_t window : {0, 1, 3, 8, 50}) {
    for (int32_t key = 0; key < 70; ++key) {
      for (int32_t pos = 0; pos < 70; ++pos) {
        ASSERT_EQ(KeySeen(key, pos, window), key <= pos && key >= WindowStart(pos, window))
            << key << " " << pos << " " << window;
      }
    }
    for (int32_t first = 0; first < 40; ++first) {
      for (int32_t last = first; last < first + 12; ++last) {
        for (int32_t lo = 0; lo < 60; ++lo) {
          for (int32_t hi = lo; hi < lo + 12; ++hi) {
            bool all = true;
            for (int32_t key = first; key <= last; ++key) {
              for (int32_t pos = lo; pos <= hi; ++pos) all = all && KeySeen(key, pos, window);
            }
            ASSERT_EQ(KeysAllSeen(first, last, lo, hi, window), all)
                << first << ".." << last << " from " << lo << ".." << hi << " window " << window;
            skippable += all;
          }
        }
      }
    }
  }
  EXPECT_GT(skippable, 0);
}

TEST(CpuOpsTest, SiluMulAndResidualAddMatchNaive) {
  for (int64_t n : {1, 63, 64, 65, 1000}) {
    const auto g = RandomVector(n, 1, 6.0f), u = RandomVector(n, 2);
    std::vector<float> out(n);
    cpu::SiluMul(g.data(), u.data(), n, out.data());
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
    ExpectNear(out, ref, kF32Tol, "silu n " + std::to_string(n));
    auto x = g;
    cpu::ResidualAdd(x.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], g[i] + u[i]);
  }
}

TEST(CpuOpsTest, SampleIsGreedyAtZeroTemperatureAndFollowsSoftmaxOtherwise) {
  const int32_t vocab = 6;
  const std::vector<float> logits = {0.1f, 1.5f, -2.0f, 0.7f, 1.5f, 0.0f};
  SampleArgs greedy;
  int32_t tok = -1;
  cpu::Sample(logits.data(), 1, vocab, &greedy, nullptr, nullptr, &tok);
  EXPECT_EQ(tok, 1);
  // Frequencies over many positions approach softmax(logits).
  const int32_t n = 20000;
  std::vector<float> many;
  std::vector<SampleArgs> args;
  for (int32_t i = 0; i < n; ++i) {
    many.insert(many.end(), logits.begin(), logits.end());
    args.push_back({.temperature = 1.0f, .seed = 99, .position = i, .row = i});
  }
  std::vector<int32_t> toks(n);
  cpu::Sample(many.data(), n, vocab, args.data(), nullptr, nullptr, toks.data());
  double z = 0;
  for (float l : logits) z += std::exp(double{l});
  std::vector<int> count(vocab);
  for (int32_t t : toks) count[t]++;
  for (int32_t i = 0; i < vocab; ++i) {
    EXPECT_NEAR(count[i] / double(n), std::exp(double{logits[i]}) / z, 0.015) << i;
  }
}

TEST(CpuOpsTest, BlockGatherAndScatterMoveWholeBlocks) {
  const int64_t block_floats = 96;
  const auto cache0 = RandomVector(10 * block_floats, 3);
  const std::vector<int32_t> ids = {7, 0, 9, 3};
  std::vector<float> staging(ids.size() * block_floats);
  cpu::BlockGather(cache0.data(), block_floats, ids, staging.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(std::memcmp(&staging[i * block_floats], &cache0[ids[i] * block_floats],
                          block_floats * sizeof(float)),
              0);
  }
  std::vector<float> cache(cache0.size(), 0.0f);
  cpu::BlockScatter(cache.data(), block_floats, ids, staging.data());
  for (int32_t b = 0; b < 10; ++b) {
    const bool copied = std::find(ids.begin(), ids.end(), b) != ids.end();
    for (int64_t j = 0; j < block_floats; ++j) {
      ASSERT_EQ(cache[b * block_floats + j], copied ? cache0[b * block_floats + j] : 0.0f);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
