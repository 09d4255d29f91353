// bench_cuda: the CUDA runner's decode and prefill speed against the GPU's
// limits (issue 15), not against a peer: decode against the HBM roofline,
// prefill against the dense bf16 tensor-core peak.
//
//   bench_cuda [--shape llama-3.2-1b|tinyllama-1.1b|qwen2.5-1.5b|gemma-2-2b|FILE]
//              [--dtype bfloat16]
//              [--batches 1,8,32,128,256] [--context 512] [--steps 32]
//              [--prefill 512,2048,8192] [--hbm-tbps 3.35] [--peak-tflops 989]
//              [--attention tensor-cores|tensor-cores-gemma|tensor-cores-wide|split-k]
//              [--cuda-graphs on|off] [--profile]
//              [--decode-attention auto|per-split|per-row|tensor-cores]
//              [--dependent-launch on|off] [--gemv-max-rows N] [--tc-gemm-max-rows N]
//              [--sampling greedy|top-p] [--prompt-logprobs N]
//
// --shape names a model shape filled with random weights (speed does not
// depend on the values) or a checkpoint file/directory. Decode: B sequences
// each hold --context tokens of KV, then --steps decode steps are timed
// (greedy, on the GPU, via ForwardSample); tok/s = B * steps / time. The
// roofline time of a step is (bf16 weight bytes + the KV bytes the step
// reads) / HBM bandwidth. Prefill: one sequence of N tokens in one chunk;
// FLOPs = 2 * N * matmul params + 2 * N^2 * q_dim * layers (causal QK^T and
// PV; windows not discounted).
// --attention split-k keeps prefill chunks off the tensor-core attention
// kernel (ModelRunnerOptions::tensor_core_attention), for the comparison;
// tensor-cores-gemma also gives it head size 256 and softcapped scores
// (ModelRunnerOptions::tensor_core_prefill_gemma; off by default for now:
// such rows take the split-K kernel); tensor-cores-wide gives head size 128
// blocks of 128 rows (ModelRunnerOptions::tensor_core_prefill_wide);
// --decode-attention per-split (the runner's default for now) gives every
// split of the split-K attention its own block, per-row gives a row's splits
// to one pipelined block, auto picks by the batch
// (ModelRunnerOptions::attention_splits_per_block; the same bits either way);
// tensor-cores computes those rows on tensor cores instead
// (ModelRunnerOptions::decode_attention_tensor_cores; other bits);
// --dependent-launch on launches the decode GEMVs as programmatic dependents
// of the kernels before them (ModelRunnerOptions::dependent_launch; off by
// default for now, the same bits either way);
// --sampling top-p draws every decode token with Llama 3's generation
// config (temperature 0.6, top_p 0.9) instead of the argmax: the sampler's
// cost per step is the difference between the two lines;
// --prompt-logprobs N scores every prompt token of each prefill with N
// alternatives (an lm-evaluation-harness request; logits for every row,
// logprobs computed on the device): less the plain prefill line, the cost
// of prompt logprobs (torch_anchor.py --prompt-logprobs: PyTorch's);
// --cuda-graphs off runs every decode step eagerly instead of replaying the
// graphs captured per batch-size bucket. --profile calls cudaProfilerStart/Stop
// around the timed decode steps and prefills only, so that
// `ncu --profile-from-start off` sees one kernel list per step
// (tools/gpu/kernel_profile.py sums it per kernel).
// tools/gpu/torch_anchor.py times PyTorch on the same shapes.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tandem/common/flags.h"
#include "tandem/model/model.h"
#include "tandem/model/model_runner.h"

#if TANDEM_BENCH_PROFILER
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace tandem::model;

ModelRunnerOptions g_runner_opts;
bool g_profile = false;
tandem::SamplingParams g_sampling;  // the decode steps' (--sampling)
int64_t g_prompt_logprobs = -1;     // --prompt-logprobs (-1: none)

// Brackets the timed region for ncu; a no-op without --profile.
void ProfilerRange(bool start) {
#if TANDEM_BENCH_PROFILER
  if (!g_profile) return;
  if (start) {
    cudaProfilerStart();
  } else {
    cudaDeviceSynchronize();
    cudaProfilerStop();
  }
#else
  (void)start;
#endif
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "bench_cuda: " << what << "\n";
  std::exit(1);
}

