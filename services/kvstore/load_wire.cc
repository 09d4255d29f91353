#include "load_wire.h"

#include <cstring>
#include <string>
#include <utility>

#include "grpc/slice.h"

namespace tandem::kvstore_service {
namespace {

// LoadChunk field tags: (field number << 3) | wire type.
constexpr uint8_t kTagChunks = (1 << 3) | 2;  // LoadResponse.chunks
constexpr uint8_t kTagBlockIndex = (1 << 3) | 0;
constexpr uint8_t kTagOffset = (2 << 3) | 0;
constexpr uint8_t kTagData = (3 << 3) | 2;
constexpr uint8_t kTagLast = (4 << 3) | 0;
constexpr uint8_t kTagOk = (5 << 3) | 0;
constexpr uint8_t kTagMissReason = (6 << 3) | 0;
constexpr uint8_t kTagTotalSize = (7 << 3) | 0;
constexpr uint8_t kTagChecksum = (8 << 3) | 0;

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// int32 and enum fields are sign-extended to 64 bits on the wire.
uint64_t Int32Wire(int32_t v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); }

}  // namespace

void LoadResponseEncoder::AddPiece(int32_t block_index, uint64_t offset, uint64_t total_size,
                                   std::span<const uint8_t> data, bool last) {
  Chunk c;
  c.block_index = block_index;
  c.offset = offset;
  c.total_size = total_size;
  c.last = last;
  c.ok = true;
  if (!data.empty()) {
    // Always refcounted (never inlined in the slice struct), so the pointer
    // stays valid when the Chunk moves.
    grpc_slice s = grpc_slice_malloc_large(data.size());
    std::memcpy(GRPC_SLICE_START_PTR(s), data.data(), data.size());
    c.data = grpc::Slice(s, grpc::Slice::STEAL_REF);
  }
  payload_bytes_ += data.size();
  chunks_.push_back(std::move(c));
}

void LoadResponseEncoder::SetLastPieceChecksum(uint32_t checksum) {
  if (!chunks_.empty()) chunks_.back().checksum = checksum;
}

void LoadResponseEncoder::AddMiss(int32_t block_index, int32_t miss_reason) {
  Chunk c;
  c.block_index = block_index;
  c.last = true;
  c.ok = false;
  c.miss_reason = miss_reason;
  chunks_.push_back(std::move(c));
}

grpc::ByteBuffer LoadResponseEncoder::Finish() {
  std::vector<grpc::Slice> slices;
  slices.reserve(2 * chunks_.size() + 1);
  std::string small;  // field bytes between two payload slices
  small.reserve(64);
  std::string head, tail;  // a chunk's fields before and after `data`
  for (const Chunk& c : chunks_) {
    // Fields in number order, default values omitted: 1-2, then data (3),
    // then 4-8.
    head.clear();
    tail.clear();
    auto varint_field = [](std::string* out, uint8_t tag, uint64_t v) {
      if (v == 0) return;
      out->push_back(static_cast<char>(tag));
      PutVarint(out, v);
    };
    varint_field(&head, kTagBlockIndex, Int32Wire(c.block_index));
    varint_field(&head, kTagOffset, c.offset);
    varint_field(&tail, kTagLast, c.last ? 1 : 0);
    varint_field(&tail, kTagOk, c.ok ? 1 : 0);
    varint_field(&tail, kTagMissReason, Int32Wire(c.miss_reason));
    varint_field(&tail, kTagTotalSize, c.total_size);
    varint_field(&tail, kTagChecksum, c.checksum);
    const uint64_t data_len = c.data.size();
    const uint64_t data_field = data_len == 0 ? 0 : 1 + VarintSize(data_len) + data_len;

    small.push_back(static_cast<char>(kTagChunks));
    PutVarint(&small, head.size() + data_field + tail.size());
    small += head;
    if (data_len != 0) {
      small.push_back(static_cast<char>(kTagData));
      PutVarint(&small, data_len);
      slices.emplace_back(small.data(), small.size());
      small.clear();
      slices.push_back(c.data);  // a reference, not a copy
    }
    small += tail;
  }
  if (!small.empty()) slices.emplace_back(small.data(), small.size());
  chunks_.clear();
  payload_bytes_ = 0;
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace tandem::kvstore_service
