#include "store_staging.h"

#include <algorithm>

#include "tandem/common/logging.h"

namespace tandem::kvconnector {

StoreStaging::StoreStaging(int64_t block_bytes, int64_t capacity_bytes, bool use_cuda_host_alloc)
    : block_bytes_(block_bytes),
      max_slots_(block_bytes > 0 ? capacity_bytes / block_bytes : 0),
      use_cuda_host_alloc_(use_cuda_host_alloc) {}

std::vector<std::byte*> StoreStaging::Take(size_t n) {
  const auto want = static_cast<int64_t>(n);
  if (static_cast<int64_t>(free_.size()) < want) {
    // A chunk covers what is missing and at least 32 MiB of slots (one
    // allocation, and one log line, per chunk).
    const int64_t missing = want - static_cast<int64_t>(free_.size());
    const int64_t room = max_slots_ - allocated_slots_;
    if (missing > room) return {};
    const int64_t slots =
        std::min(room, std::max(missing, (int64_t{32} << 20) / std::max<int64_t>(block_bytes_, 1)));
    absl::StatusOr<PinnedBuffer> chunk = PinnedBuffer::Allocate(
        static_cast<size_t>(slots * block_bytes_),
        {.use_cuda_host_alloc = use_cuda_host_alloc_, .lock = false, .what = "KV store staging"});
    if (!chunk.ok()) {
      TANDEM_LOG(WARNING) << "KV-store stores: " << chunk.status();
      return {};
    }
    for (int64_t i = 0; i < slots; ++i) free_.push_back(chunk->data() + i * block_bytes_);
    allocated_slots_ += slots;
    chunks_.push_back(std::move(chunk).value());
  }
  std::vector<std::byte*> taken(free_.end() - want, free_.end());
  free_.resize(free_.size() - n);
  return taken;
}

void StoreStaging::Give(std::span<std::byte* const> slots) {
  free_.insert(free_.end(), slots.begin(), slots.end());
}

}  // namespace tandem::kvconnector
