// The KV-store's servers keep rpc::AcceptClientPings' policy however they
// are built: kvstore_service::ConfigureServerBuilder applies it (the servers
// of KvStoreServer::Listen and the benches are not built by BuildAndStart).
#include "../rpc/ping_test_util.h"
#include "kvstore_service.h"

namespace tandem::kvstore_service {
namespace {

TEST(KvStorePingPolicyTest, ConfigureServerBuilderKeepsAPingingClientConnected) {
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder);
  EXPECT_TRUE(testing::StaysConnectedWhilePinging(&builder, 5));
}

}  // namespace
}  // namespace tandem::kvstore_service
