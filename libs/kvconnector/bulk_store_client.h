// The client side of the bulk port's store connections
// (services/kvstore/bulk_load_server.h has the protocol; DESIGN-NOTES.md,
// "Stores over the bulk port", why). Private to KvStoreClient, which tries
// it first for every Store and uses the gRPC stream when it answers nullopt.
//
// The port is the one loads use (BulkLoadClient finds it). A Store sends one
// BulkStoreRequest frame and then the blocks' bytes straight from the
// caller's buffers to the socket; the store answers with the same per-block
// statuses as the gRPC Store. Connections are pooled as the load
// connections are; a pooled one the store closed meanwhile fails before any
// byte of the answer, and the batch is sent again on a new one (stores are
// idempotent). A port that cannot be reached is left alone for 10 s.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bulk_load_client.h"
#include "tandem/common/block_hash.h"
#include "tandem/kvconnector/kvstore_client_types.h"
#include "tandem/kvtypes/kv_types.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvconnector {

// A StoreResponse as one result per block (the bulk port's and gRPC's
// Store answer alike); INTERNAL when it does not hold `num_blocks` statuses.
absl::StatusOr<std::vector<BlockStoreResult>> StoreResults(const v1::StoreResponse& response,
                                                           size_t num_blocks);

// The BulkStoreRequest of a Store (checksums_follow: the CRC32Cs go in a
// BulkStoreChecksums frame after the payload); nullopt when the batch is
// over the port's limits.
std::optional<v1::BulkStoreRequest> MakeBulkStoreRequest(
    std::string_view ns, std::span<const BlockHash> hashes,
    std::span<const std::span<const uint8_t>> src, std::optional<kvstore::Durability> durability);
// A BulkStoreAnswer as a Store's result: the batch's error, or one result
// per block.
absl::StatusOr<std::vector<BlockStoreResult>> BulkStoreResults(const v1::BulkStoreAnswer& answer,
                                                               size_t num_blocks);

class BulkStoreClient {
 public:
  // `port` finds the bulk port; not owned, must outlive this.
  BulkStoreClient(const KvStoreClientOptions& options, BulkLoadClient* port);

  // Stores as KvStoreClient::Store does. nullopt when the bulk port is off
  // or unreachable (or the batch is over the port's limits): use gRPC.
  std::optional<absl::StatusOr<std::vector<BlockStoreResult>>> Store(
      std::string_view ns, std::span<const BlockHash> hashes,
      std::span<const std::span<const uint8_t>> src, std::optional<kvstore::Durability> durability);

  // Stores answered over the port so far (tests, tools).
  [[nodiscard]] uint64_t stores() const;

 private:
  void MarkUnreachable();

  const KvStoreClientOptions opts_;
  BulkLoadClient* const port_;
  mutable std::mutex mu_;
  BulkConnectionPool pool_;
  std::chrono::steady_clock::time_point unreachable_until_{};
  uint64_t stores_ = 0;
};

}  // namespace tandem::kvconnector
