#include "block_copies_out.h"

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

BlockCopiesOut::~BlockCopiesOut() { kd::StreamDestroy(stream_); }

absl::StatusOr<ModelRunner::BlockCopyWait> BlockCopiesOut::Begin(
    void* after, int32_t device, const std::byte* cache, int64_t block_bytes,
    std::span<const int32_t> block_ids, std::span<const std::span<std::byte>> out) {
  if (stream_ == nullptr) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::StreamCreate(&stream_, /*blocking=*/false), "stream"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<void> steps_done, NewEvent());
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::EventRecord(steps_done.get(), after), "event"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::StreamWaitEvent(stream_, steps_done.get()), "stream wait"));
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int err = kd::CopyAsync(out[i].data(), cache + int64_t{block_ids[i]} * block_bytes,
                                  out[i].size(), stream_);
    if (err != 0) {
      // The copies already enqueued still write into `out`: let them end
      // before the caller takes the memory back.
      kd::StreamSynchronize(stream_);
      return CudaStatus(err, "block copy to host");
    }
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<void> copied, NewEvent());
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::EventRecord(copied.get(), stream_), "event"));
  std::vector<int32_t> blocks(block_ids.begin(), block_ids.end());
  std::sort(blocks.begin(), blocks.end());
  running_.push_back(Copy{.copied = copied, .blocks = std::move(blocks)});
  return ModelRunner::BlockCopyWait([copied, device]() -> absl::Status {
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device), "set device"));
    return CudaStatus(kd::EventSynchronize(copied.get()), "block copy to host");
  });
}

absl::Status BlockCopiesOut::OrderBefore(std::span<const int32_t> written, void* stream,
                                         bool host_waits) {
  std::erase_if(running_, [](const Copy& c) {
    bool done = false;
    // An error stays with the copy's own wait, which reports it.
    return kd::EventQuery(c.copied.get(), &done) != 0 || done;
  });
  for (const Copy& c : running_) {
    const bool overlaps = std::any_of(written.begin(), written.end(), [&](int32_t b) {
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
