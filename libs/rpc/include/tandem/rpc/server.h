// Server and channel helpers shared by every Tandem service: reflection,
// the standard health service, keepalive, port files, and SIGTERM/SIGINT
// drain.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"
#include "tandem/rpc/tls.h"

namespace tandem::rpc {

struct ServerOptions {
  // host:port to listen on; port 0 picks a free one (see port_file).
  std::string listen_address = "127.0.0.1:0";
  // When set, the bound port is written here (atomically, via rename) once
  // the server is listening. Tests and scripts read it.
  std::string port_file;
  // HTTP/2 keepalive pings, so dead peers are noticed without traffic. The
  // timeout is gRPC's default: a busy (not dead) client must not lose its
  // streams because one ping answer was late.
  int32_t keepalive_time_ms = 10000;
  int32_t keepalive_timeout_ms = 20000;
  // Largest message accepted; gRPC's default is 4 MiB.
  int32_t max_receive_message_bytes = 64 << 20;
  // TLS, and mutual TLS with tls.ca_file (tls.h); off by default.
  TlsOptions tls;

  [[nodiscard]] absl::Status Validate() const;
};

// Turns on reflection and the standard health service (grpc.health.v1) for
// every server BuildAndStart builds afterwards. Call once, before the first
// ServerBuilder is created. Health starts NOT_SERVING for "" and every
// service name (unlike gRPC's default health service, which reports ""
// SERVING from Start() on) and changes only through SetServing; it is served
// by Tandem's own implementation, installed as the server's
// HealthCheckServiceInterface.
void EnableReflectionAndHealth();

// The ping policy every Tandem server keeps: clients' keepalive pings are
// allowed without calls in flight and as often as once a second, and never
// answered with a GOAWAY ("too_many_pings"). Tandem's channels ping every
// 10 s (DefaultChannelArguments); gRPC's default server policy allows one ping
// per 5 minutes and closes the connection after the second early one.
// BuildAndStart applies it; a server built another way calls it itself.
void AcceptClientPings(grpc::ServerBuilder* builder);

// Adds the listening port and channel arguments, builds and starts the server
// (services must already be registered on `builder`), and writes the port
// file. UNAVAILABLE when the address cannot be bound.
[[nodiscard]] absl::StatusOr<std::unique_ptr<grpc::Server>> BuildAndStart(
    grpc::ServerBuilder* builder, const ServerOptions& options, int* bound_port);

// Writes `port` and a newline to `path` atomically (a temporary file, then
// rename), so that a reader never sees a partial number. BuildAndStart uses
// it for ServerOptions::port_file; servers that are not gRPC use it too.
[[nodiscard]] absl::Status WritePortFile(const std::string& path, int port);

// Sets the overall ("") and `service` health status: readiness ("can serve
// now"; NOT_SERVING while the worker is away or loading, and while draining).
void SetServing(grpc::Server* server, const std::string& service, bool serving);

// True for 127.x.x.x, [::1] and localhost listen addresses (host:port).
// BuildAndStart warns, naming the risk, when it serves any other address
// without TLS.
[[nodiscard]] bool IsLoopbackAddress(std::string_view listen_address);

// The health name of liveness ("this process runs and answers"): SERVING
// from MarkLive() until ShutdownHealth(), whatever readiness says, draining
// included; so a liveness probe does not restart a scheduler whose worker is
// loading weights or gone. Kubernetes probes: liveness and startup on
// kLivenessService, readiness on the service's own name.
inline constexpr char kLivenessService[] = "tandem.liveness";
void MarkLive(grpc::Server* server);
// Liveness SERVING or NOT_SERVING (a watchdog that sees the main loop stall).
void SetLive(grpc::Server* server, bool live);
// Health NOT_SERVING for good and open Watch calls ended, so they do not hold
// up the server's Shutdown. Call before Shutdown().
void ShutdownHealth(grpc::Server* server);

// A channel with keepalive matching ServerOptions' defaults, dialling with
// this process's client TLS settings (SetClientTls).
[[nodiscard]] std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target);
// The same with the caller's arguments (start from DefaultChannelArguments).
[[nodiscard]] std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                                           const grpc::ChannelArguments& args);
// The channel arguments CreateChannel uses (keepalive, reconnect backoff,
// receive limit), the one definition for every Tandem client; a client that
// needs more (the KV-store's bulk transfers) adds to them.
[[nodiscard]] grpc::ChannelArguments DefaultChannelArguments();

// Blocks SIGTERM and SIGINT in the calling thread and every thread it
// creates afterwards. Call first thing in main().
void BlockShutdownSignals();
// Waits until SIGTERM or SIGINT arrives (after BlockShutdownSignals) and
// returns its number.
int WaitForShutdownSignal();

}  // namespace tandem::rpc
