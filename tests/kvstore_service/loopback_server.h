// Starts a gRPC service in-process on a free loopback port, for tests that
// talk to the real service over real gRPC.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace tandem::testutil {

struct LoopbackServer {
  std::unique_ptr<grpc::Server> server;  // null when it could not start
  std::string target;                    // "127.0.0.1:<port>"
};

// `service` is not owned and must outlive the server. `port` 0 picks a free
// one; another binds that one (a restart on the same address).
inline LoopbackServer StartOnLoopback(grpc::Service* service, int port = 0) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(service);
  LoopbackServer s;
  s.server = builder.BuildAndStart();
  s.target = "127.0.0.1:" + std::to_string(port);
  return s;
}

}  // namespace tandem::testutil
