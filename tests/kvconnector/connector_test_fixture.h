// The fixture of the KV connector's tests (connector_test.cc: lookups and
// loads; connector_store_test.cc: stores): a real tandem.v1.KvStore server
// in process, a fake block-major KV cache, and helpers that drive the
// scheduler role as the scheduler does.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../kvstore/test_util.h"
#include "../kvstore_service/loopback_server.h"
#include "gtest/gtest.h"
#include "kvstore_service.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/kvstore/kv_store.h"

namespace tandem::kvconnector {

using kvstore::testing::TempDir;

constexpr int32_t kBlockSize = 4;
constexpr int64_t kBlockBytes = 256;
constexpr int32_t kCacheBlocks = 32;

// A fake block-major KV cache.
struct FakeCache {
  std::vector<std::vector<std::byte>> blocks =
      std::vector<std::vector<std::byte>>(kCacheBlocks, std::vector<std::byte>(kBlockBytes));
  void Fill(int32_t block, int seed) {
    for (int64_t i = 0; i < kBlockBytes; ++i) {
      blocks[block][i] = static_cast<std::byte>((seed * 131 + i * 7) & 0xff);
    }
  }
  // Copies at once, as the CPU backend does.
  KvStoreConnectorWorker::CopyToHost ToHost() {
    return [this](std::span<const int32_t> ids, std::span<const std::span<std::byte>> out)
               -> absl::StatusOr<std::function<absl::Status()>> {
      for (size_t i = 0; i < ids.size(); ++i) {
        std::memcpy(out[i].data(), blocks.at(ids[i]).data(), kBlockBytes);
      }
      return std::function<absl::Status()>([] { return absl::OkStatus(); });
    };
  }
  KvStoreConnectorWorker::CopyFromHost FromHost() {
    return [this](std::span<const int32_t> ids, std::span<const std::span<const std::byte>> in)
               -> absl::StatusOr<KvStoreConnectorWorker::CopyIn> {
      for (size_t i = 0; i < ids.size(); ++i) {
        std::memcpy(blocks.at(ids[i]).data(), in[i].data(), kBlockBytes);
      }
      return KvStoreConnectorWorker::CopyIn{.done = [] { return true; },
                                            .wait = [] { return absl::OkStatus(); }};
    };
  }
};

using tandem::testing::Gate;  // ../wait_for.h

inline std::vector<int32_t> Tokens(int n, int base = 100) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(base + i);
  return t;
}

// Options of the worker role beside the store address.
struct WorkerOptions {
  int64_t max_pending_store_bytes = int64_t{256} << 20;
  std::string target;  // empty: the test's store
  bool use_cuda_host_alloc = true;
  KvStoreConnectorWorker::CopyToHost to_host;  // empty: cache_.ToHost()
  KvStoreConnectorWorker::CopyFromHost from_host;  // empty: cache_.FromHost()
  std::function<void(const KvLoadTiming&)> on_load;
  int32_t load_threads = KvStoreConnectorOptions{}.load_threads;
};

