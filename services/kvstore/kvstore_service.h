// gRPC adapter of the KV-store engine: tandem.v1.KvStore on top of
// kvstore::KvStoreEngine. Handlers run on gRPC's sync thread pool and call the
// thread-safe engine directly; the engine keeps its lock hold times short and
// does payload copies and RocksDB I/O outside its lock.
//
// Errors: unknown namespace -> NOT_FOUND; a hash that is not 32 bytes ->
// INVALID_ARGUMENT naming the field and index; per-block store failures
// (wrong payload size, bad checksum) are BlockStatus entries with the code
// and message; a Store stream that ends in the middle of a block ->
// INVALID_ARGUMENT (that block is not stored; blocks completed earlier in the
// stream were stored, intact).
//
// Stats advertises the bulk port (bulk_load_server.h), the faster path
// clients use for Load and Lookup when it is on, and reports its counters.
//
// Load is served with hand-encoded LoadResponse messages (load_wire.h): the
// generated LoadResponse would copy each payload byte twice more (into the
// message, then into the serialized buffer). On the wire nothing changes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "bulk_load_server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem::kvstore_service {

struct KvStoreServiceOptions {
  // Payload bytes per Load stream message (pieces of several blocks share a
  // message up to this size). Must stay under the client's 4 MiB receive
  // limit. Default 1 MiB.
  int64_t load_chunk_bytes = 1 << 20;
  // Largest block a Store stream may announce (total_size); protects memory.
  int64_t max_block_bytes = int64_t{1} << 30;
  // The bulk port (bulk_load_server.h) whose port Stats advertises and whose
  // counters it reports; not owned; null = off.
  const BulkLoadServer* bulk_load = nullptr;

  // ---- TESTS ONLY: fault injection for the KV connector's integration
  // tests (tests/integration/kv_*). Never set these in production. ----
  // Every Lookup answers this many milliseconds late (a slow store).
  int64_t debug_lookup_delay_ms = 0;
  // Every Load (and the bulk port's, BulkLoadServerOptions) starts this
  // many milliseconds late (a slow transfer).
  int64_t debug_load_delay_ms = 0;
  // Every Nth newly stored block gets one payload byte flipped in its
  // hot-tier slot (memory corruption); 0 = off.
  int32_t debug_corrupt_hot_every = 0;
  // Every Nth newly stored block gets its RocksDB payload rewritten with one
  // byte flipped (media corruption); 0 = off.
  int32_t debug_corrupt_cold_every = 0;
  // Runs at the start of every Store call, on its gRPC thread (in-process
  // tests: a store that stalls until the test lets it go); empty = off.
  std::function<void()> debug_before_store;
  // Runs at the start of every gRPC Load call, likewise (a load the test
  // holds back); empty = off.
  std::function<void()> debug_before_load;
  // Runs at the start of every CreateNamespace call, likewise (a store that
  // hangs on it); empty = off.
  std::function<void()> debug_before_create_namespace;
  // The host id Stats advertises beside the local socket instead of this
  // host's (a store that looks remote to clients on this host); empty = off.
  std::string debug_host_id;

  [[nodiscard]] absl::Status Validate() const;
};

// The largest message a valid client sends: a Store message carries pieces
// of at most 3 MiB of payload (KvStoreClientOptions::store_chunk_bytes's
// bound, whatever the namespace's block size), and the longest Lookup or
// Load names some 30,000 block hashes (a 500,000-token prompt at block size
// 16) in 1 MiB. gRPC refuses anything bigger before reading it, so a hostile
// client cannot make the store buffer more per message (it was 64 MiB: the
// rpc::ServerOptions default overrode the 16 MiB set here before).
inline constexpr int32_t kMaxReceiveMessageBytes = (3 << 20) + (1 << 20);

// Channel arguments for bulk block transfer (large HTTP/2 frames and
// windows), the receive limit above and rpc::AcceptClientPings' ping
// policy; call on the ServerBuilder that
// registers the service. rpc::ServiceMain / rpc::BuildAndStart set the
// receive limit again from ServerOptions::max_receive_message_bytes: set that
// to kMaxReceiveMessageBytes too (tandem-kvstore's main does).
void ConfigureServerBuilder(grpc::ServerBuilder* builder);

class KvStoreServiceImpl final : public v1::KvStore::Service {
 public:
  // `store` is not owned and must outlive the service.
  KvStoreServiceImpl(kvstore::KvStoreEngine* store, KvStoreServiceOptions options);

  grpc::Status CreateNamespace(grpc::ServerContext* ctx, const v1::CreateNamespaceRequest* req,
                               v1::CreateNamespaceResponse* resp) override;
  grpc::Status Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                      v1::LookupResponse* resp) override;
  // Load's handler (registered in the constructor in place of the typed
  // Load(), which is not used): reads the one LoadRequest and streams
  // hand-encoded LoadResponse messages.
  grpc::Status LoadRaw(grpc::ServerContext* ctx,
                       grpc::ServerSplitStreamer<v1::LoadRequest, grpc::ByteBuffer>* stream);
  grpc::Status Store(grpc::ServerContext* ctx, grpc::ServerReader<v1::StoreRequest>* reader,
                     v1::StoreResponse* resp) override;
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                     v1::StatsResponse* resp) override;

 private:
  kvstore::KvStoreEngine* const store_;
  const KvStoreServiceOptions options_;
  std::atomic<uint64_t> debug_new_blocks_{0};  // tests only
};

}  // namespace tandem::kvstore_service
