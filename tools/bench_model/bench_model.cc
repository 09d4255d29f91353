// bench_model: tokens/s of the CPU backend on stories260K (DESIGN §8).
//
//   build-model/tools/bench_model/bench_model [--model PATH] [--threads N]
//
// Decode: B sequences start from BOS and decode 255 tokens each in lockstep
// (positions 0..255, as llama2.c's default 256 steps), aggregate tokens/s.
// Prefill: one 256-token prompt in one chunk.
// Anchor: llama2.c's run.c, single stream on one core of this machine kind,
// measured at about 5000 tok/s (it cannot be built here: no network). As an
// in-run stand-in we also time a straight transcription of run.c's forward
// pass (one token at a time, scalar loops) compiled with our flags.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>

#include "tandem/common/flags.h"
#include "tandem/kernels/cpu_ops.h"
#include "tandem/model/model.h"
#include "tandem/model/model_runner.h"

namespace {

using namespace tandem::model;
namespace kc = tandem::kernels::cpu;
constexpr double kLlama2cAnchorTokS = 5000.0;

// CPU seconds of this process: on a shared machine other processes' load
// does not count against us (the runner uses one thread unless --threads).
struct Timer {
  static double CpuNow() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
  static double WallNow() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  double start = CpuNow();
  double wall_start = WallNow();
  double Seconds() const {
    last_wall_seconds = WallNow() - wall_start;
    return CpuNow() - start;
  }
  static inline double last_wall_seconds = 0;  // of the latest Seconds() call
};

// Decode tokens/s at batch `b` over `steps` positions.
double DecodeTokS(const Model& m, int32_t b, int32_t steps, int32_t threads) {
  const int32_t bs = 16, per_seq = (steps + bs - 1) / bs;
  auto runner = ModelRunner::Create(&m, {.block_size = bs, .num_blocks = b * per_seq},
                                    Backend::kCpu, {.num_threads = threads});
  if (!runner.ok()) {
    std::cerr << runner.status() << "\n";
    std::exit(1);
  }
  std::vector<std::vector<int32_t>> tables(b), tokens(b, std::vector<int32_t>{1});
  for (int32_t i = 0; i < b; ++i) {
    for (int32_t j = 0; j < per_seq; ++j) tables[i].push_back(i * per_seq + j);
  }
  std::vector<float> logits;
  const int32_t vocab = m.config().vocab_size;
  const Timer timer;
  for (int32_t pos = 0; pos < steps; ++pos) {
    std::vector<SequenceInput> batch;
    for (int32_t i = 0; i < b; ++i) {
      batch.push_back({.token_ids = tokens[i], .start_pos = pos, .block_table = tables[i]});
    }
    if (!(*runner)->Forward(batch, &logits).ok()) std::exit(1);
    for (int32_t i = 0; i < b; ++i) {  // greedy, cheap
      const float* l = logits.data() + int64_t{i} * vocab;
      tokens[i][0] = static_cast<int32_t>(std::max_element(l, l + vocab) - l);
    }
  }
  return double(b) * steps / timer.Seconds();
}

double PrefillTokS(const Model& m, int32_t n, int32_t threads) {
  auto runner = ModelRunner::Create(&m, {.block_size = 16, .num_blocks = (n + 15) / 16},
                                    Backend::kCpu, {.num_threads = threads});
  if (!runner.ok()) std::exit(1);
  std::vector<int32_t> tokens(n), table((n + 15) / 16);
  for (int32_t i = 0; i < n; ++i) tokens[i] = i == 0 ? 1 : 2 + (i * 37) % 500;
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  std::vector<float> logits;
  const int reps = 20;
  const Timer timer;
  for (int r = 0; r < reps; ++r) {
    SequenceInput in{.token_ids = tokens, .start_pos = 0, .block_table = table};
    if (!(*runner)->Forward({&in, 1}, &logits).ok()) std::exit(1);
  }
  return double(n) * reps / timer.Seconds();
}

// run.c's forward(), transcribed: one token, scalar loops, contiguous cache.
double RunCStyleTokS(const Model& m, int32_t steps) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  const int32_t dim = c.dim, kv_dim = c.kv_dim(), hs = c.head_size, hidden = c.hidden_dim;
  std::vector<float> x(dim), xb(dim), xb2(dim), hb(hidden), hb2(hidden), q(dim),
      att(c.num_heads * steps), logits(c.vocab_size);
  std::vector<float> kc_(size_t(c.num_layers) * steps * kv_dim), vc(kc_.size());
  int32_t token = 1;
  const Timer timer;
  for (int32_t pos = 0; pos < steps; ++pos) {
    std::memcpy(x.data(), &w.token_embedding[size_t(token) * dim], dim * sizeof(float));
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      kc::RmsNorm(x.data(), lw.rms_att.data(), 1, dim, 1e-5f, xb.data());
      float* k = &kc_[(size_t(l) * steps + pos) * kv_dim];
      float* v = &vc[(size_t(l) * steps + pos) * kv_dim];
      kc::Matmul(lw.wq.data(), dim, dim, xb.data(), 1, q.data());
      kc::Matmul(lw.wk.data(), kv_dim, dim, xb.data(), 1, k);
      kc::Matmul(lw.wv.data(), kv_dim, dim, xb.data(), 1, v);
      kc::Rope(q.data(), 1, &pos, c.num_heads, hs, tandem::kernels::RopeKind::kAdjacentPairs,
               10000.0f);
      kc::Rope(k, 1, &pos, c.num_kv_heads, hs, tandem::kernels::RopeKind::kAdjacentPairs, 10000.0f);
      const int32_t mul = c.num_heads / c.num_kv_heads;
      for (int32_t h = 0; h < c.num_heads; ++h) {
        float* a = &att[size_t(h) * steps];
        for (int32_t t = 0; t <= pos; ++t) {
          const float* kt = &kc_[(size_t(l) * steps + t) * kv_dim + (h / mul) * hs];
          float s = 0;
          for (int32_t i = 0; i < hs; ++i) s += q[h * hs + i] * kt[i];
          a[t] = s / std::sqrt(float(hs));
        }
        float mx = a[0], sum = 0;
        for (int32_t t = 1; t <= pos; ++t) mx = std::max(mx, a[t]);
        for (int32_t t = 0; t <= pos; ++t) sum += (a[t] = std::exp(a[t] - mx));
        for (int32_t t = 0; t <= pos; ++t) a[t] /= sum;
        float* o = &xb[h * hs];
        std::memset(o, 0, hs * sizeof(float));
        for (int32_t t = 0; t <= pos; ++t) {
          const float* vt = &vc[(size_t(l) * steps + t) * kv_dim + (h / mul) * hs];
          for (int32_t i = 0; i < hs; ++i) o[i] += a[t] * vt[i];
        }
      }
      kc::Matmul(lw.wo.data(), dim, dim, xb.data(), 1, xb2.data());
      for (int32_t i = 0; i < dim; ++i) x[i] += xb2[i];
      kc::RmsNorm(x.data(), lw.rms_ffn.data(), 1, dim, 1e-5f, xb.data());
      kc::Matmul(lw.w1.data(), hidden, dim, xb.data(), 1, hb.data());
      kc::Matmul(lw.w3.data(), hidden, dim, xb.data(), 1, hb2.data());
      for (int32_t i = 0; i < hidden; ++i) {
        hb[i] = hb[i] * (1.0f / (1.0f + std::exp(-hb[i]))) * hb2[i];
      }
      kc::Matmul(lw.w2.data(), dim, hidden, hb.data(), 1, xb.data());
      for (int32_t i = 0; i < dim; ++i) x[i] += xb[i];
    }
    kc::RmsNorm(x.data(), w.rms_final.data(), 1, dim, 1e-5f, xb.data());
    kc::Matmul(w.classifier().data(), c.vocab_size, dim, xb.data(), 1, logits.data());
    token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  return steps / timer.Seconds();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "../shared/models/stories260K.bin";
  int64_t threads = 1, steps = 256;
  tandem::FlagSet flags("bench_model", "Forward-pass throughput of the CPU runner.");
  flags.Add("model", &model_path, "llama2.c .bin or Hugging Face directory");
  flags.Add("threads", &threads, "CPU threads of the runner");
  flags.Add("steps", &steps, "decode positions per sequence (from BOS)");
  flags.ParseOrExit(argc, argv);
  auto model = Model::Load(model_path);
  if (!model.ok()) {
    std::cerr << "error: " << model.status() << "\n";
    return 1;
  }
  const int32_t t = static_cast<int32_t>(threads), s = static_cast<int32_t>(steps);
  std::cout << std::fixed << std::setprecision(0);
  std::cout << "model " << (*model)->name() << ", CPU backend, " << t << " thread(s), " << s
            << " decode positions per sequence; tok/s per CPU-second of this process\n";
  std::cout << "anchor: llama2.c run.c single stream ~" << kLlama2cAnchorTokS
            << " tok/s (measured on this machine kind; not runnable here)\n";
  const double runc = RunCStyleTokS(**model, s);
  std::cout << "in-run stand-in: run.c-style scalar forward, single stream: " << runc << " tok/s\n";
  double at32 = 0;
  for (int32_t b : {1, 8, 32, 64}) {
    const double v = DecodeTokS(**model, b, s, t);
    if (b == 32) at32 = v;
    std::cout << "decode batch " << std::setw(2) << b << ": " << std::setw(8) << v
              << " tok/s  (wall clock: " << double(b) * s / Timer::last_wall_seconds << " tok/s)\n";
  }
  const double prefill = PrefillTokS(**model, 256, t);
  std::cout << "prefill 256 tokens: " << prefill
            << " tok/s  (wall clock: " << 256.0 * 20 / Timer::last_wall_seconds << " tok/s)\n";
  std::cout << std::setprecision(2) << "batch 32 vs anchor: " << at32 / kLlama2cAnchorTokS
            << "x (target >= 2x); vs in-run stand-in: " << at32 / runc << "x\n";
  return 0;
}