class ConnectorTest : public ::testing::Test {
 protected:
  void StartStore(int64_t lookup_delay_ms = 0, std::function<void()> before_store = {},
                  std::function<void()> before_load = {},
                  std::function<void()> before_create_namespace = {}) {
    auto store = kvstore::KvStoreEngine::Open({.data_dir = dir_.path(),
                                               .hot_capacity_bytes = 1 << 20,
                                               .hot_slot_bytes = 4096,
                                               .lock_hot_memory = false});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    service_ = std::make_unique<kvstore_service::KvStoreServiceImpl>(
        store_.get(), kvstore_service::KvStoreServiceOptions{
                          .debug_lookup_delay_ms = lookup_delay_ms,
                          .debug_before_store = std::move(before_store),
                          .debug_before_load = std::move(before_load),
                          .debug_before_create_namespace = std::move(before_create_namespace)});
    testutil::LoopbackServer s = testutil::StartOnLoopback(service_.get());
    ASSERT_NE(s.server, nullptr);
    server_ = std::move(s.server);
    target_ = s.target;
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  std::vector<double> lookup_latencies_;  // seconds, from on_lookup_latency
  // The outcome of the scheduler role's CreateNamespace, once it arrives.
  struct NamespaceOutcome {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::Status> status;
    std::optional<absl::Status> Wait(std::chrono::milliseconds within = std::chrono::seconds(30)) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, within, [&] { return status.has_value(); });
      return status;
    }
  };
  std::shared_ptr<NamespaceOutcome> namespace_outcome_;
  // Create sends CreateNamespace without waiting for it; unless told not
  // to, this waits for its answer, so a test's first lookup finds the
  // namespace.
  std::unique_ptr<KvStoreConnectorScheduler> MakeScheduler(int64_t deadline_ms = 2000,
                                                           int64_t refresh_ms = 100,
                                                           bool wait_for_namespace = true) {
    auto outcome = std::make_shared<NamespaceOutcome>();
    namespace_outcome_ = outcome;
    auto c = KvStoreConnectorScheduler::Create(
        {.target = target_,
         .lookup_deadline_ms = deadline_ms,
         .lookup_refresh_ms = refresh_ms,
         .on_lookup_latency = [this](double s) { lookup_latencies_.push_back(s); },
         .on_namespace =
             [outcome](const absl::Status& s) {
               std::lock_guard<std::mutex> lock(outcome->mu);
               outcome->status = s;
               outcome->cv.notify_all();
             }},
        "fp", "layout", kBlockBytes, kBlockSize);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok() && wait_for_namespace) {
      EXPECT_TRUE(outcome->Wait().has_value());
    }
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::unique_ptr<KvStoreConnectorWorker> MakeWorker(const WorkerOptions& o = {}) {
    auto w = KvStoreConnectorWorker::Create({.target = o.target.empty() ? target_ : o.target,
                                             .transfer_deadline_ms = 2000,
                                             .max_pending_store_bytes = o.max_pending_store_bytes,
                                             .load_threads = o.load_threads,
                                             .use_cuda_host_alloc = o.use_cuda_host_alloc,
                                             .on_load = o.on_load},
                                            "fp", "layout", kBlockBytes,
                                            o.to_host ? o.to_host : cache_.ToHost(),
                                            o.from_host ? o.from_host : cache_.FromHost());
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }

  // A request whose prompt is `tokens`, with the hashes the scheduler keeps.
  static sched::Request MakeRequest(const std::string& id, std::vector<int32_t> tokens,
                                    std::vector<int32_t> block_ids, const std::string& salt = "") {
    sched::Request r;
    r.request_id = id;
    r.num_prompt_tokens = static_cast<int32_t>(tokens.size());
    r.all_token_ids = std::move(tokens);
    r.block_ids = std::move(block_ids);
    r.root_hash = ComputeRootHash(HashRootParams{.model_fingerprint = "fp",
                                                 .kv_layout = "layout",
                                                 .block_size = kBlockSize,
                                                 .cache_salt = salt});
    ExtendBlockHashes(r.root_hash, r.all_token_ids, kBlockSize, &r.block_hashes);
    return r;
  }

  // Polls like the scheduler does once per step, until an answer arrives.
  static sched::ExternalMatch PollMatch(KvStoreConnectorScheduler* c, const sched::Request& r,
                                        int32_t local, int* num_polls = nullptr) {
    for (int i = 0; i < 5000; ++i) {
      std::optional<sched::ExternalMatch> m = c->GetNumNewMatchedTokens(r, local);
      if (m.has_value()) {
        if (num_polls) *num_polls = i + 1;
        return *m;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "lookup never resolved";
    return {};
  }

  static void WaitSent(KvStoreConnectorWorker* w, size_t n, sched::KvConnectorReport* report) {
    for (int i = 0; i < 5000 && report->finished_sending.size() < n; ++i) {
      w->TakeFinishedSending(report);
      if (report->finished_sending.size() < n) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    ASSERT_EQ(report->finished_sending.size(), n);
  }

  // Request `id` (17 tokens: 4 full blocks in cache blocks 1..4) computes its
  // prompt in one step; returns the step's metadata (one store entry).
  sched::KvConnectorMetadata ComputeStep(KvStoreConnectorScheduler* sc, sched::Request* r) {
    (void)PollMatch(sc, *r, 0);
    sc->UpdateStateAfterAlloc(*r, {}, 0);
    for (int b = 1; b <= 4; ++b) cache_.Fill(b, b);
    sched::ScheduledRequestView v{.request = r, .num_scheduled_tokens = 17, .will_sample = true};
    sched::SchedulerOutput out;
    return sc->BuildConnectorMeta(out, {&v, 1});
  }

  // The blocks the scheduler emits for request `id` whose 4 full blocks are
  // a local prefix hit (no lookup asks the store about them).
  static std::vector<int32_t> StoredOnLocalHit(KvStoreConnectorScheduler* sc,
                                               const std::string& id) {
    sched::Request b = MakeRequest(id, Tokens(17), {1, 2, 3, 4, 5});
    EXPECT_EQ(sc->GetNumNewMatchedTokens(b, 16)->num_external_tokens, 0);
    sc->UpdateStateAfterAlloc(b, {}, 0);
    b.num_computed_tokens = 16;
    sched::ScheduledRequestView v{.request = &b, .num_scheduled_tokens = 1, .will_sample = true};
    sched::SchedulerOutput out;
    sched::KvConnectorMetadata meta = sc->BuildConnectorMeta(out, {&v, 1});
    return meta.stores.empty() ? std::vector<int32_t>{} : meta.stores[0].block_ids;
  }

  // Runs a step's loads as the worker does: LoadBlocks, then FinishLoads
  // (waiting, as a step with nothing to compute does) until every load of
  // `meta` has been reported, for at most 30 s.
  static void RunLoads(KvStoreConnectorWorker* wk, const sched::KvConnectorMetadata& meta,
                       sched::KvConnectorReport* report) {
    const size_t want = report->finished_recving.size() + meta.loads.size();
    wk->LoadBlocks(meta, report);
    AwaitLoads(wk, report, want);
    EXPECT_EQ(report->finished_recving.size(), want) << "loads never arrived";
  }
  // Steps with nothing to compute (FinishLoads, 10 ms each) until `report`
  // holds `want` finished loads, or 3,000 of them have gone.
  static void AwaitLoads(KvStoreConnectorWorker* wk, sched::KvConnectorReport* report,
                         size_t want) {
    for (int i = 0; i < 3000 && report->finished_recving.size() < want; ++i) {
      wk->FinishLoads(report, std::chrono::milliseconds(10));
    }
  }

  // Loads the 4 full blocks of a request of `tokens` (17 of them) from the
  // store into cache blocks 20..23 through both roles, as a new request
  // `id` whose lookup hits all 4; false (with a failure) when it does not.
  bool LoadBack(KvStoreConnectorScheduler* sc, KvStoreConnectorWorker* wk, const std::string& id,
                std::vector<int32_t> tokens) {
    sched::Request again = MakeRequest(id, std::move(tokens), {20, 21, 22, 23, 24});
    EXPECT_EQ(PollMatch(sc, again, 0).num_external_tokens, 16) << id;
    sc->UpdateStateAfterAlloc(again, std::span<const int32_t>(again.block_ids).first(4), 16);
    sched::SchedulerOutput out;
    sched::KvConnectorMetadata meta = sc->BuildConnectorMeta(out, {});
    if (meta.loads.size() != 1u) {
      ADD_FAILURE() << id << ": " << meta.loads.size() << " loads";
      return false;
    }
    sched::KvConnectorReport report;
    RunLoads(wk, meta, &report);
    EXPECT_EQ(report.finished_recving, std::vector<std::string>{again.request_id});
    EXPECT_TRUE(report.invalid_block_ids.empty()) << id;
    sc->OnConnectorReport(report);
    sc->OnLoadFinished(again, 16);
    EXPECT_FALSE(sc->RequestFinished(again, again.block_ids, 0));
    return report.invalid_block_ids.empty();
  }

  bool WaitActiveLeases(uint64_t n) {
    return kvstore::testing::WaitFor([&] { return store_->GetStats().active_leases == n; },
                                     std::chrono::seconds(2));
  }

  TempDir dir_;
  std::unique_ptr<kvstore::KvStoreEngine> store_;
  std::unique_ptr<kvstore_service::KvStoreServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  FakeCache cache_;
};

// Puts blocks `first..last` (inclusive) of `tokens`' chain in the store,
// from cache blocks 10.. (filled with seed = block index), through the
// worker role.
inline void StoreBlocks(KvStoreConnectorWorker* wk, FakeCache* cache, const sched::Request& r,
                        int first, int last) {
  sched::KvConnectorMetadata meta;
  sched::KvStoreOp st{.request_id = "filler"};
  for (int b = first; b <= last; ++b) {
    cache->Fill(10 + b, b);
    st.block_ids.push_back(10 + b);
    st.block_hashes.push_back(r.block_hashes[static_cast<size_t>(b)]);
  }
  meta.stores.push_back(std::move(st));
  wk->SnapshotStores(meta);
  ASSERT_TRUE(wk->WaitForStores(5000));
  sched::KvConnectorReport sent;
  wk->TakeFinishedSending(&sent);
}

}  // namespace tandem::kvconnector
