// vLLM's own Prometheus series, served by the scheduler beside its tandem_*
// series (issue 33), so that what reads a vLLM pod's /metrics directly (the
// production-stack router's vllm:num_requests_waiting, vLLM's Grafana
// dashboard) reads a Tandem scheduler unchanged.
//
// Names, types, help, labels (model_name, engine="0"; finished_reason on
// vllm:request_success_total) and buckets are those of vLLM's
// PrometheusStatLogger (vllm/v1/metrics/loggers.py); prometheus-cpp adds no
// `_total`, so counters carry it in their name. The request-phase times
// follow vLLM's RequestStateStats: queued = first step sent - arrival,
// prefill = first token - first step sent, decode = last token - first
// token, inference = last token - first step sent, e2e = finish - arrival
// (arrival at the scheduler; vLLM's at its API server).
//
// vllm:cache_config_info is vLLM's info gauge (value 1) with the labels of
// its CacheConfig.metrics_info() that the scheduler knows exactly: engine,
// block_size, num_gpu_blocks (the worker's KV cache), enable_prefix_caching
// (Python's "True"/"False") and cache_dtype "auto" (the cache always has the
// model's dtype). vLLM's other CacheConfig fields (gpu_memory_utilization,
// swap_space, ...) belong to the worker or do not exist here and are left
// out rather than guessed.
//
// Not served, because the scheduler cannot know them exactly:
// vllm:request_params_n (the frontend fans `n` out into n requests; the
// frontend serves it), vllm:lora_requests_info and the speculative decoding
// series (no such configuration here). A request that ends in an
// error (tandem_scheduler_requests_finished_total{reason="error"}) is not a
// vLLM finish reason and is not counted in vllm:request_success_total.
// tests/integration/vllm_metrics.json is the list this is checked against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/engine/engine_core.h"
#include "tandem/metrics/metrics.h"

namespace tandem::scheduler {

// One request's timeline on the engine thread, in MonotonicNanos (0: not
// reached).
struct RequestTimeline {
  int64_t arrival_ns = 0;
  int64_t scheduled_ns = 0;  // its first step was sent to the worker
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;
  int32_t max_tokens = 0;  // the request's max_tokens (0: none given)
};

// vLLM's 1-2-5 buckets up to max_value (build_1_2_5_buckets): 1, 2, 5, 10,
// 20, 50, ... while <= max_value.
prometheus::Histogram::BucketBoundaries OneTwoFiveBuckets(int64_t max_value);

struct VllmFamilies;
class VllmMetrics {
 public:
  // The token-count histograms' buckets end at max_model_len, as vLLM's.
  VllmMetrics(prometheus::Registry& registry, const std::string& model_name, int32_t max_model_len);

  // vllm:cache_config_info for the worker now connected (a later worker may
  // bring another cache size: the old series goes).
  void SetCacheConfig(int32_t block_size, int32_t num_gpu_blocks, bool enable_prefix_caching);
  // Gauges and the counters mirrored from the core's cumulative stats.
  void Update(const engine::EngineStats& e);
  // One step sent to the worker with `num_tokens` tokens to compute.
  void ObserveStep(int32_t num_tokens);
  // A request's first output tokens (`num_tokens` of them) at `now_ns`.
  void ObserveFirstTokens(const RequestTimeline& t, int64_t now_ns, int32_t num_prompt_tokens,
                          size_t num_tokens);
  // Later output tokens, `gap_s` after the request's previous ones.
  void ObserveMoreTokens(double gap_s, size_t num_tokens);
  // A request finished (stop, length or abort; an error is not counted).
  void ObserveFinished(FinishReason reason, const RequestTimeline& t, int64_t now_ns,
                       int32_t num_prompt_tokens, int32_t num_output_tokens);

 private:
  VllmMetrics(VllmFamilies families, int32_t max_model_len);

  prometheus::Family<prometheus::Gauge>& cache_config_info_;
  prometheus::Gauge* cache_config_ = nullptr;  // the connected worker's series
  prometheus::Gauge& num_requests_running_;
  prometheus::Gauge& num_requests_waiting_;
  prometheus::Gauge& gpu_cache_usage_perc_;
  prometheus::Gauge& kv_cache_usage_perc_;
  metrics::MirroredCounter gpu_prefix_cache_queries_;
  metrics::MirroredCounter gpu_prefix_cache_hits_;
  metrics::MirroredCounter prefix_cache_queries_;
  metrics::MirroredCounter prefix_cache_hits_;
  metrics::MirroredCounter num_preemptions_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Counter* request_success_[3];  // stop, length, abort
  prometheus::Histogram& request_prompt_tokens_;
  prometheus::Histogram& request_generation_tokens_;
  prometheus::Histogram& iteration_tokens_;
  prometheus::Histogram& request_max_num_generation_tokens_;
  prometheus::Histogram& request_params_max_tokens_;
  prometheus::Histogram& time_to_first_token_;
  prometheus::Histogram& time_per_output_token_;
  prometheus::Histogram& inter_token_latency_;
  prometheus::Histogram& request_time_per_output_token_;
  prometheus::Histogram& time_per_prefill_token_request_;
  prometheus::Histogram& e2e_request_latency_;
  prometheus::Histogram& request_queue_time_;
  prometheus::Histogram& request_inference_time_;
  prometheus::Histogram& request_prefill_time_;
  prometheus::Histogram& request_decode_time_;
};

}  // namespace tandem::scheduler
