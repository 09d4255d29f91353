// Benchmark (not a test) of the KV connector, DESIGN §8 style, against
// services started by tools/bench_kv_ttft/run.sh:
//
//  1. TTFT of a 448-token prompt whose first 432 tokens are in the KV-store
//     (computed by replica A, loaded by replica B) against the SAME prompt
//     computed from scratch on the same replica B, in the same run: the
//     from-scratch request carries a cache salt of its own (B runs with
//     --allow-request-cache-salt), so neither B's prefix cache nor the store
//     has its blocks; it still pays B's store lookup (a miss). The same
//     prompt on the replica without a store (--plain) is printed too. Each
//     trial uses a fresh random prompt; the order of the two B requests
//     alternates between trials.
//  2. End-to-end throughput of a shared-prefix workload (P distinct 432-token
//     prefixes, R requests each, shuffled; workers with small KV caches) on
//     a replica with the store and one without.
//
// Anchor: vLLM reports 2-22x lower TTFT when loading KV from CPU memory
// instead of recomputing it (its KV-offloading blog post); it cannot run on
// this machine, so only the anchor's ratio is printed beside ours.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "tandem/common/flags.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/rpc/status.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  double ttft_ms = 0;
  double total_ms = 0;
  int cached_external = 0;
  int cached_local = 0;
  int output_tokens = 0;
  bool ok = false;
};

std::unique_ptr<tandem::v1::Generation::Stub> Stub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return tandem::v1::Generation::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

