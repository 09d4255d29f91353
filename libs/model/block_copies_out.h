// Block copies from the CUDA runner's KV cache to host memory that run on a
// stream of their own beside the steps (ModelRunner::CopyBlocksToHostAsync:
// the KV-store's stores), and what a later write of those blocks must wait
// for (DESIGN §5 "Ordering"; DESIGN-NOTES.md, "Stores off the step"). Built
// only with TANDEM_HAVE_CUDA. Not thread-safe: the runner's owner thread
// calls it; the waits it returns may run on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/model/model_runner.h"

namespace tandem::model::internal {

class BlockCopiesOut {
 public:
  BlockCopiesOut() = default;
  // Copies still running finish first (cudaStreamDestroy does not wait, but
  // releases the stream only then); their waits own their events.
  ~BlockCopiesOut();
  BlockCopiesOut(const BlockCopiesOut&) = delete;
  BlockCopiesOut& operator=(const BlockCopiesOut&) = delete;

  // Copies block_ids[i] (block_bytes at cache + id * block_bytes) into
  // out[i] on the copy stream (non-blocking: the steps' kernels and the
  // synchronous downloads on the legacy stream run meanwhile), after all
  // the work enqueued so far on `after` (the step stream; a blocking one,
  // so also after the legacy stream's). The caller checked ids and sizes.
  absl::StatusOr<ModelRunner::BlockCopyWait> Begin(void* after, int32_t device,
                                                   const std::byte* cache, int64_t block_bytes,
                                                   std::span<const int32_t> block_ids,
                                                   std::span<const std::span<std::byte>> out);
  // Forgets the copies that have finished; then makes `stream` (or, with
  // host_waits, the host) wait for each one still running that reads one of
  // `written`.
  absl::Status OrderBefore(std::span<const int32_t> written, void* stream, bool host_waits);
  // No copy may still be running.
  [[nodiscard]] bool empty() const { return running_.empty(); }

 private:
  // A copy that may still run: the event after it, and its block ids, sorted.
  struct Copy {
    std::shared_ptr<void> copied;
    std::vector<int32_t> blocks;
  };
  void* stream_ = nullptr;
  std::vector<Copy> running_;
};

}  // namespace tandem::model::internal