ModelConfig ShapeConfig(const std::string& name) {
  if (name == "llama-3.2-1b") {
    return ModelConfig{.dim = 2048, .hidden_dim = 8192, .num_layers = 16, .num_heads = 32,
                       .num_kv_heads = 8, .vocab_size = 128256, .max_seq_len = 16384,
                       .head_size = 64, .rope_style = RopeStyle::kRotateHalf,
                       .rope_theta = 500000.0f};
  }
  if (name == "tinyllama-1.1b") {
    return ModelConfig{.dim = 2048, .hidden_dim = 5632, .num_layers = 22, .num_heads = 32,
                       .num_kv_heads = 4, .vocab_size = 32000, .max_seq_len = 16384,
                       .head_size = 64, .rope_style = RopeStyle::kRotateHalf};
  }
  if (name == "qwen2.5-1.5b") {
    // Qwen2.5-1.5B's matrices and attention (head size 128, GQA 6: the
    // attention of the 7-8B models people serve); no q/k/v biases.
    return ModelConfig{.family = ModelFamily::kLlama,
                       .dim = 1536,
                       .hidden_dim = 8960,
                       .num_layers = 28,
                       .num_heads = 12,
                       .num_kv_heads = 2,
                       .vocab_size = 151936,
                       .max_seq_len = 16384,
                       .head_size = 128,
                       .rope_style = RopeStyle::kRotateHalf,
                       .rope_theta = 1000000.0f};
  }
  if (name == "gemma-2-2b") {
    // Gemma 2 2B's matrices and attention: head size 256, scores softcapped
    // at 50, every other layer (from the first) sliding over 4,096
    // positions; Llama's norms and no final softcap (no attention cost).
    ModelConfig c{.family = ModelFamily::kLlama,
                  .dim = 2304,
                  .hidden_dim = 9216,
                  .num_layers = 26,
                  .num_heads = 8,
                  .num_kv_heads = 4,
                  .vocab_size = 256000,
                  .max_seq_len = 16384,
                  .head_size = 256,
                  .rope_style = RopeStyle::kRotateHalf,
                  .activation = Activation::kGeluTanh,
                  .attn_logit_softcap = 50.0f};
    for (int32_t i = 0; i < c.num_layers; ++i) c.layer_window.push_back(i % 2 == 0 ? 4096 : 0);
    return c;
  }
  return ModelConfig{};
}

// Uniform(-s, s) weights, s = 1/sqrt(fan-in); norms 1. Fast, not secure.
std::unique_ptr<Model> RandomModel(const ModelConfig& c) {
  std::mt19937_64 rng(1);
  auto fill = [&](std::vector<float>& v, size_t n, float scale) {
    v.resize(n);
    uint64_t x = rng();
    for (float& f : v) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      f = scale * (static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
  };
  const size_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), hidden = c.hidden_dim;
  const float sd = 1.0f / std::sqrt(float(dim)), sh = 1.0f / std::sqrt(float(hidden));
  ModelWeights w;
  fill(w.token_embedding, size_t(c.vocab_size) * dim, 1.0f);
  w.rms_final.assign(dim, 1.0f);
  w.layers.resize(c.num_layers);
  for (LayerWeights& l : w.layers) {
    l.rms_att.assign(dim, 1.0f);
    l.rms_ffn.assign(dim, 1.0f);
    fill(l.wq, q * dim, sd);
    fill(l.wk, kv * dim, sd);
    fill(l.wv, kv * dim, sd);
    fill(l.wo, dim * q, 1.0f / std::sqrt(float(q)));
    fill(l.w1, hidden * dim, sd);
    fill(l.w3, hidden * dim, sd);
    fill(l.w2, dim * hidden, sh);
  }
  auto m = Model::FromWeights(c, std::move(w), "random");
  if (!m.ok()) Die(m.status().ToString());
  return std::move(*m);
}

std::vector<int32_t> ParseList(const std::string& s) {
  std::vector<int32_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(p, &v) || v <= 0) Die("bad list element '" + std::string(p) + "'");
    out.push_back(v);
  }
  return out;
}

// Parameters of the GEMMs (what a decode step streams from HBM).
double MatmulParams(const ModelConfig& c) {
  const double dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), hidden = c.hidden_dim;
  return c.num_layers * (dim * (q + 2 * kv) + q * dim + 3 * dim * hidden) +
         double(c.vocab_size) * dim;
}

struct DecodeResult {
  double tok_s = 0, step_ms = 0, roofline_step_ms = 0;
};

