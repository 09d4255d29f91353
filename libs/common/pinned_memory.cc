#include "tandem/common/pinned_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tandem {

const char* PinnedKindName(PinnedKind kind) {
  switch (kind) {
    case PinnedKind::kCudaPinned:
      return "cuda-pinned";
    case PinnedKind::kLocked:
      return "locked";
    case PinnedKind::kPageable:
      return "pageable";
  }
  return "?";
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes,
                                                    const PinnedMemoryOptions& options) {
  PinnedBuffer buf;
  if (bytes == 0) return buf;
#ifdef TANDEM_HAVE_CUDA
  int devices = 0;
  if (options.use_cuda_host_alloc && cudaGetDeviceCount(&devices) != cudaSuccess) {
    devices = 0;
    cudaGetLastError();  // no device or driver: clear the error it leaves behind
  }
  if (options.shareable) return AllocateShared(bytes, options, devices > 0);
  if (devices > 0) {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err == cudaSuccess) {
      buf.data_ = static_cast<std::byte*>(p);
      buf.size_ = bytes;
      buf.kind_ = PinnedKind::kCudaPinned;
      TANDEM_LOG(INFO) << options.what << ": " << bytes << " bytes pinned with cudaHostAlloc";
      return buf;
    }
    TANDEM_LOG(WARNING) << options.what << ": cudaHostAlloc(" << bytes
                        << ") failed: " << cudaGetErrorString(err)
                        << "; falling back to page-aligned host memory";
  }
#else
  if (options.shareable) return AllocateShared(bytes, options, /*cuda_device=*/false);
#endif
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options.what, ": mmap of ", bytes, " bytes failed: ", std::strerror(errno)));
  }
  buf.data_ = static_cast<std::byte*>(p);
  buf.size_ = bytes;
  buf.kind_ = PinnedKind::kPageable;
  buf.Lock(options);
  return buf;
}

void PinnedBuffer::Lock(const PinnedMemoryOptions& options) {
  if (options.lock) {
    if (mlock(data_, size_) == 0) {
      kind_ = PinnedKind::kLocked;
      TANDEM_LOG(INFO) << options.what << ": " << size_ << " bytes, page-aligned and mlock()ed";
    } else {
      TANDEM_LOG(INFO) << options.what << ": mlock of " << size_ << " bytes not allowed ("
                       << std::strerror(errno) << "); using unlocked page-aligned memory";
    }
  }
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::AllocateShared(size_t bytes,
                                                          const PinnedMemoryOptions& options,
                                                          bool cuda_device) {
  PinnedBuffer buf;
  buf.fd_ = memfd_create(options.what, MFD_CLOEXEC);
  if (buf.fd_ < 0 || ftruncate(buf.fd_, static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(options.what, ": memfd of ", bytes,
                                                     " bytes: ", std::strerror(errno)));
  }
  // Backed now, whether or not it is locked below: another process maps
  // it and populates its page tables ahead of its writes (the KV client's
  // local stores), which must find pages, not allocate them in its own
  // memory cgroup.
  if (fallocate(buf.fd_, 0, 0, static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP) {
    return absl::ResourceExhaustedError(absl::StrCat(options.what, ": backing a memfd of ", bytes,
                                                     " bytes: ", std::strerror(errno)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, buf.fd_, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        options.what, ": mmap of a ", bytes, "-byte memfd failed: ", std::strerror(errno)));
  }
  buf.data_ = static_cast<std::byte*>(p);
  buf.size_ = bytes;
  buf.kind_ = PinnedKind::kPageable;
#ifdef TANDEM_HAVE_CUDA
  if (cuda_device) {
    const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (err == cudaSuccess) {
      buf.kind_ = PinnedKind::kCudaPinned;
      buf.cuda_registered_ = true;
      TANDEM_LOG(INFO) << options.what << ": " << bytes
                       << " bytes of shared memory, pinned with cudaHostRegister";
      return buf;
    }
    cudaGetLastError();
    TANDEM_LOG(WARNING) << options.what << ": cudaHostRegister(" << bytes
                        << ") failed: " << cudaGetErrorString(err);
  }
#else
  (void)cuda_device;
#endif
  buf.Lock(options);
  return buf;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    kind_ = std::exchange(other.kind_, PinnedKind::kPageable);
    fd_ = std::exchange(other.fd_, -1);
    cuda_registered_ = std::exchange(other.cuda_registered_, false);
  }
  return *this;
}

void PinnedBuffer::Free() {
  if (fd_ >= 0) close(std::exchange(fd_, -1));
  if (data_ == nullptr) return;
  switch (kind_) {
    case PinnedKind::kCudaPinned:
#ifdef TANDEM_HAVE_CUDA
      if (cuda_registered_) {
        cudaHostUnregister(data_);
        munmap(data_, size_);
      } else {
        cudaFreeHost(data_);
      }
#endif
      break;
    case PinnedKind::kLocked:
      munlock(data_, size_);
      munmap(data_, size_);
      break;
    case PinnedKind::kPageable:
      munmap(data_, size_);
      break;
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace tandem
