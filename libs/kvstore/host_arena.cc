#include "tandem/kvstore/host_arena.h"

#include "absl/strings/str_cat.h"
#include "tandem/common/status.h"

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
  TANDEM_ASSIGN_OR_RETURN(
      arena->memory_, PinnedBuffer::Allocate(arena->slot_bytes_ * arena->num_slots_,
                                             {.use_cuda_host_alloc = options.use_cuda_host_alloc,
                                              .lock = options.lock_memory,
                                              .what = "hot tier",
                                              .shareable = options.shareable}));
  return arena;
}

}  // namespace tandem::kvstore
