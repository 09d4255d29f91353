#include "block_copies.h"

#include <algorithm>

#include "cuda_buffers.h"
#include "tandem/common/status.h"
#include "tandem/kernels/cuda_bf16_ops.h"

namespace tandem::model::internal {
namespace {

absl::StatusOr<std::shared_ptr<void>> NewEvent() {
  void* e = nullptr;
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::EventCreate(&e), "event"));
  return std::shared_ptr<void>(e, [](void* p) { kd::EventDestroy(p); });
}

}  // namespace

BlockCopies::~BlockCopies() { kd::StreamDestroy(stream_); }

absl::StatusOr<void*> BlockCopies::Stream() {
  if (stream_ == nullptr) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::StreamCreate(&stream_, /*blocking=*/false), "stream"));
  }
  return stream_;
}

absl::StatusOr<std::shared_ptr<void>> BlockCopies::Begin(void* after,
                                                         std::span<const int32_t> block_ids,
                                                         std::span<const Piece> pieces,
                                                         const char* what) {
  TANDEM_ASSIGN_OR_RETURN(void* stream, Stream());
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<void> steps_done, NewEvent());
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::EventRecord(steps_done.get(), after), "event"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::StreamWaitEvent(stream, steps_done.get()), "stream wait"));
  for (const Piece& p : pieces) {
    const int err = kd::CopyAsync(p.dst, p.src, p.bytes, stream);
    if (err != 0) {
      // The copies already enqueued still use the host memory: let them end
      // before the caller takes it back.
      kd::StreamSynchronize(stream);
      return CudaStatus(err, what);
    }
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<void> copied, NewEvent());
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::EventRecord(copied.get(), stream), "event"));
  std::vector<int32_t> blocks(block_ids.begin(), block_ids.end());
  std::sort(blocks.begin(), blocks.end());
  running_.push_back(Copy{.copied = copied, .blocks = std::move(blocks)});
  return copied;
}

ModelRunner::BlockCopyWait BlockCopies::WaitFor(std::shared_ptr<void> event, int32_t device,
                                                const char* what) {
  return [event = std::move(event), device, what]() -> absl::Status {
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device), "set device"));
    return CudaStatus(kd::EventSynchronize(event.get()), what);
  };
}

bool BlockCopies::Ended(const std::shared_ptr<void>& event) {
  bool done = false;
  return kd::EventQuery(event.get(), &done) != 0 || done;
}

absl::Status BlockCopies::OrderBefore(std::span<const int32_t> blocks, void* stream,
                                      bool host_waits) {
  std::erase_if(running_, [](const Copy& c) { return Ended(c.copied); });
  for (const Copy& c : running_) {
    const bool overlaps = std::any_of(blocks.begin(), blocks.end(), [&](int32_t b) {
      return std::binary_search(c.blocks.begin(), c.blocks.end(), b);
    });
    if (!overlaps) continue;
    TANDEM_RETURN_IF_ERROR(
        host_waits ? CudaStatus(kd::EventSynchronize(c.copied.get()), "block copy")
                   : CudaStatus(kd::StreamWaitEvent(stream, c.copied.get()), "stream wait"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::model::internal
