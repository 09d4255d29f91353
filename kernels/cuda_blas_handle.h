// The cuBLAS handle behind cuda::BlasHandle, shared by the fp32 and bf16 ops.
#pragma once

#include <cublas_v2.h>

namespace tandem::kernels::cuda {

struct BlasHandle {
  cublasHandle_t handle = nullptr;
};

}  // namespace tandem::kernels::cuda
