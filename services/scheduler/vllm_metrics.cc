#include "vllm_metrics.h"

#include <map>

namespace tandem::scheduler {

using Labels = std::map<std::string, std::string>;

// The model's series of one vLLM family, labelled as vLLM labels them.
struct VllmFamilies {
  prometheus::Registry& r;
  Labels labels;  // model_name, engine

  prometheus::Gauge& Gauge(const std::string& name, const std::string& help) {
    return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
  }
  prometheus::Counter& Counter(const std::string& name, const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
  }
  prometheus::Histogram& Histogram(const std::string& name, const std::string& help,
                                   const prometheus::Histogram::BucketBoundaries& buckets) {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add(labels, buckets);
  }
};

namespace {

double Seconds(int64_t from_ns, int64_t to_ns) { return (to_ns - from_ns) * 1e-9; }

}  // namespace

prometheus::Histogram::BucketBoundaries OneTwoFiveBuckets(int64_t max_value) {
  prometheus::Histogram::BucketBoundaries out;
  for (int64_t scale = 1;; scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > max_value) return out;
      out.push_back(static_cast<double>(m * scale));
    }
  }
}

VllmMetrics::VllmMetrics(prometheus::Registry& registry, const std::string& model_name,
                         int32_t max_model_len)
    : VllmMetrics(VllmFamilies{registry, {{"model_name", model_name}, {"engine", "0"}}},
                  max_model_len) {}

