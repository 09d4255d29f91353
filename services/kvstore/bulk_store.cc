// The bulk port's store connections (bulk_load_server.h has the protocol):
// a batch's payload bytes go from the socket straight into the hot slots the
// blocks will be served from (KvStoreEngine::ReserveHotSlots), or into one
// buffer for blocks that get none, each block's CRC32C computed as it lands,
// and from there to the engine's StoreBatch, one RocksDB write per batch.
// On the local socket the client writes the blocks that got a slot into it
// itself, through the shared memory, and the store checks them there.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bulk_load_server.h"
#include "store_answer.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/rpc/kvstore_convert.h"

namespace tandem::kvstore_service {
namespace {

// A batch's payload, reused across batches (grown, never zeroed).
class PayloadBuffer {
 public:
  uint8_t* Reserve(uint64_t n) {
    if (n > capacity_) {
      data_.reset(new uint8_t[n]);
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  uint64_t capacity_ = 0;
};

std::string HashName(const std::string& raw) {
  if (raw.size() != 32) return absl::StrCat("<", raw.size(), "-byte hash>");
  BlockHash h;
  std::memcpy(h.bytes.data(), raw.data(), 32);
  return h.ToHex().substr(0, 16);
}

}  // namespace

void BulkLoadServer::ServeStores(rpc::FramedSocket* sock, const absl::Status& allowed,
                                 bool in_place) {
  PayloadBuffer buffer;
  v1::BulkStoreRequest request;
  v1::BulkStoreAnswer answer;
  // A batch refused before its payload: answered with the frame the client
  // waits for next (in place, the slots), then the connection is closed.
  const auto refuse = [&](const absl::Status& s) {
    if (in_place) {
      v1::BulkStoreSlots slots;
      slots.set_status_code(static_cast<int32_t>(s.code()));
      slots.set_status_message(std::string(s.message()));
      (void)sock->Write(slots);
      return;
    }
    answer.set_status_code(static_cast<int32_t>(s.code()));
    answer.set_status_message(std::string(s.message()));
    (void)sock->Write(answer);
  };
  for (;;) {
    // Idle between batches, io_timeout_ms within one.
    sock->SetTimeouts(options_.io_timeout_ms, options_.idle_timeout_ms);
    absl::Status s = sock->Read(&request, rpc::kKvBulkLoadMaxRequestBytes);
    answer.Clear();
    if (s.code() == absl::StatusCode::kInvalidArgument) {
      refuse(Annotate(s, in_place ? "local store" : "bulk store"));
      return;
    }
    if (!s.ok()) return;  // closed, reset, or idle past the timeout
    if (options_.debug_before_store) options_.debug_before_store();
    sock->SetTimeouts(options_.io_timeout_ms, options_.io_timeout_ms);
    ++stores_;
    if (in_place) ++local_stores_;
    uint64_t total = 0;
    for (const v1::BulkStoreBlock& b : request.blocks()) total += b.size();
    if (total > rpc::kKvBulkStoreMaxBatchBytes) {
      // The payload cannot be received: the connection is closed after the answer.
      refuse(absl::InvalidArgumentError(absl::StrCat("bulk store: a batch of ", total,
                                                     " payload bytes; at most ",
                                                     rpc::kKvBulkStoreMaxBatchBytes,
                                                     " are accepted")));
      return;
    }
    if (!allowed.ok()) {
      // The role may not store: the batch is read past (so the client is
      // not cut off mid-send and sees why) and refused.
      if (sock->Skip(total).ok()) refuse(allowed);
      return;
    }
    if (in_place && !request.checksums_follow()) {
      refuse(absl::InvalidArgumentError(
          "local store: the blocks' checksums must follow them (checksums_follow)"));
      return;
    }
    // Blocks the engine would place in the hot tier are received straight
    // into the slots they will be served from (in place: written there by
    // the client); the others into the buffer.
    kvstore::HotSlots slots = ReserveSlots(request);
    const int n = request.blocks_size();
    if (in_place) {
      v1::BulkStoreSlots offered;
      const std::byte* base = store_->hot_tier_memory().bytes.data();
      for (int i = 0; i < n; ++i) {
        const std::span<uint8_t> slot = slots.slot(i);
        offered.add_shared_offsets(
            slot.empty() ? -1 : reinterpret_cast<const std::byte*>(slot.data()) - base);
      }
      if (!sock->Write(offered).ok()) return;
    }
    std::vector<std::span<uint8_t>> payloads(n);
    uint64_t buffered = 0;
    for (int i = 0; i < n; ++i) {
      if (slots.slot(i).empty()) buffered += request.blocks(i).size();
    }
    uint8_t* next = buffer.Reserve(buffered);
    for (int i = 0; i < n; ++i) {
      payloads[i] = slots.slot(i);
      if (payloads[i].empty() && request.blocks(i).size() > 0) {
        payloads[i] = std::span(next, request.blocks(i).size());
        next += request.blocks(i).size();
      }
    }
    // All of the batch first: a connection that breaks mid-payload stores
    // nothing.
    std::vector<uint32_t> crcs(n, 0);
    s = in_place ? ReceiveInPlace(sock, slots, payloads, &request, crcs)
                 : ReceiveInline(sock, payloads, &request, crcs);
    if (!s.ok()) {
      // The framing is lost: answered, then the connection is closed.
      if (s.code() != absl::StatusCode::kInvalidArgument) return;
      answer.set_status_code(static_cast<int32_t>(s.code()));
      answer.set_status_message(
          std::string(Annotate(s, in_place ? "local store" : "bulk store").message()));
      (void)sock->Write(answer);
      return;
    }
    s = AnswerStore(request, payloads, crcs, &slots, answer.mutable_response());
    if (!s.ok()) answer.clear_response();
    answer.set_status_code(static_cast<int32_t>(s.code()));
    answer.set_status_message(std::string(s.message()));
    if (!sock->Write(answer).ok()) return;
  }
}

absl::Status BulkLoadServer::ReceiveInline(rpc::FramedSocket* sock,
                                           std::span<const std::span<uint8_t>> payloads,
                                           v1::BulkStoreRequest* request,
                                           std::span<uint32_t> crcs) {
  // Each block's CRC32C is computed as its bytes land, while they are in
  // cache and the client is still sending, so the store does not read the
  // payload again to check the writer's checksum.
  const auto on_piece = [&](size_t k, std::span<const uint8_t> piece) {
    crcs[k] = kvstore::Crc32cExtend(crcs[k], piece.data(), piece.size());
  };
  TANDEM_RETURN_IF_ERROR(sock->ReadRawScatter(payloads, on_piece));
  if (!request->checksums_follow()) return absl::OkStatus();
  const int n = request->blocks_size();
  v1::BulkStoreChecksums checksums;
  TANDEM_RETURN_IF_ERROR(sock->Read(&checksums, rpc::kKvBulkLoadMaxRequestBytes));
  if (checksums.checksums_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bulk store: ", checksums.checksums_size(), " checksums after a batch of ", n, " blocks"));
  }
  for (int i = 0; i < n; ++i) request->mutable_blocks(i)->set_checksum(checksums.checksums(i));
  return absl::OkStatus();
}

absl::Status BulkLoadServer::ReceiveInPlace(rpc::FramedSocket* sock, const kvstore::HotSlots& slots,
                                            std::span<const std::span<uint8_t>> payloads,
                                            v1::BulkStoreRequest* request,
                                            std::span<uint32_t> crcs) {
  // Block by block: its payload when it has no slot; and where a frame of
  // checksums is due (rpc::KvLocalStoreChecksumsDue), the checksums of the
  // blocks since the last one, sent once the client has written them. Those
  // slots are checked here while the client writes the next blocks.
  const int n = request->blocks_size();
  v1::BulkStoreChecksums frame;
  int first = 0;  // the first block whose checksum has not come
  uint64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    if (slots.slot(i).empty()) {
      TANDEM_RETURN_IF_ERROR(sock->ReadRaw(payloads[i], [&](std::span<const uint8_t> piece) {
        crcs[i] = kvstore::Crc32cExtend(crcs[i], piece.data(), piece.size());
      }));
    }
    bytes += request->blocks(i).size();
    if (!rpc::KvLocalStoreChecksumsDue(bytes, i == n - 1)) continue;
    TANDEM_RETURN_IF_ERROR(sock->Read(&frame, rpc::kKvBulkLoadMaxRequestBytes));
    if (frame.checksums_size() != i + 1 - first) {
      return absl::InvalidArgumentError(absl::StrCat(frame.checksums_size(),
                                                     " checksums after blocks ", first, "-", i,
                                                     "; one for each of them follows them"));
    }
    for (int k = first; k <= i; ++k) {
      request->mutable_blocks(k)->set_checksum(frame.checksums(k - first));
      if (slots.slot(k).empty()) continue;
      crcs[k] = kvstore::Crc32c(slots.slot(k));
      ++blocks_written_in_place_;
    }
    first = i + 1;
    bytes = 0;
  }
  return absl::OkStatus();
}

kvstore::HotSlots BulkLoadServer::ReserveSlots(const v1::BulkStoreRequest& request) {
  // Only for blocks StoreBatch will take: a known namespace's, of its size,
  // with a well-formed hash and durability. (A bad batch must not evict.)
  absl::StatusOr<kvstore::NamespaceSpec> spec = store_->GetNamespace(request.namespace_());
  std::optional<kvstore::Durability> durability;
  if (!spec.ok() || !rpc::FromProto(request.durability(), &durability).ok()) return {};
  std::vector<BlockHash> hashes(request.blocks_size());
  std::vector<uint64_t> sizes;
  sizes.reserve(request.blocks_size());
  for (int i = 0; i < request.blocks_size(); ++i) {
    const v1::BulkStoreBlock& b = request.blocks(i);
    const bool fits = b.block_hash().size() == 32 && b.size() == spec->block_bytes;
    if (fits) std::memcpy(hashes[i].bytes.data(), b.block_hash().data(), 32);
    sizes.push_back(fits ? b.size() : 0);
  }
  return store_->ReserveHotSlots(request.namespace_(), hashes, sizes, durability);
}

absl::Status BulkLoadServer::AnswerStore(const v1::BulkStoreRequest& request,
                                         std::span<const std::span<uint8_t>> payloads,
                                         std::span<const uint32_t> payload_crcs,
                                         kvstore::HotSlots* reserved,
                                         v1::StoreResponse* response) {
  // As the gRPC Store: an unknown namespace or durability fails the batch,
  // a bad block only itself.
  TANDEM_ASSIGN_OR_RETURN(kvstore::NamespaceSpec spec, store_->GetNamespace(request.namespace_()));
  std::optional<kvstore::Durability> durability;
  TANDEM_RETURN_IF_ERROR(rpc::FromProto(request.durability(), &durability));
  const int n = request.blocks_size();
  std::vector<kvstore::StoreBlock> blocks;
  std::vector<int> block_of;  // blocks[k] is request block block_of[k]
  blocks.reserve(n);
  block_of.reserve(n);
  for (int i = 0; i < n; ++i) {
    const v1::BulkStoreBlock& b = request.blocks(i);
    v1::BlockStatus* st = response->add_blocks();
    st->set_block_hash(b.block_hash());
    absl::Status error;
    if (b.block_hash().size() != 32) {
      error = absl::InvalidArgumentError(absl::StrCat(
          "block ", i, ": block_hash has ", b.block_hash().size(), " bytes; a block hash has 32"));
    } else if (b.size() != spec.block_bytes) {
      error = absl::InvalidArgumentError(absl::StrCat(
          "block ", i, " (", HashName(b.block_hash()), "): total_size ", b.size(),
          " but blocks of namespace '", spec.name, "' have ", spec.block_bytes, " bytes"));
    }
    if (!error.ok()) {
      st->set_code(static_cast<int32_t>(error.code()));
      st->set_error(std::string(error.message()));
      continue;
    }
    kvstore::StoreBlock& block = blocks.emplace_back();
    std::memcpy(block.hash.bytes.data(), b.block_hash().data(), 32);
    block.payload = payloads[i];
    block.checksum = b.checksum();
    block.payload_crc = payload_crcs[i];
    if (!reserved->slot(i).empty()) block.reserved_slot = i;
    block_of.push_back(i);
  }
  std::vector<v1::BlockStatus*> statuses;
  statuses.reserve(blocks.size());
  for (int i : block_of) statuses.push_back(response->mutable_blocks(i));
  const StoredCounts stored =
      AnswerStoreBatch(store_, spec.name, durability, blocks, statuses,
                       {.debug_corrupt_hot_every = options_.debug_corrupt_hot_every,
                        .debug_corrupt_cold_every = options_.debug_corrupt_cold_every,
                        .debug_new_blocks = &debug_new_blocks_,
                        .reserved = reserved});
  blocks_stored_ += stored.blocks;
  bytes_stored_ += stored.bytes;
  return absl::OkStatus();
}

}  // namespace tandem::kvstore_service
