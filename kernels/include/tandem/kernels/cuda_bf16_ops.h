// The CUDA backend's bf16 path (DESIGN §6; issue 15): weights, GEMM inputs
// and the KV cache in bf16, accumulation and the residual stream in fp32.
// Built only when TANDEM_HAVE_CUDA. Every pointer is a device pointer; each
// call enqueues on `stream` (a cudaStream_t, nullptr = the legacy default
// stream) and returns a cudaError_t value (0 = success, see
// cuda::ErrorString).
//
// Unlike the fp32 ops of cuda_ops.h, these kernels reduce in parallel (block
// and warp reductions, flash-decoding split-K), so they match the CPU
// reference within a tolerance, not bitwise. Each still has a fixed
// reduction order for a given shape: a row's result never depends on the
// other rows of the batch (attention splits are a fixed number of tokens),
// only the cuBLAS GEMMs may pick a different algorithm per batch size.
#pragma once

#if defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA

#include <cstdint>

#include "tandem/kernels/attention_split.h"
#include "tandem/kernels/cuda_ops.h"
#include "tandem/kernels/kv_layout.h"
#include "tandem/kernels/math.h"

namespace tandem::kernels::cuda {

// Storage of one bf16 value (the bits of __nv_bfloat16; model::FloatToBFloat16
// converts).
using Bf16 = uint16_t;

// Largest head size and query heads per KV head the attention kernel takes.
inline constexpr int32_t kMaxAttentionHeadSize = 256;

// out[r] = float(table[tokens[r]]).
int EmbeddingGatherBf16(const Bf16* table, int32_t dim, const int32_t* tokens, int32_t rows,
                        float* out, void* stream);

// out[r] = bf16(w * x[src] / rms(x[src])), src = row_index ? row_index[r] : r;
// one block per row, fp32 sums.
int RmsNormBf16(const float* x, const int32_t* row_index, const float* w, int32_t rows,
                int32_t dim, float eps, Bf16* out, void* stream);
// x[r] += w * y[r] / rms(y[r]), all fp32, one block per row (Gemma 3's
// norms of a sublayer's output before its residual add).
int RmsNormAddBf16(float* x, const float* y, const float* w, int32_t rows, int32_t dim, float eps,
                   void* stream);

// y[rows][out_dim] = x[rows][in_dim] * W^T + beta * y, W [out_dim][in_dim]:
// bf16 inputs, fp32 accumulation and output, on the handle's stream (the
// default one). Up to kGemvMaxRows rows (decode steps), with in_dim a
// multiple of 8 and 16-byte aligned w and x, our own GEMV kernel, which reads
// the weights faster than cuBLAS does at these shapes; otherwise
// cublasGemmEx (compute 32F). Up to kGemvMaxRows, a row's result does not
// depend on how many rows run with it.
// beta = 1 folds a residual add into the GEMM; beta = 0 never reads y.
// dependent_launch (DeviceHasDependentLaunch devices): our GEMV is launched
// as a programmatic dependent of the kernel before it on the stream, so its
// blocks start while that kernel finishes and stream their weight rows into
// L2 before they wait for it. The same bits either way. gemv_max_rows
// (at most kGemvMaxRows; 0: cuBLAS for every GEMM) moves the GEMV's limit
// down, so that a benchmark can set the two side by side. Rows past the
// GEMV's and up to tc_gemm_max_rows (at most kTcGemmMaxRows; 0: none) run
// TcGemmBf16 where it takes the shape, with the handle's workspace.
inline constexpr int32_t kGemvMaxRows = 4;
int MatmulBf16(BlasHandle* blas, const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x,
               int32_t rows, float* y, float beta, bool dependent_launch = false,
               int32_t gemv_max_rows = kGemvMaxRows, int32_t tc_gemm_max_rows = 0);
// Compute capability 9.0 and above: programmatic dependent launch.
bool DeviceHasDependentLaunch(int device);

// y[rows][out_dim] = x W^T + beta y on tensor cores (cuda_gemm_tc.cu), for
// 1 to kTcGemmMaxRows rows, in_dim a multiple of 64, w and x 16-byte aligned
// (TcGemmTakes), compute capability 8.0 and above. The reduction splits into
// TcGemmSplits(out_dim, in_dim, workspace_bytes) slices (a function of the
// shape only, so a row's bits never depend on the other rows), whose partial
// sums take workspace. MatmulBf16 runs it with tc_gemm_max_rows.
inline constexpr int32_t kTcGemmMaxRows = 64;
inline bool TcGemmTakes(int32_t in_dim, const void* w, const void* x) {
  return in_dim > 0 && in_dim % 64 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}
int32_t TcGemmSplits(int32_t out_dim, int32_t in_dim, size_t workspace_bytes);
int TcGemmBf16(const Bf16* w, int32_t out_dim, int32_t in_dim, const Bf16* x, int32_t rows,
               float* y, float beta, void* workspace, size_t workspace_bytes, void* stream);

// qkv[rows][q_stride] holds each row's q (num_heads * head_size), then k and
// v (num_kv_heads * head_size each). Applies RoPE to q in place and to k, and
// writes k and v into the bf16 cache at slots[r] (slot < 0: not written).
// inv_freq: device array [rotary_dim / 2], or nullptr for theta's
// frequencies; amplitude: RopeCosSin's; rotary_dim: the elements of a head
// RoPE rotates (0: all; see RopePairIndices).
int RopeKvWriteBf16(float* qkv, int32_t q_stride, int32_t rows, const int32_t* positions,
                    int32_t num_heads, const KvCacheShape& shape, RopeKind kind, float theta,
                    Bf16* cache, int32_t layer, const int64_t* slots, void* stream,
                    const float* inv_freq = nullptr, float amplitude = 1.0f,
                    int32_t rotary_dim = 0);

struct Bf16AttentionArgs {
  const float* q = nullptr;  // head h of row r at q + r * q_stride + h * head_size
  int32_t q_stride = 0;
  Bf16* out = nullptr;  // [num_rows][num_heads][head_size]
  const Bf16* cache = nullptr;
  KvCacheShape shape;
  int32_t layer = 0;
  int32_t num_heads = 0;
  int32_t num_rows = 0;
  // Row r attends to positions WindowStart(row_pos[r], window) .. row_pos[r].
  const int32_t* row_pos = nullptr;
  const int32_t* row_table_offset = nullptr;
  const int32_t* block_tables = nullptr;
  // PagedAttentionBf16 only: when set, the rows to compute are
  // rows[0 .. num_rows) (AttentionPlan::single_rows), else 0 .. num_rows.
  const int32_t* rows = nullptr;
  int32_t window = 0;  // the layer's sliding window; 0: none
  // Gemma 2's attention softcapping (PagedAttentionArgs'); 0: none.
  float softcap = 0.0f;
};

// Causal paged attention for decode and prefill rows alike
// (cuda_decode_attention.cu). Blocks of (row, KV head) load each K/V row
// once for all the query heads that share it (GQA), lanes split the head
// dimension, warps split the tokens, online softmax in fp32, over splits of
// kAttentionSplitTokens tokens combined at the end (flash-decoding).
// splits_per_block: 1 gives each split a block of its own; n > 1 gives a
// block n consecutive splits of its row with its K/V copies pipelined
// through shared memory (head sizes 32, 64, 128 and 256; others take 1);
// 0 gives a block all of its row's splits; kAutoSplitsPerBlock picks by
// PipelinedSplitsPerBlock. Every choice gives the same bits.
// max_context >= every row_pos + 1; scratch holds AttentionScratchFloats(...).
// head_size <= kMaxAttentionHeadSize.
inline constexpr int32_t kAutoSplitsPerBlock = -1;
int PagedAttentionBf16(const Bf16AttentionArgs& args, int32_t max_context, float* scratch,
                       void* stream, int32_t splits_per_block = kAutoSplitsPerBlock);

// The rows PagedAttentionBf16 takes, on tensor cores: a block per (row, KV
// head, up to 16 of its query heads, split), a warp per 32 of the split's
// tokens, Q and P rounded to bf16 before
// their MMAs (cuda_decode_attention_tc.cu), so not PagedAttentionBf16's bits
// but the prefill kernel's accuracy; a row's bits depend only on its own
// query and context. The same splits, scratch and combine as
// PagedAttentionBf16. Head sizes TensorCoreHeadSize takes, block sizes
// TensorCoreDecodeBlockSize takes; compute capability 8.0
// (DeviceHasTensorCoreAttention).
int DecodeAttentionTcBf16(const Bf16AttentionArgs& args, int32_t max_context, float* scratch,
                          void* stream);

// The tensor-core kernel for AttentionPlan's tiles (device array of
// (first row, rows) pairs, num_tiles of them): the same causal attention as
// PagedAttentionBf16 for those rows, with Q and P rounded to bf16 before
// their MMAs (FlashAttention-2's tiling; cuda_prefill_attention.cu).
// args.num_rows and args.rows are not read. Needs compute capability 8.0
// (DeviceHasTensorCoreAttention) and TensorCorePrefillHeadSize(head_size).
// wide: the tiles were planned with PlanAttention's wide block (head size
// 128 only; elsewhere it changes nothing).
int PrefillAttentionBf16(const Bf16AttentionArgs& args, const int32_t* tiles, int32_t num_tiles,
                         void* stream, bool wide = false);
bool DeviceHasTensorCoreAttention(int device);

// out[r][i] = bf16(act(gu[r][i]) * gu[r][hidden + i]), act silu or GeLU-tanh.
int SiluMulBf16(const float* gate_up, int32_t rows, int32_t hidden, Bf16* out, void* stream,
                ActKind kind = ActKind::kSilu);

// out[r] = argmax of logits[r][0 .. vocab), the lowest index on ties (as
// kernels::ArgMax). One block per row.
int ArgMaxRows(const float* logits, int32_t rows, int32_t vocab, int32_t* out, void* stream);

// Raw bytes, asynchronously on `stream`.
int CopyAsync(void* dst, const void* src, size_t bytes, void* stream);
int StreamSynchronize(void* stream);
// Runs fn(arg) on a thread of the CUDA runtime once everything enqueued on
// `stream` before it has finished (cudaLaunchHostFunc); fn must not call
// CUDA.
int LaunchHostFunc(void* stream, void (*fn)(void*), void* arg);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_HAVE_CUDA
