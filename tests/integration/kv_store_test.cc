// The KV connector end to end (DESIGN §5, issue 6) with the real
// tandem-kvstore, tandem-worker and tandem-scheduler binaries:
//  - store on/off differential in sync and async mode with a worker cache
//    too small to keep the prefixes (later requests load them);
//  - cross-replica reuse and the async-load admission limit under a burst;
//  - no stored block was computed from a placeholder token;
//  - tenant isolation by cache salt;
//  - a restarted store still serves the prefixes.
#include <set>

#include "kv_util.h"
#include "tandem/common/block_hash.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvconnector/kvstore_connector.h"

namespace tandem::testing {
namespace {

std::vector<std::string> Mode(bool async) {
  return {"--async-scheduling=" + std::string(async ? "true" : "false")};
}

// The scheduler's flags for a store these tests expect loads from. A lookup
// unanswered within --kvstore-lookup-deadline-ms (50 ms by default) counts
// as a miss and the prefix is recomputed; on a loaded 2-core CI machine a
// fresh scheduler's first burst of lookups has missed that deadline, so
// these tests wait longer. What a late lookup does is kv_faults_test's.
std::vector<std::string> StoreFlags(const std::string& kv_address) {
  return {"--kvstore", kv_address, "--kvstore-lookup-deadline-ms", "5000"};
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(KvStoreTest, DifferentialStoreOnOffSyncAndAsync) {
  const std::string dir = MakeTempDir("tandem-kv-diff");
  // 16 prefixes of 6-7 blocks, 4 uses each; 40 blocks hold about five
  // requests, so a prefix's blocks are long evicted when it comes back.
  const std::vector<v1::GenerateRequest> requests = SharedPrefixWorkload(64, 16, 96);
  Service kv = StartKvStore(dir, "kv", {});
  Service plain = StartWorker(dir, "worker-plain", {"--num-blocks", "40"});
  Service worker = StartWorker(dir, "worker-kv", {"--num-blocks", "40", "--kvstore", kv.address()});
  std::vector<GenerateResult> baseline;
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    Service off = StartScheduler(dir, std::string("sched-off-") + (async ? "a" : "s"),
                                 plain.address(), Mode(async));
    std::vector<GenerateResult> ref = RunAll(off.address(), requests, 16);
    if (baseline.empty()) {
      baseline = ref;
    } else {
      ExpectSameOutputs(ref, baseline);  // sync == async without the store
    }
    Stop(off);
    Service on = StartScheduler(dir, std::string("sched-on-") + (async ? "a" : "s"),
                                worker.address(), Concat(Mode(async), StoreFlags(kv.address())));
    // Waves of 16 (the later users of a prefix arrive after it was stored).
    ExpectSameOutputs(RunAll(on.address(), requests, 16), baseline);
    const v1::GetStatsResponse st = IdleStats(on.address());
    const int64_t prompt_tokens = TotalPromptTokens(requests);
    std::printf(
        "[%s] external lookups %lu (with hits %lu), loaded %lu of %ld prompt tokens, "
        "local hits %lu, invalid %lu, stored blocks %lu\n",
        async ? "async" : "sync", static_cast<unsigned long>(st.external_lookups()),
        static_cast<unsigned long>(st.external_lookups_with_hits()),
        static_cast<unsigned long>(st.external_loaded_tokens()), static_cast<long>(prompt_tokens),
        static_cast<unsigned long>(st.prefix_cache_hits()),
        static_cast<unsigned long>(st.external_invalid_blocks()),
        static_cast<unsigned long>(st.external_stored_blocks()));
    EXPECT_GT(st.external_lookups_with_hits(), 0u);
    // Loads made up a real share of the prompt tokens (>= 20%).
    EXPECT_GE(static_cast<int64_t>(st.external_loaded_tokens()) * 5, prompt_tokens)
        << st.DebugString();
    EXPECT_EQ(st.external_invalid_blocks(), 0u);
    std::printf("[%s] stores in flight when idle: %d\n", async ? "async" : "sync",
                st.num_stores_in_flight());
    // Every store entry is accounted for: none leaks in flight.
    const v1::GetStatsResponse settled = StatsAfterStoresSettle(on.address());
    EXPECT_EQ(settled.num_stores_in_flight(), 0) << settled.DebugString();
    EXPECT_EQ(settled.num_loads_in_flight(), 0);
    EXPECT_EQ(settled.num_lookups_pending(), 0);
    Stop(on);
  }
}

void PrintBurst(const char* label, const v1::GetStatsResponse& st) {
  std::printf(
      "%s: external lookups with hits %lu, late or failed %lu, loaded tokens %lu, max "
      "running+loading %d\n",
      label, static_cast<unsigned long>(st.external_lookups_with_hits()),
      static_cast<unsigned long>(st.external_lookups_failed()),
      static_cast<unsigned long>(st.external_loaded_tokens()), st.max_running_plus_loading());
}

TEST(KvStoreTest, CrossReplicaHitAndLoadAdmissionLimitUnderBurst) {
  const std::string dir = MakeTempDir("tandem-kv-burst");
  Service kv = StartKvStore(dir, "kv", {});
  Service worker_a = StartWorker(dir, "worker-a", {"--kvstore", kv.address()});
  Service worker_b = StartWorker(dir, "worker-b", {"--kvstore", kv.address()});
  Service sched_a = StartScheduler(dir, "sched-a", worker_a.address(), {"--kvstore", kv.address()});
  constexpr int kMaxSeqs = 16;
  Service sched_b = StartScheduler(
      dir, "sched-b", worker_b.address(),
      Concat(StoreFlags(kv.address()), {"--max-num-seqs", std::to_string(kMaxSeqs)}));

  // Replica A computes 8 prefixes (one request each).
  const std::vector<v1::GenerateRequest> seed_requests = SharedPrefixWorkload(8, 8, 128, 99);
  for (const GenerateResult& r : RunAll(sched_a.address(), seed_requests)) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  // Replica B gets 200 requests at once, all on those prefixes.
  std::vector<v1::GenerateRequest> burst = SharedPrefixWorkload(200, 8, 128, 99);
  for (auto& r : burst) r.mutable_sampling()->set_max_tokens(3);
  // Let A's stores land first (they are sent in the background).
  auto client = kvconnector::KvStoreClient::Create({.target = kv.address()});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(WaitFor([&] {
    auto s = (*client)->Stats();
    return s.ok() && s->cold_blocks >= 8 * 8;
  })) << "replica A's blocks never reached the store";
  std::vector<GenerateResult> results = RunAll(sched_b.address(), burst);
  const v1::GetStatsResponse st = IdleStats(sched_b.address());
  PrintBurst("burst", st);
  EXPECT_GT(st.external_lookups_with_hits(), 0u) << "no cross-replica hit";
  EXPECT_GT(st.external_loaded_tokens(), 0u);
  // By default the schedulers look up, and the workers load, over the
  // store's bulk port.
  const v1::StatsResponse store_stats = KvStoreStatsRpc(kv.address());
  EXPECT_GT(store_stats.bulk_lookups(), 0u);
  EXPECT_GT(store_stats.bulk_loads(), 0u);
  EXPECT_LE(st.max_running_plus_loading(), kMaxSeqs);
  EXPECT_GT(st.max_running_plus_loading(), 1);

  // --limit-async-load-admission=false (vLLM's behaviour): loads count
  // against the blocks only, so the same burst runs more than max_num_seqs
  // requests and loads at once (a fresh scheduler: its prefix cache is
  // empty, the prefixes come from the store again).
  Stop(sched_b);
  Service unlimited = StartScheduler(
      dir, "sched-unlimited", worker_b.address(),
      Concat(StoreFlags(kv.address()),
             {"--max-num-seqs", std::to_string(kMaxSeqs), "--limit-async-load-admission=false"}));
  const std::vector<GenerateResult> unlimited_results = RunAll(unlimited.address(), burst);
  const v1::GetStatsResponse ust = IdleStats(unlimited.address());
  PrintBurst("burst without the limit", ust);
  EXPECT_GT(ust.external_loaded_tokens(), 0u);
  EXPECT_GT(ust.max_running_plus_loading(), kMaxSeqs);
  ExpectSameOutputs(results, unlimited_results);

  // Same tokens as a scheduler without the store (on A's worker: one
  // scheduler stream per worker).
  Stop(sched_a);
  Service plain = StartScheduler(dir, "sched-plain", worker_a.address(), {});
  ExpectSameOutputs(results, RunAll(plain.address(), burst, 50));
}

// Every stored block's hash is a block of some request's final token ids:
// no block whose KV (or key) came from a placeholder was ever stored. Blocks
// holding output tokens are among them (the async path was exercised). And
// every stored block's bytes are the KV of those tokens: the same workload
// run in sync mode into a second store holds each block under the same hash
// with identical bytes (the CPU backend is batch invariant).
TEST(KvStoreTest, AsyncStoresOnlyBlocksOfFinalTokens) {
  const std::string dir = MakeTempDir("tandem-kv-placeholder");
  Service kv = StartKvStore(dir, "kv", {});
  Service worker = StartWorker(dir, "worker", {"--kvstore", kv.address()});
  Service sched = StartScheduler(dir, "sched", worker.address(),
                                 {"--kvstore", kv.address(), "--async-scheduling=true"});
  std::vector<v1::GenerateRequest> requests = SharedPrefixWorkload(24, 6, 40, 3);
  for (auto& r : requests) {
    r.mutable_sampling()->set_max_tokens(45);
    r.mutable_sampling()->set_ignore_eos(true);
  }
  std::vector<GenerateResult> results = RunAll(sched.address(), requests);
  auto wstub = WorkerStub(worker.address());
  const v1::DescribeResponse d = Describe(wstub.get());
  const BlockHash root = ComputeRootHash({.model_fingerprint = d.model_fingerprint(),
                                          .kv_layout = d.kv_layout(),
                                          .block_size = d.block_size(),
                                          .dtype = "f32"});
  std::set<BlockHash> prompt_only, with_output;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok());
    std::vector<int32_t> tokens(requests[i].prompt_token_ids().begin(),
                                requests[i].prompt_token_ids().end());
    const size_t num_prompt = tokens.size();
    tokens.insert(tokens.end(), results[i].tokens.begin(), results[i].tokens.end());
    std::vector<BlockHash> hashes;
    ExtendBlockHashes(root, tokens, d.block_size(), &hashes);
    for (size_t b = 0; b < hashes.size(); ++b) {
      ((b + 1) * d.block_size() <= num_prompt ? prompt_only : with_output).insert(hashes[b]);
    }
  }
  auto client = kvconnector::KvStoreClient::Create({.target = kv.address()});
  ASSERT_TRUE(client.ok());
  // Every store entry has finished once the scheduler counts none in flight.
  ASSERT_EQ(StatsAfterStoresSettle(sched.address()).num_stores_in_flight(), 0);
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  const uint64_t stored = stats->cold_blocks;
  const std::string ns = kvconnector::NamespaceFor(d.model_fingerprint(), d.kv_layout());
  std::vector<BlockHash> in_store;
  auto present = [&](const std::set<BlockHash>& set) {
    uint64_t n = 0;
    for (const BlockHash& h : set) {
      const BlockHash one[] = {h};
      if ((*client)->Lookup(ns, one, {.take_lease = false, .deadline_ms = 5000})->Wait().num_hits) {
        in_store.push_back(h);
        ++n;
      }
    }
    return n;
  };
  const uint64_t n_prompt = present(prompt_only), n_output = present(with_output);
  std::printf("stored %lu blocks: %lu of prompt tokens, %lu holding output tokens\n",
              static_cast<unsigned long>(stored), static_cast<unsigned long>(n_prompt),
              static_cast<unsigned long>(n_output));
  EXPECT_EQ(n_prompt + n_output, stored) << "the store holds blocks of no final token sequence";
  EXPECT_GT(n_output, 0u) << "no block with output tokens was stored";

