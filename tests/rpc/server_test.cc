// rpc::BuildAndStart's health service: NOT_SERVING from the start (gRPC's
// default health service says SERVING until told otherwise), changes only
// through SetServing, Watch follows it, ShutdownHealth ends the watches.
#include "tandem/rpc/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "ping_test_util.h"

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

// A TCP proxy to 127.0.0.1:target_port that holds every connection for
// `delay` before it connects onwards: a peer too busy to answer a handshake
// at once.
class SlowProxy {
 public:
  SlowProxy(int target_port, std::chrono::milliseconds delay) : target_port_(target_port) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listener_, 16) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "proxy listener: " << strerror(errno);
      return;
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this, delay] {
      while (!stop_) {
        pollfd p{.fd = listener_, .events = POLLIN, .revents = 0};
        if (poll(&p, 1, 50) <= 0) continue;
        const int client = accept(listener_, nullptr, nullptr);
        if (client < 0) continue;
        pumps_.emplace_back([this, client, delay] {
          std::this_thread::sleep_for(delay);
          const int upstream = socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in to{};
          to.sin_family = AF_INET;
          to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          to.sin_port = htons(static_cast<uint16_t>(target_port_));
          if (connect(upstream, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0)
            Pump(client, upstream);
          close(upstream);
          close(client);
        });
      }
    });
  }
  ~SlowProxy() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : pumps_) t.join();
    close(listener_);
  }
  int port() const { return port_; }

 private:
  void Pump(int a, int b) {
    char buf[16384];
    while (!stop_) {
      pollfd p[2] = {{.fd = a, .events = POLLIN, .revents = 0},
                     {.fd = b, .events = POLLIN, .revents = 0}};
      if (poll(p, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (p[i].revents == 0) continue;
        const ssize_t n = read(p[i].fd, buf, sizeof buf);
        if (n <= 0 || write(p[1 - i].fd, buf, static_cast<size_t>(n)) != n) return;
      }
    }
  }

  int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;
};

// A peer that takes longer than a few hundred milliseconds to finish the
// handshake (a loaded machine) still gets the call: CreateChannel's channels
// give a connection attempt 5 s, and a call without
// wait_for_ready fails as soon as an attempt does. With the old 100 ms this
// failed with "connection attempt timed out before receiving SETTINGS frame".
TEST_F(HealthTest, ASlowHandshakeIsNotAFailedConnection) {
  SlowProxy proxy(port_, std::chrono::milliseconds(600));
  auto stub = Health::NewStub(CreateChannel("127.0.0.1:" + std::to_string(proxy.port())));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckResponse response;
  const grpc::Status s = stub->Check(&context, HealthCheckRequest(), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Tandem's channels ping every 10 s while idle (DefaultChannelArguments);
// every server keeps them (AcceptClientPings). The servers built without
// BuildAndStart (the KV-store's tests and benches) had gRPC's default policy
// and logged "too_many_pings" GOAWAYs.
TEST(PingPolicyTest, AcceptClientPingsKeepsAPingingClientConnected) {
  grpc::ServerBuilder with;
  AcceptClientPings(&with);
  EXPECT_TRUE(testing::StaysConnectedWhilePinging(&with, 5));
  grpc::ServerBuilder without;  // the test can fail: gRPC's default drops it
  EXPECT_FALSE(testing::StaysConnectedWhilePinging(&without, 5));
}

}  // namespace
}  // namespace tandem::rpc
