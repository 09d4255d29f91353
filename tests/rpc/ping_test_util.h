// A client that keeps pinging an idle connection, for the servers' ping
// policy (rpc::AcceptClientPings): rpc_server_test and kvstore_service_test.
#pragma once

#include <chrono>
#include <memory>
#include <thread>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace tandem::testing {

// Whether a client that pings every second while idle keeps its connection
// for `seconds` to a server built on `builder`: gRPC's default server policy
// answers the third early ping with GOAWAY "too_many_pings".
inline bool StaysConnectedWhilePinging(grpc::ServerBuilder* builder, int seconds) {
  int port = 0;
  builder->AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder->BuildAndStart();
  EXPECT_TRUE(server != nullptr && port != 0);
  if (server == nullptr) return false;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  EXPECT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)));
  bool connected = true;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (connected && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    connected = channel->GetState(false) == GRPC_CHANNEL_READY;
  }
  server->Shutdown(std::chrono::system_clock::now());
  return connected;
}

}  // namespace tandem::testing
