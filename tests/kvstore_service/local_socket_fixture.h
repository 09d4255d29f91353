// The fixture of the local socket's tests (local_load_test, local_store_test):
// a store with a shared hot tier holding six 64 KiB test blocks (ids 1-6,
// namespace "ns") and one 2.5 MiB block (id 100, namespace "big"), its bulk
// port with the local socket, its gRPC service, and a KV client of it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../kvstore/test_util.h"
#include "bulk_load_server.h"
#include "bulk_test_store.h"
#include "gtest/gtest.h"
#include "kvstore_service.h"
#include "loopback_server.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/rpc/framed_socket.h"

namespace tandem::testutil {

class LocalSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = OpenBulkTestStore(dir_.path(), {{"ns", kBulkBlock}, {"big", kBulkBigBlock}},
                                             /*share_hot_tier=*/true);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    for (uint64_t id = 1; id <= 6; ++id) {
      ASSERT_TRUE(PutTestBlock(store_.get(), "ns", id, kBulkBlock).ok());
    }
    ASSERT_TRUE(PutTestBlock(store_.get(), "big", 100, kBulkBigBlock).ok());
    socket_ = dir_.path() + "/kv.sock";
    auto bulk =
        kvstore_service::BulkLoadServer::Start(store_.get(), {.debug_before_load = stall_.Hook(),
                                                              .debug_before_store = stall_.Hook(),
                                                              .local_socket = socket_});
    ASSERT_TRUE(bulk.ok()) << bulk.status();
    bulk_ = std::move(*bulk);
    service_ = std::make_unique<kvstore_service::KvStoreServiceImpl>(
        store_.get(),
        kvstore_service::KvStoreServiceOptions{.bulk_load = bulk_.get(),
                                               .debug_before_store = [this] { ++grpc_stores_; },
                                               .debug_before_load = [this] { ++grpc_loads_; }});
    LoopbackServer s = StartOnLoopback(service_.get());
    ASSERT_NE(s.server, nullptr);
    server_ = std::move(s.server);
    target_ = s.target;
    auto client = kvconnector::KvStoreClient::Create({.target = s.target, .bulk_lookup = false});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  void TearDown() override {
    stall_.gate.Open();
    if (map_ != nullptr) munmap(map_, map_size_);
    client_.reset();
    if (server_) server_->Shutdown();
    if (bulk_) bulk_->Shutdown();
  }

  struct Loaded {
    absl::StatusOr<std::vector<kvconnector::BlockLoadResult>> results;
    std::vector<std::vector<uint8_t>> bufs;
  };
  Loaded Load(const std::string& ns, const std::vector<uint64_t>& ids, uint64_t size) {
    Loaded out;
    std::vector<BlockHash> hashes;
    for (uint64_t id : ids) hashes.push_back(kvstore::testing::TestHash(id));
    out.bufs.assign(ids.size(), std::vector<uint8_t>(size, 0xEE));
    std::vector<std::span<uint8_t>> dst(out.bufs.begin(), out.bufs.end());
    out.results = client_->Load(ns, hashes, dst, LeaseId(0));
    return out;
  }

  // A local-socket connection by hand: `preface`, then the hot tier's
  // memfd, mapped with `prot` into map_ (map_size_ bytes; the last such
  // mapping, unmapped at the end). Null when any of it fails.
  std::unique_ptr<rpc::FramedSocket> DialLocal(std::string_view preface, int prot) {
    if (map_ != nullptr) munmap(map_, map_size_);
    map_ = nullptr;
    auto sock = rpc::FramedSocket::ConnectUnix(socket_, 5'000);
    if (!sock.ok()) return nullptr;
    const auto* bytes = reinterpret_cast<const uint8_t*>(preface.data());
    if (!(*sock)->WriteRaw({bytes, preface.size()}).ok()) return nullptr;
    uint8_t size_le[8];
    int fd = -1;
    if (!(*sock)->ReceiveWithFd(size_le, &fd).ok() || fd < 0) return nullptr;
    map_size_ = 0;
    for (int i = 0; i < 8; ++i) map_size_ |= uint64_t{size_le[i]} << (8 * i);
    void* map = mmap(nullptr, map_size_, prot, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return nullptr;
    map_ = static_cast<uint8_t*>(map);
    return std::move(*sock);
  }

  // Every load and store batch over the local socket and the bulk port
  // passes it (a store that took the call and stalled).
  StallSwitch stall_;
  std::atomic<int> grpc_loads_{0};
  std::atomic<int> grpc_stores_{0};

  kvstore::testing::TempDir dir_;
  std::string target_;      // the gRPC service's
  uint8_t* map_ = nullptr;  // of the last DialLocal()
  uint64_t map_size_ = 0;
  std::string socket_;
  std::unique_ptr<kvstore::KvStoreEngine> store_;
  std::unique_ptr<kvstore_service::BulkLoadServer> bulk_;
  std::unique_ptr<kvstore_service::KvStoreServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<kvconnector::KvStoreClient> client_;
};

}  // namespace tandem::testutil
