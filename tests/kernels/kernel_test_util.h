// Shapes and naive loops shared by the kernel tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/kernels/cpu_ops.h"

namespace tandem::kernels::testing {

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// abs_tol + |ref| * rel_tol, per dtype (all ops are fp32 today).
struct Tolerance {
  double abs_tol;
  double rel_tol;
};
inline constexpr Tolerance kF32Tol{1e-5, 1e-4};

inline void ExpectNear(const std::vector<float>& got, const std::vector<double>& ref, Tolerance tol,
                       const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(got[i] - ref[i]), tol.abs_tol + std::fabs(ref[i]) * tol.rel_tol)
        << what << " at " << i << ": got " << got[i] << " want " << ref[i];
  }
}
inline void ExpectNear(const std::vector<float>& got, const std::vector<float>& ref, Tolerance tol,
                       const std::string& what) {
  ExpectNear(got, std::vector<double>(ref.begin(), ref.end()), tol, what);
}

// Sampling draws over `rows` rows of a `vocab` vocabulary: every filter
// (greedy, temperature, top-k, top-p, min-p and their mixes), banned ids,
// allowed lists (an id twice, one banned too), token masks (one with fewer
// words than the vocabulary, one after an allowed list), penalties and logit biases,
// `draws` of them, drawing from rows in turn.
struct SamplingCase {
  std::vector<int32_t> banned;
  std::vector<SamplePenalty> history;
  std::vector<SampleArgs> args;
};
inline SamplingCase MakeSamplingCase(int32_t vocab, int32_t rows, int32_t draws) {
  SamplingCase c;
  c.banned = {3, vocab - 1, 7, 3};
  // History entries, one with a logit_bias too, and a logit_bias alone (-1).
  c.history = {{5, 2}, {vocab - 2, 0, 1.5f}, {11, 1}, {4, -1, -3.0f}};
  for (int32_t j = 0; j < draws; ++j) {
    const int32_t f = j % 8;
    c.args.push_back({.temperature = f == 0 ? 0.0f : (j % 3 == 0 ? 0.6f : 1.0f),
                      .top_k = f == 2 || f == 5 ? 50 : (f == 6 ? 1 : 0),
                      .top_p = f == 3 || f == 5 ? 0.9f : (f == 7 ? 0.5f : 1.0f),
                      .min_p = f == 4 || f == 7 ? 0.05f : 0.0f,
                      .seed = 5u + j,
                      .position = j,
                      .row = (j * 5) % rows,
                      .banned_begin = j % 2,
                      .num_banned = j % 4 == 1 ? 3 : 0,
                      .presence_penalty = j % 3 == 2 ? 0.5f : 0.0f,
                      .frequency_penalty = j % 3 == 2 ? -0.25f : 0.0f,
                      .repetition_penalty = j % 3 == 2 ? 1.3f : 1.0f,
                      .penalty_begin = j % 2,
                      .num_penalties = j % 3 == 2 ? 3 : 0});
    if (j % 4 == 3 || j % 8 == 0) {  // its own list: banned ids, then allowed ones
      SampleArgs& a = c.args.back();
      a.num_banned = j % 8 == 7 ? 2 : 0;
      a.banned_begin = static_cast<int32_t>(c.banned.size());
      if (a.num_banned > 0) c.banned.insert(c.banned.end(), {3, vocab - 1});
      const std::vector<int32_t> allowed = {9 % vocab, vocab - 3, 9 % vocab, 20 % vocab, 3, 5};
      c.banned.insert(c.banned.end(), allowed.begin(), allowed.end());
      a.num_allowed = static_cast<int32_t>(allowed.size());
    }
    if (j % 8 == 3 || j % 8 == 6) {  // a token mask after its list (a list of its own for 6)
      SampleArgs& a = c.args.back();
      if (j % 8 == 6) {
        a.banned_begin = static_cast<int32_t>(c.banned.size());
        a.num_banned = 0;
      }
      // Every id for 6; the first half of the vocabulary for 3, whose ids
      // past it are masked by their missing words.
      const int32_t words = (j % 8 == 6 ? vocab + 31 : vocab / 2) / 32;
      std::vector<uint32_t> mask(static_cast<size_t>(words), 0);
      for (int32_t id = 0; id < words * 32; ++id) {
        if (id % 13 == 4 || id == 9 % vocab || id == 5) mask[id / 32] |= 1u << (id % 32);
      }
      for (uint32_t w : mask) c.banned.push_back(static_cast<int32_t>(w));
      a.num_mask_words = words;
    }
  }
  return c;
}

