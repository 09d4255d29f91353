#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_blas_handle.h"
#include "tandem/kernels/cuda_ops.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int32_t kThreads = 256;

#ifndef TANDEM_SIMT  // the CPU emulator (tests/kernels/simt) runs the kernels itself
template <typename F>
__global__ void FunctorKernel(F f) {
  f(static_cast<int64_t>(blockIdx.x), static_cast<int32_t>(threadIdx.x),
    static_cast<int32_t>(blockDim.x));
}

template <typename F>
int Launch(Grid grid, const F& f, void* stream = nullptr) {
  if (grid.blocks == 0) return cudaSuccess;
  FunctorKernel<<<static_cast<unsigned>(grid.blocks), grid.threads, 0,
                  static_cast<cudaStream_t>(stream)>>>(f);
  return cudaGetLastError();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
#endif  // TANDEM_SIMT

__global__ void RmsNormKernel(const float* x, const float* w, int32_t rows, int32_t dim, float eps,
                              float* out) {
  const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) RmsNormRow(x + int64_t{r} * dim, w, dim, eps, out + int64_t{r} * dim);
}

// One block per (row, head): RowHeadAttention's operations, as
// AttendRowHead runs them, with what is independent spread over the block's
// threads: a thread per position for the scores, the exps and the division,
// one thread for the maximum and the sum over positions, a thread per head
// element for the weighted sum of V. A thread per (row, head) running
// AttendRowHead took a Llama-3.2-1B decode step 121 ms on an H200
// (2026-11-30, batch 1, context 512): 32 threads, each walking 512 keys with
// a load round trip every few elements.
constexpr int kAttnThreads = 128;
__global__ void __launch_bounds__(kAttnThreads)
    AttentionKernel(PagedAttentionArgs a, float* scratch, int32_t max_context) {
  const int64_t i = blockIdx.x;
  const RowHeadAttention rh(a, static_cast<int32_t>(i / a.num_heads),
                            static_cast<int32_t>(i % a.num_heads));
  float* scores = scratch + i * max_context;
  const int32_t first = rh.lo + static_cast<int32_t>(threadIdx.x);
  for (int32_t t = first; t <= rh.pos; t += kAttnThreads) scores[t] = rh.Score(t);
  __shared__ float max_val, sum;
  __syncthreads();
  if (threadIdx.x == 0) max_val = rh.Max(scores);
  __syncthreads();
  for (int32_t t = first; t <= rh.pos; t += kAttnThreads) scores[t] = expf(scores[t] - max_val);
  __syncthreads();
  if (threadIdx.x == 0) sum = rh.Sum(scores);
  __syncthreads();
  for (int32_t t = first; t <= rh.pos; t += kAttnThreads) scores[t] /= sum;
  __syncthreads();
  for (int32_t d = static_cast<int32_t>(threadIdx.x); d < a.shape.head_size; d += kAttnThreads) {
    rh.out[d] = rh.Weighted(scores, d);
  }
}

// One block of kSampleLanes threads per row: sampling.h's program.
__global__ void __launch_bounds__(kSampleLanes)
    SampleKernel(const float* logits, int32_t vocab, const SampleArgs* args, const int32_t* banned,
                 const SamplePenalty* penalties, int32_t* out, float* scratch) {
  __shared__ SampleShared shared;
  const SampleArgs a = args[blockIdx.x];
  const int32_t token =
      SampleRowProgram(shared, logits + int64_t{a.row} * vocab, vocab, a,
                       banned == nullptr ? nullptr : banned + a.banned_begin,
                       penalties == nullptr ? nullptr : penalties + a.penalty_begin,
                       scratch + int64_t{blockIdx.x} * vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = token;
}

// One block of kSampleLanes threads per job: logprobs.h's program.
__global__ void __launch_bounds__(kSampleLanes)
    LogprobsKernel(const float* logits, int32_t vocab, const LogprobJob* jobs,
                   LogprobResult* results, int32_t* top_ids, float* top_logprobs) {
  __shared__ SampleShared shared;
  __shared__ LogprobShared top;  // with `shared`, about 36 KiB
  const LogprobJob job = jobs[blockIdx.x];
  LogprobRowProgram(shared, top, logits + int64_t{job.row} * vocab, vocab, job,
                    &results[blockIdx.x], top_ids + job.top_begin, top_logprobs + job.top_begin);
}

#ifndef TANDEM_SIMT
}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

