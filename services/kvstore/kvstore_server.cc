#include "kvstore_server.h"

#include <utility>

#include "grpcpp/server_builder.h"
#include "tandem/common/status.h"

namespace tandem::kvstore_service {

absl::StatusOr<std::unique_ptr<KvStoreServer>> KvStoreServer::Open(KvStoreServerOptions options) {
  TANDEM_RETURN_IF_ERROR(options.store.Validate());
  TANDEM_RETURN_IF_ERROR(options.service.Validate());
  if (options.bulk) TANDEM_RETURN_IF_ERROR(options.bulk->Validate());
  std::unique_ptr<KvStoreServer> server(new KvStoreServer());
  TANDEM_ASSIGN_OR_RETURN(server->engine_, kvstore::KvStoreEngine::Open(options.store));
  if (options.bulk) {
    TANDEM_ASSIGN_OR_RETURN(server->bulk_,
                            BulkLoadServer::Start(server->engine_.get(), *options.bulk));
    options.service.bulk_load = server->bulk_.get();
  }
  server->service_ = std::make_unique<KvStoreServiceImpl>(server->engine_.get(), options.service);
  server->options_ = std::move(options);
  return server;
}

KvStoreServer::~KvStoreServer() {
  Shutdown();
  servers_.clear();
  service_.reset();
  extra_services_.clear();
  bulk_.reset();
  engine_.reset();
}

absl::StatusOr<int> KvStoreServer::Listen(const std::string& address,
                                          std::shared_ptr<grpc::ServerCredentials> credentials,
                                          bool advertise_bulk_port) {
  KvStoreServiceImpl* service = service_.get();
  if (!advertise_bulk_port && bulk_ != nullptr) {
    KvStoreServiceOptions without = options_.service;
    without.bulk_load = nullptr;
    extra_services_.push_back(std::make_unique<KvStoreServiceImpl>(engine_.get(), without));
    service = extra_services_.back().get();
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, std::move(credentials), &port);
  ConfigureServerBuilder(&builder);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError("the KV-store's gRPC server could not listen on " + address);
  }
  servers_.push_back(std::move(server));
  return port;
}

void KvStoreServer::Shutdown() {
  for (auto& server : servers_) server->Shutdown();
  if (bulk_ != nullptr) bulk_->Shutdown();
}

}  // namespace tandem::kvstore_service
