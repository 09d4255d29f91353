// The client side of the KV-store's bulk load port
// (services/kvstore/bulk_load_server.h has the protocol and why it exists).
// Private to KvStoreClient, which tries it first for every Load and uses the
// gRPC stream when it answers nullopt.
//
// Finding the port: the store advertises it in StatsResponse.bulk_load_port;
// the host is the client's target's. KvStoreClientOptions.bulk_load_target
// overrides both (a proxy or a Kubernetes Service that maps ports).
// When the store advertises no port, or the port cannot be reached, loads go
// over gRPC and the port is looked up again 10 s later. A port that refuses a
// connection is looked up again at once, first: a store that restarted on a
// new port is used again from the next load on.
//
// Connections are pooled: a load takes an idle one (or opens one), and
// gives it back after the load's final frame. A pooled connection the store
// has closed in the meantime (idle timeout, restart) fails before any byte
// of its answer; the load is then retried once on a new connection.
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
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/socket_tls.h"

namespace tandem::v1 {
class LoadRequest;
}  // namespace tandem::v1

namespace tandem::kvconnector {

class BulkLoadClient;

// One load's answer on a bulk-port or local-socket connection.
struct LoadAnswer {
  std::vector<BlockLoadResult> results;  // kFailed where not answered
  size_t finished = 0;                   // blocks answered (hit or miss)
  bool done = false;                     // the done frame came
  absl::Status done_status;              // its status
  absl::Status io;                       // the connection's error, if it broke
  // Reporting corrupt blocks broke the connection after the done frame.
  bool reported_broke = false;
};
// True when a call on a bulk-port or local-socket connection got no answer
// because the connection timed out: the store took the request and stalled
// (a connection the store closed or reset fails at once instead). Trying
// again on a new connection, or on another path to the same store, would
// wait out another deadline, so the call fails at once with Stalled's
// error, and the caller recomputes or drops what it asked for.
inline bool TimedOut(const absl::Status& io) { return absl::IsDeadlineExceeded(io); }
absl::Status Stalled(const absl::Status& io, std::string_view what);
// Sends `req` and reads its answer into dst (one buffer per hash): payload
// bytes from the socket, or, for a chunk in shared memory, from `shared`
// (the store's hot tier, mapped). Verifies every block's CRC32C, zeroes and
// reports (LoadRequest.corrupt_block_hashes) the ones that fail it.
LoadAnswer ReadLoadAnswer(rpc::FramedSocket* sock, const v1::LoadRequest& req,
                          std::span<const std::span<uint8_t>> dst,
                          std::span<const std::byte> shared = {});

// Idle connections of one kind (one preface) to the bulk port, kept for the
// next call: the load and the store clients each keep one.
class BulkConnectionPool {
 public:
  static constexpr size_t kMaxIdle = 16;

  // Dials through `dialer` (not owned) with `preface`; new connections get
  // `io_timeout_ms` as their send and receive timeout.
  BulkConnectionPool(const BulkLoadClient* dialer, std::string_view preface, int64_t io_timeout_ms)
      : dialer_(dialer), preface_(preface), io_timeout_ms_(io_timeout_ms) {}

  // An idle connection (sets *pooled) or a new one to `addr`; null when
  // none can be opened.
  std::unique_ptr<rpc::FramedSocket> Take(const std::pair<std::string, std::string>& addr,
                                          bool* pooled);
  // Keeps `sock` for a later Take (beyond kMaxIdle it is closed).
  void Give(std::unique_ptr<rpc::FramedSocket> sock);
  // Closes every idle connection (the store closed one: all are suspect).
  void Clear();

 private:
  const BulkLoadClient* const dialer_;
  const std::string_view preface_;
  const int64_t io_timeout_ms_;
  std::mutex mu_;
  std::vector<std::unique_ptr<rpc::FramedSocket>> idle_;
};

class BulkLoadClient {
 public:
  // `discover_port` asks the store for its bulk load port (0 = off); it is
  // called with no lock of this class held.
  BulkLoadClient(const KvStoreClientOptions& options,
                 std::function<absl::StatusOr<uint32_t>()> discover_port);

  // Loads as KvStoreClient::Load does. nullopt when the bulk port is off or
  // unreachable and nothing was loaded: use the gRPC stream.
  std::optional<absl::StatusOr<std::vector<BlockLoadResult>>> Load(
      std::string_view ns, std::span<const BlockHash> hashes,
      std::span<const std::span<uint8_t>> dst, LeaseId lease);

  // Loads served over the port so far (tests).
  [[nodiscard]] uint64_t loads() const;

  using Address = std::pair<std::string, std::string>;  // host, port
  // The port's address, looking it up when due; nullopt when off or not
  // found (looked up again 10 s later).
  std::optional<Address> FindAddress();
  // Forgets the address, so that the next FindAddress() asks the store again
  // at once (the port refused a connection: the store may have restarted on
  // another one).
  void ForgetAddress();
  // Connects to the port (waiting at most `timeout_ms`, which also becomes
  // the socket's send and receive timeout), runs the TLS handshake when the
  // process's client TLS was on when this client was made
  // (rpc::ClientSocketTls, as the client's gRPC channel), and sends
  // `preface`; null on failure.
  std::unique_ptr<rpc::FramedSocket> Dial(const Address& addr, std::string_view preface,
                                          int64_t timeout_ms) const;

 private:
  // Forgets the address (and the pool) until the next lookup is due.
  void MarkUnreachable();

  const KvStoreClientOptions opts_;
  const std::function<absl::StatusOr<uint32_t>()> discover_port_;
  const std::shared_ptr<rpc::SocketTlsContext> tls_;  // null: plain TCP

  std::mutex lookup_mu_;  // serializes FindAddress: one lookup of the port at a time
  mutable std::mutex mu_;
  std::optional<Address> address_;
  std::chrono::steady_clock::time_point next_lookup_{};
  BulkConnectionPool pool_;
  uint64_t loads_ = 0;
};

}  // namespace tandem::kvconnector
