// Hand-encoded tandem.v1.LoadResponse stream messages for the Load RPC.
//
// The service serves Load with a grpc::ByteBuffer response type instead of
// the generated LoadResponse: building a LoadResponse copies each payload
// byte into the message (set_data) and serializing it copies it again. Here
// each payload piece is copied once, from the engine's verified block into a
// gRPC slice that the transport sends as is; the few field bytes around it
// (tags, varint lengths, offsets, flags, checksum) go into small slices.
//
// The encoding is the canonical proto3 one, byte for byte what
// LoadResponse::SerializeAsString() produces for the same chunks (fields in
// number order, default values omitted), so every client using the
// generated types (C++, Python, grpcurl) reads it unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace tandem::kvstore_service {

class LoadResponseEncoder {
 public:
  // Appends a LoadChunk with a copy of `data` (the only copy of these bytes
  // on the server): ok = true, `total_size` the block's size, `last` when it
  // is the block's final piece.
  void AddPiece(int32_t block_index, uint64_t offset, uint64_t total_size,
                std::span<const uint8_t> data, bool last);
  // Sets the checksum field of the most recently added piece.
  void SetLastPieceChecksum(uint32_t checksum);
  // Appends a miss: ok = false, last = true, `miss_reason` (a
  // tandem.v1.MissReason value).
  void AddMiss(int32_t block_index, int32_t miss_reason);

  [[nodiscard]] size_t num_chunks() const { return chunks_.size(); }
  [[nodiscard]] size_t payload_bytes() const { return payload_bytes_; }

  // Encodes the chunks added since the last call as one LoadResponse and
  // clears them. The payload slices are referenced, not copied.
  grpc::ByteBuffer Finish();

 private:
  struct Chunk {
    int32_t block_index = 0;
    uint64_t offset = 0;
    bool last = false;
    bool ok = false;
    int32_t miss_reason = 0;
    uint64_t total_size = 0;
    uint32_t checksum = 0;
    grpc::Slice data;  // empty for a miss
  };
  std::vector<Chunk> chunks_;
  size_t payload_bytes_ = 0;
};

}  // namespace tandem::kvstore_service
