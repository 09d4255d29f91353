#include "tandem/frontend/routing.h"

#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::frontend {
namespace {

std::vector<ReplicaState> Replicas(int n) {
  std::vector<ReplicaState> r;
  for (int i = 0; i < n; ++i) r.push_back({"10.0.0." + std::to_string(i) + ":50051", true, 0});
  return r;
}

std::vector<int32_t> Prompt(int32_t first, int32_t len) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(first + i);
  return p;
}

TEST(RoutingTest, KeyCoversOnlyTheFirstFullBlocks) {
  EXPECT_FALSE(AffinityKey(Prompt(1, 15), 16, 4));  // no full block
  auto a = Prompt(1, 100);
  auto b = a;
  b[80] = 9999;  // past 4 blocks of 16
  EXPECT_EQ(AffinityKey(a, 16, 4), AffinityKey(b, 16, 4));
  b[10] = 9999;  // inside the first block
  EXPECT_NE(AffinityKey(a, 16, 4), AffinityKey(b, 16, 4));
}

TEST(RoutingTest, SamePrefixSameReplicaAndKeysSpreadOverReplicas) {
  auto replicas = Replicas(3);
  std::map<int, int> hits;
  for (int32_t k = 0; k < 300; ++k) {
    const auto key = AffinityKey(Prompt(k * 100, 64), 16, 4);
    const RouteChoice a = PickReplica(replicas, RoutingPolicy::kAffinity, key, k);
    const RouteChoice b = PickReplica(replicas, RoutingPolicy::kAffinity, key, k + 17);
    ASSERT_EQ(a.index, b.index);
    EXPECT_EQ(a.reason, RouteReason::kAffinity);
    ++hits[a.index];
  }
  for (int i = 0; i < 3; ++i) EXPECT_GT(hits[i], 60) << "replica " << i;
}

TEST(RoutingTest, LosingAReplicaMovesOnlyItsKeys) {
  auto replicas = Replicas(4);
  std::vector<int> before;
  for (int32_t k = 0; k < 200; ++k) {
    before.push_back(
        PickReplica(replicas, RoutingPolicy::kAffinity, AffinityKey(Prompt(k * 7, 32), 16, 2), 0)
            .index);
  }
  replicas[2].serving = false;
  for (int32_t k = 0; k < 200; ++k) {
    const int now =
        PickReplica(replicas, RoutingPolicy::kAffinity, AffinityKey(Prompt(k * 7, 32), 16, 2), 0)
            .index;
    EXPECT_NE(now, 2);
    if (before[k] != 2) {
      EXPECT_EQ(now, before[k]) << "key " << k << " moved needlessly";
    }
  }
}

TEST(RoutingTest, AffinityYieldsToAnOverloadedReplica) {
  auto replicas = Replicas(3);
  const auto key = AffinityKey(Prompt(5, 64), 16, 4);
  const int home = PickReplica(replicas, RoutingPolicy::kAffinity, key, 0).index;
  replicas[home].outstanding = 100;  // mean of the rest: 0
  const RouteChoice c = PickReplica(replicas, RoutingPolicy::kAffinity, key, 0);
  EXPECT_NE(c.index, home);
  EXPECT_EQ(c.reason, RouteReason::kAffinitySpill);
  // A small imbalance (within the slack) keeps affinity.
  replicas[home].outstanding = kLoadSlack / 2;
  EXPECT_EQ(PickReplica(replicas, RoutingPolicy::kAffinity, key, 0).index, home);
}

TEST(RoutingTest, NotServingAndExcludedReplicasAreSkipped) {
  auto replicas = Replicas(3);
  replicas[0].serving = false;
  const int excluded[] = {1};
  for (auto policy :
       {RoutingPolicy::kAffinity, RoutingPolicy::kLeastLoaded, RoutingPolicy::kRoundRobin}) {
    for (uint64_t turn = 0; turn < 5; ++turn) {
      EXPECT_EQ(PickReplica(replicas, policy, AffinityKey(Prompt(turn, 64), 16, 4), turn, excluded)
                    .index,
                2);
    }
  }
  replicas[2].serving = false;
  EXPECT_EQ(PickReplica(replicas, RoutingPolicy::kAffinity, std::nullopt, 0, excluded).index, -1);
}

TEST(RoutingTest, LeastLoadedAndRoundRobin) {
  auto replicas = Replicas(3);
  replicas[0].outstanding = 5;
  replicas[1].outstanding = 2;
  replicas[2].outstanding = 7;
  EXPECT_EQ(PickReplica(replicas, RoutingPolicy::kLeastLoaded, std::nullopt, 0).index, 1);
  // No key under affinity: least loaded.
  EXPECT_EQ(PickReplica(replicas, RoutingPolicy::kAffinity, std::nullopt, 0).reason,
            RouteReason::kLeastLoaded);
  std::vector<int> order;
  for (uint64_t t = 0; t < 6; ++t) {
    order.push_back(PickReplica(replicas, RoutingPolicy::kRoundRobin, std::nullopt, t).index);
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

TEST(RoutingTest, PolicyNames) {
  EXPECT_EQ(ParseRoutingPolicy("affinity"), RoutingPolicy::kAffinity);
  EXPECT_EQ(ParseRoutingPolicy("least-loaded"), RoutingPolicy::kLeastLoaded);
  EXPECT_EQ(ParseRoutingPolicy("round-robin"), RoutingPolicy::kRoundRobin);
  EXPECT_FALSE(ParseRoutingPolicy("random"));
}

}  // namespace
}  // namespace tandem::frontend
