// rpc::BuildAndStart's health service: NOT_SERVING from the start (gRPC's
// default health service says SERVING until told otherwise), changes only
// through SetServing, Watch follows it, ShutdownHealth ends the watches.
#include "tandem/rpc/server.h"

#include <gtest/gtest.h>

#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace tandem::rpc {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EnableReflectionAndHealth();
    grpc::ServerBuilder builder;
    auto server = BuildAndStart(&builder, ServerOptions{.listen_address = "127.0.0.1:0"}, &port_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    stub_ = Health::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  grpc::Status Check(const std::string& service, HealthCheckResponse::ServingStatus* status) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::Status s = stub_->Check(&context, request, &response);
    *status = response.status();
    return s;
  }

  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(HealthTest, NotServingUntilSetServing) {
  HealthCheckResponse::ServingStatus status;
  ASSERT_TRUE(Check("", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check("tandem.v1.Worker", &status).error_code(), grpc::StatusCode::NOT_FOUND);

  SetServing(server_.get(), "tandem.v1.Worker", false);
  ASSERT_TRUE(Check("tandem.v1.Worker", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::NOT_SERVING);

  SetServing(server_.get(), "tandem.v1.Worker", true);
  ASSERT_TRUE(Check("", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::SERVING);
  ASSERT_TRUE(Check("tandem.v1.Worker", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::SERVING);

  SetServing(server_.get(), "tandem.v1.Worker", false);
  ASSERT_TRUE(Check("", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthTest, WatchFollowsTheStatusUntilShutdown) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  HealthCheckRequest request;
  request.set_service("tandem.v1.Generation");
  auto reader = stub_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);

  SetServing(server_.get(), "tandem.v1.Generation", true);
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  ShutdownHealth(server_.get());
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_TRUE(reader->Finish().ok());

  // No change after shutdown.
  SetServing(server_.get(), "tandem.v1.Generation", true);
  HealthCheckResponse::ServingStatus status;
  ASSERT_TRUE(Check("tandem.v1.Generation", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthTest, CancelledWatchEnds) {
  auto context = std::make_unique<grpc::ClientContext>();
  auto reader = stub_->Watch(context.get(), HealthCheckRequest());
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  context->TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server shuts down promptly (no watch left behind).
  const auto start = std::chrono::steady_clock::now();
  server_->Shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ServerTest, OnlyLoopbackAddressesCountAsLoopback) {
  for (const char* a : {"127.0.0.1:50051", "127.0.0.2:0", "[::1]:9000", "localhost:1"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a :
       {"0.0.0.0:50051", "[::]:50051", "10.0.0.5:1", ":50051", "example.com:1", "128.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

}  // namespace
}  // namespace tandem::rpc
