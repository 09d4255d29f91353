// The scheduler replicas behind tandem-frontend and the choice among them.
//
// Targets (--scheduler, repeatable):
//   host:port          one replica; gRPC resolves the name itself.
//   dns:///name:port   every address the name resolves to is a replica (a
//                      headless Kubernetes Service lists the pods); resolved
//                      again every resolve_interval_s, so replicas that come
//                      and go are added and dropped.
// A background thread checks each replica's gRPC health
// ("tandem.v1.Generation") every health_interval_s and asks a SERVING one
// for its model (GetModelInfo) once: its limits, EOS ids and sampling
// defaults. Requests go only to SERVING replicas; a call that fails with
// UNAVAILABLE marks its replica not serving until the next health check says
// otherwise. The first model described is the frontend's; a replica that
// describes another fingerprint is never used (logged).
//
// The policy is tandem::frontend::PickReplica (libs/frontend/routing.h).
//
// Each replica is reached over `connections_per_replica` HTTP/2
// connections (channels that share no subchannel), the calls spread over
// them in turn. One connection's reads are parsed by one thread at a time,
// so with every stream on one connection a burst of first tokens (256
// streams finishing a step together) is read one message after another
// before any reaches its HTTP connection; direct gRPC clients, each on its
// own connection, are read in parallel. Measured (DESIGN-NOTES.md): on 16
// cores 4 connections put the p50 TTFT at 256 streams 0.4-0.9 ms below
// direct gRPC's, where 1 put it 0.3-0.8 ms above; on 2 cores 1 is best.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "tandem/common/model_info.h"
#include "tandem/common/sampling_params.h"
#include "tandem/frontend/routing.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::frontend {

class Replica {
 public:
  // `connections` >= 1.
  Replica(std::string name, int32_t connections);
  const std::string& name() const { return name_; }
  // The stub of the next connection in turn (for a Generate call).
  v1::Generation::Stub* stub() const;
  // The first connection's (health checks and model info).
  v1::Generation::Stub* control_stub() const { return stubs_.front().get(); }
  const std::shared_ptr<grpc::Channel>& channel() const { return channels_.front(); }
  bool serving() const {
    return serving_.load() && !wrong_model_.load() && !refuses_salt_.load();
  }
  int64_t outstanding() const { return outstanding_.load(); }

 private:
  friend class Router;
  std::string name_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs_;
  mutable std::atomic<uint64_t> next_stub_{0};
  std::atomic<bool> serving_{false};
  std::atomic<bool> wrong_model_{false};
  // It would refuse the cache_salt tenants' requests carry.
  std::atomic<bool> refuses_salt_{false};
  std::atomic<bool> described_{false};
  std::atomic<int64_t> outstanding_{0};
  std::string from_target_;  // the --scheduler target it came from
};

struct RouterOptions {
  std::vector<std::string> targets;
  RoutingPolicy policy = RoutingPolicy::kAffinity;
  int32_t affinity_blocks = 4;
  int32_t connections_per_replica = 1;
  double resolve_interval_s = 5;
  double health_interval_s = 1;
  // Requests carry a cache_salt (the frontend has tenants): a replica that
  // says it would refuse one (GetModelInfoResponse.accepts_cache_salt) gets
  // no requests, with an error that names the fix.
  bool sends_cache_salt = false;
};

class Router {
 public:
  Router(RouterOptions options, prometheus::Registry* registry);
  ~Router();

  // Checks the targets (INVALID_ARGUMENT names a bad one), resolves them
  // once and starts the health thread.
  [[nodiscard]] absl::Status Start();
  void Stop();

  // A serving replica for `prompt`, not one of `exclude` (names); its
  // outstanding count is raised until Release. nullptr when none serves.
  std::shared_ptr<Replica> Pick(std::span<const int32_t> prompt,
                                std::span<const std::string> exclude);
  void Release(Replica* replica);
  // A call saw UNAVAILABLE: no new requests until health says SERVING.
  void MarkUnavailable(Replica* replica);

  // The model the replicas serve, once one has described it.
  std::optional<ModelInfo> model() const;
  bool any_serving() const;
  // Brings the per-replica gauges up to date (before a scrape).
  void UpdateMetrics();

 private:
  void Loop();
  void Resolve();
  void CheckHealth();
  std::vector<std::shared_ptr<Replica>> Snapshot() const;

  RouterOptions options_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Replica>> replicas_;
  std::optional<ModelInfo> model_;
  uint64_t turn_ = 0;
  bool stop_ = false;
  std::condition_variable cv_;
  std::thread thread_;

  prometheus::Family<prometheus::Counter>* decisions_ = nullptr;
  prometheus::Family<prometheus::Gauge>* outstanding_gauge_ = nullptr;
  prometheus::Family<prometheus::Gauge>* serving_gauge_ = nullptr;
};

}  // namespace tandem::frontend
