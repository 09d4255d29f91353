#include "engine_metrics.h"

#include <map>

#include "tandem/sched/scheduler.h"

namespace tandem::scheduler {

// Single-series families labelled with the model, and labelled children.
struct SeriesMaker {
  prometheus::Registry& r;
  std::map<std::string, std::string> labels;

  prometheus::Gauge& Gauge(const std::string& name, const std::string& help) {
    return prometheus::BuildGauge().Name(name).Help(help).Labels(labels).Register(r).Add({});
  }
  prometheus::Counter& Counter(const std::string& name, const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(r).Add({});
  }
  prometheus::Histogram& Histogram(const std::string& name, const std::string& help,
                                   const prometheus::Histogram::BucketBoundaries& buckets) {
    return prometheus::BuildHistogram().Name(name).Help(help).Labels(labels).Register(r).Add(
        {}, buckets);
  }
  // One counter per value of `label`, mirrored from cumulative values.
  template <typename NameOf>
  std::vector<metrics::MirroredCounter> Mirrored(const std::string& name, const std::string& help,
                                                 const std::string& label, int n, NameOf name_of) {
    auto& family = prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(r);
    std::vector<metrics::MirroredCounter> out;
    for (int i = 0; i < n; ++i) out.emplace_back(&family.Add({{label, name_of(i)}}));
    return out;
  }
};

namespace {

// Schedule() takes microseconds: 10 us .. 250 ms.
prometheus::Histogram::BucketBoundaries ScheduleBuckets() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.25};
}

}  // namespace

EngineMetrics::EngineMetrics(prometheus::Registry& r, const std::string& model_name)
    : EngineMetrics(SeriesMaker{r, {{"model_name", model_name}}}) {}

EngineMetrics::EngineMetrics(SeriesMaker m)
    : num_requests_running(m.Gauge("tandem_scheduler_num_requests_running",
                                   "Requests running (scheduled in steps).")),
      num_requests_waiting(
          m.Gauge("tandem_scheduler_num_requests_waiting", "Requests waiting for admission.")),
      num_requests_waiting_by_reason{},
      kv_cache_usage(
          m.Gauge("tandem_scheduler_kv_cache_usage_ratio", "Fraction of KV blocks in use (0-1).")),
      kv_blocks_free(m.Gauge("tandem_scheduler_kv_blocks_free",
                             "Free KV blocks (cached-but-unused blocks count as free).")),
      worker_connected(m.Gauge("tandem_scheduler_worker_connected",
                               "1 while a worker is connected and serving.")),
      num_steps_in_flight(m.Gauge("tandem_scheduler_num_steps_in_flight",
                                  "Steps sent to the worker whose output has not arrived.")),
      num_async_loads_in_flight(
          m.Gauge("tandem_scheduler_num_async_loads_in_flight",
                  "Requests whose prompt prefix is being loaded from the KV-store.")),
      num_lookups_pending(m.Gauge("tandem_scheduler_num_lookups_pending",
                                  "KV-store lookups sent and not yet answered.")),
      preemptions(m.Mirrored(
          "tandem_scheduler_preemptions_total", "Requests preempted for recompute, by cause.",
          "cause", sched::kNumPreemptionReasons,
          [](int i) {
            return sched::PreemptionReasonName(static_cast<sched::PreemptionReason>(i));
          })),
      admission_blocked_steps(m.Mirrored(
          "tandem_scheduler_admission_blocked_steps_total",
          "Steps in which admission stopped with requests waiting, by the limit that stopped it.",
          "limit", sched::kNumAdmissionLimits,
          [](int i) { return sched::AdmissionLimitName(static_cast<sched::AdmissionLimit>(i)); })),
      requests_admitted(&m.Counter(
          "tandem_scheduler_requests_admitted_total",
          "Waiting requests that started running (new, resumed, or after their KV load).")),
      recomputed_tokens(&m.Counter("tandem_scheduler_recomputed_tokens_total",
                                   "Computed tokens that preemptions threw away.")),
      prefix_cache_queries(&m.Counter("tandem_scheduler_prefix_cache_queries_tokens_total",
                                      "Prompt tokens looked up in the local prefix cache.")),
      prefix_cache_hits(&m.Counter("tandem_scheduler_prefix_cache_hits_tokens_total",
                                   "Prompt tokens found in the local prefix cache.")),
      external_cache_queries(&m.Counter("tandem_scheduler_external_cache_queries_tokens_total",
                                        "Tokens looked up in the external KV-store.")),
      external_cache_hits(&m.Counter("tandem_scheduler_external_cache_hits_tokens_total",
                                     "Tokens found in the external KV-store.")),
      steps(&m.Counter("tandem_scheduler_steps_total", "Steps scheduled.")),
      requests_finished(prometheus::BuildCounter()
                            .Name("tandem_scheduler_requests_finished_total")
                            .Help("Requests finished, by reason (stop, length, abort, error).")
                            .Labels(m.labels)
                            .Register(m.r)),
      prompt_tokens(
          m.Counter("tandem_scheduler_prompt_tokens_total", "Prompt tokens of finished requests.")),
      generation_tokens(m.Counter("tandem_scheduler_generation_tokens_total",
                                  "Output tokens streamed to clients.")),
      request_latency(m.Histogram("tandem_scheduler_request_latency_seconds",
                                  "Time from arrival to the end of a request.",
                                  metrics::RequestLatencyBuckets())),
      time_to_first_token(m.Histogram("tandem_scheduler_time_to_first_token_seconds",
                                      "Time from arrival to the first output token.",
                                      metrics::TimeToFirstTokenBuckets())),
      inter_token_latency(m.Histogram("tandem_scheduler_inter_token_latency_seconds",
                                      "Time between successive outputs of a request.",
                                      metrics::InterTokenLatencyBuckets())),
      time_per_output_token(
          m.Histogram("tandem_scheduler_time_per_output_token_seconds",
                      "Per request: (latency - time to first token) / (output tokens - 1).",
                      metrics::InterTokenLatencyBuckets())),
      schedule_duration(m.Histogram("tandem_scheduler_schedule_duration_seconds",
                                    "Time one Schedule() call takes.", ScheduleBuckets())),
      output_duration(m.Histogram("tandem_scheduler_output_duration_seconds",
                                  "Time the engine loop spends on one worker output: updating "
                                  "its requests and handing their tokens to the callers' streams.",
                                  ScheduleBuckets())),
      kv_lookup_duration(m.Histogram("tandem_scheduler_kv_lookup_duration_seconds",
                                     "KV-store lookup latency (sent to answered or given up).",
                                     metrics::LatencyBuckets())) {
  static const char* kWaitingReasons[] = {"capacity", "lookup", "load"};
  auto& by_reason = prometheus::BuildGauge()
                        .Name("tandem_scheduler_num_requests_waiting_by_reason")
                        .Help(
                            "Waiting requests by what they wait for: capacity (budgets, "
                            "blocks or queue order), lookup (a KV-store lookup), load (a "
                            "KV-store load).")
                        .Labels(m.labels)
                        .Register(m.r);
  for (int i = 0; i < 3; ++i) {
    num_requests_waiting_by_reason[i] = &by_reason.Add({{"reason", kWaitingReasons[i]}});
  }
}