  // The same workload in sync mode, into a second store.
  Service kv_sync = StartKvStore(dir, "kv-sync", {});
  Service worker_sync = StartWorker(dir, "worker-sync", {"--kvstore", kv_sync.address()});
  Service sched_sync = StartScheduler(dir, "sched-sync", worker_sync.address(),
                                      {"--kvstore", kv_sync.address(), "--async-scheduling=false"});
  ExpectSameOutputs(RunAll(sched_sync.address(), requests), results);
  ASSERT_EQ(StatsAfterStoresSettle(sched_sync.address()).num_stores_in_flight(), 0);
  auto client_sync = kvconnector::KvStoreClient::Create({.target = kv_sync.address()});
  ASSERT_TRUE(client_sync.ok());

  // Load every block of the async store from both stores and compare.
  const size_t block_bytes = static_cast<size_t>(d.block_bytes());
  ASSERT_GT(block_bytes, 0u);
  auto load_all = [&](kvconnector::KvStoreClient* c, std::vector<std::vector<uint8_t>>* bytes) {
    bytes->assign(in_store.size(), std::vector<uint8_t>(block_bytes));
    std::vector<std::span<uint8_t>> dst(bytes->begin(), bytes->end());
    auto r = c->Load(ns, in_store, std::span<const std::span<uint8_t>>(dst));
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<bool> ok;
    for (size_t i = 0; i < in_store.size(); ++i) ok.push_back(r.ok() && (*r)[i].ok());
    return ok;
  };
  std::vector<std::vector<uint8_t>> async_bytes, sync_bytes;
  const std::vector<bool> async_ok = load_all(client->get(), &async_bytes);
  const std::vector<bool> sync_ok = load_all(client_sync->get(), &sync_bytes);
  size_t compared = 0;
  for (size_t i = 0; i < in_store.size(); ++i) {
    ASSERT_TRUE(async_ok[i]) << "block " << in_store[i].ToHex() << " did not load";
    // Sync mode stores a superset: its bound on known tokens is one higher.
    ASSERT_TRUE(sync_ok[i]) << "block " << in_store[i].ToHex() << " is not in the sync store";
    EXPECT_EQ(async_bytes[i], sync_bytes[i])
        << "block " << in_store[i].ToHex() << ": the async run stored other KV bytes";
    ++compared;
  }
  std::printf("compared %zu blocks byte for byte with the sync run\n", compared);
  EXPECT_EQ(compared, stored);
}

