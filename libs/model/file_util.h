// Private file helpers of the model library.
#pragma once

#include <openssl/evp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::model {
struct ModelConfig;
}  // namespace tandem::model

namespace tandem::model::internal {

// A whole file mapped read-only (mmap), so a checkpoint is read in place
// instead of copied onto the heap. Release(begin, end) tells the kernel the
// pages of a byte range are no longer needed (they leave the process's RSS).
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view view() const { return {data_, size_}; }
  void Release(int64_t begin, int64_t end) const;

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// The whole file; NOT_FOUND naming the path when it cannot be opened.
absl::StatusOr<std::string> ReadFile(const std::string& path);
absl::Status WriteFile(const std::string& path, const std::string& bytes);
// Finishes a SHA-256 digest, frees `ctx` and returns the digest in hex.
std::string FinishSha256Hex(EVP_MD_CTX* ctx);
// Adds what partial RoPE (rotary_dim), yarn and longrope scaling (the
// inverse frequencies and the attention factor) and Gemma 2's and 3's
// switches (sandwich norms, query_pre_attn_scalar, local RoPE, softcaps)
// change to a model's
// fingerprint; nothing for a model without them, so those fingerprints stay
// as they were.
void HashRopeScaling(EVP_MD_CTX* ctx, const ModelConfig& c);
std::string JoinPath(const std::string& dir, const std::string& name);
std::string BaseName(const std::string& path);

}  // namespace tandem::model::internal
