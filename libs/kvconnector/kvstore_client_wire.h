// The KV-store client's reader of tandem.v1.LoadResponse stream messages
// straight from gRPC's received slices (internal to the client; tests use
// it directly).
//
// Parsing with the generated LoadResponse copies each payload byte into the
// message's `data` string before the client copies it into the caller's
// buffer. ParseLoadResponse() only locates the fields: it reads the few
// header fields of every LoadChunk and records where its `data` lies in the
// received slices; CopyLoadPayload() then copies those bytes into the
// destination and checksums them in the same pass, so each payload byte is
// copied once on the client.
//
// It accepts any valid encoding of the message, as the generated parser
// does: fields in any order, a repeated scalar field (last one wins), data
// split across slices, unknown fields of every wire type (skipped). A
// malformed message is an error naming the byte offset and what was wrong;
// nothing of it is then used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace tandem::kvconnector::wire {

// The message's bytes: the received slices, in order.
using Segments = std::span<const std::span<const uint8_t>>;

// Where a chunk's `data` bytes lie in the segments.
struct PayloadRef {
  size_t segment = 0;
  size_t pos = 0;  // offset inside that segment
  uint64_t size = 0;
};

// One tandem.v1.LoadChunk's fields (proto3 defaults when absent).
struct LoadChunkView {
  int32_t block_index = 0;
  uint64_t offset = 0;
  PayloadRef data;
  bool last = false;
  bool ok = false;
  int32_t miss_reason = 0;
  uint64_t total_size = 0;
  uint32_t checksum = 0;
};

// Parses one LoadResponse message. On success `chunks` holds its chunks in
// order (it is cleared first). INTERNAL for a malformed message, naming the
// byte offset and the problem.
absl::Status ParseLoadResponse(Segments message, std::vector<LoadChunkView>* chunks);

// Copies `data` (from a chunk parsed out of `message`) to `dst` (data.size
// bytes) and extends `crc` (CRC32C) over the copied bytes, in cache-sized
// pieces: one pass over memory, verifying exactly the bytes the caller gets.
void CopyLoadPayload(Segments message, const PayloadRef& data, uint8_t* dst, uint32_t* crc);

}  // namespace tandem::kvconnector::wire
