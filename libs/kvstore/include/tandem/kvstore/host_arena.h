// The hot tier's memory: one pinned host allocation cut into fixed-size slots.
//
// With a CUDA device present (built with TANDEM_HAVE_CUDA and a device found
// at run time) the arena comes from cudaHostAlloc, so copies to the GPU run
// at full PCIe speed. Otherwise it is page-aligned anonymous memory, mlock()ed
// where the OS allows it (a failed mlock is logged and ignored).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"

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

  [[nodiscard]] absl::Status Validate() const;
};

class HostArena {
 public:
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(const HostArenaOptions& options);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  [[nodiscard]] uint64_t slot_bytes() const { return slot_bytes_; }
  [[nodiscard]] uint64_t num_slots() const { return num_slots_; }
  [[nodiscard]] uint8_t* slot(uint64_t index) const { return base_ + index * slot_bytes_; }
  // True when the memory is CUDA-pinned, or mlock()ed.
  [[nodiscard]] bool cuda_pinned() const { return cuda_pinned_; }
  [[nodiscard]] bool locked() const { return locked_; }

 private:
  HostArena() = default;
  uint8_t* base_ = nullptr;
  uint64_t slot_bytes_ = 0;
  uint64_t num_slots_ = 0;
  uint64_t mapped_bytes_ = 0;
  bool cuda_pinned_ = false;
  bool locked_ = false;
};

}  // namespace tandem::kvstore
