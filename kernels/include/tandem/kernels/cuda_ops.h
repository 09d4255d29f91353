// CUDA implementations of the ops (built only when TANDEM_HAVE_CUDA). Every
// pointer is a device pointer unless named host_*. Each call is enqueued on
// the default stream and returns a cudaError_t value (0 = success; see
// ErrorString); the per-element math is the shared TANDEM_HD code of math.h
// and sampling.h, so the GPU-only part is just the launches.
#pragma once

#if defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA

#include <cstddef>
#include <cstdint>

#include "tandem/kernels/kv_layout.h"
#include "tandem/kernels/logprobs.h"
#include "tandem/kernels/math.h"
#include "tandem/kernels/sampling.h"

namespace tandem::kernels::cuda {

// Number of CUDA devices; 0 when the runtime or driver reports an error.
int DeviceCount();
const char* ErrorString(int error);

int Malloc(void** ptr, size_t bytes);
int Free(void* ptr);
int Memset(void* ptr, int value, size_t bytes);
int CopyToDevice(void* dst, const void* host_src, size_t bytes);
int CopyToHost(void* host_dst, const void* src, size_t bytes);
int Synchronize();
// Makes `device` current for the calling thread (cudaSetDevice).
int SetDevice(int device);
// Free and total bytes of the current device (cudaMemGetInfo).
int MemGetInfo(size_t* free_bytes, size_t* total_bytes);

// cuBLAS handle for Matmul.
struct BlasHandle;
int CreateBlas(BlasHandle** out);
void DestroyBlas(BlasHandle* handle);
// Routes the handle's GEMMs to `stream` with a fixed workspace (device
// memory of `bytes`), so that they can be captured in a graph.
int SetBlasStream(BlasHandle* blas, void* stream, void* workspace, size_t bytes);

// Streams and graphs (the bf16 runner's decode steps). StreamCreate makes a
// blocking stream: work on the legacy default stream (the synchronous
// copies, the fp32 kernels) stays ordered with it. With blocking = false it
// neither waits for the legacy stream nor makes it wait (the KV block
// copies to host run on one beside the step's kernels and the synchronous
// downloads).
int StreamCreate(void** stream, bool blocking = true);
void StreamDestroy(void* stream);
// Captures what the calling thread enqueues on `stream` until EndCapture,
// which instantiates it into *exec (nullptr when the capture failed).
int BeginCapture(void* stream);
int EndCapture(void* stream, void** exec);
int GraphLaunch(void* exec, void* stream);
void GraphDestroy(void* exec);

// Events without timing, for ordering streams and waiting on the host.
int EventCreate(void** event);
void EventDestroy(void* event);
int EventRecord(void* event, void* stream);
// The device's `stream` runs nothing enqueued after this call before
// `event` has happened; the host does not wait.
int StreamWaitEvent(void* stream, void* event);
int EventSynchronize(void* event);
// *done: whether the work before the event has finished (cudaEventQuery);
// returns that work's error, if any.
int EventQuery(void* event, bool* done);
// An event that keeps the time it happened at, and the seconds between two
// such events that have both happened (cudaEventElapsedTime: about half a
// microsecond's resolution).
int TimedEventCreate(void** event);
int EventElapsedSeconds(void* from, void* to, double* seconds);

int EmbeddingGather(const float* table, int32_t dim, const int32_t* tokens, int32_t rows,
                    float* out);
int RmsNorm(const float* x, const float* w, int32_t rows, int32_t dim, float eps, float* out);
// y[rows][out_dim] = x[rows][in_dim] * W^T with W [out_dim][in_dim] (cuBLAS SGEMM).
int Matmul(BlasHandle* blas, const float* w, int32_t out_dim, int32_t in_dim, const float* x,
           int32_t rows, float* y);
// inv_freq: device array [rotary_dim / 2], or nullptr for theta's
// frequencies; amplitude: RopeCosSin's; rotary_dim: the elements of a head
// RoPE rotates (0: all).
int Rope(float* vec, int32_t rows, const int32_t* positions, int32_t num_heads, int32_t head_size,
         RopeKind kind, float theta, const float* inv_freq = nullptr, float amplitude = 1.0f,
         int32_t rotary_dim = 0);
int KvWrite(float* cache, const KvCacheShape& shape, int32_t layer, const float* k, const float* v,
            int32_t rows, const int64_t* slots);
// `args` holds device pointers; scratch holds num_rows * num_heads *
// max_context floats, max_context > every row_pos.
int PagedAttention(const PagedAttentionArgs& args, float* scratch, int32_t max_context);
int SiluMul(const float* gate, const float* up, int64_t n, float* out,
            ActKind kind = ActKind::kSilu);
// x[r * stride + i] += bias[i], i < width, for `rows` rows.
int AddBias(float* x, const float* bias, int32_t rows, int32_t width, int64_t stride,
            void* stream = nullptr);
// x[i] *= scale.
int Scale(float* x, int64_t n, float scale, void* stream = nullptr);
// x[i] = TanhSoftcap(x[i], cap) (math.h).
int Softcap(float* x, int64_t n, float cap, void* stream = nullptr);
// RMSNorm in place over `heads` head vectors per row (HeadRmsNormFn): row r's
// first head at x + r * stride.
int HeadRmsNorm(float* x, const float* w, int32_t rows, int32_t heads, int32_t head_size,
                int64_t stride, float eps, void* stream = nullptr);
int ResidualAdd(float* x, const float* y, int64_t n);
// cpu::Sample on the GPU, to the bit: out_tokens[r] from row args[r].row of
// logits[][vocab] (one block per r). args: device array of `rows`; banned,
// penalties: device arrays of what args name, or nullptr; scratch: rows *
// vocab floats.
int Sample(const float* logits, int32_t rows, int32_t vocab, const SampleArgs* args,
           const int32_t* banned, const SamplePenalty* penalties, int32_t* out_tokens,
           float* scratch, void* stream = nullptr);
// cpu::Logprobs on the GPU, to the bit: one block per job. jobs: device
// array of n; results, top_ids, top_logprobs: device arrays (n, and the
// jobs' top_n summed).
int Logprobs(const float* logits, int32_t vocab, const LogprobJob* jobs, int32_t n,
             LogprobResult* results, int32_t* top_ids, float* top_logprobs, void* stream = nullptr);
// block_ids is a device array; staging may be device or pinned host memory.
int BlockGather(const float* cache, int64_t block_floats, const int32_t* block_ids,
                int32_t num_blocks, float* staging);
int BlockScatter(float* cache, int64_t block_floats, const int32_t* block_ids, int32_t num_blocks,
                 const float* staging);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_HAVE_CUDA
