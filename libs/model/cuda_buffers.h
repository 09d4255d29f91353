// Device-memory helpers of the CUDA runner (cuda_runner_base.h; built only with
// TANDEM_HAVE_CUDA): CUDA error codes as Status, grow-only device buffers,
// and the upload of a model's weights into them. Pinned host memory is
// tandem::PinnedBuffer (tandem/common/pinned_memory.h), the tree's one.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tandem/common/status.h"
#include "tandem/kernels/cuda_ops.h"
#include "tandem/model/checkpoint.h"
#include "tandem/model/model.h"

namespace tandem::model::internal {

namespace kd = ::tandem::kernels::cuda;

inline absl::Status CudaStatus(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", kd::ErrorString(err)));
}

// Device memory (kd::Malloc) that only grows.
template <int (*kAlloc)(void**, size_t), int (*kFree)(void*)>
class GrowOnlyBuffer {
 public:
  GrowOnlyBuffer() = default;
  ~GrowOnlyBuffer() {
    if (ptr_ != nullptr) kFree(ptr_);
  }
  GrowOnlyBuffer(const GrowOnlyBuffer&) = delete;
  GrowOnlyBuffer& operator=(const GrowOnlyBuffer&) = delete;
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_ != nullptr) kFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    TANDEM_RETURN_IF_ERROR(CudaStatus(kAlloc(&ptr_, bytes), "alloc"));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  // Device buffers only.
  template <typename T>
  absl::Status Upload(const std::vector<T>& host) {
    return UploadParts<T>({std::span<const T>(host)});
  }
  // The parts one after another (a fused GEMM's stacked weights).
  template <typename T>
  absl::Status UploadParts(std::initializer_list<std::span<const T>> parts) {
    size_t total = 0;
    for (const std::span<const T>& p : parts) total += p.size();
    TANDEM_RETURN_IF_ERROR(Reserve(std::max<size_t>(total * sizeof(T), 1)));
    size_t offset = 0;
    for (const std::span<const T>& p : parts) {
      if (p.empty()) continue;
      TANDEM_RETURN_IF_ERROR(CudaStatus(
          kd::CopyToDevice(static_cast<T*>(ptr_) + offset, p.data(), p.size() * sizeof(T)),
          "upload"));
      offset += p.size();
    }
    return absl::OkStatus();
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};
using DeviceBuffer = GrowOnlyBuffer<kd::Malloc, kd::Free>;

// Uploads the weights `kinds` of `layer`, stacked by rows (one fused GEMM's
// weight when several), as fp32 or bf16 (the model's Fp32 / Bf16 views: a
// tensor converted on the host lives only until its upload). An absent
// optional weight uploads nothing.
template <typename T>
absl::Status UploadWeights(const Model& model, DeviceBuffer* dst,
                           std::initializer_list<WeightKind> kinds, int32_t layer) {
  std::vector<WeightView<T>> views;
  for (WeightKind kind : kinds) {
    absl::StatusOr<WeightView<T>> v;
    if constexpr (std::is_same_v<T, float>) {
      v = model.Fp32({kind, layer});
    } else {
      v = model.Bf16({kind, layer});
    }
    if (!v.ok()) return v.status();
    views.push_back(std::move(*v));
  }
  if (views.front().empty()) return absl::OkStatus();
  if (views.size() == 1) return dst->UploadParts<T>({views[0].span()});
  if (views.size() == 2) return dst->UploadParts<T>({views[0].span(), views[1].span()});
  return dst->UploadParts<T>({views[0].span(), views[1].span(), views[2].span()});
}

}  // namespace tandem::model::internal
