#include "tandem/kvstore/host_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tandem::kvstore {

absl::Status HostArenaOptions::Validate() const {
  if (num_slots > 0 && slot_bytes == 0) {
    return absl::InvalidArgumentError("HostArenaOptions.slot_bytes must be > 0");
  }
  if (num_slots > 0 && slot_bytes > (uint64_t{1} << 40) / num_slots) {
    return absl::InvalidArgumentError(absl::StrCat("HostArenaOptions: ", num_slots, " slots of ",
                                                   slot_bytes, " bytes exceed 1 TiB"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Create(const HostArenaOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<HostArena> arena(new HostArena());
  arena->slot_bytes_ = (options.slot_bytes + 63) / 64 * 64;
  arena->num_slots_ = options.num_slots;
  const uint64_t bytes = arena->slot_bytes_ * arena->num_slots_;
  if (bytes == 0) return arena;
#ifdef TANDEM_HAVE_CUDA
  int devices = 0;
  if (options.use_cuda_host_alloc && cudaGetDeviceCount(&devices) != cudaSuccess) {
    devices = 0;
    cudaGetLastError();  // no device or driver: clear the error it leaves behind
  }
  if (devices > 0) {
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err == cudaSuccess) {
      arena->base_ = static_cast<uint8_t*>(p);
      arena->cuda_pinned_ = true;
      arena->locked_ = true;
      TANDEM_LOG(INFO) << "hot tier: " << bytes << " bytes pinned with cudaHostAlloc";
      return arena;
    }
    TANDEM_LOG(WARNING) << "cudaHostAlloc(" << bytes << ") failed: " << cudaGetErrorString(err)
                        << "; falling back to page-aligned host memory";
  }
#endif
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("hot tier: mmap of ", bytes, " bytes failed: ", std::strerror(errno)));
  }
  arena->base_ = static_cast<uint8_t*>(p);
  arena->mapped_bytes_ = bytes;
  if (options.lock_memory) {
    if (mlock(p, bytes) == 0) {
      arena->locked_ = true;
    } else {
      TANDEM_LOG(INFO) << "hot tier: mlock of " << bytes << " bytes not allowed ("
                       << std::strerror(errno) << "); using unlocked page-aligned memory";
    }
  }
  return arena;
}

HostArena::~HostArena() {
  if (base_ == nullptr) return;
#ifdef TANDEM_HAVE_CUDA
  if (cuda_pinned_) {
    cudaFreeHost(base_);
    return;
  }
#endif
  if (locked_) munlock(base_, mapped_bytes_);
  munmap(base_, mapped_bytes_);
}

}  // namespace tandem::kvstore