const char* ErrorString(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

int Malloc(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
int Free(void* ptr) { return cudaFree(ptr); }
int Memset(void* ptr, int value, size_t bytes) { return cudaMemset(ptr, value, bytes); }
int CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  return cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice);
}
int CopyToHost(void* host_dst, const void* src, size_t bytes) {
  return cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost);
}
int Synchronize() { return cudaDeviceSynchronize(); }
int SetDevice(int device) { return cudaSetDevice(device); }

int MemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  return cudaMemGetInfo(free_bytes, total_bytes);
}

int CreateBlas(BlasHandle** out) {
  auto* h = new BlasHandle;
  if (cublasCreate(&h->handle) != CUBLAS_STATUS_SUCCESS) {
    delete h;
    return cudaErrorUnknown;
  }
  *out = h;
  return cudaSuccess;
}

void DestroyBlas(BlasHandle* handle) {
  if (handle == nullptr) return;
  cublasDestroy(handle->handle);
  delete handle;
}

int SetBlasStream(BlasHandle* blas, void* stream, void* workspace, size_t bytes) {
  if (cublasSetStream(blas->handle, static_cast<cudaStream_t>(stream)) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(blas->handle, workspace, bytes) != CUBLAS_STATUS_SUCCESS) {
    return cudaErrorUnknown;
  }
  blas->workspace = workspace;
  blas->workspace_bytes = bytes;
  return cudaSuccess;
}

int StreamCreate(void** stream, bool blocking) {
  cudaStream_t s = nullptr;
  const cudaError_t e =
      cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking);
  *stream = s;
  return e;
}

