// The cuBLAS handle behind cuda::BlasHandle, shared by the fp32 and bf16 ops.
#pragma once

#include <cublas_v2.h>

namespace tandem::kernels::cuda {

struct BlasHandle {
  cublasHandle_t handle = nullptr;
  // SetBlasStream's workspace, also TcGemmBf16's partial sums (stream-ordered
  // with cuBLAS's own use of it).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

}  // namespace tandem::kernels::cuda