VllmMetrics::VllmMetrics(VllmFamilies f, int32_t max_model_len)
    : cache_config_info_(prometheus::BuildGauge()
                             .Name("vllm:cache_config_info")
                             .Help("Information of the LLMEngine CacheConfig")
                             .Register(f.r)),
      num_requests_running_(
          f.Gauge("vllm:num_requests_running", "Number of requests in model execution batches.")),
      num_requests_waiting_(
          f.Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")),
      gpu_cache_usage_perc_(f.Gauge("vllm:gpu_cache_usage_perc",
                                    "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: "
                                    "Use vllm:kv_cache_usage_perc instead.")),
      kv_cache_usage_perc_(
          f.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")),
      gpu_prefix_cache_queries_(&f.Counter(
          "vllm:gpu_prefix_cache_queries_total",
          "GPU prefix cache queries, in terms of number of queried tokens. DEPRECATED: Use "
          "vllm:prefix_cache_queries instead.")),
      gpu_prefix_cache_hits_(
          &f.Counter("vllm:gpu_prefix_cache_hits_total",
                     "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use "
                     "vllm:prefix_cache_hits instead.")),
      prefix_cache_queries_(
          &f.Counter("vllm:prefix_cache_queries_total",
                     "Prefix cache queries, in terms of number of queried tokens.")),
      prefix_cache_hits_(&f.Counter("vllm:prefix_cache_hits_total",
                                    "Prefix cache hits, in terms of number of cached tokens.")),
      num_preemptions_(&f.Counter("vllm:num_preemptions_total",
                                  "Cumulative number of preemption from the engine.")),
      prompt_tokens_(f.Counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")),
      generation_tokens_(
          f.Counter("vllm:generation_tokens_total", "Number of generation tokens processed.")),
      request_success_{},
      request_prompt_tokens_(f.Histogram("vllm:request_prompt_tokens",
                                         "Number of prefill tokens processed.",
                                         OneTwoFiveBuckets(max_model_len))),
      request_generation_tokens_(f.Histogram("vllm:request_generation_tokens",
                                             "Number of generation tokens processed.",
                                             OneTwoFiveBuckets(max_model_len))),
      iteration_tokens_(f.Histogram(
          "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
          {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384})),
      request_max_num_generation_tokens_(
          f.Histogram("vllm:request_max_num_generation_tokens",
                      "Histogram of maximum number of requested generation tokens.",
                      OneTwoFiveBuckets(max_model_len))),
      request_params_max_tokens_(f.Histogram("vllm:request_params_max_tokens",
                                             "Histogram of the max_tokens request parameter.",
                                             OneTwoFiveBuckets(max_model_len))),
      time_to_first_token_(f.Histogram("vllm:time_to_first_token_seconds",
                                       "Histogram of time to first token in seconds.",
                                       metrics::TimeToFirstTokenBuckets())),
      time_per_output_token_(
          f.Histogram("vllm:time_per_output_token_seconds",
                      "Histogram of time per output token in seconds. DEPRECATED: Use "
                      "vllm:inter_token_latency_seconds instead.",
                      metrics::InterTokenLatencyBuckets())),
      inter_token_latency_(f.Histogram("vllm:inter_token_latency_seconds",
                                       "Histogram of inter-token latency in seconds.",
                                       metrics::InterTokenLatencyBuckets())),
      request_time_per_output_token_(
          f.Histogram("vllm:request_time_per_output_token_seconds",
                      "Histogram of time_per_output_token_seconds per request.",
                      metrics::InterTokenLatencyBuckets())),
      time_per_prefill_token_request_(
          f.Histogram("vllm:time_per_prefill_token_request_seconds",
                      "Time spent per token during prefill  phase in seconds",
                      {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0})),
      e2e_request_latency_(f.Histogram("vllm:e2e_request_latency_seconds",
                                       "Histogram of e2e request latency in seconds.",
                                       metrics::RequestLatencyBuckets())),
      request_queue_time_(f.Histogram("vllm:request_queue_time_seconds",
                                      "Histogram of time spent in WAITING phase for request.",
                                      metrics::RequestLatencyBuckets())),
      request_inference_time_(f.Histogram("vllm:request_inference_time_seconds",
                                          "Histogram of time spent in RUNNING phase for request.",
                                          metrics::RequestLatencyBuckets())),
      request_prefill_time_(f.Histogram("vllm:request_prefill_time_seconds",
                                        "Histogram of time spent in PREFILL phase for request.",
                                        metrics::RequestLatencyBuckets())),
      request_decode_time_(f.Histogram("vllm:request_decode_time_seconds",
                                       "Histogram of time spent in DECODE phase for request.",
                                       metrics::RequestLatencyBuckets())) {
  auto& success = prometheus::BuildCounter()
                      .Name("vllm:request_success_total")
                      .Help("Count of successfully processed requests.")
                      .Register(f.r);
  const char* kReasons[] = {"stop", "length", "abort"};
  for (int i = 0; i < 3; ++i) {
    Labels labels = f.labels;
    labels["finished_reason"] = kReasons[i];
    request_success_[i] = &success.Add(labels);
  }
}

void VllmMetrics::SetCacheConfig(int32_t block_size, int32_t num_gpu_blocks,
                                 bool enable_prefix_caching) {
  if (cache_config_ != nullptr) cache_config_info_.Remove(cache_config_);
  cache_config_ =
      &cache_config_info_.Add({{"engine", "0"},
                               {"block_size", std::to_string(block_size)},
                               {"num_gpu_blocks", std::to_string(num_gpu_blocks)},
                               {"enable_prefix_caching", enable_prefix_caching ? "True" : "False"},
                               {"cache_dtype", "auto"}});
  cache_config_->Set(1);
}

void VllmMetrics::Update(const engine::EngineStats& e) {
  num_requests_running_.Set(e.num_running);
  num_requests_waiting_.Set(e.num_waiting);
  const double usage = e.has_scheduler ? e.scheduler.kv_cache_usage : 0.0;
  gpu_cache_usage_perc_.Set(usage);
  kv_cache_usage_perc_.Set(usage);
  if (!e.has_scheduler) return;
  const sched::SchedulerStats& st = e.scheduler;
  gpu_prefix_cache_queries_.Set(st.prefix_cache_queries_tokens);
  gpu_prefix_cache_hits_.Set(st.prefix_cache_hits_tokens);
  prefix_cache_queries_.Set(st.prefix_cache_queries_tokens);
  prefix_cache_hits_.Set(st.prefix_cache_hits_tokens);
  // The scheduler is rebuilt after a worker loss: the core counts those.
  uint64_t preemptions = e.num_worker_lost_preemptions;
  for (int i = 0; i < sched::kNumPreemptionReasons; ++i) {
    if (i != static_cast<int>(sched::PreemptionReason::kWorkerLost)) {
      preemptions += st.num_preemptions_by_reason[i];
    }
  }
  num_preemptions_.Set(preemptions);
}

void VllmMetrics::ObserveStep(int32_t num_tokens) { iteration_tokens_.Observe(num_tokens); }

void VllmMetrics::ObserveFirstTokens(const RequestTimeline& t, int64_t now_ns,
                                     int32_t num_prompt_tokens, size_t num_tokens) {
  prompt_tokens_.Increment(num_prompt_tokens);
  generation_tokens_.Increment(static_cast<double>(num_tokens));
  time_to_first_token_.Observe(Seconds(t.arrival_ns, now_ns));
}

void VllmMetrics::ObserveMoreTokens(double gap_s, size_t num_tokens) {
  generation_tokens_.Increment(static_cast<double>(num_tokens));
  time_per_output_token_.Observe(gap_s);
  inter_token_latency_.Observe(gap_s);
}

void VllmMetrics::ObserveFinished(FinishReason reason, const RequestTimeline& t, int64_t now_ns,
                                  int32_t num_prompt_tokens, int32_t num_output_tokens) {
  int index = -1;
  switch (reason) {
    case FinishReason::kStop:
      index = 0;
      break;
    case FinishReason::kLength:
      index = 1;
      break;
    case FinishReason::kAbort:
      index = 2;
      break;
    case FinishReason::kError:
    case FinishReason::kNone:
      return;
  }
  request_success_[index]->Increment();
  e2e_request_latency_.Observe(Seconds(t.arrival_ns, now_ns));
  request_prompt_tokens_.Observe(num_prompt_tokens);
  request_generation_tokens_.Observe(num_output_tokens);
  // n is 1 per scheduler request: the group's max is the request's own count.
  request_max_num_generation_tokens_.Observe(num_output_tokens);
  if (t.max_tokens > 0) request_params_max_tokens_.Observe(t.max_tokens);
  if (t.scheduled_ns == 0) return;  // aborted while waiting: no phase ran
  request_queue_time_.Observe(Seconds(t.arrival_ns, t.scheduled_ns));
  if (t.first_token_ns == 0) return;
  const double prefill_s = Seconds(t.scheduled_ns, t.first_token_ns);
  request_prefill_time_.Observe(prefill_s);
  if (num_prompt_tokens > 0) time_per_prefill_token_request_.Observe(prefill_s / num_prompt_tokens);
  request_inference_time_.Observe(Seconds(t.scheduled_ns, t.last_token_ns));
  request_decode_time_.Observe(Seconds(t.first_token_ns, t.last_token_ns));
  // vLLM observes 0 for a request of one output token.
  request_time_per_output_token_.Observe(
      num_output_tokens > 1 ? Seconds(t.first_token_ns, t.last_token_ns) / (num_output_tokens - 1)
                            : 0.0);
}

}  // namespace tandem::scheduler
