// bench_kernels: Google Benchmark of the CPU kernels on stories260K-sized
// shapes (the CUDA ops are benchmarked only where a device exists).
//   build-model/tools/bench_model/bench_kernels
#include <benchmark/benchmark.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "tandem/kernels/cpu_ops.h"
#include "tandem/kernels/sampling.h"

namespace {

namespace kc = tandem::kernels::cpu;
using tandem::kernels::KvCacheShape;
using tandem::kernels::PagedAttentionArgs;

std::vector<float> Random(size_t n) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// y = W x for W 172 x 64 (stories260K's w1) over `rows` tokens.
void BM_MatmulNaive(benchmark::State& state) {
  const int32_t rows = static_cast<int32_t>(state.range(0)), out = 172, in = 64;
  const auto w = Random(out * in), x = Random(rows * in);
  std::vector<float> y(rows * out);
  for (auto _ : state) {
    kc::Matmul(w.data(), out, in, x.data(), rows, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * int64_t{rows} * out * in);  // MACs
}
BENCHMARK(BM_MatmulNaive)->Arg(1)->Arg(32)->Arg(256);

void BM_MatmulPacked(benchmark::State& state) {
  const int32_t rows = static_cast<int32_t>(state.range(0)), out = 172, in = 64;
  const auto w = Random(out * in), x = Random(rows * in);
  const kc::PackedMatrix packed(w.data(), out, in);
  std::vector<float> y(rows * out);
  for (auto _ : state) {
    packed.Apply(x.data(), rows, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * int64_t{rows} * out * in);
}
BENCHMARK(BM_MatmulPacked)->Arg(1)->Arg(32)->Arg(256);

// Decode attention of 32 sequences at context `range(0)`, 8 heads / 4 KV
// heads of size 8, block 16. `reference` runs the shared (GPU) code.
void Attention(benchmark::State& state, bool reference) {
  const int32_t ctx = static_cast<int32_t>(state.range(0)), seqs = 32, bs = 16;
  const int32_t per = (ctx + bs - 1) / bs;
  const KvCacheShape shape{.num_blocks = seqs * per,
                           .num_layers = 1,
                           .block_size = bs,
                           .num_kv_heads = 4,
                           .head_size = 8};
  const auto cache = Random(shape.BlockFloats() * shape.num_blocks), q = Random(seqs * 64);
  std::vector<int32_t> tables(seqs * per), pos(seqs, ctx - 1), off(seqs);
  for (int32_t i = 0; i < seqs * per; ++i) tables[i] = i;
  for (int32_t s = 0; s < seqs; ++s) off[s] = s * per;
  std::vector<float> out(q.size());
  const PagedAttentionArgs args{.q = q.data(),
                                .out = out.data(),
                                .cache = cache.data(),
                                .shape = shape,
                                .layer = 0,
                                .num_heads = 8,
                                .num_rows = seqs,
                                .row_pos = pos.data(),
                                .row_table_offset = off.data(),
                                .block_tables = tables.data()};
  for (auto _ : state) {
    if (reference) {
      kc::PagedAttentionReference(args);
    } else {
      kc::PagedAttention(args);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * seqs);  // query rows
}
void BM_PagedAttention(benchmark::State& state) { Attention(state, false); }
void BM_PagedAttentionSharedCode(benchmark::State& state) { Attention(state, true); }
BENCHMARK(BM_PagedAttention)->Arg(16)->Arg(128)->Arg(512);
BENCHMARK(BM_PagedAttentionSharedCode)->Arg(16)->Arg(128)->Arg(512);

// One draw over Llama 3's vocabulary (128,256) with its generation config
// (temperature 0.6, top_p 0.9; logits ~ N(0, 4)), or with top_k 50:
// ours (kernels/sampling.h, the program the GPU runs too) beside the
// textbook way, which vLLM's sampler takes with torch.sort: softmax, sort
// the whole vocabulary, cumulative sum, draw.
//   bench_kernels --benchmark_filter=Sample
int32_t SortedDraw(const std::vector<float>& logits, const tandem::kernels::SampleArgs& a,
                   std::vector<float>* probs, std::vector<int32_t>* idx) {
  const size_t n = logits.size();
  const float m = *std::max_element(logits.begin(), logits.end()) / a.temperature;
  float z = 0;
  for (size_t i = 0; i < n; ++i) z += (*probs)[i] = std::exp(logits[i] / a.temperature - m);
  for (size_t i = 0; i < n; ++i) (*idx)[i] = static_cast<int32_t>(i);
  std::sort(idx->begin(), idx->end(),
            [&](int32_t x, int32_t y) { return (*probs)[x] > (*probs)[y]; });
  size_t keep = a.top_k > 0 ? static_cast<size_t>(a.top_k) : n;
  float cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += (*probs)[(*idx)[i]];
    if (cum >= a.top_p * z) keep = i + 1;
  }
  const float r = tandem::kernels::CounterUniform(a.seed, a.position) * cum;
  float c = 0;
  for (size_t i = 0; i < keep; ++i) {
    c += (*probs)[(*idx)[i]];
    if (r < c) return (*idx)[i];
  }
  return (*idx)[keep - 1];
}

void Sample(benchmark::State& state, bool ours) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 4);
  std::vector<float> logits(128256), probs(logits.size());
  std::vector<int32_t> idx(logits.size());
  for (float& x : logits) x = d(rng);
  tandem::kernels::SampleArgs a{.temperature = 0.6f, .seed = 3};
  if (state.range(0) == 0) a.top_p = 0.9f;
  if (state.range(0) == 1) a.top_k = 50;
  for (auto _ : state) {
    ++a.position;
    benchmark::DoNotOptimize(ours ? kc::SampleRow(logits.data(), 128256, a)
                                  : SortedDraw(logits, a, &probs, &idx));
  }
  state.SetLabel(state.range(0) == 0 ? "top_p 0.9" : "top_k 50");
}
void BM_SampleOurs(benchmark::State& state) { Sample(state, true); }
void BM_SampleSortingTheVocabulary(benchmark::State& state) { Sample(state, false); }
BENCHMARK(BM_SampleOurs)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SampleSortingTheVocabulary)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// One structured-outputs row over Llama 3's vocabulary whose grammar allows
// every 997th id (129 of 128,256): the row's int32 list built from the
// grammar's bitmask and one greedy draw, as the list the device gets holds
// it now (the mask's 4,008 words) beside how it did before (every id the
// mask leaves out, ~128k, as banned ids). `list_bytes` is what the row adds
// to the step's upload.
//   bench_kernels --benchmark_filter=GrammarRow
void GrammarRow(benchmark::State& state, bool as_mask) {
  constexpr int32_t kVocab = 128256;
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 4);
  std::vector<float> logits(kVocab);
  for (float& x : logits) x = d(rng);
  std::vector<uint32_t> mask((kVocab + 31) / 32, 0);
  for (int32_t t = 0; t < kVocab; t += 997) mask[t / 32] |= 1u << (t % 32);
  std::vector<int32_t> ids;
  ids.reserve(kVocab);
  tandem::kernels::SampleArgs a{};  // greedy
  for (auto _ : state) {
    ids.clear();
    if (as_mask) {
      for (uint32_t w : mask) ids.push_back(static_cast<int32_t>(w));
      a.num_mask_words = static_cast<int32_t>(ids.size());
    } else {
      for (size_t w = 0; w < mask.size(); ++w) {
        for (uint32_t left = ~mask[w]; left != 0; left &= left - 1) {
          const int32_t t = static_cast<int32_t>(w * 32) + std::countr_zero(left);
          if (t >= kVocab) break;
          ids.push_back(t);
        }
      }
      a.num_banned = static_cast<int32_t>(ids.size());
    }
    benchmark::DoNotOptimize(kc::SampleRow(logits.data(), kVocab, a, ids.data()));
  }
  state.counters["list_bytes"] = static_cast<double>(ids.size() * sizeof(int32_t));
}
void BM_GrammarRowAsMask(benchmark::State& state) { GrammarRow(state, true); }
void BM_GrammarRowAsBannedIds(benchmark::State& state) { GrammarRow(state, false); }
BENCHMARK(BM_GrammarRowAsMask)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GrammarRowAsBannedIds)->Unit(benchmark::kMicrosecond);

// log Z of one row of Llama 3's vocabulary (logits ~ N(0, 4)), what every
// logprob needs: ours (kernels/logprobs.h, the device's program, in float
// with our own exp and log) beside the host's way before it, exp and sum in
// double.
//   bench_kernels --benchmark_filter=LogNormalizer
void LogNormalizer(benchmark::State& state, bool ours) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 4);
  std::vector<float> logits(128256);
  for (float& x : logits) x = d(rng);
  for (auto _ : state) {
    if (ours) {
      benchmark::DoNotOptimize(kc::LogNormalizer(logits.data(), 128256));
    } else {
      const float m = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float l : logits) sum += std::exp(static_cast<double>(l) - m);
      benchmark::DoNotOptimize(m + std::log(sum));
    }
  }
}
void BM_LogNormalizerOurs(benchmark::State& state) { LogNormalizer(state, true); }
void BM_LogNormalizerInDouble(benchmark::State& state) { LogNormalizer(state, false); }
BENCHMARK(BM_LogNormalizerOurs)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LogNormalizerInDouble)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
