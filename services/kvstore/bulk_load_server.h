// The bulk load port: the KV-store's Load, and Lookup, served over plain TCP
// beside gRPC.
//
// It changes DESIGN §5 three ways (Load beside gRPC, the reader verifies,
// Lookup beside gRPC); why, with the measurements, is in DESIGN-NOTES.md
// ("The KV-store's bulk port"). The gRPC Load and Lookup stay, unchanged,
// for every client (grpcurl, Python, ours when this port is off or down).
//
// The service advertises the port in StatsResponse.bulk_load_port; the KV
// client (libs/kvconnector) finds it there and uses it for Load, falling
// back to the gRPC stream when the port is off or cannot be reached.
//
// Protocol (frames: rpc::FramedSocket, a 4-byte little-endian length and a
// serialized message; all messages are in protos/tandem/v1/kvstore.proto):
//   1. The client sends the 8-byte preface "TKVBULK1" (rpc::kKvBulkLoadPreface)
//      once per connection
//      (the server closes a connection that starts with anything else, so a
//      misdirected HTTP/2 or HTTP client fails fast).
//   2. Any number of loads, one at a time. The client sends a LoadRequest
//      frame (as for gRPC Load). The server answers, for each hash in
//      request order, a BulkLoadFrame whose `chunk` is the whole block
//      (block_index, last = true, ok = true, total_size, checksum) followed
//      by total_size raw payload bytes, or a miss (ok = false,
//      miss_reason); then a BulkLoadFrame with done = true and the load's
//      status (status_code 0 = OK). A load that cannot start (unknown
//      namespace -> NOT_FOUND, a hash that is not 32 bytes ->
//      INVALID_ARGUMENT) answers only the done frame, with its error; an I/O
//      error midway ends the blocks early and the done frame carries it.
//   3. The reader verifies every block: the CRC32C of the payload bytes must
//      equal chunk.checksum (written with the block). On a mismatch it must
//      not use the bytes, and it reports the block in a LoadRequest's
//      corrupt_block_hashes (with the namespace; block_hashes may be empty),
//      answered like any load. The server verifies each reported block
//      itself and drops it when it is corrupt; an intact one is kept.
//      On this port the store does not verify before sending (the gRPC
//      Load does).
//   4. The request's lease (if not 0) is released when the load ends, as
//      for gRPC Load: before the done frame goes out (a client that sees the
//      end sees the lease gone), or when the connection breaks.
// A frame that is not a LoadRequest, or is over 16 MiB
// (rpc::kKvBulkLoadMaxRequestBytes, about 470,000 hashes), is answered with a
// done frame carrying INVALID_ARGUMENT, and the connection is closed.
//
// Lookup connections: a connection that opens with the preface "TKVLOOK1"
// (rpc::kKvBulkLookupPreface) carries lookups. The client sends LookupRequest
// frames (as for gRPC Lookup, release_lease_ids included) without waiting
// for answers; the server answers each, in order, with a BulkLookupAnswer
// (status_code 0 and the LookupResponse, or the lookup's error: NOT_FOUND for
// an unknown namespace, INVALID_ARGUMENT naming a hash that is not 32
// bytes). A frame that does not parse is answered with INVALID_ARGUMENT and
// the connection is closed. There is no deadline on the wire: a client that
// gave up on a lookup still reads its answer and releases its lease. Lookup
// connections are not closed for being idle. The scheduler's
// KV client keeps one such connection (libs/kvconnector/bulk_lookup_client.h)
// and falls back to gRPC whenever it is down.
//
// Store connections: a connection that opens with the preface "TKVSTOR1"
// (rpc::kKvBulkStorePreface) carries stores, one batch at a time. The client
// sends a BulkStoreRequest frame (namespace, durability, and per block its
// 32-byte hash, size and CRC32C) followed by the blocks' payload bytes back
// to back, blocks[i].size bytes each in request order, whatever the sizes
// (so the framing survives a block of the wrong size). With
// checksums_follow, the CRC32Cs come after the payload instead, in a
// BulkStoreChecksums frame with one per block (another count is
// INVALID_ARGUMENT and closes the connection). The server receives
// the whole batch (at most rpc::kKvBulkStoreMaxBatchBytes, 256 MiB) before
// it stores any of it, so a connection that breaks mid-payload stores
// nothing, then stores it with one RocksDB write (KvStoreEngine::StoreBatch)
// and answers one BulkStoreAnswer: status_code 0 and a StoreResponse with
// one BlockStatus per block, exactly as the gRPC Store answers (ok,
// already_present; a bad block fails only itself: INVALID_ARGUMENT for a
// hash that is not 32 bytes or a size other than the namespace's, DATA_LOSS
// for a checksum that does not match; a mismatched block keeps the first
// write), or the batch's error with no statuses, as the gRPC Store fails the
// call: NOT_FOUND for an unknown namespace, INVALID_ARGUMENT for an unknown
// durability. A frame that does not parse, or a batch over the size limit,
// is answered with INVALID_ARGUMENT and the connection is closed. The KV
// client stores this way when the port is up (libs/kvconnector/
// bulk_store_client.h) and over gRPC otherwise. DESIGN-NOTES.md ("Stores
// over the bulk port") has why and the figures.
//
// Threads: one acceptor, and one thread per connection (a connection
// serves one load or lookup at a time; the worker keeps one connection per
// transfer thread, a scheduler one lookup connection). Connections beyond max_connections are
// closed on accept, and the client then uses gRPC. A send that makes no progress for io_timeout_ms
// closes the connection, which bounds how long a stalled client keeps a
// block pinned; a connection idle for idle_timeout_ms between loads is
// closed.
//
// Local socket: with BulkLoadServerOptions::local_socket set (and the hot
// tier shared: KvStoreOptions::share_hot_tier), the server also listens on
// that Unix-domain path (created mode 0600: the store's user only) for loads
// that read the hot tier in place. A connection opens with the preface
// "TKVSHM01" (rpc::kKvLocalLoadPreface); the server answers with 8 bytes,
// the hot tier's size (little-endian), sent with the tier's memfd
// (SCM_RIGHTS), which the client maps read-only. Loads then go as on the
// bulk port (LoadRequest, one BulkLoadFrame per block, a done frame), except
// that the server first pins the request's leading hits under a lease of its
// own (a Lookup that stages cold hits into the hot tier), and each pinned
// block in the hot tier is answered with chunk.in_shared_memory and its
// shared_offset instead of payload bytes: the client copies it out of the
// mapping (to a GPU, or to its staging memory) and verifies the CRC32C
// itself. Other blocks come inline as on the bulk port. The pins hold until
// the client's next frame on the connection (it sends an empty LoadRequest,
// answered with a done frame, once it has copied the blocks) or until the
// connection ends.
//   A connection that opens with "TKVSHS01" (rpc::kKvLocalStorePreface)
// instead carries stores, written in place: it gets the memfd the same way,
// which the client maps read-write. Each batch goes as on the bulk port's
// store connections, except that after the BulkStoreRequest (with
// checksums_follow) the server reserves a hot slot for each block it will
// keep in the hot tier (KvStoreEngine::ReserveHotSlots) and answers a
// BulkStoreSlots frame with each block's offset in the shared memory, or -1.
// Then, block by block in request order, the client writes the block into
// its slot or sends its payload inline; after block i, when the blocks since
// the last frame hold at least rpc::kKvLocalStoreChecksumBytes or i is the
// last (rpc::KvLocalStoreChecksumsDue), it sends a BulkStoreChecksums frame
// with those blocks' CRC32Cs (another count is INVALID_ARGUMENT and closes
// the connection). The server checks those slots' CRC32Cs against the
// writer's while the client writes the next blocks, and stores the batch. A
// request without checksums_follow is refused (INVALID_ARGUMENT, in the
// slots frame). A slot is not served to anyone before its
// block is stored, and goes back to the tier when it is not (a failed
// checksum, the connection ending). A client that writes into the mapping
// outside its slots, or after its batch is answered, corrupts blocks; every
// reader checks the CRC32C, so that is a miss, not a wrong token.
// The socket's file permissions are its access control:
// it does not speak TLS and checks no role. The KV client uses it when the
// store advertises it (StatsResponse.local_socket) with its own host id
// (the kernel's boot id), and falls back to the bulk port otherwise.
//
// TLS: a store with TLS (--tls-cert) serves this port under TLS too, with
// the gRPC port's files, reloads and roles (rpc/socket_tls.h): the client
// starts the handshake before the preface. Under mutual TLS (--tls-ca) a
// load connection is open to the roles that may call gRPC's
// tandem.v1.KvStore/Load, and a lookup connection to those of Lookup
// (method_roles.h); another role's first request is answered with
// PERMISSION_DENIED (a done frame, or a BulkLookupAnswer) naming the method,
// the roles and the peer, and the connection is closed. A handshake that
// fails (no client certificate, an unknown CA, a client speaking plain TCP)
// closes the connection, is logged and counted. A store connection is
// open to the roles of tandem.v1.KvStore/Store.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/socket_tls.h"
#include "tandem/rpc/tls.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvstore_service {