TEST(KvStoreTest, CacheSaltsIsolateTenants) {
  const std::string dir = MakeTempDir("tandem-kv-salt");
  Service kv = StartKvStore(dir, "kv", {});
  Service worker = StartWorker(dir, "worker", {"--kvstore", kv.address()});
  const std::vector<std::string> flags = {"--kvstore", kv.address(), "--allow-request-cache-salt"};
  v1::GenerateRequest req = SharedPrefixWorkload(1, 1, 100, 5)[0];
  req.mutable_sampling()->set_max_tokens(4);
  {
    Service a = StartScheduler(dir, "sched-a", worker.address(), flags);
    req.set_cache_salt("tenant-1");
    auto stub = GenerationStub(a.address());
    ASSERT_TRUE(RunGenerate(stub.get(), req).status.ok());
    IdleStats(a.address());
    Stop(a);
  }
  auto client = kvconnector::KvStoreClient::Create({.target = kv.address()});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(WaitFor([&] {
    auto s = (*client)->Stats();
    return s.ok() && s->cold_blocks >= 6;
  }));
  // A fresh scheduler (empty local cache): tenant 2 misses, tenant 1 hits.
  Service b = StartScheduler(dir, "sched-b", worker.address(), flags);
  auto stub = GenerationStub(b.address());
  req.set_cache_salt("tenant-2");
  const GenerateResult other = RunGenerate(stub.get(), req);
  ASSERT_TRUE(other.status.ok());
  EXPECT_EQ(other.usage.cached_tokens_external(), 0);
  req.set_cache_salt("tenant-1");
  req.set_request_id("again");
  const GenerateResult same = RunGenerate(stub.get(), req);
  ASSERT_TRUE(same.status.ok());
  EXPECT_GE(same.usage.cached_tokens_external(), 96);
  EXPECT_EQ(same.tokens, other.tokens);
}