DecodeResult Decode(const Model& m, DType dtype, int32_t batch, int32_t context, int32_t steps) {
  const ModelConfig& c = m.config();
  const int32_t bs = 16, per_seq = (context + steps + bs - 1) / bs;
  auto runner = ModelRunner::Create(
      &m, {.block_size = bs, .num_blocks = batch * per_seq, .dtype = dtype}, Backend::kCuda,
      g_runner_opts);
  if (!runner.ok()) Die(runner.status().ToString());
  std::vector<std::vector<int32_t>> tables(batch), tokens(batch);
  for (int32_t i = 0; i < batch; ++i) {
    for (int32_t j = 0; j < per_seq; ++j) tables[i].push_back(i * per_seq + j);
  }
  // Prefill the contexts, a few sequences per step.
  std::vector<int32_t> prompt(context);
  for (int32_t t = 0; t < context; ++t) prompt[t] = 1 + (t * 7919) % (c.vocab_size - 1);
  std::vector<float> logits;
  const int32_t per_prefill = std::max(1, 8192 / std::max(1, context));
  for (int32_t i = 0; i < batch; i += per_prefill) {
    std::vector<SequenceInput> chunk;
    for (int32_t j = i; j < std::min(batch, i + per_prefill); ++j) {
      chunk.push_back({.token_ids = prompt, .start_pos = 0, .block_table = tables[j]});
    }
    if (absl::Status s = (*runner)->Forward(chunk, &logits); !s.ok()) Die(s.ToString());
  }
  std::vector<tandem::SamplingParams> params(batch, g_sampling);
  std::vector<SampleRequest> sample;
  for (int32_t i = 0; i < batch; ++i) {
    params[i].seed = 1000 + i;
    sample.push_back({.params = &params[i]});
  }
  std::vector<int32_t> next(batch, 2);
  auto step = [&](int32_t pos) {
    std::vector<SequenceInput> in;
    for (int32_t i = 0; i < batch; ++i) {
      tokens[i] = {next[i]};
      sample[i].output_position = pos - context;
      in.push_back({.token_ids = tokens[i], .start_pos = pos, .block_table = tables[i]});
    }
    if (absl::Status s = (*runner)->ForwardSample(in, sample, &next); !s.ok()) Die(s.ToString());
  };
  step(context);  // warm-up (buffers, cuBLAS heuristics)
  ProfilerRange(true);
  const double t0 = Now();
  for (int32_t k = 1; k < steps; ++k) step(context + k);
  const double secs = Now() - t0;
  ProfilerRange(false);
  DecodeResult r;
  const int32_t timed = steps - 1;
  r.step_ms = secs / timed * 1e3;
  r.tok_s = double(batch) * timed / secs;
  const double weight_bytes = MatmulParams(c) * DTypeBytes(dtype);
  const double kv_bytes_per_token = 2.0 * c.num_layers * c.kv_dim() * DTypeBytes(dtype);
  const double mean_context = context + 1 + timed / 2.0;
  const double kv_bytes = batch * mean_context * kv_bytes_per_token;
  r.roofline_step_ms = (weight_bytes + kv_bytes) / 3.35e12 * 1e3;
  return r;
}

