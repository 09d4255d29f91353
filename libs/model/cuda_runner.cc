// The CUDA backend: a thin composition of the kernels' CUDA ops.
#include "cpu_runner.h"

namespace tandem::model::internal {

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(const Model*, KvCacheOptions) {
  return absl::UnavailableError("CUDA backend: not implemented yet");
}

}  // namespace tandem::model::internal