struct BulkLoadServerOptions {
  // Address to listen on; port 0 picks a free one (see BulkLoadServer::port).
  std::string host = "127.0.0.1";
  int port = 0;
  int32_t max_connections = 64;
  int64_t io_timeout_ms = 30'000;
  int64_t idle_timeout_ms = 300'000;
  // Tests only: each lookup sleeps this long first (a slow store), as
  // KvStoreServiceOptions::debug_lookup_delay_ms does for gRPC lookups.
  int64_t debug_lookup_delay_ms = 0;
  // Tests only: each load sleeps this long first (a slow transfer), as
  // KvStoreServiceOptions::debug_load_delay_ms does for gRPC loads.
  int64_t debug_load_delay_ms = 0;
  // Tests only: runs at the start of each load, on the connection's thread,
  // over the bulk port and the local socket (a store that stalls until the
  // test lets it go); empty = off.
  std::function<void()> debug_before_load;
  // Tests only: likewise at the start of each store batch, once its request
  // is read; empty = off.
  std::function<void()> debug_before_store;
  // TLS on the port when enabled() (the store's --tls-* flags); plain TCP
  // otherwise.
  rpc::TlsOptions tls;
  // Tests only: as KvStoreServiceOptions::debug_corrupt_*_every, for the
  // blocks stored over this port.
  int32_t debug_corrupt_hot_every = 0;
  int32_t debug_corrupt_cold_every = 0;
  // Unix-domain path of the local socket (see above); empty = none. Needs
  // the store's hot tier shared (KvStoreOptions::share_hot_tier). A stale
  // socket file at the path is replaced.
  std::string local_socket;

