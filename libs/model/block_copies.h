// Block copies between the CUDA runner's KV cache and host memory that run
// on a stream of their own beside the steps: out of the cache for the
// KV-store's stores (ModelRunner::CopyBlocksToHostAsync), into it for its
// loads (CopyBlocksFromHostAsync), and what other work on those blocks must
// wait for (DESIGN §5 "Ordering"; DESIGN-NOTES.md, "Stores off the step",
// "Loads into the cache off the step"). Built only with TANDEM_HAVE_CUDA.
// Not thread-safe: the runner's owner thread calls it; the events it
// returns may be waited for on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/model/model_runner.h"

namespace tandem::model::internal {

class BlockCopies {
 public:
  // One block's copy: `bytes` from src to dst (one of them in the cache).
  struct Piece {
    void* dst;
    const void* src;
    size_t bytes;
  };

  BlockCopies() = default;
  // Copies still running finish first (cudaStreamDestroy does not wait, but
  // releases the stream only then); their events stay with their waits.
  ~BlockCopies();
  BlockCopies(const BlockCopies&) = delete;
  BlockCopies& operator=(const BlockCopies&) = delete;

  // The copy stream (non-blocking: the steps' kernels and the synchronous
  // downloads on the legacy stream run meanwhile), made on first use.
  absl::StatusOr<void*> Stream();
  // Queues pieces[i], which copies block block_ids[i], on the copy stream
  // after all the work enqueued so far on `after` (the step stream; a
  // blocking one, so also after the legacy stream's) and after the work
  // already on the copy stream. Returns the event recorded after them. The
  // caller checked ids and sizes.
  absl::StatusOr<std::shared_ptr<void>> Begin(void* after, std::span<const int32_t> block_ids,
                                              std::span<const Piece> pieces, const char* what);
  // Forgets the copies that have finished; then makes `stream` (or, with
  // host_waits, the host) wait for each one still running that copies one
  // of `blocks`.
  absl::Status OrderBefore(std::span<const int32_t> blocks, void* stream, bool host_waits);
  // No copy may still be running.
  [[nodiscard]] bool empty() const { return running_.empty(); }

  // What waits for a copy's event on any thread; `what` names the copy in
  // its error.
  static ModelRunner::BlockCopyWait WaitFor(std::shared_ptr<void> event, int32_t device,
                                            const char* what);
  // Whether a copy's event has fired; an error counts as ended (its wait
  // reports it).
  static bool Ended(const std::shared_ptr<void>& event);

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
