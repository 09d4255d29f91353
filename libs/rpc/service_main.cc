#include "tandem/rpc/service_main.h"

#include <iostream>
#include <thread>

#include "tandem/common/logging.h"
#include "tandem/rpc/tls.h"

namespace tandem::rpc {

ServiceMain::ServiceMain(std::string binary, const char* log_tag, std::string health_name,
                         std::string default_listen)
    : binary_(std::move(binary)), health_name_(std::move(health_name)) {
  BlockShutdownSignals();
  SetLogTag(log_tag);
  options_.listen_address = std::move(default_listen);
}

void ServiceMain::AddServerFlags(FlagSet* flags) {
  flags->Add("listen", &options_.listen_address, "host:port to serve on (port 0: any free port)");
  flags->Add("port-file", &options_.port_file,
             "write the bound port to this file once listening (empty: don't)");
  AddTlsFlags(flags, &options_.tls);
}

absl::Status ServiceMain::Validate() {
  if (absl::Status s = options_.Validate(); !s.ok()) return s;
  SetClientTls(options_.tls);
  return absl::OkStatus();
}

int ServiceMain::Fail(std::string_view message, int exit_code) const {
  std::cerr << binary_ << ": " << message << "\n";
  return exit_code;
}

absl::Status ServiceMain::Serve(grpc::ServerBuilder* builder) {
  EnableReflectionAndHealth();
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = BuildAndStart(builder, options_, &port_);
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  // Health is NOT_SERVING from the start (EnableReflectionAndHealth); this
  // names the service too. Live while loading, waiting and draining.
  SetServing(false);
  MarkLive(server_.get());
  return absl::OkStatus();
}

void ServiceMain::SetServing(bool serving) {
  if (server_ != nullptr) rpc::SetServing(server_.get(), health_name_, serving);
}

int ServiceMain::WaitForShutdown(std::string_view what) {
  const int sig = WaitForShutdownSignal();
  TANDEM_LOG(INFO) << "signal " << sig << ": " << what;
  if (server_ != nullptr) SetServing(false);
  return sig;
}

int ServiceMain::Drain(const std::function<int()>& open, std::chrono::milliseconds timeout,
                       std::string_view what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (open() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int left = open();
  if (left > 0) TANDEM_LOG(WARNING) << "drain timeout: " << left << " " << what;
  return left;
}

void ServiceMain::Shutdown(std::chrono::milliseconds grace) {
  if (server_ == nullptr) return;
  ShutdownHealth(server_.get());
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
}

}  // namespace tandem::rpc
