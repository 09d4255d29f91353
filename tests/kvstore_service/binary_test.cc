// The tandem-kvstore binary: --help, serving, SIGTERM drain, and blocks that
// survive a clean restart and kill -9 (wal durability).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../kvstore/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "grpcpp/create_channel.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem {
namespace {

using kvstore::testing::TempDir;
using kvstore::testing::TestHash;
using kvstore::testing::TestPayload;
using ::testing::HasSubstr;

constexpr uint64_t kBlock = 32 << 10;

std::string RunForOutput(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

class Server {
 public:
  explicit Server(const std::string& dir, const std::string& extra_flag = "--durability=wal")
      : dir_(dir) {
    std::remove((dir_ + "/port").c_str());
    pid_ = fork();
    if (pid_ == 0) {
      const std::string port_file = "--port-file=" + dir_ + "/port";
      const std::string data = "--data-dir=" + dir_ + "/data";
      execl(TANDEM_KVSTORE_BINARY, TANDEM_KVSTORE_BINARY, "--listen=127.0.0.1:0",
            port_file.c_str(), data.c_str(), "--hot-capacity-bytes=4194304",
            "--hot-slot-bytes=65536", "--durability=wal", extra_flag.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 1000 && port_.empty(); ++i) {
      std::ifstream f(dir_ + "/port");
      std::getline(f, port_);
      if (port_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Sends `sig` and returns the exit status.
  int Stop(int sig) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  ~Server() {
    if (pid_ > 0) Stop(SIGKILL);
  }
  std::string target() const { return "127.0.0.1:" + port_; }

 private:
  std::string dir_;
  std::string port_;
  pid_t pid_ = -1;
};

std::unique_ptr<kvconnector::KvStoreClient> Connect(const Server& s) {
  auto c = kvconnector::KvStoreClient::Create({.target = s.target(), .lookup_deadline_ms = 5000});
  EXPECT_TRUE(c.ok());
  return std::move(*c);
}

// Stores blocks [from, to) and checks the acks.
void StoreRange(kvconnector::KvStoreClient* c, uint64_t from, uint64_t to) {
  std::vector<BlockHash> hashes;
  std::vector<std::vector<uint8_t>> payloads;
  for (uint64_t i = from; i < to; ++i) {
    hashes.push_back(TestHash(i));
    payloads.push_back(TestPayload(i, kBlock));
  }
  std::vector<std::span<const uint8_t>> src(payloads.begin(), payloads.end());
  auto r = c->Store("ns", hashes, src);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& b : *r) ASSERT_TRUE(b.status.ok()) << b.status;
}

// Lookup and load of blocks [0, n): every one present with its bytes.
void ExpectBlocks(kvconnector::KvStoreClient* c, uint64_t n) {
  std::vector<BlockHash> hashes;
  for (uint64_t i = 0; i < n; ++i) hashes.push_back(TestHash(i));
  auto lookup = c->Lookup("ns", hashes, {.take_lease = false})->Wait();
  ASSERT_TRUE(lookup.status.ok()) << lookup.status;
  EXPECT_EQ(lookup.num_hits, static_cast<int32_t>(n));
  std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(kBlock));
  std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
  auto r = c->Load("ns", hashes, dst);
  ASSERT_TRUE(r.ok()) << r.status();
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_TRUE((*r)[i].ok()) << i;
    EXPECT_EQ(bufs[i], TestPayload(i, kBlock)) << i;
  }
}

TEST(KvStoreBinaryTest, HelpDocumentsFlagsAndDefaults) {
  const std::string out = RunForOutput(std::string(TANDEM_KVSTORE_BINARY) + " --help 2>&1");
  for (const char* s : {"--listen", "127.0.0.1:50070", "--data-dir", "--hot-capacity-bytes",
                        "--cold-capacity-bytes", "--durability", "wal", "--lease-ttl-ms",
                        "--bulk-load-listen", "--bulk-load-max-connections"}) {
    EXPECT_THAT(out, HasSubstr(s));
  }
}

TEST(KvStoreBinaryTest, ServesAcrossCleanRestartAndKill9) {
  TempDir dir;
  {
    Server server(dir.path());
    auto c = Connect(server);
    ASSERT_TRUE(c->CreateNamespace({.name = "ns", .block_bytes = kBlock}).ok());
    StoreRange(c.get(), 0, 20);
    ExpectBlocks(c.get(), 20);
    EXPECT_EQ(c->bulk_loads(), 1u);  // the bulk load port is on by default
    const int status = server.Stop(SIGTERM);  // drains and exits cleanly
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  {
    Server server(dir.path());
    auto c = Connect(server);
    ExpectBlocks(c.get(), 20);
    StoreRange(c.get(), 20, 40);
    server.Stop(SIGKILL);  // acknowledged wal stores survive kill -9
  }
  {
    Server server(dir.path());
    auto c = Connect(server);
    ExpectBlocks(c.get(), 40);
  }
}

// gRPC refuses a message over kvstore_service::kMaxReceiveMessageBytes before
// the store reads it; the biggest message a client sends (3 MiB of pieces)
// still goes through.
TEST(KvStoreBinaryTest, MessagesPastWhatAClientSendsAreRefusedUnread) {
  TempDir dir;
  Server server(dir.path());
  auto c = kvconnector::KvStoreClient::Create(
      {.target = server.target(), .lookup_deadline_ms = 5000, .store_chunk_bytes = 3 << 20});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->CreateNamespace({.name = "ns", .block_bytes = kBlock}).ok());
  // 90 blocks of 32 KiB: one Store message of 2.8 MiB.
  std::vector<BlockHash> hashes;
  std::vector<std::vector<uint8_t>> payloads;
  for (uint64_t i = 0; i < 90; ++i) {
    hashes.push_back(TestHash(i));
    payloads.push_back(TestPayload(i, kBlock));
  }
  std::vector<std::span<const uint8_t>> src(payloads.begin(), payloads.end());
  auto stored = (*c)->Store("ns", hashes, src);
  ASSERT_TRUE(stored.ok()) << stored.status();
  for (const auto& b : *stored) EXPECT_TRUE(b.status.ok()) << b.status;
  // 160 blocks (5 MiB) in one message: refused whole.
  v1::StoreRequest msg;
  msg.set_namespace_("ns");
  for (uint64_t i = 100; i < 260; ++i) {
    v1::StoreChunk* chunk = msg.add_chunks();
    chunk->set_block_hash(TestHash(i).ToBytes());
    chunk->set_total_size(kBlock);
    const std::vector<uint8_t> payload = TestPayload(i, kBlock);
    chunk->set_data(payload.data(), payload.size());
    chunk->set_last(true);
  }
  auto stub = v1::KvStore::NewStub(
      grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::StoreResponse resp;
  auto writer = stub->Store(&ctx, &resp);
  writer->Write(msg);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  std::vector<BlockHash> refused = {TestHash(100), TestHash(259)};
  auto lookup = (*c)->Lookup("ns", refused, {.take_lease = false})->Wait();
  ASSERT_TRUE(lookup.status.ok()) << lookup.status;
  EXPECT_EQ(lookup.num_hits, 0);
}

TEST(KvStoreBinaryTest, WithTheBulkLoadPortOffLoadsGoOverGrpc) {
  TempDir dir;
  Server server(dir.path(), "--bulk-load-listen=off");
  auto c = Connect(server);
  ASSERT_TRUE(c->CreateNamespace({.name = "ns", .block_bytes = kBlock}).ok());
  StoreRange(c.get(), 0, 5);
  ExpectBlocks(c.get(), 5);
  EXPECT_EQ(c->bulk_loads(), 0u);
}

TEST(KvStoreBinaryTest, ABadBulkLoadAddressIsRefusedAtStartup) {
  TempDir dir;
  const std::string out = RunForOutput(std::string(TANDEM_KVSTORE_BINARY) + " --data-dir=" +
                                       dir.path() + " --bulk-load-listen=nohostport 2>&1; echo rc=$?");
  EXPECT_THAT(out, HasSubstr("--bulk-load-listen"));
  EXPECT_THAT(out, HasSubstr("rc=2"));
}

}  // namespace
}  // namespace tandem
