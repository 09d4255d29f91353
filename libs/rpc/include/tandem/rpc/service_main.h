// The boot and drain every Tandem gRPC server binary shares (issue 13):
// shutdown signals blocked first thing, the log tag, the --listen,
// --port-file and --tls-* flags, error exits that name the binary,
// reflection and the health service, NOT_SERVING until the binary says
// otherwise, liveness SERVING while it runs, and on SIGTERM/SIGINT health
// NOT_SERVING, a bounded drain and a shutdown with a deadline.
//
//   rpc::ServiceMain boot("tandem-worker", "worker", "tandem.v1.Worker", "127.0.0.1:50061");
//   tandem::FlagSet flags(...);
//   boot.AddServerFlags(&flags);
//   ... flags.ParseOrExit(argc, argv);
//   if (absl::Status s = boot.Validate(); !s.ok()) return boot.Fail(s);
//   grpc::ServerBuilder builder; builder.RegisterService(&service);
//   if (absl::Status s = boot.Serve(&builder); !s.ok()) return boot.Fail(s, 1);
//   ... boot.SetServing(true);
//   boot.WaitForShutdown("draining");
//   boot.Shutdown(std::chrono::seconds(5));
//
// Exit codes: 2 for bad flags, 1 for a start that failed (Fail's argument).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "tandem/common/flags.h"
#include "tandem/rpc/server.h"

namespace tandem::rpc {

class ServiceMain {
 public:
  // Blocks SIGTERM and SIGINT (construct it first thing in main, before any
  // thread starts) and tags the log. `health_name` is the service's
  // readiness name; `default_listen` the --listen default.
  ServiceMain(std::string binary, const char* log_tag, std::string health_name,
              std::string default_listen);

  // --listen, --port-file and the --tls-* flags (tls.h).
  void AddServerFlags(FlagSet* flags);
  // The server options as the flags left them (tests of the binary may
  // change keepalive and the like before Serve).
  ServerOptions& options() { return options_; }

  // The server options are valid and the TLS files readable; sets this
  // process's client TLS (SetClientTls) to the same files, so that its
  // clients present its certificate.
  [[nodiscard]] absl::Status Validate();

  // Prints "<binary>: <message>" to stderr and returns `exit_code`.
  int Fail(std::string_view message, int exit_code = 2) const;
  int Fail(const absl::Status& status, int exit_code = 2) const {
    return Fail(std::string(status.message()), exit_code);
  }

  // Reflection and health, then builds and starts the server (services
  // registered on `builder` already): health NOT_SERVING under "" and the
  // health name, liveness SERVING. Logs the port.
  [[nodiscard]] absl::Status Serve(grpc::ServerBuilder* builder);
  grpc::Server* server() const { return server_.get(); }
  int port() const { return port_; }

  // Readiness ("" and the health name).
  void SetServing(bool serving);

  // Waits for SIGTERM or SIGINT, logs "signal N: <what>", and marks the
  // server NOT_SERVING; returns the signal.
  int WaitForShutdown(std::string_view what);

  // Waits until `open()` is 0 or `timeout` passes; logs and returns how many
  // are still open then.
  static int Drain(const std::function<int()>& open, std::chrono::milliseconds timeout,
                   std::string_view what);

  // Health shut (Watch calls end), then Shutdown with `grace` for calls in
  // flight, then Wait.
  void Shutdown(std::chrono::milliseconds grace);

 private:
  const std::string binary_;
  const std::string health_name_;
  ServerOptions options_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace tandem::rpc