// One attention problem: sequences with shuffled block tables, query rows
// that are prefill chunks (possibly starting mid-block) or decode steps.
struct AttentionProblem {
  KvCacheShape shape;
  int32_t num_heads = 0;
  std::vector<float> cache;
  // Per sequence: contiguous K and V [pos][kv_heads][head_size] (the naive view).
  std::vector<std::vector<float>> seq_k, seq_v;
  std::vector<int32_t> block_tables, row_pos, row_table_offset, row_seq;
  std::vector<float> q;
  std::vector<int64_t> slots;       // slot of every cached token (for KvWrite)
  std::vector<float> all_k, all_v;  // K/V of every cached token, in `slots` order
  int32_t window = 0;               // sliding window (0: none)
  float softcap = 0.0f;             // Gemma 2's score softcap (0: none)
  PagedAttentionArgs Args(float* out) const {
    return PagedAttentionArgs{.q = q.data(),
                              .out = out,
                              .cache = cache.data(),
                              .shape = shape,
                              .layer = 1,
                              .num_heads = num_heads,
                              .num_rows = static_cast<int32_t>(row_pos.size()),
                              .row_pos = row_pos.data(),
                              .row_table_offset = row_table_offset.data(),
                              .block_tables = block_tables.data(),
                              .window = window,
                              .softcap = softcap};
  }
};

