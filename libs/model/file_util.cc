#include "file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tandem/model/model.h"

namespace tandem::model::internal {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, ": cannot map: ", std::strerror(err)));
    }
    f->data_ = static_cast<const char*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

void MappedFile::Release(int64_t begin, int64_t end) const {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t first = (begin + page - 1) / page * page;  // whole pages inside the range
  const int64_t last = end / page * page;
  if (data_ == nullptr || last <= first) return;
  ::madvise(const_cast<char*>(data_) + first, static_cast<size_t>(last - first), MADV_DONTNEED);
}

void HashRopeScaling(EVP_MD_CTX* ctx, const ModelConfig& c) {
  if (c.rotary_dim != 0) EVP_DigestUpdate(ctx, &c.rotary_dim, sizeof(c.rotary_dim));
  if (c.sandwich_norms || !c.local_rope_layers.empty() || c.query_pre_attn_scalar != 0) {
    const float gemma3[] = {c.sandwich_norms ? 1.0f : 0.0f, c.query_pre_attn_scalar,
                            c.local_rope_theta, c.attn_logit_softcap, c.final_logit_softcap};
    EVP_DigestUpdate(ctx, gemma3, sizeof(gemma3));
    for (bool local : c.local_rope_layers) {
      const uint8_t b = local ? 1 : 0;
      EVP_DigestUpdate(ctx, &b, 1);
    }
  }
  if (!c.rope_scaling.ScalesAttention()) return;
  const std::vector<float> inv_freq = c.RopeInverseFrequencies();
  EVP_DigestUpdate(ctx, inv_freq.data(), inv_freq.size() * sizeof(float));
  EVP_DigestUpdate(ctx, &c.rope_scaling.attention_factor, sizeof(float));
}

std::string FinishSha256Hex(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return std::move(ss).str();
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace tandem::model::internal
