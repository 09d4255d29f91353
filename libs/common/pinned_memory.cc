#include "tandem/common/pinned_memory.h"

#include <sys/mman.h>

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
#endif
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options.what, ": mmap of ", bytes, " bytes failed: ", std::strerror(errno)));
  }
  buf.data_ = static_cast<std::byte*>(p);
  buf.size_ = bytes;
  buf.kind_ = PinnedKind::kPageable;
  if (options.lock) {
    if (mlock(p, bytes) == 0) {
      buf.kind_ = PinnedKind::kLocked;
      TANDEM_LOG(INFO) << options.what << ": " << bytes << " bytes, page-aligned and mlock()ed";
    } else {
      TANDEM_LOG(INFO) << options.what << ": mlock of " << bytes << " bytes not allowed ("
                       << std::strerror(errno) << "); using unlocked page-aligned memory";
    }
  }
  return buf;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    kind_ = std::exchange(other.kind_, PinnedKind::kPageable);
  }
  return *this;
}

void PinnedBuffer::Free() {
  if (data_ == nullptr) return;
  switch (kind_) {
    case PinnedKind::kCudaPinned:
#ifdef TANDEM_HAVE_CUDA
      cudaFreeHost(data_);
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
