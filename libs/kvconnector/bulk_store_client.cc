#include "bulk_store_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvconnector {
namespace {

constexpr auto kTryAgainAfter = std::chrono::seconds(10);

}  // namespace

absl::StatusOr<std::vector<BlockStoreResult>> StoreResults(const v1::StoreResponse& response,
                                                           size_t num_blocks) {
  if (response.blocks_size() != static_cast<int>(num_blocks)) {
    return absl::InternalError(absl::StrCat("KV-store store: ", response.blocks_size(),
                                            " statuses for ", num_blocks, " blocks"));
  }
  std::vector<BlockStoreResult> results;
  results.reserve(num_blocks);
  for (const v1::BlockStatus& b : response.blocks()) {
    BlockStoreResult r;
    r.already_present = b.already_present();
    if (!b.ok()) r.status = absl::Status(static_cast<absl::StatusCode>(b.code()), b.error());
    results.push_back(std::move(r));
  }
  return results;
}

std::optional<v1::BulkStoreRequest> MakeBulkStoreRequest(
    std::string_view ns, std::span<const BlockHash> hashes,
    std::span<const std::span<const uint8_t>> src, std::optional<kvstore::Durability> durability) {
  v1::BulkStoreRequest req;
  req.set_namespace_(std::string(ns));
  req.set_durability(rpc::ToProto(durability));
  // Each block is checksummed just before it is sent (the checksums follow
  // the payload), so that the store receives one block while this computes
  // the next one's CRC32C, and the send reads the bytes from cache.
  req.set_checksums_follow(true);
  uint64_t total = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    v1::BulkStoreBlock* b = req.add_blocks();
    b->set_block_hash(hashes[i].ToBytes());
    b->set_size(src[i].size());
    total += src[i].size();
  }
  if (total > rpc::kKvBulkStoreMaxBatchBytes ||
      req.ByteSizeLong() > rpc::kKvBulkLoadMaxRequestBytes) {
    return std::nullopt;
  }
  return req;
}

absl::StatusOr<std::vector<BlockStoreResult>> BulkStoreResults(const v1::BulkStoreAnswer& answer,
                                                               size_t num_blocks) {
  if (answer.status_code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(answer.status_code()),
                        absl::StrCat("KV-store store: ", answer.status_message()));
  }
  return StoreResults(answer.response(), num_blocks);
}

BulkStoreClient::BulkStoreClient(const KvStoreClientOptions& options, BulkLoadClient* port)
    : opts_(options), port_(port), pool_(port, rpc::kKvBulkStorePreface, options.rpc_deadline_ms) {}

uint64_t BulkStoreClient::stores() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stores_;
}

void BulkStoreClient::MarkUnreachable() {
  pool_.Clear();
  std::lock_guard<std::mutex> lock(mu_);
  unreachable_until_ = std::chrono::steady_clock::now() + kTryAgainAfter;
}

std::optional<absl::StatusOr<std::vector<BlockStoreResult>>> BulkStoreClient::Store(
    std::string_view ns, std::span<const BlockHash> hashes,
    std::span<const std::span<const uint8_t>> src, std::optional<kvstore::Durability> durability) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::chrono::steady_clock::now() < unreachable_until_) return std::nullopt;
  }
  std::optional<BulkLoadClient::Address> addr = port_->FindAddress();
  if (!addr) return std::nullopt;
  std::optional<v1::BulkStoreRequest> req = MakeBulkStoreRequest(ns, hashes, src, durability);
  if (!req) return std::nullopt;
  const size_t n = hashes.size();
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool pooled = false;
    std::unique_ptr<rpc::FramedSocket> sock = pool_.Take(*addr, &pooled);
    if (sock == nullptr) {
      MarkUnreachable();
      return std::nullopt;
    }
    const uint64_t received_before = sock->bytes_received();
    // The blocks' bytes go from the caller's buffers to the socket.
    v1::BulkStoreChecksums checksums;
    absl::Status io = sock->Write(*req);
    for (size_t i = 0; i < n && io.ok(); ++i) {
      checksums.add_checksums(kvstore::Crc32c(src[i]));
      io = sock->WriteRaw(src[i]);
    }
    if (io.ok()) io = sock->Write(checksums);
    v1::BulkStoreAnswer answer;
    if (io.ok()) io = sock->Read(&answer, rpc::kKvBulkLoadMaxRequestBytes);
    if (io.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stores_;
      }
      // After an error the store closes the connection.
      if (answer.status_code() == 0) pool_.Give(std::move(sock));
      return BulkStoreResults(answer, n);
    }
    if (sock->bytes_received() == received_before) {
      if (TimedOut(io)) return Stalled(io, "KV-store store (bulk port)");
      // No answer at all. A pooled connection the store closed meanwhile:
      // every pooled one is suspect, send again on a new one (stores are
      // idempotent). A new one: the port is not serving.
      if (pooled) {
        pool_.Clear();
        continue;
      }
      TANDEM_LOG(WARNING) << "KV-store bulk port " << addr->first << ":" << addr->second
                          << " did not answer a store (" << io << "); storing over gRPC";
      MarkUnreachable();
      return std::nullopt;
    }
    return absl::Status(io.code(), absl::StrCat("KV-store store (bulk port): ", io.message()));
  }
  return std::nullopt;
}

}  // namespace tandem::kvconnector
