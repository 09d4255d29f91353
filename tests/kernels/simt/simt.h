// A CPU emulator of CUDA thread blocks, for testing the logic of the bf16
// attention kernels on machines without a GPU (most of this project's
// sessions). A kernel's .cu file is compiled as host C++ with TANDEM_SIMT
// defined (its launch code left out) and its __global__ function run by
// simt::Launch: every thread of a block is a fiber (ucontext) on one OS
// thread, switched at each barrier and warp collective, and the blocks run
// one after another. Shared memory is one buffer (static __shared__ arrays
// become function statics), cp.async copies at once, and the warp-level
// instructions the kernels use (shfl.xor, vote.all, ldmatrix.x4 with and
// without .trans, mma.sync m16n8k16 bf16 with fp32 accumulation) follow the
// fragment layouts of the PTX ISA, with fp32 sums in k order. cp.async's
// timing and the threads' order are the test's choice (Schedule).
//
// What it checks: indexing, masks, loop bounds, the online softmax's
// bookkeeping and the layouts a kernel assumes, against a naive reference;
// with Schedule, shared memory read before its copy's wait or before the
// barrier after another thread's write. What it cannot: timing, and the
// bits of the tensor cores' sums. The prefill
// kernel, whose layouts a GPU validated (DESIGN-NOTES, round one), passing
// here is what vouches for the emulated instructions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>

namespace tandem::simt {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};
// The running fiber's built-in variables.
extern Dim3 thread_idx, block_idx, block_dim, grid_dim;

// Runs kernel() for every thread of every block of a grid (grid.x by grid.y
// blocks of block.x threads, a multiple of 32), with `dynamic_shared` bytes
// of dynamic shared memory, zeroed per launch.
void Launch(Dim3 grid, Dim3 block, size_t dynamic_shared, const std::function<void()>& kernel);
unsigned char* DynamicShared();

// How the emulator orders what the hardware leaves open, so that a test can
// run a kernel under more than one order:
// - copies_at_wait: cp.async copies land only at the cp.async.wait_group
//   that needs them (exposes a read before its wait), else at once;
// - warps_run_ahead: each warp runs until all its threads wait at a
//   __syncthreads before the next warp runs (exposes a buffer refilled by
//   one warp while another still reads it: a missing barrier at a loop's
//   end), else the threads take turns one collective at a time;
// - reverse: threads and warps in decreasing order (exposes a read of
//   another thread's write that no barrier orders, whichever runs first).
struct Schedule {
  bool copies_at_wait = false;
  bool warps_run_ahead = false;
  bool reverse = false;
};
void SetSchedule(Schedule s);

// cp.async of 16 bytes (bytes < 16: the rest zero), commit_group and
// wait_group n, per thread.
void CpAsync(void* dst, const void* src, int bytes);
void CpAsyncCommit();
void CpAsyncWait(int n);

void SyncThreads();
// Warp collectives: every lane of the calling thread's warp calls them, with
// the full mask.
float ShflXor(float v, int lane_mask);
int32_t ShflXor(int32_t v, int lane_mask);
bool AllLanes(bool predicate);
void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
void LdMatrixX4(uint32_t (&out)[4], const void* row, bool trans);

// f(std::integral_constant<int, V>{}) for the first V of the list equal to
// n, or for the last V when none is: a kernel template's runtime choice
// (head size, n-tiles, lanes, heads a block) as the tests launch it.
template <int V, int... Rest, typename F>
void WithConstant(int n, F&& f) {
  if constexpr (sizeof...(Rest) == 0) {
    f(std::integral_constant<int, V>{});
  } else if (n == V) {
    f(std::integral_constant<int, V>{});
  } else {
    WithConstant<Rest...>(n, std::forward<F>(f));
  }
}

}  // namespace tandem::simt

#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)
#define threadIdx ::tandem::simt::thread_idx
#define blockIdx ::tandem::simt::block_idx
#define blockDim ::tandem::simt::block_dim
#define gridDim ::tandem::simt::grid_dim
// Dynamic shared memory, declared in the kernels with
// TANDEM_DYNAMIC_SHARED (cuda_bf16_device.cuh).
#define TANDEM_SIMT_DYNAMIC_SHARED(name) unsigned char* const name = ::tandem::simt::DynamicShared()

inline void __syncthreads() { ::tandem::simt::SyncThreads(); }
inline float __shfl_xor_sync(unsigned, float v, int m) { return ::tandem::simt::ShflXor(v, m); }
inline int __shfl_xor_sync(unsigned, int v, int m) { return ::tandem::simt::ShflXor(v, m); }
inline int __all_sync(unsigned, int predicate) {
  return ::tandem::simt::AllLanes(predicate != 0) ? 1 : 0;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t bytes = uint64_t{y} << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<uint32_t>((bytes >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
// Fibers switch only at barriers and collectives: a plain add is atomic.
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p += v;
  return old;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// The special function unit's exp with .ftz: subnormal results are zero.
inline float __expf(float x) {
  const float r = std::exp2(x * 1.4426950408889634f);
  return r < FLT_MIN ? 0.0f : r;
}
using std::max;
using std::min;
