// Host/device plumbing shared by the CPU and CUDA implementations.
//
// TANDEM_HD marks per-element math that both nvcc and the host compiler
// build, so the CPU tests run the same code the GPU runs. Simple kernels are
// functors of (block, thread, block_dim): LaunchOnCpu() walks the same grid a
// CUDA launch would, so their indexing is exercised without a GPU.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__
#else
#define TANDEM_HD
#endif

namespace tandem::kernels {

// A 1-D launch: `blocks` blocks of `threads` threads.
struct Grid {
  int64_t blocks = 0;
  int32_t threads = 0;
};

// Runs f(block, thread, threads) for every point of the grid, in order.
template <typename F>
inline void LaunchOnCpu(Grid grid, const F& f) {
  for (int64_t b = 0; b < grid.blocks; ++b) {
    for (int32_t t = 0; t < grid.threads; ++t) f(b, t, grid.threads);
  }
}

}  // namespace tandem::kernels
