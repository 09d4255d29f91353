// The hot tier's memory: one pinned host allocation (tandem::PinnedBuffer:
// cudaHostAlloc with a CUDA device, else page-aligned and mlock()ed where the
// OS allows) cut into fixed-size slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "tandem/common/pinned_memory.h"

namespace tandem::kvstore {

struct HostArenaOptions {
  // Bytes per slot; > 0 when num_slots > 0. Rounded up to a multiple of 64.
  uint64_t slot_bytes = 2 << 20;
  // Number of slots; 0 makes an empty arena (no hot tier).
  uint64_t num_slots = 0;
  // Use cudaHostAlloc when a CUDA device is present.
  bool use_cuda_host_alloc = true;
  // mlock() the arena when not CUDA-pinned.
  bool lock_memory = true;
  // Back it with a memfd another process can map (PinnedMemoryOptions::
  // shareable); HostArena::fd() returns it.
  bool shareable = false;

  [[nodiscard]] absl::Status Validate() const;
};

class HostArena {
 public:
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(const HostArenaOptions& options);
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  [[nodiscard]] uint64_t slot_bytes() const { return slot_bytes_; }
  [[nodiscard]] uint64_t num_slots() const { return num_slots_; }
  [[nodiscard]] uint8_t* slot(uint64_t index) const {
    return reinterpret_cast<uint8_t*>(memory_.data()) + index * slot_bytes_;
  }
  // True when the memory is CUDA-pinned, or locked (CUDA-pinned or mlock()ed).
  [[nodiscard]] bool cuda_pinned() const {
    return memory_.size() > 0 && memory_.kind() == PinnedKind::kCudaPinned;
  }
  [[nodiscard]] bool locked() const {
    return memory_.size() > 0 && memory_.kind() != PinnedKind::kPageable;
  }
  // The whole arena, and its memfd when shareable (else -1).
  [[nodiscard]] std::span<const std::byte> memory() const {
    return {memory_.data(), memory_.size()};
  }
  [[nodiscard]] int fd() const { return memory_.fd(); }

 private:
  HostArena() = default;
  PinnedBuffer memory_;
  uint64_t slot_bytes_ = 0;
  uint64_t num_slots_ = 0;
};

}  // namespace tandem::kvstore
