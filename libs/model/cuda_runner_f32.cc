// The CUDA backend's float32 mode (cuda_runner_base.h): a thin composition
// of cuda_ops.h in the CPU backend's order, matmuls through cuBLAS SGEMM, for
// exactness against the CPU backend (and so against run.c).
#include <algorithm>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_runner_base.h"
#include "tandem/model/checkpoint.h"

namespace tandem::model::internal {
namespace {

struct DeviceLayer {
  DeviceBuffer rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3;
  DeviceBuffer bq, bk, bv, bo, q_norm, k_norm;  // when the config has them
  DeviceBuffer post_att_norm, post_ffn_norm;    // sandwich_norms
};

// float32: the CPU backend's order of operations.
class CudaF32Runner final : public CudaRunnerBase {
 public:
  using CudaRunnerBase::CudaRunnerBase;

  absl::Status Init() override {
    TANDEM_RETURN_IF_ERROR(InitCommon());
    const Model& m = *model_;
    using K = WeightKind;
    TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &embedding_, {K::kEmbedding}, 0));
    TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &rms_final_, {K::kRmsFinal}, 0));
    TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &classifier_, {K::kClassifier}, 0));
    layers_ = std::vector<DeviceLayer>(static_cast<size_t>(m.config().num_layers));
    for (int32_t i = 0; i < m.config().num_layers; ++i) {
      DeviceLayer& d = layers_[static_cast<size_t>(i)];
      using Part = std::pair<DeviceBuffer*, WeightKind>;
      const std::initializer_list<Part> parts = {{&d.rms_att, K::kRmsAtt},
                                                 {&d.wq, K::kWq},
                                                 {&d.wk, K::kWk},
                                                 {&d.wv, K::kWv},
                                                 {&d.wo, K::kWo},
                                                 {&d.rms_ffn, K::kRmsFfn},
                                                 {&d.w1, K::kW1},
                                                 {&d.w2, K::kW2},
                                                 {&d.w3, K::kW3},
                                                 {&d.bq, K::kBq},
                                                 {&d.bk, K::kBk},
                                                 {&d.bv, K::kBv},
                                                 {&d.bo, K::kBo},
                                                 {&d.q_norm, K::kQNorm},
                                                 {&d.k_norm, K::kKNorm},
                                                 {&d.post_att_norm, K::kPostAttNorm},
                                                 {&d.post_ffn_norm, K::kPostFfnNorm}};
      for (auto [buffer, kind] : parts) {
        TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, buffer, {kind}, i));
      }
    }
    return AllocateCache();
  }

 private:
  absl::Status ReserveLayers(int32_t T, int32_t max_context) override {
    const ModelConfig& c = model_->config();
    const size_t f = sizeof(float), dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim,
                 qd = c.q_dim();
    for (DeviceBuffer* b : {&x_, &xb_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * dim * f));
    for (DeviceBuffer* b : {&q_, &att_}) {
      TANDEM_RETURN_IF_ERROR(b->Reserve(T * std::max(dim, qd) * f));
    }
    for (DeviceBuffer* b : {&k_, &v_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * kv * f));
    for (DeviceBuffer* b : {&hb_, &hb2_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * hidden * f));
    return scratch_.Reserve(size_t{1} * T * c.num_heads * max_context * f);
  }

  void AppendStepBuffers(std::vector<void*>* out) const override {
    for (const DeviceBuffer* b : {&x_, &xb_, &q_, &att_, &k_, &v_, &hb_, &hb2_, &scratch_}) {
      out->push_back(b->get<void>());
    }
  }

  // On the legacy default stream (ordered with stream_, which is blocking);
  // decode graphs are a bfloat16 feature.
  absl::Status RunLayers(const BatchLayout& lay, const StepInputs& in, int32_t B) override {
    const ModelConfig& c = model_->config();
    const int32_t T = lay.num_rows;
    const size_t dim = c.dim, hidden = c.hidden_dim;
    TANDEM_RETURN_IF_ERROR(ReserveLayers(T, lay.max_context));
    float *x = x_.get<float>(), *xb = xb_.get<float>(), *q = q_.get<float>(),
          *att = att_.get<float>(), *k = k_.get<float>(), *v = v_.get<float>(),
          *hb = hb_.get<float>(), *hb2 = hb2_.get<float>();
    const RopeKind rope = ToKernel(c.rope_style);
    auto ok = [](int err, const char* what) { return CudaStatus(err, what); };
    TANDEM_RETURN_IF_ERROR(
        ok(kd::EmbeddingGather(embedding_.get<float>(), c.dim, in.tokens, T, x), "embedding"));
    if (c.embedding_scale != 1.0f) {
      TANDEM_RETURN_IF_ERROR(ok(kd::Scale(x, T * dim, c.embedding_scale), "embedding scale"));
    }
    for (int32_t li = 0; li < c.num_layers; ++li) {
      const DeviceLayer& l = layers_[static_cast<size_t>(li)];
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RmsNorm(x, l.rms_att.get<float>(), T, c.dim, c.norm_eps, xb), "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wq.get<float>(), c.q_dim(), c.dim, xb, T, q), "wq"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wk.get<float>(), c.kv_dim(), c.dim, xb, T, k), "wk"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wv.get<float>(), c.kv_dim(), c.dim, xb, T, v), "wv"));
      if (c.qkv_bias) {
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(q, l.bq.get<float>(), T, c.q_dim(), c.q_dim()), "q bias"));
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(k, l.bk.get<float>(), T, c.kv_dim(), c.kv_dim()), "k bias"));
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(v, l.bv.get<float>(), T, c.kv_dim(), c.kv_dim()), "v bias"));
      }
      if (c.qk_norm) {  // per head, in place, as the CPU backend
        TANDEM_RETURN_IF_ERROR(
            ok(kd::RmsNorm(q, l.q_norm.get<float>(), T * c.num_heads, c.head_size, c.norm_eps, q),
               "q norm"));
        TANDEM_RETURN_IF_ERROR(ok(
            kd::RmsNorm(k, l.k_norm.get<float>(), T * c.num_kv_heads, c.head_size, c.norm_eps, k),
            "k norm"));
      }
      const float* inv_freq = InvFreq(li);
      const float amplitude = c.RopeAmplitude(li), theta = c.RopeTheta(li);
      TANDEM_RETURN_IF_ERROR(ok(kd::Rope(q, T, in.row_pos, c.num_heads, c.head_size, rope, theta,
                                         inv_freq, amplitude, c.rotary_dim),
                                "rope q"));
      TANDEM_RETURN_IF_ERROR(ok(kd::Rope(k, T, in.row_pos, c.num_kv_heads, c.head_size, rope, theta,
                                         inv_freq, amplitude, c.rotary_dim),
                                "rope k"));
      // All K/V of the step before any attention of this layer (same stream).
      TANDEM_RETURN_IF_ERROR(
          ok(kd::KvWrite(cache_.get<float>(), shape_, li, k, v, T, in.slots), "kv write"));
      const PagedAttentionArgs args{.q = q,
                                    .out = att,
                                    .cache = cache_.get<float>(),
                                    .shape = shape_,
                                    .layer = li,
                                    .num_heads = c.num_heads,
                                    .num_rows = T,
                                    .row_pos = in.row_pos,
                                    .row_table_offset = in.row_off,
                                    .block_tables = in.tables,
                                    .window = c.AttentionWindow(li),
                                    .softcap = c.attn_logit_softcap};
      TANDEM_RETURN_IF_ERROR(
          ok(kd::PagedAttention(args, scratch_.get<float>(), lay.max_context), "attention"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wo.get<float>(), c.dim, c.q_dim(), att, T, xb), "wo"));
      if (c.o_bias) {
        TANDEM_RETURN_IF_ERROR(ok(kd::AddBias(xb, l.bo.get<float>(), T, c.dim, c.dim), "o bias"));
      }
      if (c.sandwich_norms) {  // in place, as the CPU backend
        TANDEM_RETURN_IF_ERROR(ok(
            kd::RmsNorm(xb, l.post_att_norm.get<float>(), T, c.dim, c.norm_eps, xb), "post norm"));
      }
      TANDEM_RETURN_IF_ERROR(ok(kd::ResidualAdd(x, xb, T * dim), "residual"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RmsNorm(x, l.rms_ffn.get<float>(), T, c.dim, c.norm_eps, xb), "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w1.get<float>(), c.hidden_dim, c.dim, xb, T, hb), "w1"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w3.get<float>(), c.hidden_dim, c.dim, xb, T, hb2), "w3"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::SiluMul(hb, hb2, T * hidden, hb, ToKernel(c.activation)), "activation"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w2.get<float>(), c.dim, c.hidden_dim, hb, T, xb), "w2"));
      if (c.sandwich_norms) {
        TANDEM_RETURN_IF_ERROR(ok(
            kd::RmsNorm(xb, l.post_ffn_norm.get<float>(), T, c.dim, c.norm_eps, xb), "post norm"));
      }
      TANDEM_RETURN_IF_ERROR(ok(kd::ResidualAdd(x, xb, T * dim), "residual"));
    }
    // Last token of each sequence: gather its row (an embedding gather over x).
    TANDEM_RETURN_IF_ERROR(ok(kd::EmbeddingGather(x, c.dim, in.last_rows, B, att), "gather last"));
    TANDEM_RETURN_IF_ERROR(
        ok(kd::RmsNorm(att, rms_final_.get<float>(), B, c.dim, c.norm_eps, xb), "rmsnorm"));
    TANDEM_RETURN_IF_ERROR(ok(kd::Matmul(blas_, classifier_.get<float>(), c.vocab_size, c.dim, xb,
                                         B, logits_.get<float>()),
                              "classifier"));
    if (c.final_logit_softcap == 0) return absl::OkStatus();
    return ok(kd::Softcap(logits_.get<float>(), int64_t{B} * c.vocab_size, c.final_logit_softcap),
              "logit softcap");
  }

  DeviceBuffer embedding_, rms_final_, classifier_;
  std::vector<DeviceLayer> layers_;
  DeviceBuffer x_, xb_, q_, att_, k_, v_, hb_, hb2_, scratch_;
};

}  // namespace

std::unique_ptr<CudaRunnerBase> NewCudaF32Runner(const Model* model, KvCacheOptions opts,
                                                 ModelRunnerOptions runner_opts) {
  return std::make_unique<CudaF32Runner>(model, opts, runner_opts);
}

}  // namespace tandem::model::internal
