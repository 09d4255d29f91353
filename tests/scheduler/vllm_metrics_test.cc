// vLLM's series as the scheduler serves them (services/scheduler/
// vllm_metrics.h): vLLM's 1-2-5 buckets, the request-phase times of one
// request's timeline, and what an error or a request aborted while waiting
// records. Names, types, labels and buckets against vLLM's own list are
// checked on the running binary by tests/integration/metrics_test.py.
#include "vllm_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace tandem::scheduler {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

// The series `name` (a histogram's sum and count, or a counter's value) with
// label `key`=`value` when given.
const prometheus::ClientMetric* Find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name, const std::string& key = "",
                                     const std::string& value = "") {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      if (key.empty()) return &m;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == key && l.value == value) return &m;
      }
    }
  }
  return nullptr;
}

double HistogramSum(const std::vector<prometheus::MetricFamily>& f, const std::string& name) {
  const prometheus::ClientMetric* m = Find(f, name);
  return m == nullptr ? -1 : m->histogram.sample_sum;
}
uint64_t HistogramCount(const std::vector<prometheus::MetricFamily>& f, const std::string& name) {
  const prometheus::ClientMetric* m = Find(f, name);
  return m == nullptr ? 0 : m->histogram.sample_count;
}
double Success(const std::vector<prometheus::MetricFamily>& f, const std::string& reason) {
  return Find(f, "vllm:request_success_total", "finished_reason", reason)->counter.value;
}

TEST(VllmMetricsTest, OneTwoFiveBucketsAsVllmBuildsThem) {
  using B = prometheus::Histogram::BucketBoundaries;
  EXPECT_EQ(OneTwoFiveBuckets(100), (B{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(OneTwoFiveBuckets(512), (B{1, 2, 5, 10, 20, 50, 100, 200, 500}));
  EXPECT_EQ(OneTwoFiveBuckets(1), (B{1}));
}

TEST(VllmMetricsTest, PhaseTimesFollowTheRequestsTimeline) {
  prometheus::Registry registry;
  VllmMetrics m(registry, "m", 512);
  // Arrives at 10 s, first step at 11 s, first token at 13 s, last at 17 s,
  // finishes at 18 s; 10 prompt tokens, 5 output tokens.
  RequestTimeline t{.arrival_ns = 10 * kSecond,
                    .scheduled_ns = 11 * kSecond,
                    .first_token_ns = 13 * kSecond,
                    .last_token_ns = 17 * kSecond,
                    .max_tokens = 16};
  m.ObserveFirstTokens(t, t.first_token_ns, 10, 1);
  m.ObserveMoreTokens(1.0, 4);
  m.ObserveFinished(FinishReason::kLength, t, 18 * kSecond, 10, 5);
  const auto f = registry.Collect();
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_queue_time_seconds"), 1.0);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_prefill_time_seconds"), 2.0);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_decode_time_seconds"), 4.0);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_inference_time_seconds"), 6.0);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:e2e_request_latency_seconds"), 8.0);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:time_to_first_token_seconds"), 3.0);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:time_per_prefill_token_request_seconds"), 0.2);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_time_per_output_token_seconds"), 1.0);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_prompt_tokens"), 10);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_generation_tokens"), 5);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_max_num_generation_tokens"), 5);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_params_max_tokens"), 16);
  EXPECT_DOUBLE_EQ(Find(f, "vllm:prompt_tokens_total")->counter.value, 10);
  EXPECT_DOUBLE_EQ(Find(f, "vllm:generation_tokens_total")->counter.value, 5);
  EXPECT_EQ(HistogramCount(f, "vllm:inter_token_latency_seconds"), 1u);
  EXPECT_EQ(HistogramCount(f, "vllm:time_per_output_token_seconds"), 1u);
  EXPECT_DOUBLE_EQ(Success(f, "length"), 1);
  EXPECT_DOUBLE_EQ(Success(f, "stop"), 0);
  EXPECT_DOUBLE_EQ(Success(f, "abort"), 0);
}

// vLLM observes a request of one output token in the per-request time per
// output token too, as 0 (mean_time_per_output_token), so its _count is
// the finished requests'; it was left out.
TEST(VllmMetricsTest, AOneTokenRequestObservesZeroTimePerOutputToken) {
  prometheus::Registry registry;
  VllmMetrics m(registry, "m", 512);
  RequestTimeline t{.arrival_ns = kSecond,
                    .scheduled_ns = 2 * kSecond,
                    .first_token_ns = 3 * kSecond,
                    .last_token_ns = 3 * kSecond};
  m.ObserveFirstTokens(t, t.first_token_ns, 4, 1);
  m.ObserveFinished(FinishReason::kLength, t, 3 * kSecond, 4, 1);
  const auto f = registry.Collect();
  EXPECT_EQ(HistogramCount(f, "vllm:request_time_per_output_token_seconds"), 1u);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:request_time_per_output_token_seconds"), 0.0);
}