// `seqs`: (context length, first query position) per sequence; its rows are
// positions first .. length-1.
inline AttentionProblem MakeAttentionProblem(int32_t num_heads, int32_t num_kv_heads,
                                             int32_t head_size, int32_t block_size,
                                             const std::vector<std::pair<int32_t, int32_t>>& seqs,
                                             uint32_t seed) {
  AttentionProblem p;
  int32_t total_blocks = 0;
  for (auto [len, first] : seqs) total_blocks += (len + block_size - 1) / block_size;
  p.shape = KvCacheShape{.num_blocks = total_blocks + 3,
                         .num_layers = 2,
                         .block_size = block_size,
                         .num_kv_heads = num_kv_heads,
                         .head_size = head_size};
  p.num_heads = num_heads;
  p.cache = RandomVector(static_cast<size_t>(p.shape.BlockFloats() * p.shape.num_blocks), seed);
  std::vector<int32_t> ids(static_cast<size_t>(p.shape.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  size_t next = 0;
  const int32_t width = num_kv_heads * head_size;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto [len, first] = seqs[s];
    const int32_t offset = static_cast<int32_t>(p.block_tables.size());
    const int32_t nblocks = (len + block_size - 1) / block_size;
    for (int32_t b = 0; b < nblocks; ++b) p.block_tables.push_back(ids[next++]);
    p.seq_k.push_back(RandomVector(static_cast<size_t>(len) * width, seed + 11 + s));
    p.seq_v.push_back(RandomVector(static_cast<size_t>(len) * width, seed + 97 + s));
    p.all_k.insert(p.all_k.end(), p.seq_k.back().begin(), p.seq_k.back().end());
    p.all_v.insert(p.all_v.end(), p.seq_v.back().begin(), p.seq_v.back().end());
    for (int32_t t = 0; t < len; ++t) {
      const int32_t block = p.block_tables[static_cast<size_t>(offset + t / block_size)];
      p.slots.push_back(int64_t{block} * block_size + t % block_size);
    }
    for (int32_t t = first; t < len; ++t) {
      p.row_pos.push_back(t);
      p.row_table_offset.push_back(offset);
      p.row_seq.push_back(static_cast<int32_t>(s));
    }
  }
  p.q = RandomVector(p.row_pos.size() * num_heads * head_size, seed + 5);
  return p;
}

// Naive causal GQA attention over the contiguous per-sequence K/V, in double.
// Under a sliding window a key kv is kept when kv > pos - window (the mask
// transformers' sliding_window_overlay builds), written out here on its own.
inline std::vector<double> NaiveAttention(const AttentionProblem& p) {
  const int32_t hs = p.shape.head_size, width = p.shape.num_kv_heads * hs;
  std::vector<double> out(p.q.size(), 0.0);
  for (size_t r = 0; r < p.row_pos.size(); ++r) {
    const auto& k = p.seq_k[static_cast<size_t>(p.row_seq[r])];
    const auto& v = p.seq_v[static_cast<size_t>(p.row_seq[r])];
    for (int32_t h = 0; h < p.num_heads; ++h) {
      const int32_t kvh = h / (p.num_heads / p.shape.num_kv_heads);
      const float* q = &p.q[(r * p.num_heads + h) * hs];
      std::vector<double> s(static_cast<size_t>(p.row_pos[r]) + 1);
      auto kept = [&](int32_t t) { return p.window == 0 || t > p.row_pos[r] - p.window; };
      double mx = -1e300;
      for (int32_t t = 0; t <= p.row_pos[r]; ++t) {
        if (!kept(t)) continue;
        double d = 0;
        for (int32_t i = 0; i < hs; ++i) d += double{q[i]} * k[t * width + kvh * hs + i];
        s[t] = d / std::sqrt(double(hs));
        if (p.softcap > 0) s[t] = p.softcap * std::tanh(s[t] / p.softcap);
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (int32_t t = 0; t <= p.row_pos[r]; ++t) {
        s[t] = kept(t) ? std::exp(s[t] - mx) : 0.0;
        sum += s[t];
      }
      for (int32_t t = 0; t <= p.row_pos[r]; ++t) {
        for (int32_t i = 0; i < hs; ++i) {
          out[(r * p.num_heads + h) * hs + i] += s[t] / sum * v[t * width + kvh * hs + i];
        }
      }
    }
  }
  return out;
}

// RoPE on q and k and the K/V write of three rows of packed q | k | v
// (positions 0, 17 and 511; the middle row has no slot), as the CPU does
// them (cpu::Rope, cpu::KvWrite into layer 1): the reference of the GPU's
// RopeKvWriteBf16 and of its emulated kernel. Head size 128 takes partial
// RoPE (Phi-4-mini's 0.75): the k elements it leaves must still reach the
// cache. The cache holds `unwritten` wherever no slot writes.
struct RopeKvCase {
  int32_t heads, hs, rotary_dim, rows = 3, stride;
  RopeKind kind;
  float amplitude;  // Llama 3's 1.19 with rotate-half, else 1
  KvCacheShape shape;
  std::vector<int32_t> pos = {0, 17, 511};
  std::vector<int64_t> slots = {5 * 16 + 3, -1, 2 * 16 + 15};
  std::vector<float> qkv;         // the input, [rows][stride]
  std::vector<float> want_q;      // [rows][heads * hs]
  std::vector<float> want_cache;  // the whole fp32 cache
};
// Both RoPE layouts over these (heads, KV heads, head size).
inline constexpr RopeKind kRopeKinds[] = {RopeKind::kAdjacentPairs, RopeKind::kRotateHalf};
inline constexpr int32_t kRopeKvShapes[][3] = {{8, 4, 8}, {7, 7, 64}, {32, 8, 128}};
inline RopeKvCase MakeRopeKvCase(RopeKind kind, const int32_t (&dims)[3], float unwritten) {
  const int32_t heads = dims[0], kv_heads = dims[1], hs = dims[2];
  RopeKvCase c{.heads = heads,
               .hs = hs,
               .rotary_dim = hs == 128 ? 96 : 0,
               .stride = (heads + 2 * kv_heads) * hs,
               .kind = kind,
               .amplitude = kind == RopeKind::kRotateHalf ? 1.19f : 1.0f,
               .shape = {.num_blocks = 6,
                         .num_layers = 2,
                         .block_size = 16,
                         .num_kv_heads = kv_heads,
                         .head_size = hs}};
  c.qkv = RandomVector(static_cast<size_t>(c.rows) * c.stride, 7);
  std::vector<float> k, v;
  for (int32_t r = 0; r < c.rows; ++r) {
    const float* row = &c.qkv[static_cast<size_t>(r) * c.stride];
    c.want_q.insert(c.want_q.end(), row, row + heads * hs);
    k.insert(k.end(), row + heads * hs, row + (heads + kv_heads) * hs);
    v.insert(v.end(), row + (heads + kv_heads) * hs, row + c.stride);
  }
  cpu::Rope(c.want_q.data(), c.rows, c.pos.data(), heads, hs, kind, 10000.0f, nullptr, c.amplitude,
            c.rotary_dim);
  cpu::Rope(k.data(), c.rows, c.pos.data(), kv_heads, hs, kind, 10000.0f, nullptr, c.amplitude,
            c.rotary_dim);
  c.want_cache.assign(static_cast<size_t>(c.shape.BlockFloats() * c.shape.num_blocks), unwritten);
  cpu::KvWrite(c.want_cache.data(), c.shape, 1, k.data(), v.data(), c.rows, c.slots.data());
  return c;
}

}  // namespace tandem::kernels::testing