void StreamDestroy(void* stream) {
  if (stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

int BeginCapture(void* stream) {
  // Thread-local: another thread's CUDA calls neither join nor break it.
  return cudaStreamBeginCapture(static_cast<cudaStream_t>(stream),
                                cudaStreamCaptureModeThreadLocal);
}

int EndCapture(void* stream, void** exec) {
  *exec = nullptr;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  if (e == cudaSuccess) {
    cudaGraphExec_t instance = nullptr;
    e = cudaGraphInstantiate(&instance, graph, 0);
    if (e == cudaSuccess) *exec = instance;
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (e != cudaSuccess) cudaGetLastError();  // a failed capture leaves no sticky error
  return e;
}

int GraphLaunch(void* exec, void* stream) {
  return cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream));
}

void GraphDestroy(void* exec) {
  if (exec != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

int EventCreate(void** event) {
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  *event = e;
  return err;
}

void EventDestroy(void* event) {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

int EventRecord(void* event, void* stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
}

int StreamWaitEvent(void* stream, void* event) {
  return cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
}

int EventSynchronize(void* event) { return cudaEventSynchronize(static_cast<cudaEvent_t>(event)); }

int TimedEventCreate(void** event) {
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreate(&e);
  *event = e;
  return err;
}

int EventElapsedSeconds(void* from, void* to, double* seconds) {
  float ms = 0.0f;
  const cudaError_t err =
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to));
  *seconds = ms * 1e-3;
  return err;
}

int EventQuery(void* event, bool* done) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  *done = e != cudaErrorNotReady;
  return e == cudaErrorNotReady ? cudaSuccess : e;
}

int EmbeddingGather(const float* table, int32_t dim, const int32_t* tokens, int32_t rows,
                    float* out) {
  return Launch(Grid{rows, kThreads}, EmbeddingGatherFn{table, tokens, out, dim});
}

int RmsNorm(const float* x, const float* w, int32_t rows, int32_t dim, float eps, float* out) {
  if (rows == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(CeilDiv(rows, 64)), 64>>>(x, w, rows, dim, eps, out);
  return cudaGetLastError();
}

int Matmul(BlasHandle* blas, const float* w, int32_t out_dim, int32_t in_dim, const float* x,
           int32_t rows, float* y) {
  if (rows == 0) return cudaSuccess;
  const float alpha = 1.0f;
  const float beta = 0.0f;
  // Column-major view: Y (out x rows) = W^T-view (out x in) * X (in x rows).
  const cublasStatus_t s = cublasSgemm(blas->handle, CUBLAS_OP_T, CUBLAS_OP_N, out_dim, rows,
                                       in_dim, &alpha, w, in_dim, x, in_dim, &beta, y, out_dim);
  return s == CUBLAS_STATUS_SUCCESS ? cudaGetLastError() : cudaErrorUnknown;
}

int Rope(float* vec, int32_t rows, const int32_t* positions, int32_t num_heads, int32_t head_size,
         RopeKind kind, float theta, const float* inv_freq, float amplitude, int32_t rotary_dim) {
  return Launch(Grid{rows, kThreads}, RopeFn{vec, positions, num_heads, head_size, kind, theta,
                                             inv_freq, amplitude, rotary_dim});
}

int KvWrite(float* cache, const KvCacheShape& shape, int32_t layer, const float* k, const float* v,
            int32_t rows, const int64_t* slots) {
  return Launch(Grid{rows, kThreads}, KvWriteFn{cache, shape, layer, k, v, slots});
}

int PagedAttention(const PagedAttentionArgs& args, float* scratch, int32_t max_context) {
  const int64_t n = int64_t{args.num_rows} * args.num_heads;
  if (n == 0) return cudaSuccess;
  AttentionKernel<<<static_cast<unsigned>(n), kAttnThreads>>>(args, scratch, max_context);
  return cudaGetLastError();
}

int SiluMul(const float* gate, const float* up, int64_t n, float* out, ActKind kind) {
  return Launch(Grid{CeilDiv(n, kThreads), kThreads}, SiluMulFn{gate, up, out, n, kind});
}

int AddBias(float* x, const float* bias, int32_t rows, int32_t width, int64_t stride,
            void* stream) {
  return Launch(Grid{rows, kThreads}, AddBiasFn{x, bias, width, stride}, stream);
}

int Softcap(float* x, int64_t n, float cap, void* stream) {
  return Launch(Grid{CeilDiv(n, kThreads), kThreads}, SoftcapFn{x, cap, n}, stream);
}

int Scale(float* x, int64_t n, float scale, void* stream) {
  return Launch(Grid{CeilDiv(n, kThreads), kThreads}, ScaleFn{x, scale, n}, stream);
}

int HeadRmsNorm(float* x, const float* w, int32_t rows, int32_t heads, int32_t head_size,
                int64_t stride, float eps, void* stream) {
  const int64_t n = int64_t{rows} * heads;
  return Launch(Grid{CeilDiv(n, 64), 64}, HeadRmsNormFn{x, w, rows, heads, head_size, stride, eps},
                stream);
}

int ResidualAdd(float* x, const float* y, int64_t n) {
  return Launch(Grid{CeilDiv(n, kThreads), kThreads}, ResidualAddFn{x, y, n});
}

int Sample(const float* logits, int32_t rows, int32_t vocab, const SampleArgs* args,
           const int32_t* banned, const SamplePenalty* penalties, int32_t* out_tokens,
           float* scratch, void* stream) {
  if (rows == 0) return cudaSuccess;
  SampleKernel<<<static_cast<unsigned>(rows), kSampleLanes, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, vocab, args, banned, penalties, out_tokens, scratch);
  return cudaGetLastError();
}

int Logprobs(const float* logits, int32_t vocab, const LogprobJob* jobs, int32_t n,
             LogprobResult* results, int32_t* top_ids, float* top_logprobs, void* stream) {
  if (n == 0) return cudaSuccess;
  LogprobsKernel<<<static_cast<unsigned>(n), kSampleLanes, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, vocab, jobs, results, top_ids, top_logprobs);
  return cudaGetLastError();
}

int BlockGather(const float* cache, int64_t block_floats, const int32_t* block_ids,
                int32_t num_blocks, float* staging) {
  return Launch(Grid{num_blocks, kThreads},
                BlockCopyFn{const_cast<float*>(cache), staging, block_ids, block_floats, true});
}

int BlockScatter(float* cache, int64_t block_floats, const int32_t* block_ids, int32_t num_blocks,
                 const float* staging) {
  return Launch(Grid{num_blocks, kThreads},
                BlockCopyFn{cache, const_cast<float*>(staging), block_ids, block_floats, false});
}

#else
}  // namespace
#endif  // TANDEM_SIMT

}  // namespace tandem::kernels::cuda
