// tandem-worker: loads a model and executes the scheduler's steps.
#include <chrono>
#include <iostream>
#include <thread>

#include "grpcpp/server_builder.h"
#include "tandem/common/logging.h"
#include "tandem/rpc/flags.h"
#include "tandem/rpc/server.h"
#include "worker_service.h"

int main(int argc, char** argv) {
  tandem::rpc::BlockShutdownSignals();
  tandem::SetLogTag("worker");
  tandem::worker::WorkerOptions options{.model_path = "../shared/models/stories260K.bin"};
  tandem::rpc::ServerOptions server_options{.listen_address = "127.0.0.1:50061"};
  tandem::rpc::FlagSet flags("tandem-worker",
                             "Loads a model, owns its paged KV cache and executes the steps a "
                             "tandem-scheduler streams to it (tandem.v1.Worker).");
  flags.Add("listen", &server_options.listen_address,
            "host:port to serve on (port 0: any free port)");
  flags.Add("port-file", &server_options.port_file,
            "write the bound port to this file once listening (empty: don't)");
  tandem::rpc::AddTlsFlags(&flags, &server_options.tls);
  flags.Add("model", &options.model_path, "llama2.c .bin checkpoint or Hugging Face directory");
  flags.Add("backend", &options.backend, "cpu | cuda (error without a device) | sim (no math)");
  flags.Add("block-size", &options.block_size, "tokens per KV block");
  flags.Add("num-blocks", &options.num_blocks, "KV blocks to allocate; 0 = from --kv-cache-bytes");
  flags.Add("kv-cache-bytes", &options.kv_cache_bytes,
            "KV cache memory budget in bytes, used when --num-blocks is 0");
  flags.Add("threads", &options.num_threads, "CPU threads of the cpu backend");
  flags.Add("dtype", &options.dtype,
            "[vLLM] float32 | bfloat16: KV cache and (cuda) weight dtype; bfloat16 needs "
            "--backend=cuda (fast kernels), float32 matches the cpu backend");
  flags.Add("device", &options.device, "CUDA device ordinal of the cuda backend");
  flags.Add("gpus", &options.gpus, "GPUs per worker; only 1 (no tensor parallelism yet)");
  flags.Add("sim-step-us", &options.sim_step_us, "sim backend: delay per step in microseconds");
  flags.Add("sim-token-us", &options.sim_token_us, "sim backend: extra delay per scheduled token");
  flags.Add("kvstore", &options.kvstore_target,
            "host:port of tandem-kvstore: load cached prefixes from it and store computed blocks "
            "(empty: off)");
  flags.Add("kvstore-transfer-deadline-ms", &options.kvstore_transfer_deadline_ms,
            "deadline of one step's KV-store load and of one store, in milliseconds");
  flags.Add("kvstore-bulk-load", &options.kvstore_bulk_load,
            "how KV-store loads travel: auto (the store's bulk load port, plain TCP, when it "
            "advertises one; else gRPC), off (gRPC only), or host:port of the bulk load port");
  tandem::metrics::ExposerOptions metrics_options;
  flags.Add("metrics-listen", &metrics_options.listen_address,
            tandem::metrics::ExposerOptions::kListenHelp);
  flags.Add("debug-fail-steps", &options.debug_fail_steps,
            "TESTS ONLY: comma-separated step ids (per scheduler stream) that fail before their "
            "forward pass (empty: none)");
  flags.Add("debug-step-delay-us", &options.debug_step_delay_us,
            "TESTS ONLY: every step sleeps this long before its forward pass (0: off)");
  int32_t debug_load_delay_ms = 0;
  flags.Add(
      "debug-load-delay-ms", &debug_load_delay_ms,
      "TESTS ONLY: wait this long (listening, NOT_SERVING) before loading the model (0: off)");
  flags.MirrorsVllm({"model", "block-size"});
  flags.ParseOrExit(argc, argv);
  if (absl::Status s = server_options.Validate(); !s.ok()) {
    std::cerr << "tandem-worker: " << s.message() << "\n";
    return 2;
  }
  tandem::rpc::SetClientTls(server_options.tls);  // its KV-store client too
  if (absl::Status s = options.Validate(); !s.ok()) {
    std::cerr << "tandem-worker: " << s.message() << "\n";
    return 2;
  }

  auto registry = std::make_shared<prometheus::Registry>();
  auto exposer = tandem::metrics::MetricsServer::Start(metrics_options, registry);
  if (!exposer.ok()) {
    std::cerr << "tandem-worker: " << exposer.status().message() << "\n";
    return 1;
  }
  if (*exposer != nullptr) {
    TANDEM_LOG(INFO) << "metrics on " << (*exposer)->url();
  }
  tandem::worker::WorkerService service(options, registry.get());
  tandem::rpc::EnableReflectionAndHealth();
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  int port = 0;
  auto server = tandem::rpc::BuildAndStart(&builder, server_options, &port);
  if (!server.ok()) {
    std::cerr << "tandem-worker: " << server.status().message() << "\n";
    return 1;
  }
  // Health is NOT_SERVING from the start (rpc::EnableReflectionAndHealth);
  // this names the service too.
  tandem::rpc::SetServing(server->get(), "tandem.v1.Worker", false);
  tandem::rpc::MarkLive(server->get());  // while loading too
  TANDEM_LOG(INFO) << "listening on port " << port << "; loading " << options.model_path;
  if (debug_load_delay_ms > 0) {
    TANDEM_LOG(WARNING) << "TEST-ONLY --debug-load-delay-ms=" << debug_load_delay_ms;
    std::this_thread::sleep_for(std::chrono::milliseconds(debug_load_delay_ms));
  }
  if (absl::Status s = service.Load(); !s.ok()) {
    TANDEM_LOG(ERROR) << s;
    (*server)->Shutdown();
    return 1;
  }
  tandem::rpc::SetServing(server->get(), "tandem.v1.Worker", true);
  TANDEM_LOG(INFO) << "SERVING";

  int sig = tandem::rpc::WaitForShutdownSignal();
  TANDEM_LOG(INFO) << "signal " << sig << ": draining";
  tandem::rpc::ShutdownHealth(server->get());
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  service.Stop();
  TANDEM_LOG(INFO) << "stopped";
  return 0;
}
