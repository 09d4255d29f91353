// The CUDA backend: a thin composition of the kernels' CUDA ops in the CPU
// backend's order (matmuls through cuBLAS). Built only with TANDEM_HAVE_CUDA.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cpu_runner.h"
#include "tandem/common/status.h"
#include "tandem/kernels/cuda_ops.h"

namespace tandem::model::internal {
namespace {

namespace kd = ::tandem::kernels::cuda;
using kernels::KvCacheShape;
using kernels::PagedAttentionArgs;
using kernels::RopeKind;

absl::Status CudaStatus(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", kd::ErrorString(err)));
}

// Device memory that only grows.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) kd::Free(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_ != nullptr) kd::Free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::Malloc(&ptr_, bytes), "malloc"));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Upload(const std::vector<T>& host) {
    TANDEM_RETURN_IF_ERROR(Reserve(std::max<size_t>(host.size() * sizeof(T), 1)));
    if (host.empty()) return absl::OkStatus();
    return CudaStatus(kd::CopyToDevice(ptr_, host.data(), host.size() * sizeof(T)), "upload");
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct DeviceLayer {
  DeviceBuffer rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3;
};

class CudaModelRunner final : public ModelRunner {
 public:
  CudaModelRunner(const Model* model, KvCacheOptions opts)
      : ModelRunner(model, opts, Backend::kCuda) {}
  ~CudaModelRunner() override { kd::DestroyBlas(blas_); }

