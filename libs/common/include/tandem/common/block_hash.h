// Block hashing of DESIGN §3: a SHA-256 chain over full blocks of token ids.
//
//   root  = SHA-256("tandem/v1", model fingerprint, KV layout, block size,
//                   dtype, cache salt)            (each field length-prefixed)
//   h[i]  = SHA-256(h[i-1] or root, token ids of block i as little-endian int32)
//
// Blocks of different models, layouts, block sizes, dtypes or tenants never
// share a chain. Keys are 32 bytes. Only full blocks are hashed.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct BlockHash {
  std::array<uint8_t, 32> bytes{};

  auto operator<=>(const BlockHash&) const = default;
  // 64 lowercase hex characters.
  [[nodiscard]] std::string ToHex() const;
  // The raw 32 bytes as a string (the wire form).
  [[nodiscard]] std::string ToBytes() const;
  // Parses the wire form; INVALID_ARGUMENT unless exactly 32 bytes.
  static absl::Status FromBytes(std::string_view raw, BlockHash* out);
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine_contiguous(std::move(h), b.bytes.data(), b.bytes.size());
  }
};

// What the root of every chain covers.
struct HashRootParams {
  // Identifies the weights, e.g. the SHA-256 of the checkpoint file.
  std::string model_fingerprint;
  // The KV cache layout, e.g. "block-major/L5/KV2/B16/H4/D8".
  std::string kv_layout;
  // Tokens per block; > 0.
  int32_t block_size = 16;
  // Element type of the cached KV, e.g. "f32".
  std::string dtype = "f32";
  // Tenant salt set by the server; empty for the shared namespace.
  std::string cache_salt;
};

[[nodiscard]] BlockHash ComputeRootHash(const HashRootParams& params);

// Hash of one full block given its parent (the root for block 0).
[[nodiscard]] BlockHash HashBlock(const BlockHash& parent,
                                  std::span<const int32_t> block_token_ids);

// Hashes of every full block of `token_ids`, continuing the chain from
// `existing` (hashes already computed for the leading blocks). Returns the
// extended list; a partial last block is not hashed.
void ExtendBlockHashes(const BlockHash& root, std::span<const int32_t> token_ids,
                       int32_t block_size, std::vector<BlockHash>* hashes);

// SHA-256 of a file's bytes as hex; used as a model fingerprint.
absl::Status Sha256File(const std::string& path, std::string* hex_out);

}  // namespace tandem

template <>
struct std::hash<tandem::BlockHash> {
  size_t operator()(const tandem::BlockHash& h) const noexcept {
    size_t v;
    static_assert(sizeof(v) <= 32);
    __builtin_memcpy(&v, h.bytes.data(), sizeof(v));
    return v;
  }
};