double PrefillSeconds(const Model& m, DType dtype, int32_t n, int32_t reps) {
  const int32_t bs = 16, blocks = (n + bs - 1) / bs;
  auto runner = ModelRunner::Create(&m, {.block_size = bs, .num_blocks = blocks, .dtype = dtype},
                                    Backend::kCuda, g_runner_opts);
  if (!runner.ok()) Die(runner.status().ToString());
  std::vector<int32_t> tokens(n), table(blocks);
  for (int32_t i = 0; i < n; ++i) tokens[i] = 1 + (i * 7919) % (m.config().vocab_size - 1);
  for (int32_t i = 0; i < blocks; ++i) table[i] = i;
  tandem::SamplingParams greedy;
  const bool score = g_prompt_logprobs >= 0;
  const SampleRequest sample{
      .params = &greedy,
      .prompt_targets =
          score ? std::span<const int32_t>(tokens).subspan(1) : std::span<const int32_t>(),
      .num_prompt_logprobs = static_cast<int32_t>(std::max<int64_t>(g_prompt_logprobs, 0))};
  std::vector<int32_t> out;
  std::vector<SampleLogprobs> logprobs;
  const SequenceInput in{
      .token_ids = tokens, .start_pos = 0, .block_table = table, .all_logits = score};
  auto run = [&] {
    if (absl::Status s =
            (*runner)->ForwardSample({&in, 1}, {&sample, 1}, &out, score ? &logprobs : nullptr);
        !s.ok()) {
      Die(s.ToString());
    }
  };
  run();  // warm-up
  ProfilerRange(true);
  const double t0 = Now();
  for (int32_t r = 0; r < reps; ++r) run();
  const double secs = (Now() - t0) / reps;
  ProfilerRange(false);
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "llama-3.2-1b", dtype_name = "bfloat16", batches = "1,8,32,128,256",
              prefills = "512,2048,8192", attention = "tensor-cores", graphs = "on",
              decode_attention = "per-split", dependent = "off", sampling = "greedy";
  int64_t context = 512, steps = 32;
  double hbm_tbps = 3.35, peak_tflops = 989;
  tandem::FlagSet flags("bench_cuda", "Decode and prefill speed of the CUDA runner.");
  flags.Add("shape", &shape,
            "llama-3.2-1b | tinyllama-1.1b | qwen2.5-1.5b | gemma-2-2b (random weights) | "
            "a checkpoint");
  flags.Add("dtype", &dtype_name, "float32 | bfloat16");
  flags.Add("batches", &batches, "decode batch sizes");
  flags.Add("context", &context, "KV tokens per sequence before the timed decode steps");
  flags.Add("steps", &steps, "decode steps per batch size (the first is a warm-up)");
  flags.Add("prefill", &prefills, "prefill lengths (empty: none)");
  flags.Add("hbm-tbps", &hbm_tbps, "HBM bandwidth of the roofline, TB/s (H100 SXM: 3.35)");
  flags.Add("peak-tflops", &peak_tflops, "dense bf16 tensor-core peak, TFLOPS (H100 SXM: 989)");
  flags.Add("attention", &attention,
            "tensor-cores | tensor-cores-gemma (also head size 256 and softcaps) | "
            "tensor-cores-wide (128-row blocks at head size 128) | split-k: "
            "the bf16 prefill attention kernel");
  flags.Add("decode-attention", &decode_attention,
            "auto | per-split | per-row: blocks of the split-K attention kernel; "
            "tensor-cores: the tensor-core decode attention instead");
  flags.Add("dependent-launch", &dependent,
            "on | off: decode GEMVs start under the kernel before (compute capability 9.0)");
  flags.Add("gemv-max-rows", &g_runner_opts.gemv_max_rows,
            "GEMMs of up to this many rows run the project's GEMV (at most 4; 0: all cuBLAS)");
  flags.Add("tc-gemm-max-rows", &g_runner_opts.tc_gemm_max_rows,
            "GEMMs past the GEMV's rows and up to this many run the tensor-core GEMM "
            "(at most 64; 0: cuBLAS)");
  flags.Add("cuda-graphs", &graphs, "on | off: decode steps through CUDA graphs");
  flags.Add("sampling", &sampling,
            "greedy | top-p: decode tokens by argmax or with temperature 0.6, top_p 0.9");
  flags.Add("prompt-logprobs", &g_prompt_logprobs,
            "-1 | N: prefills also score every prompt token with N alternatives");
  flags.Add("profile", &g_profile, "bracket the timed steps for ncu --profile-from-start off");
  flags.ParseOrExit(argc, argv);
  if (graphs != "on" && graphs != "off") {
    flags.Fail("--cuda-graphs must be on or off, not '" + graphs + "'");
  }
  g_runner_opts.cuda_graphs = graphs == "on";
  if (sampling == "top-p") {
    g_sampling = {.temperature = 0.6f, .top_p = 0.9f};
  } else if (sampling != "greedy") {
    flags.Fail("--sampling must be greedy or top-p, not '" + sampling + "'");
  }
  if (g_runner_opts.gemv_max_rows < 0 || g_runner_opts.gemv_max_rows > 4) {
    flags.Fail("--gemv-max-rows must be 0 to 4 (the GEMV's limit), not " +
               std::to_string(g_runner_opts.gemv_max_rows));
  }
  if (g_runner_opts.tc_gemm_max_rows < 0 || g_runner_opts.tc_gemm_max_rows > 64) {
    flags.Fail("--tc-gemm-max-rows must be 0 to 64 (the tensor-core GEMM's limit), not " +
               std::to_string(g_runner_opts.tc_gemm_max_rows));
  }
  if (dependent != "on" && dependent != "off") {
    flags.Fail("--dependent-launch must be on or off, not '" + dependent + "'");
  }
  g_runner_opts.dependent_launch = dependent == "on";
  if (attention != "tensor-cores" && attention != "tensor-cores-gemma" &&
      attention != "tensor-cores-wide" && attention != "split-k") {
    flags.Fail(
        "--attention must be tensor-cores, tensor-cores-gemma, tensor-cores-wide or "
        "split-k, not '" +
        attention + "'");
  }
  g_runner_opts.tensor_core_attention = attention != "split-k";
  g_runner_opts.tensor_core_prefill_gemma = attention == "tensor-cores-gemma";
  g_runner_opts.tensor_core_prefill_wide = attention == "tensor-cores-wide";
  if (decode_attention == "auto") {
    g_runner_opts.attention_splits_per_block = -1;
  } else if (decode_attention == "per-split") {
    g_runner_opts.attention_splits_per_block = 1;
  } else if (decode_attention == "per-row") {
    g_runner_opts.attention_splits_per_block = 0;
  } else if (decode_attention == "tensor-cores") {
    g_runner_opts.decode_attention_tensor_cores = true;
  } else {
    flags.Fail("--decode-attention must be auto, per-split, per-row or tensor-cores, not '" +
               decode_attention + "'");
  }
  auto dtype = ParseDType(dtype_name);
  if (!dtype.ok()) flags.Fail(dtype.status().ToString());
  std::unique_ptr<Model> model;
  const ModelConfig sc = ShapeConfig(shape);
  if (sc.dim > 0) {
    model = RandomModel(sc);
  } else {
    auto m = Model::Load(shape);
    if (!m.ok()) Die(m.status().ToString());
    model = std::move(*m);
  }
  const ModelConfig& c = model->config();
  std::cout << std::fixed << std::setprecision(1);
  std::cout << "model " << shape << " (dim " << c.dim << ", " << c.num_layers << " layers, "
            << c.num_heads << "/" << c.num_kv_heads << " heads, ffn " << c.hidden_dim << ", vocab "
            << c.vocab_size << ", " << MatmulParams(c) / 1e9 << " G matmul params), dtype "
            << DTypeName(*dtype) << ", attention " << attention << ", CUDA graphs " << graphs
            << ", sampling " << sampling << ", prompt logprobs " << g_prompt_logprobs << "\n";
  std::cout << "decode: context " << context << ", " << steps - 1
            << " timed steps; roofline = (weights + KV read) / " << hbm_tbps << " TB/s\n";
  for (int32_t b : ParseList(batches)) {
    DecodeResult r = Decode(*model, *dtype, b, static_cast<int32_t>(context),
                            static_cast<int32_t>(steps));
    r.roofline_step_ms *= 3.35 / hbm_tbps;
    std::cout << "  batch " << std::setw(3) << b << ": " << std::setw(9) << r.tok_s
              << " tok/s, step " << std::setprecision(3) << r.step_ms << " ms; roofline "
              << r.roofline_step_ms << " ms (" << std::setprecision(1)
              << double(b) / r.roofline_step_ms * 1e3 << " tok/s): " << std::setprecision(0)
              << 100 * r.roofline_step_ms / r.step_ms << "% of roofline, ITL "
              << std::setprecision(2) << r.step_ms / r.roofline_step_ms << "x roofline\n"
              << std::setprecision(1);
  }
  const std::vector<int32_t> pl = prefills.empty() ? std::vector<int32_t>{} : ParseList(prefills);
  for (int32_t n : pl) {
    const double secs = PrefillSeconds(*model, *dtype, n, n >= 4096 ? 3 : 5);
    const double flops =
        2.0 * n * MatmulParams(c) - 2.0 * n * c.vocab_size * c.dim +  // classifier: last row only
        2.0 * c.vocab_size * c.dim + 2.0 * double(n) * n * c.q_dim() * c.num_layers;
    const double tflops = flops / secs / 1e12;
    std::cout << "prefill " << std::setw(5) << n << " tokens: " << std::setprecision(2)
              << secs * 1e3 << " ms, " << std::setprecision(1) << n / secs << " tok/s, " << tflops
              << " TFLOPS = " << std::setprecision(0) << 100 * tflops / peak_tflops << "% of "
              << peak_tflops << " peak\n"
              << std::setprecision(1);
  }
  return 0;
}
