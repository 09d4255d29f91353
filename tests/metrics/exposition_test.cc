// AppendExposition: one scrape from two processes' expositions (tandem serve
// serves the scheduler's series on the frontend's /metrics).
#include <regex>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "tandem/metrics/metrics.h"

namespace tandem::metrics {
namespace {

// The exposition of a registry with a counter `shared` (value `shared_value`)
// and a histogram `own_name`.
std::string Exposition(const std::string& own_name, double shared_value) {
  prometheus::Registry registry;
  AddCounter(registry, "shared_total", "in both").Increment(shared_value);
  AddHistogram(registry, own_name, "one process's", {1, 2}).Observe(1.5);
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

int Count(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern, std::regex::multiline);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

TEST(AppendExpositionTest, AddsTheUpstreamsFamiliesOnceEach) {
  const std::string own = Exposition("front_seconds", 1);
  const std::string upstream = Exposition("sched_seconds", 7);
  const std::string merged = AppendExposition(own, upstream);
  EXPECT_EQ(merged.substr(0, own.size()), own);
  // Both histograms, whole: HELP, TYPE, buckets, sum and count.
  EXPECT_EQ(Count(merged, "^# TYPE front_seconds histogram$"), 1);
  EXPECT_EQ(Count(merged, "^# TYPE sched_seconds histogram$"), 1);
  EXPECT_EQ(Count(merged, "^sched_seconds_bucket"), 3);
  EXPECT_EQ(Count(merged, "^sched_seconds_count 1$"), 1);
  // The family both hold appears once, with own's value.
  EXPECT_EQ(Count(merged, "^# TYPE shared_total counter$"), 1);
  EXPECT_EQ(Count(merged, "^shared_total 1$"), 1);
  EXPECT_EQ(Count(merged, "^shared_total 7$"), 0);
  EXPECT_EQ(merged.back(), '\n');
}

TEST(AppendExpositionTest, EmptyUpstreamLeavesOwnAsItIs) {
  const std::string own = Exposition("front_seconds", 1);
  EXPECT_EQ(AppendExposition(own, ""), own);
}

}  // namespace
}  // namespace tandem::metrics
