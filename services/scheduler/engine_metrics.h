// The scheduler service's Prometheus series (DESIGN §7): what they are
// called, their help text, labels and buckets, and how the engine core's
// stats map onto them. The engine owns one EngineMetrics and updates it on
// its loop thread.
#pragma once

#include <string>
#include <vector>

#include "tandem/engine/engine_core.h"
#include "tandem/metrics/metrics.h"

namespace tandem::scheduler {

// Prometheus series of the engine (DESIGN §7); updated on the loop thread.
// Every series carries model_name (vLLM's label): --served-model-name, or
// else the model name the first worker describes (no series before it).
// Latency histograms use vLLM's buckets.
struct SeriesMaker;
struct EngineMetrics {
  EngineMetrics(prometheus::Registry& registry, const std::string& model_name);
  explicit EngineMetrics(SeriesMaker maker);

  // Sets the gauges and mirrored counters from the core's stats.
  void Update(const engine::EngineStats& e);

  prometheus::Gauge& num_requests_running;
  prometheus::Gauge& num_requests_waiting;
  // Waiting requests by reason: capacity, lookup, load.
  prometheus::Gauge* num_requests_waiting_by_reason[3];
  prometheus::Gauge& kv_cache_usage;
  prometheus::Gauge& kv_blocks_free;
  prometheus::Gauge& worker_connected;
  prometheus::Gauge& num_steps_in_flight;
  prometheus::Gauge& num_async_loads_in_flight;
  prometheus::Gauge& num_lookups_pending;
  std::vector<metrics::MirroredCounter> preemptions;              // by sched::PreemptionReason
  std::vector<metrics::MirroredCounter> admission_blocked_steps;  // by sched::AdmissionLimit
  metrics::MirroredCounter requests_admitted;
  metrics::MirroredCounter recomputed_tokens;
  metrics::MirroredCounter prefix_cache_queries;
  metrics::MirroredCounter prefix_cache_hits;
  metrics::MirroredCounter external_cache_queries;
  metrics::MirroredCounter external_cache_hits;
  metrics::MirroredCounter steps;
  prometheus::Family<prometheus::Counter>& requests_finished;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Histogram& request_latency;
  prometheus::Histogram& time_to_first_token;
  // The gap between successive outputs of a request (one per step that
  // streamed tokens), and per request (latency - TTFT) / (outputs - 1).
  prometheus::Histogram& inter_token_latency;
  prometheus::Histogram& time_per_output_token;
  prometheus::Histogram& schedule_duration;   // one Schedule() call
  prometheus::Histogram& output_duration;     // one worker output, its tokens streamed
  prometheus::Histogram& kv_lookup_duration;  // one KV-store lookup
};

}  // namespace tandem::scheduler
