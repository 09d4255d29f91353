// Which scheduler replica serves a request: the policy, as a pure function
// of the replicas' state, so that it is tested in-process
// (tests/frontend/routing_test.cc); services/frontend/router keeps the state.
//
// kAffinity (default): requests whose first KV blocks are the same go to the
// same replica, so that its local prefix cache hits. The key is a hash of the
// prompt's first min(affinity_blocks, full blocks) blocks of block_size
// tokens; replicas are ranked by rendezvous (highest random weight) hashing
// of (key, replica name), so adding or losing a replica moves only the keys
// it wins or held. Affinity yields to load: a replica whose outstanding
// requests would exceed kLoadFactor times the mean plus kLoadSlack is skipped
// for the next in rank (bounded-load consistent hashing, Mirrokni et al.
// 2018; the absolute slack, as in SGLang's cache-aware router, keeps a small
// imbalance from breaking affinity when a replica batches hundreds of
// requests), and so is one that is not SERVING. A prompt shorter than one block has no key
// and goes to the least-loaded replica.
// kLeastLoaded: fewest outstanding requests; ties to the lowest rank of a
// rotating start, so equal replicas share the load.
// kRoundRobin: the next serving replica in turn (the baseline affinity is
// measured against).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::frontend {

enum class RoutingPolicy { kAffinity, kLeastLoaded, kRoundRobin };

// "affinity", "least-loaded", "round-robin"; nullopt for anything else.
[[nodiscard]] std::optional<RoutingPolicy> ParseRoutingPolicy(std::string_view name);

// Why a replica was chosen (a metric label).
enum class RouteReason { kAffinity, kAffinitySpill, kLeastLoaded, kRoundRobin };
[[nodiscard]] const char* RouteReasonName(RouteReason reason);

struct ReplicaState {
  std::string name;         // stable identity: "host:port"
  bool serving = false;     // gRPC health SERVING
  int64_t outstanding = 0;  // requests in flight through this frontend
};

// The affinity key of a prompt, or nullopt when it has no full block.
[[nodiscard]] std::optional<uint64_t> AffinityKey(std::span<const int32_t> prompt,
                                                  int32_t block_size, int32_t affinity_blocks);

struct RouteChoice {
  int index = -1;  // into the replicas; -1 when none serves
  RouteReason reason = RouteReason::kLeastLoaded;
};

inline constexpr double kLoadFactor = 1.25;
inline constexpr int64_t kLoadSlack = 8;

// `turn` advances round-robin and the least-loaded tie-break; `exclude`
// lists replicas already tried for this request.
[[nodiscard]] RouteChoice PickReplica(const std::vector<ReplicaState>& replicas,
                                      RoutingPolicy policy, std::optional<uint64_t> key,
                                      uint64_t turn, std::span<const int> exclude = {});

}  // namespace tandem::frontend
