#include "tandem/rpc/server.h"

#include <signal.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "health_service.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"

namespace tandem::rpc {

absl::Status ServerOptions::Validate() const {
  if (listen_address.empty()) return absl::InvalidArgumentError("listen_address is empty");
  if (keepalive_time_ms <= 0 || keepalive_timeout_ms <= 0) {
    return absl::InvalidArgumentError("keepalive_time_ms and keepalive_timeout_ms must be > 0");
  }
  if (max_receive_message_bytes <= 0) {
    return absl::InvalidArgumentError("max_receive_message_bytes must be > 0");
  }
  return tls.Validate(/*server=*/true);
}

namespace {
bool health_enabled = false;
}  // namespace

bool IsLoopbackAddress(std::string_view listen_address) {
  const size_t colon = listen_address.rfind(':');
  std::string_view host = listen_address.substr(0, colon == std::string_view::npos ? 0 : colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

void EnableReflectionAndHealth() {
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  health_enabled = true;
}

void AcceptClientPings(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

absl::StatusOr<std::unique_ptr<grpc::Server>> BuildAndStart(grpc::ServerBuilder* builder,
                                                            const ServerOptions& options,
                                                            int* bound_port) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  int port = 0;
  if (!options.tls.enabled() && !IsLoopbackAddress(options.listen_address)) {
    TANDEM_LOG(WARNING) << "serving " << options.listen_address
                        << " without TLS: any process that reaches this address can call every "
                           "method unauthenticated, in plain text. Set --tls-cert/--tls-key "
                           "(and --tls-ca for mutual TLS), keep it on a private network (the Helm "
                           "chart's NetworkPolicy), or bind loopback.";
  }
  builder->AddListeningPort(options.listen_address, ServerCredentialsFor(options.tls), &port);
  builder->SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  AcceptClientPings(builder);
  if (health_enabled) {
    // Ours, not gRPC's default: that one says SERVING from Start() on.
    auto health = std::make_unique<HealthService>();
    builder->RegisterService(health.get());
    builder->SetOption(
        std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(std::move(health)));
  }
  std::unique_ptr<grpc::Server> server = builder->BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address, " (address in use or invalid?)"));
  }
  if (!options.port_file.empty()) {
    TANDEM_RETURN_IF_ERROR(WritePortFile(options.port_file, port));
  }
  if (bound_port != nullptr) *bound_port = port;
  return server;
}

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << port << "\n";
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

void SetServing(grpc::Server* server, const std::string& service, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  if (!service.empty()) health->SetServingStatus(service, serving);
}

void MarkLive(grpc::Server* server) { SetLive(server, true); }

void SetLive(grpc::Server* server, bool live) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(kLivenessService, live);
}

void ShutdownHealth(grpc::Server* server) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) health->Shutdown();
}

// The shortest time a connection attempt of DefaultChannelArguments may take
// before it counts as failed.
constexpr int kMinConnectTimeoutMs = 5000;

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(64 << 20);
  // Reconnect quickly after a peer restarts: the backoff between attempts.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Despite its name, gRPC reads this as the shortest time one connection
  // attempt may take (TCP connect plus the peer's first SETTINGS frame), not
  // as a backoff. It was 100 ms: on a loaded machine a busy peer missed that,
  // the channel went TRANSIENT_FAILURE and calls failed with "connection
  // attempt timed out before receiving SETTINGS frame". A peer that is down
  // refuses at once and is retried after the backoff above.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinConnectTimeoutMs);
  return args;
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target) {
  return CreateChannel(target, DefaultChannelArguments());
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                             const grpc::ChannelArguments& args) {
  return grpc::CreateCustomChannel(target, ChannelCredentialsFor(ClientTls()), args);
}

namespace {
sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void BlockShutdownSignals() {
  sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  sigset_t set = ShutdownSignals();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace tandem::rpc
