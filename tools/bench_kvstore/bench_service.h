// bench_kvstore's in-process tandem-kvstore: the real service on loopback,
// its clients over each path (bulk port, gRPC, local socket), and the same
// store behind a mutual-TLS gRPC server and bulk port.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "kvstore_server.h"
#include "kvstore_service.h"
#include "tandem/common/logging.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/rpc/tls.h"

namespace tandem::bench {

struct Service {
  std::unique_ptr<kvstore_service::KvStoreServer> server;
  std::unique_ptr<kvconnector::KvStoreClient> client;       // loads and lookups over the bulk port
  std::unique_ptr<kvconnector::KvStoreClient> grpc_client;  // loads and lookups over gRPC
  // Loads through the local socket (shared memory); null without a hot tier.
  std::unique_ptr<kvconnector::KvStoreClient> local_client;
  int port = 0;
  // The same store behind a second gRPC server and bulk port with mutual
  // TLS (declared after `server`, so they stop before the store closes).
  std::unique_ptr<kvstore_service::BulkLoadServer> tls_bulk;
  std::unique_ptr<kvstore_service::KvStoreServiceImpl> tls_service;
  std::unique_ptr<grpc::Server> tls_server;
  std::unique_ptr<kvconnector::KvStoreClient> tls_client;       // gRPC only
  std::unique_ptr<kvconnector::KvStoreClient> tls_bulk_client;  // the bulk port (default)
};

// A CA and one certificate for 127.0.0.1 with the worker role, made with the
// openssl CLI in `dir`; the options present it on both ends.
inline rpc::TlsOptions MakeCertificates(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
  const std::string cmd =
      "cd " + dir + " && openssl req -x509" + ec + "-keyout ca.key -out ca.pem -days 1 " +
      "-subj /CN=bench-ca && openssl req" + ec + "-keyout leaf.key -out leaf.csr -subj /CN=bench " +
      "&& printf 'subjectAltName=IP:127.0.0.1,URI:spiffe://cluster.local/tandem/worker\n' > "
      "leaf.ext " +
      "&& openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem " +
      "-days 1 -extfile leaf.ext > /dev/null 2>&1";
  TANDEM_CHECK(std::system(cmd.c_str()) == 0) << "openssl could not make the TLS certificates";
  return rpc::TlsOptions{
      .cert_file = dir + "/leaf.pem", .key_file = dir + "/leaf.key", .ca_file = dir + "/ca.pem"};
}

inline void StartTls(Service* s, const std::string& dir, int64_t load_chunk_bytes) {
  const rpc::TlsOptions tls = MakeCertificates(dir);
  // As tandem-kvstore under TLS: the bulk port speaks TLS with the same files.
  auto bulk = kvstore_service::BulkLoadServer::Start(s->server->engine(), {.tls = tls});
  TANDEM_CHECK(bulk.ok()) << bulk.status();
  s->tls_bulk = std::move(*bulk);
  s->tls_service = std::make_unique<kvstore_service::KvStoreServiceImpl>(
      s->server->engine(),
      kvstore_service::KvStoreServiceOptions{.load_chunk_bytes = load_chunk_bytes,
                                             .bulk_load = s->tls_bulk.get()});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", rpc::ServerCredentialsFor(tls), &port);
  kvstore_service::ConfigureServerBuilder(&builder);
  builder.RegisterService(s->tls_service.get());
  s->tls_server = builder.BuildAndStart();
  TANDEM_CHECK(s->tls_server != nullptr && port != 0);
  // The clients dial with the process's client TLS settings of their making.
  rpc::SetClientTls(tls);
  const std::string target = "127.0.0.1:" + std::to_string(port);
  auto grpc_only = kvconnector::KvStoreClient::Create(
      {.target = target, .lookup_deadline_ms = 5000, .bulk_load = false, .bulk_lookup = false});
  auto bulk_client =
      kvconnector::KvStoreClient::Create({.target = target, .lookup_deadline_ms = 5000});
  rpc::SetClientTls(rpc::TlsOptions{});
  TANDEM_CHECK(grpc_only.ok() && bulk_client.ok());
  s->tls_client = std::move(*grpc_only);
  s->tls_bulk_client = std::move(*bulk_client);
}

inline Service StartService(const std::string& dir, uint64_t hot_bytes, int64_t load_chunk_bytes) {
  Service s;
  auto server =
      kvstore_service::KvStoreServer::Open({.store = {.data_dir = dir,
                                                      .hot_capacity_bytes = hot_bytes,
                                                      .hot_slot_bytes = 2 << 20,
                                                      .durability = kvstore::Durability::kWal,
                                                      .store_to_hot = hot_bytes > 0,
                                                      .share_hot_tier = hot_bytes > 0},
                                            .service = {.load_chunk_bytes = load_chunk_bytes},
                                            .bulk = kvstore_service::BulkLoadServerOptions{
                                                .local_socket = hot_bytes > 0
                                                                    ? dir + "/local.sock"
                                                                    : ""}});
  TANDEM_CHECK(server.ok()) << server.status();
  s.server = std::move(*server);
  absl::StatusOr<int> port = s.server->Listen("127.0.0.1:0", grpc::InsecureServerCredentials());
  TANDEM_CHECK(port.ok()) << port.status();
  s.port = *port;
  const std::string target = "127.0.0.1:" + std::to_string(s.port);
  for (bool bulk : {true, false}) {
    auto client = kvconnector::KvStoreClient::Create({.target = target,
                                                      .lookup_deadline_ms = 5000,
                                                      .bulk_load = bulk,
                                                      .bulk_lookup = bulk,
                                                      .bulk_store = bulk,
                                                      .local_load = false,
                                                      .local_store = false});
    TANDEM_CHECK(client.ok());
    (bulk ? s.client : s.grpc_client) = std::move(*client);
  }
  if (hot_bytes > 0) {
    auto local = kvconnector::KvStoreClient::Create({.target = target, .bulk_lookup = false});
    TANDEM_CHECK(local.ok());
    s.local_client = std::move(*local);
  }
  for (int i = 0; i < 1000 && !s.client->bulk_lookup_connected(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  TANDEM_CHECK(s.client->bulk_lookup_connected()) << "the lookup connection did not come up";
  return s;
}

}  // namespace tandem::bench
