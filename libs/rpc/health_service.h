// grpc.health.v1.Health served by Tandem itself instead of gRPC's default
// health service. gRPC's default reports "" SERVING from the moment the server
// starts until the first SetServingStatus call, so a worker would briefly
// claim SERVING before its model is loaded. This one starts NOT_SERVING for
// "" and for every service name, and changes only when told (DESIGN §7).
//
// Check: the status of a known name; NOT_FOUND for a name never set.
// Watch: the current status (SERVICE_UNKNOWN for an unknown name), then every
// change. Shutdown(): everything NOT_SERVING for good; open watches end.
//
// Installed by rpc::BuildAndStart (server.h) through
// HealthCheckServiceServerBuilderOption, so the server owns it and
// Server::GetHealthCheckService() returns it.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"

namespace tandem::rpc {

class HealthService final : public grpc::HealthCheckServiceInterface,
                            public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  HealthService();
  ~HealthService() override;

  void SetServingStatus(const std::string& service_name, bool serving) override;
  void SetServingStatus(bool serving) override;
  void Shutdown() override;

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;
  void Set(const std::string& service_name, ServingStatus status);
  void RemoveWatcher(Watcher* watcher);

  // Lock order: mu_, then a Watcher's own mutex.
  std::mutex mu_;
  std::map<std::string, ServingStatus> statuses_;  // "" always present
  std::set<Watcher*> watchers_;
  bool shut_down_ = false;
};

}  // namespace tandem::rpc