TEST(KvStoreTest, RestartedStoreServesPrefixes) {
  const std::string dir = MakeTempDir("tandem-kv-restart");
  Service kv = StartKvStore(dir, "kv", {"--durability", "wal"});
  const std::string kv_address = kv.address();
  Service worker = StartWorker(dir, "worker", {"--kvstore", kv_address});
  const std::vector<v1::GenerateRequest> requests = SharedPrefixWorkload(24, 6, 80, 11);
  std::vector<GenerateResult> first;
  {
    Service s = StartScheduler(dir, "sched-1", worker.address(), {"--kvstore", kv_address});
    first = RunAll(s.address(), requests);
    IdleStats(s.address());
    Stop(s);
  }
  // Let the background stores land, then restart the store on its port.
  auto client = kvconnector::KvStoreClient::Create({.target = kv_address});
  ASSERT_TRUE(client.ok());
  uint64_t stored = 0;
  ASSERT_TRUE(WaitFor([&] {
    auto st = (*client)->Stats();
    const bool settled = st.ok() && st->cold_blocks == stored && stored > 0;
    if (st.ok()) stored = st->cold_blocks;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return settled;
  }));
  Stop(kv);
  kv = StartKvStore(dir, "kv", {"--durability", "wal"}, kv_address);
  Service s = StartScheduler(dir, "sched-2", worker.address(), {"--kvstore", kv_address});
  ExpectSameOutputs(RunAll(s.address(), requests), first);
  const v1::GetStatsResponse st = IdleStats(s.address());
  EXPECT_GT(st.external_lookups_with_hits(), 0u);
  EXPECT_GT(st.external_loaded_tokens(), 0u);
  // The worker, which outlived the store, found its new bulk port.
  EXPECT_GT(KvStoreStatsRpc(kv_address).bulk_loads(), 0u);
}

}  // namespace
}  // namespace tandem::testing
