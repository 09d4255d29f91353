// tandem-scheduler: the client API (tandem.v1.Generation) in front of one
// tandem-worker.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <iostream>
#include <optional>

#include "engine.h"
#include "generation_service.h"
#include "grpcpp/server_builder.h"
#include "tandem/common/clock.h"
#include "tandem/common/flags.h"
#include "tandem/common/logging.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/rpc/liveness_watchdog.h"
#include "tandem/rpc/service_main.h"
#include "tandem/rpc/tls_reload.h"

int main(int argc, char** argv) {
  tandem::rpc::ServiceMain boot("tandem-scheduler", "scheduler", "tandem.v1.Generation",
                                "127.0.0.1:50051");
  tandem::scheduler::EngineOptions engine_options;
  tandem::sched::SchedulerConfig& sc = engine_options.core.scheduler;
  tandem::scheduler::GenerationOptions generation_options;
  std::string policy = "fcfs";
  int32_t drain_timeout_s = 30;
  tandem::metrics::ExposerOptions metrics_options;

  tandem::FlagSet flags(
      "tandem-scheduler",
      "Serves tandem.v1.Generation: admits requests, batches them continuously and streams one "
      "step at a time to a tandem-worker. Block size, KV blocks, vocabulary and EOS come from the "
      "worker's Describe.");
  boot.AddServerFlags(&flags);
  flags.Add("worker", &engine_options.core.worker_address, "host:port of the tandem-worker");
  flags.Add("max-num-seqs", &sc.max_num_seqs, "most requests running at once");
  flags.Add("max-num-batched-tokens", &sc.max_num_batched_tokens, "token budget of one step");
  flags.Add("max-logprobs", &sc.max_logprobs,
            "most logprobs or prompt_logprobs a request may ask for (as vLLM)");
  flags.Add("max-model-len", &engine_options.core.max_model_len,
            "most prompt + output tokens per request; 0 = the model's context length");
  flags.Add("enable-prefix-caching", &sc.enable_prefix_caching,
            "reuse KV blocks of identical prompt prefixes");
  flags.Add("enable-chunked-prefill", &sc.enable_chunked_prefill,
            "split prompts over several steps when they do not fit the token budget");
  flags.Add("long-prefill-token-threshold", &sc.long_prefill_token_threshold,
            "cap on one prefill chunk per step; 0 = off");
  flags.Add("async-scheduling", &sc.async_scheduling,
            "schedule step N+1 before step N's output arrives (two steps in flight); "
            "false = plain schedule-execute-update");
  flags.Add("policy", &policy, "fcfs | priority (lower priority value first, preempted last)");
  flags.Alias("scheduling-policy", "policy");
  flags.Add("limit-async-load-admission", &sc.limit_async_load_admission,
            "a request whose prefix is being loaded from the KV-store counts against "
            "--max-num-seqs and the token budget of the step that admits the load (false: only "
            "the KV block reservation gates loads, as in vLLM)");
  flags.Add("max-step-failures", &sc.max_step_failures,
            "a request in this many failed worker steps ends with INTERNAL; before that each "
            "failure recomputes it");
  flags.Add("worker-loss-grace-s", &engine_options.core.worker_loss_grace_s,
            "when the worker is lost, live requests wait this long for a worker to serve again "
            "and resume where they stopped (same tokens; their KV recomputes); then they end "
            "with UNAVAILABLE. 0: they end at once");
  flags.Add("step-timeout-s", &engine_options.core.step_timeout_s,
            "a worker with steps in flight that answers none for this long is wedged: it is "
            "dropped as if its stream broke (its requests wait out --worker-loss-grace-s). "
            "0: never");
  flags.Add("max-waiting", &sc.max_waiting_requests,
            "waiting requests at most; beyond it Generate returns RESOURCE_EXHAUSTED");
  flags.Add("allow-request-cache-salt", &generation_options.allow_request_cache_salt,
            "accept GenerateRequest.cache_salt from clients (tenant isolation is then the "
            "client's word)");
  tandem::kvconnector::AddKvStoreFlags(&flags,
                                       "look prompt prefixes up there and load them instead of "
                                       "recomputing; computed blocks are stored",
                                       &engine_options.kvstore_target,
                                       &engine_options.kvstore_bulk_port);
  flags.Add("kvstore-lookup-deadline-ms", &engine_options.kvstore_lookup_deadline_ms,
            "a KV-store lookup unanswered after this long counts as a miss");
  flags.Add("served-model-name", &engine_options.core.served_model_name,
            "the model's name in GetModelInfo and the model_name label of every metric (empty: "
            "the name the worker describes; the metrics appear once it has)");
  bool disable_log_requests = false;
  flags.Add("disable-log-requests", &disable_log_requests,
            "no log line per finished or refused request (ids, token counts, latency)");
  flags.Add("metrics-listen", &metrics_options.listen_address,
            tandem::metrics::ExposerOptions::kListenHelp);
  std::string metrics_port_file;
  flags.Add("metrics-port-file", &metrics_port_file,
            "write the /metrics port here once it listens (before the gRPC port file; tandem "
            "serve reads it to serve these series on the API port too)");
  double liveness_stall_s = 60;
  flags.Add("liveness-stall-s", &liveness_stall_s,
            "tandem.liveness reads NOT_SERVING while the engine loop has not gone round for this "
            "long (a stuck scheduler; the kubelet then restarts it); 0: off");
  flags.Add("drain-timeout-s", &drain_timeout_s,
            "on SIGTERM/SIGINT, how long accepted requests may take to finish");
  flags.Add("debug-submit-delay-ms", &engine_options.debug_submit_delay_ms,
            "TESTS ONLY: the engine sleeps this long before taking each new request (holds "
            "accepted calls in its queue; 0: off)");
  flags.MirrorsVllm({"max-num-seqs", "max-num-batched-tokens", "max-model-len", "max-logprobs",
                     "enable-prefix-caching", "enable-chunked-prefill",
                     "long-prefill-token-threshold", "async-scheduling", "scheduling-policy",
                     "served-model-name", "disable-log-requests"});
  flags.ParseOrExit(argc, argv);
  engine_options.log_requests = !disable_log_requests;
  // Sets the client TLS too: to the worker and the KV-store.
  if (absl::Status s = boot.Validate(); !s.ok()) return boot.Fail(s);
  if (policy == "fcfs") {
    sc.policy = tandem::sched::SchedulingPolicy::kFcfs;
  } else if (policy == "priority") {
    sc.policy = tandem::sched::SchedulingPolicy::kPriority;
  } else {
    return boot.Fail("--policy must be fcfs or priority, got '" + policy + "'");
  }
  if (drain_timeout_s < 0) {
    return boot.Fail("--drain-timeout-s must be >= 0, got " + std::to_string(drain_timeout_s));
  }
  if (liveness_stall_s != 0 && !(liveness_stall_s >= 1)) {
    return boot.Fail("--liveness-stall-s must be 0 (off) or >= 1, got " +
                     std::to_string(liveness_stall_s));
  }
  if (absl::Status s = engine_options.Validate(); !s.ok()) return boot.Fail(s);

  auto registry = std::make_shared<prometheus::Registry>();
  tandem::rpc::RegisterTlsMetrics(registry);  // the --tls-* reloads
  auto exposer = tandem::metrics::MetricsServer::Start(metrics_options, registry);
  if (!exposer.ok()) return boot.Fail(exposer.status(), 1);
  if (*exposer != nullptr) TANDEM_LOG(INFO) << "metrics on " << (*exposer)->url();
  if (!metrics_port_file.empty()) {
    if (*exposer == nullptr) return boot.Fail("--metrics-port-file needs --metrics-listen");
    if (absl::Status s = tandem::rpc::WritePortFile(metrics_port_file, (*exposer)->port());
        !s.ok()) {
      return boot.Fail(s, 1);
    }
  }
  tandem::scheduler::Engine engine(engine_options, registry.get());
  tandem::scheduler::GenerationService service(&engine, generation_options);
  // A Generate message holds at most max_model_len prompt tokens (at most 5
  // bytes each) and a few short fields; gRPC refuses anything bigger before
  // parsing it (57 MB messages once peaked at 764 MB here). Without
  // --max-model-len the worker's is not known yet: 8 MiB, 1.6M tokens.
  boot.options().max_receive_message_bytes = static_cast<int32_t>(
      engine_options.core.max_model_len > 0
          ? std::min<int64_t>(5LL * engine_options.core.max_model_len + (1 << 20), INT32_MAX)
          : 8 << 20);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  // Live (for the liveness and startup probes) whether a worker serves or not.
  if (absl::Status s = boot.Serve(&builder); !s.ok()) return boot.Fail(s, 1);
  grpc::Server* srv = boot.server();
  engine.set_on_serving_changed([&boot](bool serving) { boot.SetServing(serving); });
  if (engine_options.debug_submit_delay_ms > 0) {
    TANDEM_LOG(WARNING) << "TEST-ONLY --debug-submit-delay-ms="
                        << engine_options.debug_submit_delay_ms << " is on";
  }
  engine.Start();
  // The engine loop goes round at least every Engine::kIdleHeartbeat, so a
  // longer silence is a stall.
  std::optional<tandem::rpc::LivenessWatchdog> watchdog;
  watchdog.emplace(
      srv, [&] { return (tandem::MonotonicNanos() - engine.last_loop_ns()) * 1e-9; },
      liveness_stall_s, "engine loop");
  TANDEM_LOG(INFO) << "listening on port " << boot.port() << "; worker "
                   << engine_options.core.worker_address;

  boot.WaitForShutdown("draining (new calls get UNAVAILABLE)");
  engine.SetDraining();
  // Every call accepted before SetDraining() counts here until the engine
  // has finished it, including those it has not taken from its queue yet.
  tandem::rpc::ServiceMain::Drain([&] { return engine.num_calls_open(); },
                                  std::chrono::seconds(drain_timeout_s),
                                  "calls fail with UNAVAILABLE");
  // Finished calls were given their last message; Shutdown waits for their
  // writes briefly, then cancels.
  watchdog.reset();
  engine.Stop();
  boot.Shutdown(std::chrono::milliseconds(500));
  TANDEM_LOG(INFO) << "stopped";
  return 0;
}