TEST(VllmMetricsTest, AnAbortWhileWaitingRecordsNoPhaseAndAnErrorNothing) {
  prometheus::Registry registry;
  VllmMetrics m(registry, "m", 512);
  m.ObserveFinished(FinishReason::kAbort, RequestTimeline{.arrival_ns = kSecond}, 3 * kSecond, 7,
                    0);
  m.ObserveFinished(FinishReason::kError,
                    RequestTimeline{.arrival_ns = kSecond, .scheduled_ns = 2 * kSecond},
                    3 * kSecond, 7, 0);
  const auto f = registry.Collect();
  EXPECT_DOUBLE_EQ(Success(f, "abort"), 1);
  EXPECT_EQ(HistogramCount(f, "vllm:e2e_request_latency_seconds"), 1u);
  EXPECT_DOUBLE_EQ(HistogramSum(f, "vllm:e2e_request_latency_seconds"), 2.0);
  EXPECT_EQ(HistogramCount(f, "vllm:request_queue_time_seconds"), 0u);
  EXPECT_EQ(HistogramCount(f, "vllm:request_prefill_time_seconds"), 0u);
  EXPECT_EQ(HistogramCount(f, "vllm:request_decode_time_seconds"), 0u);
}

TEST(VllmMetricsTest, GaugesAndMirroredCountersFromTheEngineStats) {
  prometheus::Registry registry;
  VllmMetrics m(registry, "m", 512);
  engine::EngineStats e;
  e.has_scheduler = true;
  e.num_running = 3;
  e.num_waiting = 2;
  e.scheduler.kv_cache_usage = 0.25;
  e.scheduler.prefix_cache_queries_tokens = 100;
  e.scheduler.prefix_cache_hits_tokens = 40;
  e.scheduler.num_preemptions_by_reason[static_cast<int>(sched::PreemptionReason::kKvCacheFull)] =
      2;
  e.num_worker_lost_preemptions = 1;
  m.Update(e);
  m.Update(e);  // cumulative: the same stats add nothing
  const auto f = registry.Collect();
  EXPECT_DOUBLE_EQ(Find(f, "vllm:num_requests_running")->gauge.value, 3);
  EXPECT_DOUBLE_EQ(Find(f, "vllm:num_requests_waiting")->gauge.value, 2);
  EXPECT_DOUBLE_EQ(Find(f, "vllm:kv_cache_usage_perc")->gauge.value, 0.25);
  EXPECT_DOUBLE_EQ(Find(f, "vllm:gpu_cache_usage_perc")->gauge.value, 0.25);
  EXPECT_DOUBLE_EQ(Find(f, "vllm:prefix_cache_queries_total")->counter.value, 100);
  EXPECT_DOUBLE_EQ(Find(f, "vllm:prefix_cache_hits_total")->counter.value, 40);
  EXPECT_DOUBLE_EQ(Find(f, "vllm:num_preemptions_total")->counter.value, 3);
}

// vllm:cache_config_info: one series, value 1, with vLLM's CacheConfig label
// names; a later worker's cache replaces the first one's series.
TEST(VllmMetricsTest, CacheConfigInfoDescribesTheConnectedWorkersCache) {
  prometheus::Registry registry;
  VllmMetrics m(registry, "m", 512);
  m.SetCacheConfig(16, 1000, true);
  m.SetCacheConfig(32, 70, false);
  const auto f = registry.Collect();
  const prometheus::MetricFamily* info = nullptr;
  for (const prometheus::MetricFamily& family : f) {
    if (family.name == "vllm:cache_config_info") info = &family;
  }
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->type, prometheus::MetricType::Gauge);
  ASSERT_EQ(info->metric.size(), 1u);
  EXPECT_EQ(info->metric[0].gauge.value, 1);
  std::map<std::string, std::string> labels;
  for (const prometheus::ClientMetric::Label& l : info->metric[0].label) labels[l.name] = l.value;
  EXPECT_EQ(labels, (std::map<std::string, std::string>{{"engine", "0"},
                                                        {"block_size", "32"},
                                                        {"num_gpu_blocks", "70"},
                                                        {"enable_prefix_caching", "False"},
                                                        {"cache_dtype", "auto"}}));
}

}  // namespace
}  // namespace tandem::scheduler
