// Client of the tandem-kvstore service for the two callers of DESIGN §5.
//
// Scheduler: Lookup() never blocks. It sends the lookup on the client's
// connection to the store's bulk port when that is up (bulk_lookup,
// bulk_lookup_client.h), otherwise as a gRPC call with the callback API, and
// returns a PendingLookup that the scheduler polls once per step:
//
//   auto pending = client->Lookup("ns", hashes, {.take_lease = true});
//   ... every step:
//   if (std::optional<RemoteLookupResult> r = pending->Poll()) { use r->num_hits }
//
// A lookup that fails or is not answered by its deadline resolves to zero
// hits (with the reason in `status`); a lease granted after the caller gave
// up is released automatically, as is the lease of a PendingLookup destroyed
// before its result was polled. ReleaseAsync() is fire-and-forget, and
// batched: released leases ride on the next Lookup, or go in one Release RPC
// after release_batch_ms (a lease whose carrying Lookup fails is freed by its
// TTL instead).
//
// Worker: Load() and Store() block the calling thread (the worker's transfer
// thread) and move block bytes between the store and caller-provided
// buffers. Load() reads the blocks in place from the store's shared memory
// when the store is on this host and has a local socket (local_load,
// local_socket_client.h), and Store() writes them in place there
// (local_store). Load() and Store() otherwise use the store's bulk
// port when it has one (each payload byte is received straight into the
// caller's buffer), the gRPC stream otherwise; the results are the same. Every loaded block's CRC32C is
// verified here too; a block that fails it is a kChecksum miss, and its
// destination bytes must not be used. Over the bulk port this check is the
// read's verification (the store sends without checking): the destination
// is zeroed, and the block is reported to the store, which checks it and
// drops it, before Load() returns.
//
// Thread-safe: one client may be shared by many threads. Destroy every
// PendingLookup before its client; the client's destructor waits for its
// callback-API calls still in flight (bounded by their deadlines).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/common/block_hash.h"
#include "tandem/common/ids.h"
#include "tandem/kvconnector/kvstore_client_types.h"
#include "tandem/kvtypes/kv_types.h"

namespace tandem::kvconnector {

// The scheduler's future. Not thread-safe itself; owned by one caller.
class PendingLookup {
 public:
  struct State;
  explicit PendingLookup(std::shared_ptr<State> state);
  // Releases a lease the caller never received (now, or when the answer of
  // an unfinished RPC arrives).
  ~PendingLookup();
  PendingLookup(const PendingLookup&) = delete;
  PendingLookup& operator=(const PendingLookup&) = delete;

  // nullopt while the answer is pending and the deadline has not passed;
  // afterwards the result (the same one on every later call). Never blocks.
  [[nodiscard]] std::optional<RemoteLookupResult> Poll();
  // Blocks until Poll() would return a result (tests, tools).
  [[nodiscard]] RemoteLookupResult Wait();

 private:
  std::shared_ptr<State> state_;
};

class KvStoreClient {
 public:
  static absl::StatusOr<std::unique_ptr<KvStoreClient>> Create(const KvStoreClientOptions& options);
  ~KvStoreClient();

  // Non-blocking; see PendingLookup.
  [[nodiscard]] std::unique_ptr<PendingLookup> Lookup(std::string_view ns,
                                                      std::span<const BlockHash> hashes,
                                                      const RemoteLookupOptions& options = {});
  // Fire-and-forget release (batched, see release_batch_ms). Never blocks.
  void ReleaseAsync(LeaseId lease);
  // Blocking release; true when the store knew the lease.
  absl::StatusOr<bool> Release(LeaseId lease);

  // Loads hashes[i] into dst[i] (each exactly the namespace's block size).
  // Returns one result per block; an error status only when nothing could be
  // attempted (unknown namespace, bad hash, store unreachable). When the
  // stream breaks midway, blocks not completed are kFailed. `lease` (if not
  // 0) is released by the store when the load completes.
  absl::StatusOr<std::vector<BlockLoadResult>> Load(std::string_view ns,
                                                    std::span<const BlockHash> hashes,
                                                    std::span<const std::span<uint8_t>> dst,
                                                    LeaseId lease = LeaseId(0));

  // Stores src[i] under hashes[i], computing each block's CRC32C. One
  // result per block.
  absl::StatusOr<std::vector<BlockStoreResult>> Store(
      std::string_view ns, std::span<const BlockHash> hashes,
      std::span<const std::span<const uint8_t>> src,
      std::optional<kvstore::Durability> durability = std::nullopt);

  // True when created, false when it existed with the same spec.
  absl::StatusOr<bool> CreateNamespace(const kvstore::NamespaceSpec& spec);
  // The same without waiting: `done` runs on a gRPC thread with the answer
  // (before the client's destructor returns).
  void CreateNamespaceAsync(const kvstore::NamespaceSpec& spec,
                            std::function<void(absl::StatusOr<bool>)> done);
  absl::StatusOr<kvstore::KvStoreStats> Stats();
  // Loads served through the bulk load port so far (the rest went over gRPC).
  [[nodiscard]] uint64_t bulk_loads() const;
  // Loads served through the store's local socket so far (not counted in
  // bulk_loads).
  [[nodiscard]] uint64_t local_loads() const;
  // Stores answered over the bulk port so far (the rest went over gRPC).
  [[nodiscard]] uint64_t bulk_stores() const;
  // Stores answered through the store's local socket so far (not counted
  // in bulk_stores).
  [[nodiscard]] uint64_t local_stores() const;
  // Lookups answered over the bulk port's lookup connection so far, and
  // whether it is connected now (tests, tools).
  [[nodiscard]] uint64_t bulk_lookups() const;
  [[nodiscard]] bool bulk_lookup_connected() const;

  class Impl;

 private:
  explicit KvStoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::kvconnector
