// tandem-kvstore in a process of your own: the engine (libs/kvstore), the
// bulk load port (bulk_load_server.h) and the gRPC service
// (kvstore_service.h), opened and wired as tandem-kvstore's main wires them.
// tandem-kvstore's main serves the service through rpc::ServiceMain (health,
// reflection, TLS reloads, drain); tools/bench_kvstore and tests serve it on
// their own gRPC servers with Listen(). Code outside services/kvstore starts a
// store through this header; the service's own tests (tests/kvstore_service)
// still build its parts one by one.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bulk_load_server.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "kvstore_service.h"
#include "tandem/kvstore/kv_store.h"

namespace tandem::kvstore_service {

struct KvStoreServerOptions {
  kvstore::KvStoreOptions store;
  // The gRPC service's options; bulk_load is set by Open when the bulk port
  // is on (and left as given otherwise).
  KvStoreServiceOptions service;
  // The bulk load port; nullopt: off (clients load over gRPC).
  std::optional<BulkLoadServerOptions> bulk;
};

class KvStoreServer {
 public:
  // Opens the store (a directory it cannot read is repaired or salvaged,
  // kv_store.h) and starts the bulk port. Errors: the options' Validate()
  // messages, the store's open error, the bulk port's bind error.
  static absl::StatusOr<std::unique_ptr<KvStoreServer>> Open(KvStoreServerOptions options);

  // Shuts down the servers Listen() started and the bulk port, then closes
  // the store (which flushes its memtable).
  ~KvStoreServer();

  // The gRPC service, for the caller's ServerBuilder (call
  // ConfigureServerBuilder on it too).
  KvStoreServiceImpl* service() { return service_.get(); }

  // Serves the store on a gRPC server of its own at `address` (port 0: a
  // free one); returns the bound port. With `advertise_bulk_port` false the
  // server's Stats advertise no bulk port, so its clients load over gRPC
  // (a second listener whose clients must not use the bulk port).
  absl::StatusOr<int> Listen(const std::string& address,
                             std::shared_ptr<grpc::ServerCredentials> credentials,
                             bool advertise_bulk_port = true);

  // Stops the servers Listen() started (in-flight RPCs are cancelled) and
  // the bulk port; idempotent.
  void Shutdown();

  kvstore::KvStoreEngine* engine() { return engine_.get(); }
  BulkLoadServer* bulk() { return bulk_.get(); }  // null when off

 private:
  KvStoreServer() = default;

  KvStoreServerOptions options_;
  std::unique_ptr<kvstore::KvStoreEngine> engine_;
  std::unique_ptr<BulkLoadServer> bulk_;
  std::unique_ptr<KvStoreServiceImpl> service_;
  // Listen()'s servers, each with its service (the ones without the bulk
  // port have their own).
  std::vector<std::unique_ptr<KvStoreServiceImpl>> extra_services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
};

}  // namespace tandem::kvstore_service
