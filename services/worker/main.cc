// tandem-worker: loads a model and executes the scheduler's steps.
#include <chrono>
#include <iostream>
#include <optional>
#include <thread>

#include "grpcpp/server_builder.h"
#include "tandem/common/flags.h"
#include "tandem/common/logging.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/rpc/liveness_watchdog.h"
#include "tandem/rpc/service_main.h"
#include "tandem/rpc/tls_reload.h"
#include "worker_service.h"

int main(int argc, char** argv) {
  tandem::rpc::ServiceMain boot("tandem-worker", "worker", "tandem.v1.Worker", "127.0.0.1:50061");
  tandem::worker::WorkerOptions options{.model_path = "../shared/models/stories260K.bin"};
  tandem::FlagSet flags("tandem-worker",
                        "Loads a model, owns its paged KV cache and executes the steps a "
                        "tandem-scheduler streams to it (tandem.v1.Worker).");
  boot.AddServerFlags(&flags);
  flags.Add("model", &options.model_path, "llama2.c .bin checkpoint or Hugging Face directory");
  flags.Add("tokenizer", &options.tokenizer_path,
            "the model's tokenizer (tokenizer.bin, tokenizer.model, tokenizer.json or a directory "
            "holding one), for structured outputs; default: --model's directory when it holds "
            "one (a llama2.c checkpoint has none: without it, no json_schema is served)");
  flags.Add("grammar-mask-cache-mib", &options.grammar_mask_cache_mib,
            "structured outputs: MiB of token masks kept by grammar state and reused by every "
            "request that reaches the state again (a mask is the vocabulary's size / 8 bytes; "
            "0: none kept)");
  flags.Add("backend", &options.backend, "cpu | cuda (error without a device) | sim (no math)");
  flags.Add("block-size", &options.block_size, "tokens per KV block");
  flags.Add("num-blocks", &options.num_blocks, "KV blocks to allocate; 0 = from --kv-cache-bytes");
  flags.Add("kv-cache-bytes", &options.kv_cache_bytes,
            "KV cache memory budget in bytes, used when --num-blocks is 0; 0 = cuda: from "
            "--gpu-memory-utilization, cpu/sim: min(4 GiB, a quarter of physical memory)");
  flags.Add("gpu-memory-utilization", &options.gpu_memory_utilization,
            "[vLLM] fraction of the GPU's memory this worker may use, in (0, 1]; 0 = 0.9: the "
            "KV cache gets what the weights and step buffers leave of it (--backend=cuda "
            "without --num-blocks or --kv-cache-bytes; refused otherwise)");
  flags.Add("threads", &options.num_threads, "CPU threads of the cpu backend");
  flags.Add("dtype", &options.dtype,
            "[vLLM] auto | float32 | bfloat16: KV cache and (cuda) weight dtype. auto: bfloat16 "
            "for a bfloat16 checkpoint on --backend=cuda (fast kernels), else float32 (the "
            "checkpoint's values exactly; the cpu backend's); float16/half: refused (no float16 "
            "path)");
  flags.Add("device", &options.device, "CUDA device ordinal of the cuda backend");
  flags.Add("enforce-eager", &options.enforce_eager,
            "run every step eagerly: no CUDA graphs for decode steps (cuda bfloat16 "
            "otherwise replays graphs captured per batch-size bucket, up to 256 sequences)");
  flags.Add("overlap-steps", &options.overlap_steps,
            "prepare each step (its batch diff, inputs and sampling plan) while the step "
            "before runs on the device; --overlap-steps=false prepares it after (to measure "
            "the gain)");
  flags.Add("cuda-async-launch", &options.cuda_async_launch,
            "--backend=cuda: a step returns once enqueued and its token ids come back by an "
            "asynchronous copy, so that the next step is prepared while the GPU runs this one "
            "(off until it has run on a GPU)");
  flags.Add("disable-sliding-window", &options.disable_sliding_window,
            "serve a model whose attention slides (Mistral, Phi-3, Qwen) without the "
            "window, its context capped at the window, where sliding changes nothing");
  flags.Add("max-model-len", &options.max_model_len,
            "[vLLM] the longest context this worker serves and describes to the scheduler "
            "(0: the model's; more is refused at load). A longrope model (Phi-3.5, "
            "Phi-3-*-128k, Phi-4-mini) is capped at original_max_position_embeddings with its "
            "short factors unless this asks for more: then its long factors serve every "
            "position, as in vLLM");
  flags.Add("gpus", &options.gpus, "GPUs per worker; only 1 (no tensor parallelism yet)");
  flags.Add("sim-step-us", &options.sim_step_us, "sim backend: delay per step in microseconds");
  flags.Add("sim-token-us", &options.sim_token_us, "sim backend: extra delay per scheduled token");
  tandem::kvconnector::AddKvStoreFlags(&flags,
                                       "load cached prefixes from it and store computed blocks",
                                       &options.kvstore_target, &options.kvstore_bulk_port);
  flags.Add("kvstore-transfer-deadline-ms", &options.kvstore_transfer_deadline_ms,
            "deadline of one step's KV-store load and of one store, in milliseconds");
  flags.Add("kvstore-load-threads", &options.kvstore_load_threads,
            "steps' KV-store loads read at once (each step's loads are one read; a slow one "
            "holds up no other), 1 to 64");
  flags.Add("kvstore-empty-step-wait-ms", &options.kvstore_empty_step_wait_ms,
            "how long a step with nothing to compute waits for a KV-store load to arrive before "
            "it answers (a step that computes ends the wait; a request that arrives meanwhile "
            "may wait this long for its first step), 0 to 1000");
  tandem::metrics::ExposerOptions metrics_options;
  flags.Add("metrics-listen", &metrics_options.listen_address,
            tandem::metrics::ExposerOptions::kListenHelp);
  flags.Add("debug-fail-steps", &options.debug_fail_steps,
            "TESTS ONLY: comma-separated step ids (per scheduler stream) that fail before their "
            "forward pass (empty: none)");
  flags.Add("debug-reject-steps", &options.debug_reject_steps,
            "TESTS ONLY: comma-separated step ids (per scheduler stream) answered as if they "
            "could not be read (empty: none)");
  flags.Add("debug-step-delay-us", &options.debug_step_delay_us,
            "TESTS ONLY: every step sleeps this long before its forward pass (0: off)");
  flags.Add("debug-send-delay-us", &options.debug_send_delay_us,
            "TESTS ONLY: the writer sleeps this long before each step's output (0: off)");
  // Longer than the scheduler's own default drain (30 s), which it runs on
  // this worker's steps before it detaches.
  int32_t drain_timeout_s = 60;
  flags.Add("drain-timeout-s", &drain_timeout_s,
            "on SIGTERM/SIGINT, how long the worker goes on running the steps of the scheduler "
            "attached to it (a scheduler draining its own requests, as when Kubernetes stops the "
            "pod both run in) before it stops; it stops as soon as the scheduler detaches");
  // Longer than the scheduler's --step-timeout-s (300): the scheduler drops
  // a wedged worker first, and the orchestrator restarts it after this.
  double liveness_stall_s = 600;
  flags.Add("liveness-stall-s", &liveness_stall_s,
            "tandem.liveness reads NOT_SERVING while the step loop has been at one step (a "
            "launch, or the wait for its results) this long, e.g. a hung kernel, so that a "
            "liveness probe restarts the worker; 0: never");
  int32_t debug_load_delay_ms = 0;
  flags.Add(
      "debug-load-delay-ms", &debug_load_delay_ms,
      "TESTS ONLY: wait this long (listening, NOT_SERVING) before loading the model (0: off)");
  flags.MirrorsVllm({"model", "tokenizer", "block-size", "enforce-eager", "disable-sliding-window",
                     "max-model-len"});
  flags.ParseOrExit(argc, argv);
  if (absl::Status s = boot.Validate(); !s.ok()) return boot.Fail(s);  // its KV-store client too
  if (absl::Status s = options.Validate(); !s.ok()) return boot.Fail(s);
  if (liveness_stall_s != 0 && !(liveness_stall_s >= 1)) {
    return boot.Fail("--liveness-stall-s must be 0 (off) or >= 1, got " +
                     std::to_string(liveness_stall_s));
  }
  if (drain_timeout_s < 0) {
    return boot.Fail("--drain-timeout-s must be >= 0, got " + std::to_string(drain_timeout_s));
  }

  auto registry = std::make_shared<prometheus::Registry>();
  tandem::rpc::RegisterTlsMetrics(registry);  // the --tls-* reloads
  auto exposer = tandem::metrics::MetricsServer::Start(metrics_options, registry);
  if (!exposer.ok()) return boot.Fail(exposer.status(), 1);
  if (*exposer != nullptr) TANDEM_LOG(INFO) << "metrics on " << (*exposer)->url();
  tandem::worker::WorkerService service(options, registry.get());
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  if (absl::Status s = boot.Serve(&builder); !s.ok()) return boot.Fail(s, 1);
  TANDEM_LOG(INFO) << "listening on port " << boot.port() << "; loading " << options.model_path;
  if (debug_load_delay_ms > 0) {
    TANDEM_LOG(WARNING) << "TEST-ONLY --debug-load-delay-ms=" << debug_load_delay_ms;
    std::this_thread::sleep_for(std::chrono::milliseconds(debug_load_delay_ms));
  }
  if (absl::Status s = service.Load(); !s.ok()) {
    TANDEM_LOG(ERROR) << s;
    boot.server()->Shutdown();
    return 1;
  }
  boot.SetServing(true);
  TANDEM_LOG(INFO) << "SERVING";
  std::optional<tandem::rpc::LivenessWatchdog> watchdog;
  watchdog.emplace(
      boot.server(), [&] { return service.busy_s(); }, liveness_stall_s, "step loop");

  boot.WaitForShutdown("draining: running the attached scheduler's steps until it detaches");
  // Kubernetes signals the scheduler and the worker of a pod at once: the
  // scheduler finishes its requests on this worker's steps, then detaches.
  // Before this wait the worker left after 5 s and took them with it.
  tandem::rpc::ServiceMain::Drain([&] { return service.stream_attached() ? 1 : 0; },
                                  std::chrono::seconds(drain_timeout_s),
                                  "the scheduler's stream is cut");
  watchdog.reset();
  boot.Shutdown(std::chrono::seconds(5));
  service.Stop();
  TANDEM_LOG(INFO) << "stopped";
  return 0;
}
