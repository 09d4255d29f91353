// bench_scheduler: Schedule() + UpdateFromOutput() CPU time per step
// (DESIGN §8, issue 3).
//
//   cmake --build build --target bench_scheduler
//   build/tools/bench_scheduler/bench_scheduler [--benchmark_filter=...]
//
// Decode: N requests all decoding (prefix caching on, 16-token blocks), one
// iteration = one Schedule() plus one UpdateFromOutput() (async: the update of
// the previous step, two steps in flight). The worker's output is prepared
// outside the timed region, as the worker would produce it. Its token is
// never EOS, but each one is checked against the three EOS ids.
// Mixed: N running requests of random lengths (async); finished ones are
// replaced by new 200-token prompts (half share a 128-token prefix), so every
// step has prefill chunks, decodes, finishes and admissions.
//
// The summary prints us per step and ns per running request for every
// workload beside the anchor: vLLM's Python scheduler takes about 95 us per
// schedule() call at ~100 requests (vllm-project/vllm#19057); it cannot run
// on this machine, so the published figure is printed. Target: <= 25 us per
// step at 256 decodes, growing linearly to 4096.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "tandem/sched/scheduler.h"

// Counts heap allocations so the benchmark can report them per step. (GCC
// sees the replaced operator new inlined next to free() and warns.)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<uint64_t> g_num_allocs{0};
void* operator new(size_t n) {
  g_num_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace tandem::sched {
namespace {

constexpr int32_t kPromptLen = 32;
constexpr int32_t kStepsPerScheduler = 1000;

// Request ids as long as a UUID (36 characters), as clients send them: no
// small-string optimisation hides the copies.
std::string RequestId(int64_t i) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "5f0c2a4e-9b1d-4c3e-8a7f-%012lld", static_cast<long long>(i));
  return buf;
}

SchedulerConfig BenchConfig(int32_t n, bool async) {
  SchedulerConfig c;
  c.max_num_seqs = n;
  // Large enough to prefill everything in one step; decodes use n per step.
  c.max_num_batched_tokens = std::max(2048, n * kPromptLen);
  c.max_model_len = kPromptLen + kStepsPerScheduler + 64;
  c.block_size = 16;
  c.num_gpu_blocks = n * ((c.max_model_len + 15) / 16) + 1;
  c.async_scheduling = async;
  // Three EOS ids, as Llama 3 has; the sampled token (7) is none of them.
  c.eos_token_id = 1;
  c.extra_eos_token_ids = {2, 3};
  c.vocab_size = 32000;
  c.hash_root =
      HashRootParams{.model_fingerprint = "bench", .kv_layout = "bench", .block_size = 16};
  return c;
}

// A scheduler with n requests past their prefill, and the worker output that
// samples one token for each of them.
struct DecodeFixture {
  std::unique_ptr<Scheduler> sched;
  SchedulerOutput outs[2];
  int cur = 0;
  ModelRunnerOutput mro;
  std::vector<RequestOutput> results;
  bool async = false;

  void Build(int32_t n, bool async_mode) {
    async = async_mode;
    sched = std::make_unique<Scheduler>(BenchConfig(n, async), nullptr);
    for (int32_t i = 0; i < n; ++i) {
      std::vector<int32_t> prompt(kPromptLen);
      for (int32_t t = 0; t < kPromptLen; ++t) prompt[t] = 2 + (i * 31 + t * 7) % 30000;
      SamplingParams sp;
      sp.max_tokens = kStepsPerScheduler + 32;
      sp.ignore_eos = false;  // every sampled token goes through the EOS check
      (void)sched->AddRequest(
          {.request_id = RequestId(i), .prompt_token_ids = std::move(prompt), .sampling = sp}, i);
    }
    // Prefill synchronously (one step in flight at a time) until all decode.
    mro = {};
    for (int step = 0; step < 64; ++step) {
      sched->ScheduleInto(&outs[0]);
      Sample(outs[0]);
      sched->UpdateFromOutputInto(outs[0], mro, &results);
      if (sched->num_running() == n && outs[0].total_num_scheduled_tokens == n &&
          outs[0].scheduled_new_reqs.empty()) {
        break;
      }
    }
    Sample(outs[0]);  // steady state: every running request samples each step
    if (async) {
      sched->ScheduleInto(&outs[0]);
      cur = 1;
    }
  }

  void Sample(const SchedulerOutput& so) {
    mro.sampled.resize(so.scheduled_new_reqs.size() + so.scheduled_cached_reqs.size());
    size_t k = 0;
    for (const auto& d : so.scheduled_new_reqs) mro.sampled[k++] = {d.request_id, {7}};
    for (const auto& d : so.scheduled_cached_reqs) mro.sampled[k++] = {d.request_id, {7}};
  }

  void Step() {
    if (async) {
      sched->ScheduleInto(&outs[cur]);
      sched->UpdateFromOutputInto(outs[cur ^ 1], mro, &results);
      cur ^= 1;
    } else {
      sched->ScheduleInto(&outs[0]);
      sched->UpdateFromOutputInto(outs[0], mro, &results);
    }
  }
};

void BM_Decode(benchmark::State& state) {
  const int32_t n = static_cast<int32_t>(state.range(0));
  const bool async = state.range(1) != 0;
  DecodeFixture f;
  f.Build(n, async);
  int steps = 0;
  uint64_t setup_allocs = 0;
  const uint64_t allocs_before = g_num_allocs.load();
  for (auto _ : state) {
    if (++steps == kStepsPerScheduler) {  // requests near max_tokens: start over
      state.PauseTiming();
      const uint64_t a = g_num_allocs.load();
      f.Build(n, async);
      setup_allocs += g_num_allocs.load() - a;
      steps = 0;
      state.ResumeTiming();
    }
    f.Step();
    benchmark::DoNotOptimize(f.results.data());
  }
  const uint64_t step_allocs = g_num_allocs.load() - allocs_before - setup_allocs;
  state.counters["allocs_per_step"] =
      static_cast<double>(step_allocs) / static_cast<double>(state.iterations());
  if (f.sched->num_running() != n) state.SkipWithError("requests stopped decoding");
  state.counters["requests"] = n;
  state.counters["ns_per_request"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate |
                                                     benchmark::Counter::kInvert);
  state.SetLabel(async ? "async" : "sync");
}

void BM_Mixed(benchmark::State& state) {
  const int32_t n = static_cast<int32_t>(state.range(0));
  SchedulerConfig c = BenchConfig(n, /*async=*/true);
  c.max_model_len = 512;
  c.max_num_batched_tokens = 2048;
  c.num_gpu_blocks = n * 32 + 1;
  Scheduler sched(c, nullptr);
  std::mt19937_64 rng(1);
  std::vector<int32_t> shared(128);
  for (auto& t : shared) t = 2 + static_cast<int32_t>(rng() % 30000);
  int64_t next_id = 0;
  auto add = [&] {
    std::vector<int32_t> prompt;
    if (rng() % 2) prompt = shared;
    while (prompt.size() < 200) prompt.push_back(2 + static_cast<int32_t>(rng() % 30000));
    SamplingParams sp;
    sp.max_tokens = 32 + static_cast<int32_t>(rng() % 224);
    sp.ignore_eos = true;
    (void)sched.AddRequest(
        {.request_id = RequestId(next_id), .prompt_token_ids = std::move(prompt), .sampling = sp},
        next_id);
    ++next_id;
  };
  for (int32_t i = 0; i < n; ++i) add();
  SchedulerOutput outs[2];
  ModelRunnerOutput mro;
  std::vector<RequestOutput> results;
  int cur = 0;
  bool have_prev = false;
  int64_t tokens = 0;
  int64_t running = 0;
  for (auto _ : state) {
    sched.ScheduleInto(&outs[cur]);
    tokens += outs[cur].total_num_scheduled_tokens;
    running += sched.num_running();
    if (have_prev) {
      const SchedulerOutput& prev = outs[cur ^ 1];
      state.PauseTiming();  // the worker's part
      mro.sampled.clear();
      for (const auto& d : prev.scheduled_new_reqs) mro.sampled.push_back({d.request_id, {7}});
      for (const auto& d : prev.scheduled_cached_reqs) mro.sampled.push_back({d.request_id, {7}});
      state.ResumeTiming();
      sched.UpdateFromOutputInto(prev, mro, &results);
      for (const RequestOutput& o : results) {
        if (o.finished) add();
      }
    }
    have_prev = true;
    cur ^= 1;
  }
  state.counters["tokens_per_step"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kAvgIterations);
  state.counters["requests"] =
      benchmark::Counter(static_cast<double>(running), benchmark::Counter::kAvgIterations);
  state.counters["ns_per_request"] = benchmark::Counter(
      static_cast<double>(running), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel("async");
}

BENCHMARK(BM_Decode)
    ->ArgNames({"requests", "async"})
    ->ArgsProduct({{16, 256, 512, 1024, 2048, 4096}, {1, 0}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Mixed)->ArgName("requests")->Arg(256)->Arg(1024)->Unit(benchmark::kMicrosecond);

constexpr double kAnchorUs = 95.0;  // vLLM schedule() at ~100 requests

// After Google Benchmark's own table, one line per workload: us per step, ns
// per running request, and how the step compares with the anchor.
class AnchorReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    // One repetition's figures, or the median of several
    // (--benchmark_repetitions=n).
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.run_type != Run::RT_Iteration && !median) continue;
      Row& row = rows_[r.run_name.function_name + "/" + r.run_name.args];
      if (row.from_median && !median) continue;
      row.from_median = median;
      row.us = r.GetAdjustedCPUTime();  // in the run's unit (us)
      auto it = r.counters.find("requests");
      row.requests = it == r.counters.end() ? 0.0 : static_cast<double>(it->second);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf(
        "\nSchedule() + UpdateFromOutput() CPU time per step\n"
        "anchor: vLLM's Python scheduler, ~%.0f us per schedule() at ~100 requests "
        "(vllm-project/vllm#19057; published figure, vLLM cannot run here)\n"
        "target: <= 25 us per step at 256 decodes, linear up to 4096\n\n",
        kAnchorUs);
    std::printf("  %-22s %8s %6s %10s %8s %10s\n", "workload", "requests", "mode", "us/step",
                "ns/req", "anchor/ours");
    for (int n : {16, 256, 512, 1024, 2048, 4096}) {
      for (int async : {1, 0}) {
        Print("decode",
              "BM_Decode/requests:" + std::to_string(n) + "/async:" + std::to_string(async),
              async ? "async" : "sync");
      }
    }
    for (int n : {256, 1024}) {
      Print("mixed prefill/decode", "BM_Mixed/requests:" + std::to_string(n), "async");
    }
  }

 private:
  struct Row {
    double us = 0.0;
    double requests = 0.0;
    bool from_median = false;
  };
  void Print(const char* workload, const std::string& name, const char* mode) const {
    auto it = rows_.find(name);
    if (it == rows_.end()) return;  // filtered out
    const Row& r = it->second;
    std::printf("  %-22s %8.0f %6s %10.2f %8.1f %9.1fx\n", workload, r.requests, mode, r.us,
                r.requests > 0 ? r.us * 1000.0 / r.requests : 0.0, kAnchorUs / r.us);
  }
  std::map<std::string, Row> rows_;
};

}  // namespace
}  // namespace tandem::sched

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  tandem::sched::AnchorReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