Result Generate(tandem::v1::Generation::Stub* stub, const std::vector<int32_t>& prompt,
                int max_tokens, const std::string& cache_salt = "") {
  tandem::v1::GenerateRequest req;
  req.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  req.set_cache_salt(cache_salt);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  Result r;
  const auto start = Clock::now();
  auto reader = stub->Generate(&ctx, req);
  tandem::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (r.ttft_ms == 0 && msg.token_ids_size() > 0) {
      r.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    }
    r.output_tokens += msg.token_ids_size();
    if (msg.has_usage()) {
      r.cached_external = msg.usage().cached_tokens_external();
      r.cached_local = msg.usage().cached_tokens_local();
    }
  }
  const grpc::Status status = reader->Finish();
  r.ok = status.ok();
  if (!r.ok) {  // every caller's failure then says why
    std::fprintf(stderr, "Generate (%zu prompt tokens): %s: %s\n", prompt.size(),
                 tandem::rpc::StatusCodeName(status).c_str(), status.error_message().c_str());
  }
  r.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return r;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, bool bos) {
  std::vector<int32_t> t;
  if (bos) t.push_back(1);
  while (static_cast<int>(t.size()) < n) t.push_back(static_cast<int32_t>(2 + rng() % 510));
  return t;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

struct Throughput {
  double seconds = 0;
  double output_tok_s = 0;
  double mean_ttft_ms = 0;
  long external = 0;
  long local = 0;
  int failed = 0;
};

Throughput RunWorkload(const std::string& address, const std::vector<std::vector<int32_t>>& prompts,
                       int output_len, int concurrency) {
  auto stub = Stub(address);
  std::vector<Result> results(prompts.size());
  std::atomic<size_t> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < prompts.size(); i = next++) {
        results[i] = Generate(stub.get(), prompts[i], output_len);
      }
    });
  }
  for (auto& t : threads) t.join();
  Throughput t;
  t.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  long tokens = 0;
  for (const Result& r : results) {
    tokens += r.output_tokens;
    t.mean_ttft_ms += r.ttft_ms / results.size();
    t.external += r.cached_external;
    t.local += r.cached_local;
    t.failed += !r.ok;
  }
  t.output_tok_s = tokens / t.seconds;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line into a file too: a run cut short (a crash, the device
  // tool's limit) keeps the figures already printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string replica_a, replica_b, plain, kvstore;
  int32_t trials = 20, prompt_len = 448, cached_len = 432;
  int32_t num_prefixes = 16, per_prefix = 8, output_len = 16, concurrency = 8;
  tandem::FlagSet flags("tandem-bench-kv-ttft",
                        "KV-store TTFT and shared-prefix throughput (see run.sh).");
  flags.Add("replica-a", &replica_a,
            "scheduler (with --kvstore) that computes and stores prefixes");
  flags.Add("replica-b", &replica_b,
            "scheduler (with --kvstore and --allow-request-cache-salt) whose TTFT is measured");
  flags.Add("plain", &plain, "scheduler without a KV-store (throughput baseline)");
  flags.Add("kvstore", &kvstore, "tandem-kvstore host:port (to wait for stores)");
  flags.Add("trials", &trials, "TTFT trials");
  flags.Add("prompt-len", &prompt_len, "TTFT prompt tokens");
  flags.Add("cached-len", &cached_len, "leading prompt tokens put in the store first");
  flags.Add("num-prefixes", &num_prefixes, "throughput: distinct prefixes");
  flags.Add("per-prefix", &per_prefix, "throughput: requests per prefix");
  flags.Add("output-len", &output_len, "throughput: output tokens per request");
  flags.Add("concurrency", &concurrency, "throughput: requests in flight");
  flags.ParseOrExit(argc, argv);

  auto client = tandem::kvconnector::KvStoreClient::Create({.target = kvstore});
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto cold_blocks = [&]() -> uint64_t {
    auto s = (*client)->Stats();
    return s.ok() ? s->cold_blocks : 0;
  };
  // Waits until the store holds more than `before` blocks and the count has
  // stopped growing (replica A stores in the background), at most 5 s.
  auto wait_stores = [&](uint64_t before) {
    uint64_t last = before;
    for (int i = 0; i < 100; ++i) {
      const uint64_t now = cold_blocks();
      if (now > before && now == last) return;
      last = now;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };

  std::mt19937 rng(2026);
  auto stub_a = Stub(replica_a), stub_b = Stub(replica_b);
  auto stub_plain = plain.empty() ? nullptr : Stub(plain);
  // Warm-up (connections, code paths).
  (void)Generate(stub_b.get(), RandomTokens(rng, prompt_len, true), 1);
  if (stub_plain) (void)Generate(stub_plain.get(), RandomTokens(rng, prompt_len, true), 1);
  std::vector<double> hit_ms, miss_ms, plain_ms;
  int min_external = prompt_len, max_scratch_cached = 0, short_hits = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<int32_t> prefix = RandomTokens(rng, cached_len, true);
    std::vector<int32_t> warm = prefix, prompt = prefix;
    for (int i = cached_len; i < prompt_len; ++i) warm.push_back(2 + rng() % 510);
    for (int i = cached_len; i < prompt_len; ++i) prompt.push_back(2 + rng() % 510);
    const uint64_t stored_before = cold_blocks();
    if (!Generate(stub_a.get(), warm, 1).ok) return 1;
    wait_stores(stored_before);
    // The same prompt from scratch: a salt of its own hashes every block
    // differently, so B finds none of them locally or in the store.
    const std::string scratch_salt = "bench-scratch-" + std::to_string(t);
    Result miss, h;
    if (t % 2 == 0) {
      miss = Generate(stub_b.get(), prompt, 1, scratch_salt);
      h = Generate(stub_b.get(), prompt, 1);
    } else {
      h = Generate(stub_b.get(), prompt, 1);
      miss = Generate(stub_b.get(), prompt, 1, scratch_salt);
    }
    if (!miss.ok || !h.ok) {
      std::fprintf(stderr, "trial %d failed (replica B needs --allow-request-cache-salt)\n", t);
      return 1;
    }
    hit_ms.push_back(h.ttft_ms);
    miss_ms.push_back(miss.ttft_ms);
    min_external = std::min(min_external, h.cached_external);
    if (h.cached_external < cached_len) {
      ++short_hits;
      std::fprintf(stderr, "trial %d: %d tokens from the store (TTFT %.2f ms)\n", t,
                   h.cached_external, h.ttft_ms);
    }
    max_scratch_cached = std::max({max_scratch_cached, miss.cached_external, miss.cached_local});
    if (stub_plain) {
      const Result p = Generate(stub_plain.get(), prompt, 1);
      if (!p.ok) return 1;
      plain_ms.push_back(p.ttft_ms);
    }
  }
  std::printf("TTFT, the same %d-token prompt per trial, %d trials (on the workers' --backend):\n",
              prompt_len, trials);
  std::printf(
      "  first %d tokens from the KV-store : p50 %.2f ms  p90 %.2f ms  (external cached "
      "tokens >= %d; %d trials got fewer than %d)\n",
      cached_len, Percentile(hit_ms, 0.5), Percentile(hit_ms, 0.9), min_external, short_hits,
      cached_len);
  std::printf(
      "  from scratch, same replica       : p50 %.2f ms  p90 %.2f ms  (cached tokens <= %d)\n",
      Percentile(miss_ms, 0.5), Percentile(miss_ms, 0.9), max_scratch_cached);
  if (!plain_ms.empty()) {
    std::printf("  from scratch, replica w/o store  : p50 %.2f ms  p90 %.2f ms\n",
                Percentile(plain_ms, 0.5), Percentile(plain_ms, 0.9));
  }
  {
    grpc::ClientContext ctx;
    tandem::v1::GetStatsResponse st;
    (void)stub_b->GetStats(&ctx, tandem::v1::GetStatsRequest(), &st);
    std::printf(
        "  replica B: %lu store lookups, %lu late or failed (zero hits), %lu invalid blocks\n",
        static_cast<unsigned long>(st.external_lookups()),
        static_cast<unsigned long>(st.external_lookups_failed()),
        static_cast<unsigned long>(st.external_invalid_blocks()));
  }
  std::printf("  speed-up p50 %.2fx   (anchor: vLLM 2-22x loading KV from CPU memory)\n",
              Percentile(miss_ms, 0.5) / Percentile(hit_ms, 0.5));

  if (!plain.empty()) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::vector<int32_t>> prefixes;
    for (int p = 0; p < num_prefixes; ++p) prefixes.push_back(RandomTokens(rng, cached_len, true));
    for (int p = 0; p < num_prefixes; ++p) {
      for (int r = 0; r < per_prefix; ++r) {
        std::vector<int32_t> prompt = prefixes[p];
        for (int i = cached_len; i < prompt_len; ++i) prompt.push_back(2 + rng() % 510);
        prompts.push_back(prompt);
      }
    }
    std::shuffle(prompts.begin(), prompts.end(), rng);
    const Throughput off = RunWorkload(plain, prompts, output_len, concurrency);
    const Throughput on = RunWorkload(replica_b, prompts, output_len, concurrency);
    std::printf(
        "Shared-prefix workload: %d prefixes x %d requests, %d-token prompts, %d output "
        "tokens, concurrency %d, small worker KV caches:\n",
        num_prefixes, per_prefix, prompt_len, output_len, concurrency);
    for (const auto& [name, t] : {std::pair{"store off", off}, std::pair{"store on ", on}}) {
      std::printf(
          "  %s: %.2f s, %.1f output tok/s, mean TTFT %.1f ms, cached tokens local %ld "
          "external %ld, failed %d\n",
          name, t.seconds, t.output_tok_s, t.mean_ttft_ms, t.local, t.external, t.failed);
    }
    std::printf("  throughput ratio on/off: %.2fx\n", on.output_tok_s / off.output_tok_s);
  }
  // Store entries are reported finished with a later step: what each
  // replica counts in flight when idle, and after one more (storeless)
  // request.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (auto& [name, stub] : {std::pair{"A", stub_a.get()}, std::pair{"B", stub_b.get()}}) {
    auto stats = [&] {
      grpc::ClientContext ctx;
      tandem::v1::GetStatsResponse st;
      (void)stub->GetStats(&ctx, tandem::v1::GetStatsRequest(), &st);
      return st;
    };
    const tandem::v1::GetStatsResponse idle = stats();
    (void)Generate(stub, {1}, 1);
    const tandem::v1::GetStatsResponse after = stats();
    std::printf(
        "Replica %s when idle: stores in flight %d (after one more request: %d), stored blocks "
        "%lu\n",
        name, idle.num_stores_in_flight(), after.num_stores_in_flight(),
        static_cast<unsigned long>(after.external_stored_blocks()));
  }
  return 0;
}
