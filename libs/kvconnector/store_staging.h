// Host memory of the worker's queued stores (KvStoreConnectorWorker): slots
// of one KV block each, cut from chunks of tandem::PinnedBuffer (CUDA-pinned
// when asked and a device is present, so that a GPU cache's copies into it
// are DMA at bus speed), allocated on demand up to a cap and kept for reuse.
// Before it each store entry allocated and zeroed a std::vector of its
// blocks: on a CPU worker that was a fresh mmap with a page fault per 4 KiB
// on every entry, and a GPU's copy into pageable memory is staged by the
// driver and waits for the host.
// Not thread-safe: the connector calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tandem/common/pinned_memory.h"

namespace tandem::kvconnector {

class StoreStaging {
 public:
  // Slots of `block_bytes`; at most `capacity_bytes` in all (whole slots).
  StoreStaging(int64_t block_bytes, int64_t capacity_bytes, bool use_cuda_host_alloc);

  // `n` free slots, or none when fewer than `n` are free and the cap (or
  // the host, logged) allows no more.
  [[nodiscard]] std::vector<std::byte*> Take(size_t n);
  // Returns slots Take gave.
  void Give(std::span<std::byte* const> slots);

  // Bytes allocated so far (they stay allocated for reuse).
  [[nodiscard]] int64_t allocated_bytes() const { return allocated_slots_ * block_bytes_; }

 private:
  const int64_t block_bytes_;
  const int64_t max_slots_;
  const bool use_cuda_host_alloc_;
  int64_t allocated_slots_ = 0;
  std::vector<PinnedBuffer> chunks_;
  std::vector<std::byte*> free_;
};

}  // namespace tandem::kvconnector