  absl::Status Init() {
    const ModelConfig& c = model_->config();
    const ModelWeights& w = model_->weights();
    shape_ = KvCacheShape{.num_blocks = opts_.num_blocks,
                          .num_layers = c.num_layers,
                          .block_size = opts_.block_size,
                          .num_kv_heads = c.num_kv_heads,
                          .head_size = c.head_size};
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::CreateBlas(&blas_), "cublasCreate"));
    const size_t cache_bytes =
        static_cast<size_t>(shape_.BlockFloats()) * opts_.num_blocks * sizeof(float);
    TANDEM_RETURN_IF_ERROR(cache_.Reserve(cache_bytes));
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::Memset(cache_.get<void>(), 0, cache_bytes), "memset"));
    TANDEM_RETURN_IF_ERROR(embedding_.Upload(w.token_embedding));
    TANDEM_RETURN_IF_ERROR(rms_final_.Upload(w.rms_final));
    TANDEM_RETURN_IF_ERROR(classifier_.Upload(w.classifier()));
    layers_ = std::vector<DeviceLayer>(w.layers.size());
    for (size_t i = 0; i < w.layers.size(); ++i) {
      const LayerWeights& l = w.layers[i];
      DeviceLayer& d = layers_[i];
      TANDEM_RETURN_IF_ERROR(d.rms_att.Upload(l.rms_att));
      TANDEM_RETURN_IF_ERROR(d.wq.Upload(l.wq));
      TANDEM_RETURN_IF_ERROR(d.wk.Upload(l.wk));
      TANDEM_RETURN_IF_ERROR(d.wv.Upload(l.wv));
      TANDEM_RETURN_IF_ERROR(d.wo.Upload(l.wo));
      TANDEM_RETURN_IF_ERROR(d.rms_ffn.Upload(l.rms_ffn));
      TANDEM_RETURN_IF_ERROR(d.w1.Upload(l.w1));
      TANDEM_RETURN_IF_ERROR(d.w2.Upload(l.w2));
      TANDEM_RETURN_IF_ERROR(d.w3.Upload(l.w3));
    }
    return absl::OkStatus();
  }

  absl::Status Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) override {
    TANDEM_RETURN_IF_ERROR(ValidateBatch(batch));
    const ModelConfig& c = model_->config();
    const BatchLayout lay = MakeBatchLayout(batch, opts_.block_size);
    const int32_t T = lay.num_rows, B = static_cast<int32_t>(batch.size());
    if (B == 0) {
      logits->clear();
      return absl::OkStatus();
    }
    const size_t f = sizeof(float), dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim;
    TANDEM_RETURN_IF_ERROR(tokens_.Upload(lay.tokens));
    TANDEM_RETURN_IF_ERROR(row_pos_.Upload(lay.row_pos));
    TANDEM_RETURN_IF_ERROR(row_off_.Upload(lay.row_table_offset));
    TANDEM_RETURN_IF_ERROR(tables_.Upload(lay.block_tables));
    TANDEM_RETURN_IF_ERROR(slots_.Upload(lay.slots));
    TANDEM_RETURN_IF_ERROR(last_rows_.Upload(lay.last_rows));
    for (DeviceBuffer* b : {&x_, &xb_, &q_, &att_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * dim * f));
    for (DeviceBuffer* b : {&k_, &v_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * kv * f));
    for (DeviceBuffer* b : {&hb_, &hb2_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * hidden * f));
    TANDEM_RETURN_IF_ERROR(scratch_.Reserve(size_t{1} * T * c.num_heads * lay.max_context * f));
    TANDEM_RETURN_IF_ERROR(logits_.Reserve(size_t{1} * B * c.vocab_size * f));
    float *x = x_.get<float>(), *xb = xb_.get<float>(), *q = q_.get<float>(),
          *att = att_.get<float>(), *k = k_.get<float>(), *v = v_.get<float>(),
          *hb = hb_.get<float>(), *hb2 = hb2_.get<float>();
    const RopeKind rope =
        c.rope_style == RopeStyle::kRotateHalf ? RopeKind::kRotateHalf : RopeKind::kAdjacentPairs;
    auto ok = [](int err, const char* what) { return CudaStatus(err, what); };
    TANDEM_RETURN_IF_ERROR(
        ok(kd::EmbeddingGather(embedding_.get<float>(), c.dim, tokens_.get<int32_t>(), T, x),
           "embedding"));
    for (int32_t li = 0; li < c.num_layers; ++li) {
      const DeviceLayer& l = layers_[static_cast<size_t>(li)];
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RmsNorm(x, l.rms_att.get<float>(), T, c.dim, c.norm_eps, xb), "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wq.get<float>(), c.dim, c.dim, xb, T, q), "wq"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wk.get<float>(), c.kv_dim(), c.dim, xb, T, k), "wk"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wv.get<float>(), c.kv_dim(), c.dim, xb, T, v), "wv"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Rope(q, T, row_pos_.get<int32_t>(), c.num_heads, c.head_size, rope, c.rope_theta),
             "rope q"));
      TANDEM_RETURN_IF_ERROR(ok(
          kd::Rope(k, T, row_pos_.get<int32_t>(), c.num_kv_heads, c.head_size, rope, c.rope_theta),
          "rope k"));
      // All K/V of the step before any attention of this layer (same stream).
      TANDEM_RETURN_IF_ERROR(
          ok(kd::KvWrite(cache_.get<float>(), shape_, li, k, v, T, slots_.get<int64_t>()),
             "kv write"));
      const PagedAttentionArgs args{.q = q,
                                    .out = att,
                                    .cache = cache_.get<float>(),
                                    .shape = shape_,
                                    .layer = li,
                                    .num_heads = c.num_heads,
                                    .num_rows = T,
                                    .row_pos = row_pos_.get<int32_t>(),
                                    .row_table_offset = row_off_.get<int32_t>(),
                                    .block_tables = tables_.get<int32_t>()};
      TANDEM_RETURN_IF_ERROR(
          ok(kd::PagedAttention(args, scratch_.get<float>(), lay.max_context), "attention"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wo.get<float>(), c.dim, c.dim, att, T, xb), "wo"));
      TANDEM_RETURN_IF_ERROR(ok(kd::ResidualAdd(x, xb, T * dim), "residual"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RmsNorm(x, l.rms_ffn.get<float>(), T, c.dim, c.norm_eps, xb), "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w1.get<float>(), c.hidden_dim, c.dim, xb, T, hb), "w1"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w3.get<float>(), c.hidden_dim, c.dim, xb, T, hb2), "w3"));
      TANDEM_RETURN_IF_ERROR(ok(kd::SiluMul(hb, hb2, T * hidden, hb), "silu"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w2.get<float>(), c.dim, c.hidden_dim, hb, T, xb), "w2"));
      TANDEM_RETURN_IF_ERROR(ok(kd::ResidualAdd(x, xb, T * dim), "residual"));
    }
    // Last token of each sequence: gather its row (an embedding gather over x).
    TANDEM_RETURN_IF_ERROR(
        ok(kd::EmbeddingGather(x, c.dim, last_rows_.get<int32_t>(), B, att), "gather last"));
    TANDEM_RETURN_IF_ERROR(
        ok(kd::RmsNorm(att, rms_final_.get<float>(), B, c.dim, c.norm_eps, xb), "rmsnorm"));
    TANDEM_RETURN_IF_ERROR(ok(kd::Matmul(blas_, classifier_.get<float>(), c.vocab_size, c.dim, xb,
                                         B, logits_.get<float>()),
                              "classifier"));
    logits->resize(static_cast<size_t>(B) * c.vocab_size);
    return ok(kd::CopyToHost(logits->data(), logits_.get<float>(), logits->size() * f),
              "logits download");
  }

  std::span<std::byte> BlockBytes(int32_t) override { return {}; }

  absl::Status CopyBlockToHost(int32_t block_id, std::span<std::byte> out) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopy(block_id, out.size()));
    return CudaStatus(kd::CopyToHost(out.data(), BlockPtr(block_id), out.size()), "block copy");
  }
  absl::Status CopyBlockFromHost(int32_t block_id, std::span<const std::byte> in) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopy(block_id, in.size()));
    return CudaStatus(kd::CopyToDevice(BlockPtr(block_id), in.data(), in.size()), "block copy");
  }

 private:
  float* BlockPtr(int32_t block_id) const {
    return cache_.get<float>() + int64_t{block_id} * shape_.BlockFloats();
  }

  KvCacheShape shape_;
  kd::BlasHandle* blas_ = nullptr;
  DeviceBuffer cache_, embedding_, rms_final_, classifier_;
  std::vector<DeviceLayer> layers_;
  DeviceBuffer tokens_, row_pos_, row_off_, tables_, slots_, last_rows_;
  DeviceBuffer x_, xb_, q_, att_, k_, v_, hb_, hb2_, scratch_, logits_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(const Model* model,
                                                              KvCacheOptions opts) {
  if (kd::DeviceCount() == 0) {
    return absl::UnavailableError("CUDA backend: no CUDA device is present");
  }
  auto runner = std::make_unique<CudaModelRunner>(model, opts);
  TANDEM_RETURN_IF_ERROR(runner->Init());
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace tandem::model::internal
