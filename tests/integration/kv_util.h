// Helpers of the KV connector integration tests (kv_*_test.cc): start the
// real tandem-kvstore, a shared-prefix workload, and running it.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem::testing {

// Starts tandem-kvstore on `listen` (port 0: any) with its data in
// dir/<name>.data; waits until it listens.
inline Service StartKvStore(const std::string& dir, const std::string& name,
                            const std::vector<std::string>& extra_args,
                            const std::string& listen = "127.0.0.1:0") {
  const std::string port_file = dir + "/" + name + ".port";
  const std::string log = dir + "/" + name + ".log";
  std::remove(port_file.c_str());
  std::vector<std::string> argv = {BinaryPath("services/kvstore/tandem-kvstore"),
                                   "--listen",
                                   listen,
                                   "--port-file",
                                   port_file,
                                   "--data-dir",
                                   dir + "/" + name + ".data",
                                   "--hot-slot-bytes",
                                   "65536",
                                   "--hot-capacity-bytes",
                                   std::to_string(64 << 20)};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  Service s;
  s.log_path = log;
  s.process = Process::Spawn(argv, log);
  EXPECT_TRUE(WaitFor([&] {
    std::ifstream f(port_file);
    return static_cast<bool>(f >> s.port) && s.port > 0;
  })) << "tandem-kvstore "
      << name << " never listened (log " << log << ")";
  return s;
}

// The store's Stats, as grpcurl would see them (the bulk port's counters
// included).
inline v1::StatsResponse KvStoreStatsRpc(const std::string& address) {
  auto stub =
      v1::KvStore::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse resp;
  const grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

inline void Stop(Service& s) {
  s.process.Signal(SIGTERM);
  EXPECT_TRUE(s.process.Wait(std::chrono::seconds(30)).has_value());
}

// `num_prefixes` distinct long prefixes (`prefix_len` tokens), request i
// using prefix i % num_prefixes plus a short suffix; greedy and seeded
// sampling mixed; some requests ignore EOS so their outputs fill blocks.
inline std::vector<v1::GenerateRequest> SharedPrefixWorkload(int num_requests, int num_prefixes,
                                                             int prefix_len, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  auto token = [&] { return static_cast<int32_t>(2 + rng() % 510); };
  std::vector<std::vector<int32_t>> prefixes;
  for (int f = 0; f < num_prefixes; ++f) {
    std::vector<int32_t> p{1};
    while (static_cast<int>(p.size()) < prefix_len + (f % 3) * 8) p.push_back(token());
    prefixes.push_back(p);
  }
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < num_requests; ++i) {
    std::vector<int32_t> prompt = prefixes[i % num_prefixes];
    const int suffix = 1 + static_cast<int>(rng() % 20);
    for (int j = 0; j < suffix; ++j) prompt.push_back(token());
    const int32_t max_tokens = 4 + (i * 7) % 29;
    const bool greedy = i % 2 == 0;
    v1::GenerateRequest r = MakeRequest(prompt, max_tokens, greedy ? 0.0f : 0.9f,
                                        /*seed=*/500 + i, /*ignore_eos=*/i % 3 == 0);
    r.set_request_id("q" + std::to_string(i));
    requests.push_back(r);
  }
  return requests;
}

// Runs every request concurrently (at most `concurrency` at a time; 0 = all
// at once) and waits for all of them.
inline std::vector<GenerateResult> RunAll(const std::string& address,
                                          const std::vector<v1::GenerateRequest>& requests,
                                          int concurrency = 0) {
  auto stub = GenerationStub(address);
  std::vector<GenerateResult> results(requests.size());
  const size_t wave = concurrency > 0 ? static_cast<size_t>(concurrency) : requests.size();
  for (size_t start = 0; start < requests.size(); start += wave) {
    std::vector<std::thread> threads;
    for (size_t i = start; i < std::min(requests.size(), start + wave); ++i) {
      threads.emplace_back([&, i] { results[i] = RunGenerate(stub.get(), requests[i]); });
    }
    for (auto& t : threads) t.join();
  }
  return results;
}

// Every request succeeded and got the baseline's tokens.
inline void ExpectSameOutputs(const std::vector<GenerateResult>& results,
                              const std::vector<GenerateResult>& baseline) {
  ASSERT_EQ(results.size(), baseline.size());
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok())
        << "request " << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, baseline[i].tokens) << "request " << i;
    EXPECT_EQ(results[i].finish_reason, baseline[i].finish_reason) << "request " << i;
  }
}

// Waits until the scheduler is idle (its stats are published after each
// engine iteration) and returns the stats.
inline v1::GetStatsResponse IdleStats(const std::string& address) {
  auto stub = GenerationStub(address);
  EXPECT_TRUE(WaitFor([&] {
    v1::GetStatsResponse s = GetStats(stub.get());
    return s.num_running() == 0 && s.num_waiting() == 0 && s.num_active_streams() == 0;
  }));
  return GetStats(stub.get());
}

// The connector's store entries are reported finished with a later step;
// while idle the engine sends an empty step every 100 ms to collect them
// (Engine::SendIdleStep). Polls, without sending anything, until the
// scheduler counts no store, load or lookup in flight (a leaked entry never
// gets there) or 10 s pass. Returns the stats then.
inline v1::GetStatsResponse StatsAfterStoresSettle(const std::string& address) {
  v1::GetStatsResponse s = IdleStats(address);
  for (int i = 0;
       i < 200 && s.num_stores_in_flight() + s.num_loads_in_flight() + s.num_lookups_pending() > 0;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s = IdleStats(address);
  }
  return s;
}

inline int64_t TotalPromptTokens(const std::vector<v1::GenerateRequest>& requests) {
  int64_t n = 0;
  for (const auto& r : requests) n += r.prompt_token_ids_size();
  return n;
}

}  // namespace tandem::testing
