// Device helpers the bf16 kernels share (cuda_bf16_ops.cu,
// cuda_decode_attention.cu, cuda_prefill_attention.cu): bf16 loads and
// stores, and cp.async copies from global into shared memory. With
// TANDEM_SIMT (tests/kernels/simt) the instructions go to the CPU
// emulator, which includes this header as host C++.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "tandem/kernels/cuda_bf16_ops.h"

namespace tandem::kernels::cuda {

inline cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

__device__ __forceinline__ float Load(const Bf16* p) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}
__device__ __forceinline__ Bf16 Store(float f) {
  const __nv_bfloat16 b = __float2bfloat16(f);
  return *reinterpret_cast<const Bf16*>(&b);
}

// The bf16 in the low (hi = 0) or high half of a packed pair, as a float
// (exact: bf16 is the top half of an fp32).
__device__ __forceinline__ float Bf16Half(uint32_t pair, int hi) {
  return __uint_as_float(hi ? pair & 0xffff0000u : pair << 16);
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
#if defined(TANDEM_SIMT)  // tests/kernels/simt: only the asm takes it
  (void)p;
  return 0;
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// A kernel's dynamic shared memory, `name` its bytes.
#if defined(TANDEM_SIMT)
#define TANDEM_DYNAMIC_SHARED(name) TANDEM_SIMT_DYNAMIC_SHARED(name)
#else
#define TANDEM_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// 16 bytes global -> shared without passing through registers; bytes = 0
// writes zeros and reads nothing. Both addresses 16-byte aligned.
__device__ __forceinline__ void CpAsync16(Bf16* dst, const Bf16* src, int bytes = 16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)),
               "l"(src), "r"(bytes));
#elif defined(TANDEM_SIMT)
  ::tandem::simt::CpAsync(dst, src, bytes);
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#elif defined(TANDEM_SIMT)
  ::tandem::simt::CpAsyncCommit();
#endif
}
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#elif defined(TANDEM_SIMT)
  ::tandem::simt::CpAsyncWait(N);
#endif
}

// Two floats as a bf16 pair, `lo` in the low half (the lower column of an
// MMA fragment).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a * b for one 16x8x16 tile (PTX ISA "mma.sync m16n8k16" fragments:
// lane = 4 * g + t holds A rows g and g + 8, columns 2t, 2t + 1 and
// 2t + 8, 2t + 9; B columns g, rows 2t, 2t + 1 and 2t + 8, 2t + 9; D rows g
// and g + 8, columns 2t and 2t + 1).
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(TANDEM_SIMT)
  ::tandem::simt::Mma16816(d, a, b0, b1);
#endif
}

// 2^x on the special function unit with subnormal results flushed to zero
// (ex2.approx.ftz, what __expf and, under --use_fast_math, exp2f become; as
// FlashAttention's softmax). exp2f without .ftz rescales around each call
// for subnormal results: three instructions more per weight. The same value
// wherever 2^x >= 2^-126; an attention weight below that, against its row
// maximum's 1, changes no sum it enters.
__device__ __forceinline__ float Exp2Ftz(float x) {
#if defined(TANDEM_SIMT)
  const float y = exp2f(x);
  return y < FLT_MIN ? 0.0f : y;
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#endif
}

// One step of the online softmax of an MMA fragment's row, whose columns
// sit on a quad of lanes: the step's maximum over the quad, the running
// maximum mx updated, the maximum to subtract (0 while every column so far
// was masked, so that corr and P come out 0, not NaN), and corr = exp(old mx
// - m_use) for the sum and the output so far. `exp` is the kernel's base
// (Exp2Ftz with a log2 scale, or __expf).
template <typename Exp>
__device__ __forceinline__ void QuadSoftmaxStep(float step_max, float& mx, float& m_use,
                                                float& corr, Exp exp) {
  step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 1));
  step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 2));
  const float m_new = fmaxf(mx, step_max);
  m_use = m_new == -INFINITY ? 0.0f : m_new;
  corr = exp(mx - m_use);
  mx = m_new;
}

// Programmatic dependent launch (compute capability 9.0; a no-op below): a
// kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may
// start before the kernel ahead of it on the stream has finished, and must
// call this before it touches memory that kernel reads or writes. Once it
// returns, that kernel has completed and its writes are visible.
__device__ __forceinline__ void WaitForPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets a programmatic dependent launched after this kernel start once every
// block of this one has called it (or exited): called first thing by the
// kernels a decode GEMV follows (RMSNorm, SiLU-mul, decode attention), so the
// GEMV's blocks take the multiprocessors those leave idle and stream weights
// meanwhile. The dependent still waits (WaitForPriorGrid) for this kernel's
// end before it reads anything this kernel writes. A no-op for a kernel
// whose successor is launched plainly.
__device__ __forceinline__ void LetDependentsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Asks for the 128-byte line at p to be brought into L2.
__device__ __forceinline__ void PrefetchL2(const void* p) {
#if defined(TANDEM_SIMT)
  (void)p;
#else
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#endif
}

// Combines the attention splits of the rows whose context spans more than
// one (their m, l and acc in `scratch`, AttentionScratchFloats' layout) into
// args.out: the split-K kernels' second launch (cuda_decode_attention.cu).
int CombineAttentionSplits(const Bf16AttentionArgs& a, int32_t splits, const float* scratch,
                           void* stream);

}  // namespace tandem::kernels::cuda