  [[nodiscard]] absl::Status Validate() const;
};

struct BulkLoadServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_rejected = 0;  // over max_connections
  uint64_t connections_open = 0;
  uint64_t bad_prefaces = 0;
  uint64_t tls_handshake_failures = 0;
  uint64_t permission_denied = 0;  // connections refused by the role check
  uint64_t loads = 0;        // LoadRequests answered (local_loads of them on the local socket)
  uint64_t lookups = 0;      // LookupRequests answered on lookup connections
  uint64_t stores = 0;       // store batches answered on store connections
  uint64_t blocks_stored = 0;  // new blocks stored (not already present)
  uint64_t bytes_stored = 0;   // their payload bytes
  uint64_t blocks_sent = 0;  // payloads sent
  uint64_t bytes_sent = 0;   // payload bytes
  uint64_t local_loads = 0;  // LoadRequests answered on the local socket
  uint64_t blocks_shared = 0;  // blocks answered with their place in shared memory
  uint64_t local_stores = 0;   // store batches answered on the local socket
  uint64_t blocks_written_in_place = 0;  // blocks the client wrote into a shared slot
};

class BulkLoadServer {
 public:
  // Binds and starts accepting. `store` is not owned and must outlive the
  // server. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<BulkLoadServer>> Start(kvstore::KvStoreEngine* store,
                                                               const BulkLoadServerOptions& options);
  // Shutdown(), then frees.
  ~BulkLoadServer();
  BulkLoadServer(const BulkLoadServer&) = delete;
  BulkLoadServer& operator=(const BulkLoadServer&) = delete;

  // The bound port.
  [[nodiscard]] int port() const { return port_; }
  // The local socket's path; empty when there is none.
  [[nodiscard]] const std::string& local_socket() const { return options_.local_socket; }
  // Stops accepting (closes the port), closes every connection (a load in progress ends with
  // a broken connection, which its client reports as failed blocks) and
  // joins the threads. Idempotent.
  void Shutdown();
  [[nodiscard]] BulkLoadServerStats GetStats() const;

 private:
  struct Connection;
  BulkLoadServer(kvstore::KvStoreEngine* store, BulkLoadServerOptions options, int listen_fd, int port);

  void AcceptLoop();
  void Serve(Connection* conn);
  // A lookup connection: answers LookupRequests until the client closes;
  // with `allowed` not OK, answers the first with it and returns.
  void ServeLookups(rpc::FramedSocket* sock, const absl::Status& allowed);
  // Under TLS, the handshake; OK when the connection may go on.
  absl::Status StartTls(Connection* conn);
  // The role check of the gRPC method a connection kind stands for
  // (method_roles.h): OK, or PERMISSION_DENIED naming both.
  absl::Status Authorize(const Connection& conn, std::string_view method);
  // A store connection (bulk_store.cc): answers store batches until the
  // client closes; with `allowed` not OK, answers the first with it and
  // returns. `in_place` (the local socket): each batch's reserved slots are
  // offered to the client (BulkStoreSlots), which writes those blocks into
  // the shared memory itself.
  void ServeStores(rpc::FramedSocket* sock, const absl::Status& allowed, bool in_place = false);
  // A batch's payload over the socket into `payloads`, each block's CRC32C
  // into `crcs`, then (with checksums_follow) the writer's checksums into
  // `request`.
  absl::Status ReceiveInline(rpc::FramedSocket* sock, std::span<const std::span<uint8_t>> payloads,
                             v1::BulkStoreRequest* request, std::span<uint32_t> crcs);
  // In place (the local socket): block by block, its payload into
  // payloads[i] when it has no slot, and the checksums where a frame of them
  // is due; each slot the client wrote is checksummed there.
  absl::Status ReceiveInPlace(rpc::FramedSocket* sock, const kvstore::HotSlots& slots,
                              std::span<const std::span<uint8_t>> payloads,
                              v1::BulkStoreRequest* request, std::span<uint32_t> crcs);
  // Stores one batch whose block k's bytes are in payloads[k] (a slot of
  // `reserved` where it got one), with each block's CRC32C as received in
  // `payload_crcs`. The batch's error, or OK with one status per block in
  // `response`.
  // The hot slots a batch's blocks can be received into (none for a batch
  // the store would refuse).
  kvstore::HotSlots ReserveSlots(const v1::BulkStoreRequest& request);
  absl::Status AnswerStore(const v1::BulkStoreRequest& request,
                           std::span<const std::span<uint8_t>> payloads,
                           std::span<const uint32_t> payload_crcs, kvstore::HotSlots* reserved,
                           v1::StoreResponse* response);
  // Answers one request; false when the connection must be closed. With
  // `shared_lease` (the local socket), pins the request's leading hits
  // under a lease it stores there, and answers those in the hot tier with
  // their place in shared memory (local_load.cc).
  bool ServeLoad(rpc::FramedSocket* sock, const v1::LoadRequest& request,
                 LeaseId* shared_lease = nullptr);
  // A local-socket connection (local_load.cc): sends the hot tier's memfd,
  // then answers loads until the client closes.
  void ServeLocal(rpc::FramedSocket* sock);
  // Joins and frees finished connections. Requires mu_.
  void ReapLocked();

  kvstore::KvStoreEngine* const store_;
  const BulkLoadServerOptions options_;
  const int listen_fd_;
  const int port_;
  int local_fd_ = -1;  // the local socket's listener, or -1
  std::shared_ptr<rpc::SocketTlsContext> tls_;  // null: plain TCP
  int wake_pipe_[2] = {-1, -1};  // Shutdown() wakes the acceptor through it
  std::thread acceptor_;

  mutable std::mutex mu_;
  bool shut_down_ = false;
  std::list<std::unique_ptr<Connection>> connections_;

  std::atomic<uint64_t> accepted_{0}, rejected_{0}, bad_prefaces_{0}, loads_{0}, lookups_{0},
      blocks_sent_{0}, bytes_sent_{0}, tls_failures_{0}, permission_denied_{0}, stores_{0},
      blocks_stored_{0}, bytes_stored_{0}, debug_new_blocks_{0}, local_loads_{0},
      blocks_shared_{0}, local_stores_{0}, blocks_written_in_place_{0};
  std::atomic<bool> logged_kernel_tls_{false};
};

// Sends a load's final frame carrying `status`; false when the connection
// broke.
bool SendDone(rpc::FramedSocket* sock, const absl::Status& status);
// Listens on the Unix-domain path (mode 0600), replacing a stale socket
// file; ALREADY_EXISTS when a live process serves it (local_load.cc).
absl::StatusOr<int> ListenLocal(const std::string& path);

}  // namespace tandem::kvstore_service
