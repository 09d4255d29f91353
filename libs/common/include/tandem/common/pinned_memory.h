// Host memory that copies to and from a GPU read at full bus speed: the one
// helper for it, used by the KV-store's hot tier (kvstore::HostArena) and the
// KV connector's load staging.
//
// cudaHostAlloc (portable) when built with CUDA and a device is present at
// run time; else page-aligned anonymous memory, mlock()ed where the OS allows
// (RLIMIT_MEMLOCK; a refused mlock is logged and the memory stays pageable).
// Lives in its own target, tandem::pinned_memory, so that only the binaries
// that use it link the CUDA runtime.
#pragma once

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"

namespace tandem {

enum class PinnedKind {
  kCudaPinned,  // cudaHostAlloc
  kLocked,      // page-aligned, mlock()ed
  kPageable,    // page-aligned; mlock() not allowed or not asked for
};
[[nodiscard]] const char* PinnedKindName(PinnedKind kind);

struct PinnedMemoryOptions {
  // Use cudaHostAlloc when a CUDA device is present.
  bool use_cuda_host_alloc = true;
  // mlock() the memory when it is not CUDA-pinned.
  bool lock = true;
  // Names the buffer in log lines ("hot tier", "KV load staging").
  const char* what = "host buffer";
  // Back the memory with a memfd mapped MAP_SHARED (PinnedBuffer::fd()), so
  // that another process can map it too: the KV-store's hot tier, read in
  // place by the workers on its host. With a CUDA device it is registered
  // (cudaHostRegister) instead of allocated by cudaHostAlloc.
  bool shareable = false;
};

// One allocation, freed by the destructor; move-only.
class PinnedBuffer {
 public:
  // RESOURCE_EXHAUSTED when the memory cannot be had at all. `bytes` == 0
  // gives an empty buffer.
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes, const PinnedMemoryOptions& options);

  PinnedBuffer() = default;
  ~PinnedBuffer() { Free(); }
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  [[nodiscard]] std::byte* data() const { return data_; }
  [[nodiscard]] size_t size() const { return size_; }
  [[nodiscard]] PinnedKind kind() const { return kind_; }
  // The memfd of a shareable buffer; -1 otherwise. Owned by the buffer.
  [[nodiscard]] int fd() const { return fd_; }

 private:
  static absl::StatusOr<PinnedBuffer> AllocateShared(size_t bytes,
                                                     const PinnedMemoryOptions& options,
                                                     bool cuda_device);
  // mlock()s the memory when options.lock (kLocked), logging a refusal.
  void Lock(const PinnedMemoryOptions& options);
  void Free();
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  PinnedKind kind_ = PinnedKind::kPageable;
  int fd_ = -1;
  bool cuda_registered_ = false;  // cudaHostRegister'ed (shareable), not cudaHostAlloc'ed
};

}  // namespace tandem
