// Multi-process test harness: starts the real tandem-worker and
// tandem-scheduler binaries on free loopback ports (port 0 + --port-file),
// waits until they serve, and offers small client helpers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../wait_for.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::testing {

// A child process; killed with SIGKILL on destruction if still running.
class Process {
 public:
  Process() = default;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  Process(Process&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }
  Process& operator=(Process&& other) noexcept;
  ~Process();

  // argv[0] is the binary path; stdout and stderr go to `log_path`.
  static Process Spawn(const std::vector<std::string>& argv, const std::string& log_path);
  void Signal(int sig);
  // Waits up to `timeout` for exit; returns the wait status or nullopt.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  // True while the child is alive (waitpid WNOHANG; a child that exited is
  // reaped here and its status kept in exit_status()).
  bool running();
  std::optional<int> exit_status() const { return exit_status_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
};

// A fresh temp directory per test (logs, port files).
std::string MakeTempDir(const std::string& prefix);
// Binary path under the build tree, e.g. "services/worker/tandem-worker".
std::string BinaryPath(const std::string& relative);
std::string ModelPath();  // ../shared/models/stories260K.bin

struct Service {
  Process process;
  int port = 0;
  std::string log_path;  // its stdout and stderr
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

// The whole content of a file ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// Runs a binary to completion (killed after `timeout`) with stdout and stderr
// in `output`; returns its exit code, or -1 when it did not exit normally.
int RunCommand(const std::vector<std::string>& argv, std::string* output,
               std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Starts a worker (extra flags appended, may include --listen; the model is
// stories260K unless they name a --model, the KV cache 64 MiB unless they
// give --kv-cache-bytes or --num-blocks); waits until it
// listens and, when `wait_for_serving`, until its health says SERVING.
// Dies (test failure) after 30 s.
Service StartWorker(const std::string& dir, const std::string& name,
                    const std::vector<std::string>& extra_args, bool wait_for_serving = true);
// Starts a scheduler for `worker_address`; waits until it is listening and,
// when `wait_for_worker`, until it reports the worker connected.
Service StartScheduler(const std::string& dir, const std::string& name,
                       const std::string& worker_address,
                       const std::vector<std::string>& extra_args, bool wait_for_worker = true);

// Starts a tandem-frontend (HTTP) for the scheduler targets; waits until it
// listens and, when `wait_for_serving`, until its /health answers 200.
Service StartFrontend(const std::string& dir, const std::string& name,
                      const std::vector<std::string>& scheduler_targets,
                      const std::vector<std::string>& extra_args, bool wait_for_serving = true);
// A connected TCP socket to "ipv4:port", or -1; `before_connect` may set
// socket options first.
int ConnectTcp(const std::string& address, const std::function<void(int fd)>& before_connect = {});
// The HTTP status of GET http://address/path, or -1 when it cannot connect.
int HttpGetStatus(const std::string& address, const std::string& path);
// The body of GET http://address/path ("" when it cannot be had).
std::string HttpGetBody(const std::string& address, const std::string& path);
// The value of an unlabelled series on a service's /metrics page (the
// address its log names: "metrics on http://ADDRESS/metrics"); -1 when the
// page or the series is missing.
double ScrapeMetric(const Service& service, const std::string& series);
// host:port of a service's /metrics (from its log's "metrics on http://"
// line); empty when it logged none.
std::string MetricsAddress(const Service& service);

// grpc.health.v1.Health/Check of `service` ("" = the whole server):
// 1 SERVING, 2 NOT_SERVING, -1 when the call failed (NOT_FOUND included).
int HealthStatus(const std::string& address, const std::string& service = "");

struct GenerateResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;  // the last message's
  bool last_token_stops = false;  // any message's
  // Each message's usage (a default one where it had none) and how many
  // tokens had come with it and those before.
  std::vector<std::pair<v1::Usage, int32_t>> usage_so_far;
  int32_t messages_without_usage = 0;
};
// Runs every request at once, one thread each; `meanwhile` (when given) runs
// on the calling thread while they stream. Results in request order.
std::vector<GenerateResult> RunConcurrently(
    v1::Generation::Stub* stub, const std::vector<v1::GenerateRequest>& requests,
    const std::function<void()>& meanwhile = {},
    std::chrono::milliseconds timeout = std::chrono::seconds(120));
GenerateResult RunGenerate(v1::Generation::Stub* stub, const v1::GenerateRequest& request,
                           std::chrono::milliseconds timeout = std::chrono::seconds(120));
v1::GenerateRequest MakeRequest(std::vector<int32_t> prompt, int32_t max_tokens,
                                float temperature = 0, std::optional<uint64_t> seed = {},
                                bool ignore_eos = false);

std::unique_ptr<v1::Generation::Stub> GenerationStub(const std::string& address);
std::unique_ptr<v1::Worker::Stub> WorkerStub(const std::string& address);
v1::GetStatsResponse GetStats(v1::Generation::Stub* stub);
v1::DescribeResponse Describe(v1::Worker::Stub* stub);


}  // namespace tandem::testing
