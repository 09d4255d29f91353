// The plain types of the KV-store client (kvstore_client.h): its options, a
// lookup's options and result, and a block's load or store result. Their own
// header so that the client's bulk-port transports (bulk_load_client.h,
// bulk_lookup_client.h), which the client includes, need not include the
// client.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "tandem/common/ids.h"

namespace tandem::kvconnector {

struct KvStoreClientOptions {
  // host:port of tandem-kvstore. Required.
  std::string target;
  // A lookup unanswered after this long counts as zero hits. Default 50 ms.
  int64_t lookup_deadline_ms = 50;
  // Deadline of Load, Store, Release, CreateNamespace and Stats. Default 30 s.
  int64_t rpc_deadline_ms = 30'000;
  // Payload bytes per Store stream message (under the server's 4 MiB limit).
  int64_t store_chunk_bytes = 1 << 20;
  // ReleaseAsync() batching: a released lease waits up to this long for the
  // next Lookup to carry it to the store (LookupRequest.release_lease_ids),
  // then goes in one Release RPC with every other waiting lease. Saves an RPC
  // per lookup for a scheduler that releases as often as it looks up. 0 = a
  // Release RPC per lease, at once. Default 5 ms.
  int64_t release_batch_ms = 5;
  // Load through the store's bulk load port (TCP beside gRPC, see
  // services/kvstore/bulk_load_server.h; TLS with the process's client TLS,
  // rpc::SetClientTls, when this client is made) when the store advertises
  // one; over the gRPC stream otherwise, or when the port cannot be reached.
  bool bulk_load = true;
  // Look up over a connection to the same port when the store advertises
  // one (libs/kvconnector/bulk_lookup_client.h): two thread wake-ups per
  // lookup instead of gRPC's five or so. Over gRPC until it is connected,
  // and whenever it is not.
  bool bulk_lookup = true;
  // Store through a connection to the same port when the store advertises
  // one (bulk_store_client.h): the blocks' bytes go from the caller's
  // buffers to the socket, and the store writes a call's blocks with one
  // RocksDB write. Over the gRPC stream otherwise, or when the port cannot
  // be reached.
  bool bulk_store = true;
  // With bulk_load: load through the store's local socket when the store is
  // on this host and advertises one (local_socket_client.h): the blocks are
  // read in place from the store's shared memory instead of through TCP.
  // Through the bulk port otherwise. Default true.
  bool local_load = true;
  // With bulk_store: store through the same local socket: the blocks the
  // store keeps in its hot tier are written straight into their slots in
  // the shared memory instead of through TCP. Through the bulk port
  // otherwise. Default true.
  bool local_store = true;
  // host:port of the bulk load port, overriding the advertised port and the
  // target's host (for a proxy or a Kubernetes Service that maps ports).
  std::string bulk_load_target;

  [[nodiscard]] absl::Status Validate() const;
};

struct RemoteLookupOptions {
  // Pin the leading hits under a lease (release it, or pass it to Load).
  bool take_lease = true;
  // Lease time-to-live; 0 = the server's default.
  uint32_t lease_ttl_ms = 0;
  // Ask the store to copy cold hits into its hot tier before answering.
  bool stage_to_hot = false;
  // Overrides KvStoreClientOptions.lookup_deadline_ms when > 0.
  int64_t deadline_ms = 0;
  // Called (on a gRPC thread, no lock held) when the answer arrives, so a
  // caller that polls can sleep until then instead of polling in a loop.
  // Not called for a lookup that fails or is never answered.
  std::function<void()> on_answer;
};

struct RemoteLookupResult {
  // Leading hits; 0 when the lookup failed or was late.
  int32_t num_hits = 0;
  int32_t num_hot_hits = 0;
  // LeaseId(0) when none was granted.
  LeaseId lease{0};
  // OK, or why this counts as zero hits (DEADLINE_EXCEEDED, UNAVAILABLE, ...).
  absl::Status status;
  // Microseconds from Lookup() until the answer arrived (when Poll() could
  // first return it); 0 when it never did (failed or late).
  int64_t answered_after_us = 0;
};

// Why a block was not loaded.
enum class LoadMiss {
  kNone,      // loaded and verified
  kNotFound,  // not in the store
  kChecksum,  // failed verification (in the store or here)
  kFailed,    // the RPC failed or ended before this block (see Load's status)
};
[[nodiscard]] const char* LoadMissName(LoadMiss m);

struct BlockLoadResult {
  LoadMiss miss = LoadMiss::kFailed;
  [[nodiscard]] bool ok() const { return miss == LoadMiss::kNone; }
};

struct BlockStoreResult {
  // OK, or the store's reason (INVALID_ARGUMENT for a wrong size, ...).
  absl::Status status;
  bool already_present = false;
};

}  // namespace tandem::kvconnector
