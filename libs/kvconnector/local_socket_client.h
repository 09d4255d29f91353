// The client side of the KV-store's local socket (services/kvstore/
// bulk_load_server.h, "Local socket"): a load from a store on this host
// reads the blocks in place from the store's hot tier, which it maps from
// the memfd the store passes on each connection, instead of receiving them
// through TCP; a store writes them in place, into the hot-tier slots the
// store reserves for them. Private to KvStoreClient, which tries it before
// the bulk port and falls back to that when it answers nullopt.
//
// Why: the bulk port's TCP path copies each byte twice (into the kernel's
// socket buffer and out of it); here it is copied once, by the reader into
// its destination, or by the writer into the slot it will be served from.
// One run of bench_kvstore on the 2-core VM, hot-tier loads of 64 KiB /
// 2 MiB blocks: 6.51 / 10.22 GB/s here, 3.76 / 5.09 over the bulk port,
// 2.02 / 3.19 for redis GET (DESIGN-NOTES.md, "Loads from a store on the
// same host"; stores: "Stores into a store on the same host").
//
// Finding it: the store advertises the path and its host id (the kernel's
// boot id) in StatsResponse; the client uses it only when the host id is
// its own and the path connects (in Kubernetes, pods that share no volume
// do not see each other's socket). Otherwise, or when a connection fails,
// it is looked up again 10 s later.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/common/block_hash.h"
#include "tandem/common/ids.h"
#include "tandem/kvconnector/kvstore_client_types.h"
#include "tandem/kvtypes/kv_types.h"

namespace tandem::kvconnector {

class LocalSocketClient {
 public:
  // The store's advertised local socket path and host id (either empty:
  // none); called with no lock of this class held.
  using Discover = std::function<absl::StatusOr<std::pair<std::string, std::string>>()>;

  // `io_timeout_ms`: each connection's send and receive timeout.
  LocalSocketClient(int64_t io_timeout_ms, Discover discover);
  ~LocalSocketClient();
  LocalSocketClient(const LocalSocketClient&) = delete;
  LocalSocketClient& operator=(const LocalSocketClient&) = delete;

  // Loads as KvStoreClient::Load does. nullopt when the store has no local
  // socket for this host or it cannot be reached, and nothing was loaded.
  std::optional<absl::StatusOr<std::vector<BlockLoadResult>>> Load(
      std::string_view ns, std::span<const BlockHash> hashes,
      std::span<const std::span<uint8_t>> dst, LeaseId lease);

  // Stores as KvStoreClient::Store does, writing each block the store
  // gives a hot slot straight into it (the others go inline). nullopt when
  // the store has no local socket for this host or it cannot be reached,
  // or the batch is over the socket's limits, and nothing was stored.
  std::optional<absl::StatusOr<std::vector<BlockStoreResult>>> Store(
      std::string_view ns, std::span<const BlockHash> hashes,
      std::span<const std::span<const uint8_t>> src, std::optional<kvstore::Durability> durability);

  // Loads and stores served this way so far (tests, benchmarks).
  [[nodiscard]] uint64_t loads() const;
  [[nodiscard]] uint64_t stores() const;

 private:
  struct Mapping;
  struct Connection;
  // A connection's kind: its preface, and how it maps the hot tier
  // (read-only for loads, read-write for stores).
  enum Use { kLoads = 0, kStores = 1 };
  // The socket's path, looking it up when due; nullopt when there is none.
  std::optional<std::string> FindPath();
  std::unique_ptr<Connection> Dial(const std::string& path, Use use);
  // An idle connection of that kind, or a new one; null when none connects.
  std::unique_ptr<Connection> Take(const std::string& path, Use use, bool* pooled);
  // Keeps a connection for the next call of its kind.
  void Give(std::unique_ptr<Connection> conn, Use use);
  // Drops the idle connections of that kind (one the store closed makes
  // every pooled one suspect).
  void ClearIdle(Use use);
  // Forgets the path and the idle connections until the next lookup is due.
  void MarkUnusable(const std::string& why);

  const int64_t io_timeout_ms_;
  const Discover discover_;
  std::mutex lookup_mu_;  // one lookup at a time
  mutable std::mutex mu_;
  std::optional<std::string> path_;
  std::chrono::steady_clock::time_point next_lookup_{};
  std::shared_ptr<const Mapping> mapping_[2];  // of the newest connection of each use
  std::vector<std::unique_ptr<Connection>> idle_[2];
  uint64_t loads_ = 0;
  uint64_t stores_ = 0;
};

}  // namespace tandem::kvconnector