void EngineMetrics::Update(const engine::EngineStats& e) {
  num_requests_running.Set(e.num_running);
  num_requests_waiting.Set(e.num_waiting);
  kv_blocks_free.Set(e.num_free_blocks);
  kv_cache_usage.Set(e.has_scheduler ? e.scheduler.kv_cache_usage : 0.0);
  worker_connected.Set(e.worker_connected ? 1 : 0);
  num_steps_in_flight.Set(e.num_steps_in_flight);
  num_async_loads_in_flight.Set(e.scheduler.num_waiting_for_load);
  num_lookups_pending.Set(e.kv_connector.lookups_pending);
  if (e.has_scheduler) {
    const sched::SchedulerStats& st = e.scheduler;
    num_requests_waiting_by_reason[0]->Set(st.num_waiting_for_capacity);
    num_requests_waiting_by_reason[1]->Set(st.num_waiting_for_lookup);
    num_requests_waiting_by_reason[2]->Set(st.num_waiting_for_load);
    for (int i = 0; i < sched::kNumPreemptionReasons; ++i) {
      // The scheduler is rebuilt after a worker loss: the core counts those.
      preemptions[i].Set(i == static_cast<int>(sched::PreemptionReason::kWorkerLost)
                             ? e.num_worker_lost_preemptions
                             : st.num_preemptions_by_reason[i]);
    }
    for (int i = 0; i < sched::kNumAdmissionLimits; ++i) {
      admission_blocked_steps[i].Set(st.num_admission_blocked_steps[i]);
    }
    requests_admitted.Set(st.num_requests_admitted);
    recomputed_tokens.Set(st.num_recomputed_tokens);
    prefix_cache_queries.Set(st.prefix_cache_queries_tokens);
    prefix_cache_hits.Set(st.prefix_cache_hits_tokens);
    external_cache_queries.Set(st.external_cache_queries_tokens);
    external_cache_hits.Set(st.external_cache_hits_tokens);
    steps.Set(st.num_steps);
  }
}

}  // namespace tandem::scheduler
