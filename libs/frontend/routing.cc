#include "tandem/frontend/routing.h"

#include <algorithm>
#include <cstring>

namespace tandem::frontend {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

uint64_t Fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ULL) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

bool Excluded(std::span<const int> exclude, int i) {
  return std::find(exclude.begin(), exclude.end(), i) != exclude.end();
}

}  // namespace

std::optional<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  if (name == "affinity") return RoutingPolicy::kAffinity;
  if (name == "least-loaded") return RoutingPolicy::kLeastLoaded;
  if (name == "round-robin") return RoutingPolicy::kRoundRobin;
  return std::nullopt;
}

const char* RouteReasonName(RouteReason reason) {
  switch (reason) {
    case RouteReason::kAffinity:
      return "affinity";
    case RouteReason::kAffinitySpill:
      return "affinity_spill";
    case RouteReason::kLeastLoaded:
      return "least_loaded";
    case RouteReason::kRoundRobin:
      return "round_robin";
  }
  return "";
}

std::optional<uint64_t> AffinityKey(std::span<const int32_t> prompt, int32_t block_size,
                                    int32_t affinity_blocks) {
  if (block_size <= 0 || affinity_blocks <= 0) return std::nullopt;
  const int64_t blocks = std::min<int64_t>(affinity_blocks, prompt.size() / block_size);
  if (blocks == 0) return std::nullopt;
  uint64_t h = Fnv1a(prompt.data(), static_cast<size_t>(blocks * block_size) * sizeof(int32_t));
  return Mix(h);
}

RouteChoice PickReplica(const std::vector<ReplicaState>& replicas, RoutingPolicy policy,
                        std::optional<uint64_t> key, uint64_t turn, std::span<const int> exclude) {
  std::vector<int> candidates;
  int64_t total = 0;
  for (int i = 0; i < static_cast<int>(replicas.size()); ++i) {
    if (!replicas[i].serving || Excluded(exclude, i)) continue;
    candidates.push_back(i);
    total += replicas[i].outstanding;
  }
  if (candidates.empty()) return {};
  const int n = static_cast<int>(candidates.size());

  if (policy == RoutingPolicy::kRoundRobin) {
    return {candidates[turn % n], RouteReason::kRoundRobin};
  }
  auto least_loaded = [&](RouteReason reason) {
    int best = -1;
    for (int k = 0; k < n; ++k) {
      const int i = candidates[(turn + k) % n];
      if (best < 0 || replicas[i].outstanding < replicas[best].outstanding) best = i;
    }
    return RouteChoice{best, reason};
  };
  if (policy == RoutingPolicy::kLeastLoaded || !key) {
    return least_loaded(RouteReason::kLeastLoaded);
  }
  // Rendezvous ranking of the candidates for this key.
  std::vector<std::pair<uint64_t, int>> ranked;
  ranked.reserve(n);
  for (int i : candidates) {
    const std::string& name = replicas[i].name;
    ranked.emplace_back(Mix(*key ^ Fnv1a(name.data(), name.size())), i);
  }
  std::sort(ranked.begin(), ranked.end(), std::greater<>());
  const double mean = static_cast<double>(total + 1) / n;
  const double cap = kLoadFactor * mean + static_cast<double>(kLoadSlack);
  for (size_t r = 0; r < ranked.size(); ++r) {
    const int i = ranked[r].second;
    if (static_cast<double>(replicas[i].outstanding + 1) <= cap) {
      return {i, r == 0 ? RouteReason::kAffinity : RouteReason::kAffinitySpill};
    }
  }
  return least_loaded(RouteReason::kAffinitySpill);
}

}  // namespace tandem::frontend
