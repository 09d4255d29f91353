#include "tandem/common/block_hash.h"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"

namespace tandem {
namespace {

void AppendU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Length-prefixed so ("ab","c") and ("a","bc") hash differently.
void AppendField(std::string* out, std::string_view field) {
  AppendU32(out, static_cast<uint32_t>(field.size()));
  out->append(field);
}

// OpenSSL 3's one-shot SHA256() fetches the algorithm (taking a global lock)
// on every call; a per-thread context over a pre-fetched EVP_MD does not.
BlockHash Sha256(const void* data, size_t size) {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  struct Ctx {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    ~Ctx() { EVP_MD_CTX_free(ctx); }
  };
  thread_local Ctx ctx;
  BlockHash h;
  unsigned int len = 0;
  TANDEM_CHECK(EVP_DigestInit_ex(ctx.ctx, md, nullptr) == 1 &&
               EVP_DigestUpdate(ctx.ctx, data, size) == 1 &&
               EVP_DigestFinal_ex(ctx.ctx, h.bytes.data(), &len) == 1 && len == 32)
      << "SHA-256 failed";
  return h;
}

}  // namespace

std::string BlockHash::ToHex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kHex[bytes[i] >> 4];
    out[2 * i + 1] = kHex[bytes[i] & 0xf];
  }
  return out;
}

std::string BlockHash::ToBytes() const {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

absl::Status BlockHash::FromBytes(std::string_view raw, BlockHash* out) {
  if (raw.size() != out->bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block hash must be 32 bytes, got ", raw.size()));
  }
  std::memcpy(out->bytes.data(), raw.data(), raw.size());
  return absl::OkStatus();
}

BlockHash ComputeRootHash(const HashRootParams& params) {
  TANDEM_CHECK_GT(params.block_size, 0);
  std::string buf;
  AppendField(&buf, "tandem/v1");
  AppendField(&buf, params.model_fingerprint);
  AppendField(&buf, params.kv_layout);
  AppendU32(&buf, static_cast<uint32_t>(params.block_size));
  AppendField(&buf, params.dtype);
  AppendField(&buf, params.cache_salt);
  return Sha256(buf.data(), buf.size());
}

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> block_token_ids) {
  unsigned char buf[32 + 4 * 256];
  std::string heap;
  unsigned char* p = buf;
  const size_t size = 32 + 4 * block_token_ids.size();
  if (size > sizeof(buf)) {
    heap.resize(size);
    p = reinterpret_cast<unsigned char*>(heap.data());
  }
  std::memcpy(p, parent.bytes.data(), 32);
  for (size_t i = 0; i < block_token_ids.size(); ++i) {
    const uint32_t v = static_cast<uint32_t>(block_token_ids[i]);
    unsigned char* q = p + 32 + 4 * i;
    q[0] = v & 0xff;
    q[1] = (v >> 8) & 0xff;
    q[2] = (v >> 16) & 0xff;
    q[3] = (v >> 24) & 0xff;
  }
  return Sha256(p, size);
}

void ExtendBlockHashes(const BlockHash& root, std::span<const int32_t> token_ids,
                       int32_t block_size, std::vector<BlockHash>* hashes) {
  TANDEM_CHECK_GT(block_size, 0);
  const size_t num_full = token_ids.size() / static_cast<size_t>(block_size);
  while (hashes->size() < num_full) {
    const size_t i = hashes->size();
    const BlockHash& parent = i == 0 ? root : (*hashes)[i - 1];
    hashes->push_back(HashBlock(parent, token_ids.subspan(i * block_size, block_size)));
  }
}

absl::Status Sha256File(const std::string& path, std::string* hex_out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof(buf));
    EVP_DigestUpdate(ctx, buf, static_cast<size_t>(in.gcount()));
  }
  BlockHash h;
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, h.bytes.data(), &len);
  EVP_MD_CTX_free(ctx);
  *hex_out = h.ToHex();
  return absl::OkStatus();
}

}  // namespace tandem
