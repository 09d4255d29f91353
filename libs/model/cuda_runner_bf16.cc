// The CUDA backend's bfloat16 mode (cuda_runner_base.h): fused GEMMs,
// split-K and tensor-core attention (cuda_bf16_ops.h), decode graphs.
#include <algorithm>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_runner_base.h"
#include "tandem/model/checkpoint.h"

namespace tandem::model::internal {
namespace {

struct Bf16Layer {
  DeviceBuffer rms_att, wqkv, wo, rms_ffn, w13, w2;
  DeviceBuffer bqkv, bo, q_norm, k_norm;  // fp32, when the config has them
  DeviceBuffer post_att_norm, post_ffn_norm;  // fp32, sandwich_norms
};

// bfloat16: fused GEMMs, split-K attention; see DType.
class CudaBf16Runner final : public CudaRunnerBase {
 public:
  using CudaRunnerBase::CudaRunnerBase;

  absl::Status Init() override {
    TANDEM_RETURN_IF_ERROR(InitCommon());
    const ModelConfig& c = model_->config();
    if (c.head_size > kd::kMaxAttentionHeadSize) {
      return absl::InvalidArgumentError(absl::StrCat("dtype bfloat16: head size ", c.head_size,
                                                     " exceeds the attention kernel's ",
                                                     kd::kMaxAttentionHeadSize));
    }
    // bf16 tensors go from the mapped checkpoint straight to the device;
    // others are converted one at a time.
    const Model& m = *model_;
    using K = WeightKind;
    TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &embedding_, {K::kEmbedding}, 0));
    TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &rms_final_, {K::kRmsFinal}, 0));
    TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &classifier_, {K::kClassifier}, 0));
    layers_ = std::vector<Bf16Layer>(static_cast<size_t>(c.num_layers));
    for (int32_t i = 0; i < c.num_layers; ++i) {
      Bf16Layer& d = layers_[static_cast<size_t>(i)];
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.rms_att, {K::kRmsAtt}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &d.wqkv, {K::kWq, K::kWk, K::kWv}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &d.wo, {K::kWo}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.rms_ffn, {K::kRmsFfn}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &d.w13, {K::kW1, K::kW3}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &d.w2, {K::kW2}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.bqkv, {K::kBq, K::kBk, K::kBv}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.bo, {K::kBo}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.q_norm, {K::kQNorm}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.k_norm, {K::kKNorm}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.post_att_norm, {K::kPostAttNorm}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.post_ffn_norm, {K::kPostFfnNorm}, i));
    }
    return AllocateCache();
  }

 private:
  absl::Status ReserveLayers(int32_t T, int32_t max_context) override {
    const ModelConfig& c = model_->config();
    const int32_t qd = c.q_dim();
    const int32_t qkv_width = qd + 2 * c.kv_dim();
    const size_t f = sizeof(float), h = sizeof(kd::Bf16);
    TANDEM_RETURN_IF_ERROR(x_.Reserve(f * T * c.dim));
    TANDEM_RETURN_IF_ERROR(xn_.Reserve(h * T * std::max(c.dim, c.hidden_dim)));
    // qkv_ also holds the gate/up output and, with sandwich norms, a
    // sublayer's output before its norm.
    TANDEM_RETURN_IF_ERROR(qkv_.Reserve(f * T * std::max({qkv_width, 2 * c.hidden_dim, c.dim})));
    TANDEM_RETURN_IF_ERROR(att_.Reserve(h * T * qd));
    return scratch_.Reserve(
        f *
        std::max<int64_t>(1, kd::AttentionScratchFloats(T, c.num_heads, c.head_size, max_context)));
  }

  void AppendStepBuffers(std::vector<void*>* out) const override {
    for (const DeviceBuffer* b : {&x_, &xn_, &qkv_, &att_, &scratch_})
      out->push_back(b->get<void>());
  }

  absl::Status RunLayers(const BatchLayout& lay, const StepInputs& in, int32_t B) override {
    const ModelConfig& c = model_->config();
    const int32_t T = lay.num_rows;
    const int32_t qd = c.q_dim();
    const int32_t qkv_width = qd + 2 * c.kv_dim();
    TANDEM_RETURN_IF_ERROR(ReserveLayers(T, in.plan->single_max_context));
    void* const st = stream_;
    float* x = x_.get<float>();
    float* qkv = qkv_.get<float>();  // also the gate/up output
    kd::Bf16* xn = xn_.get<kd::Bf16>();
    kd::Bf16* att = att_.get<kd::Bf16>();
    kd::Bf16* cache = cache_.get<kd::Bf16>();
    // y = x W^T + beta y; decode GEMVs start under the kernel before (pdl).
    const bool pdl = dependent_launch_;
    auto gemm = [&](const DeviceBuffer& w, int32_t out_dim, int32_t in_dim, const kd::Bf16* in,
                    int32_t rows, float* y, float beta) {
      return kd::MatmulBf16(blas_, w.get<kd::Bf16>(), out_dim, in_dim, in, rows, y, beta, pdl,
                            gemv_max_rows_, tc_gemm_max_rows_);
    };
    const RopeKind rope = ToKernel(c.rope_style);
    auto ok = [](int err, const char* what) { return CudaStatus(err, what); };
    TANDEM_RETURN_IF_ERROR(
        ok(kd::EmbeddingGatherBf16(embedding_.get<kd::Bf16>(), c.dim, in.tokens, T, x, st),
           "embedding"));
    if (c.embedding_scale != 1.0f) {
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Scale(x, int64_t{T} * c.dim, c.EmbeddingScale(/*bf16=*/true), st),
             "embedding scale"));
    }
    for (int32_t li = 0; li < c.num_layers; ++li) {
      const Bf16Layer& l = layers_[static_cast<size_t>(li)];
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RmsNormBf16(x, nullptr, l.rms_att.get<float>(), T, c.dim, c.norm_eps, xn, st),
             "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(ok(gemm(l.wqkv, qkv_width, c.dim, xn, T, qkv, 0.0f), "wqkv"));
      if (c.qkv_bias) {
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(qkv, l.bqkv.get<float>(), T, qkv_width, qkv_width, st), "qkv bias"));
      }
      if (c.qk_norm) {
        TANDEM_RETURN_IF_ERROR(ok(kd::HeadRmsNorm(qkv, l.q_norm.get<float>(), T, c.num_heads,
                                                  c.head_size, qkv_width, c.norm_eps, st),
                                  "q norm"));
        TANDEM_RETURN_IF_ERROR(
            ok(kd::HeadRmsNorm(qkv + qd, l.k_norm.get<float>(), T, c.num_kv_heads, c.head_size,
                               qkv_width, c.norm_eps, st),
               "k norm"));
      }
      // All K/V of the step before any attention of this layer (same stream).
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RopeKvWriteBf16(qkv, qkv_width, T, in.row_pos, c.num_heads, shape_, rope,
                                 c.RopeTheta(li), cache, li, in.slots, st, InvFreq(li),
                                 c.RopeAmplitude(li), c.rotary_dim),
             "rope + kv write"));
      const kd::Bf16AttentionArgs args{.q = qkv,
                                       .q_stride = qkv_width,
                                       .out = att,
                                       .cache = cache,
                                       .shape = shape_,
                                       .layer = li,
                                       .num_heads = c.num_heads,
                                       .num_rows = in.plan->num_single_rows(),
                                       .row_pos = in.row_pos,
                                       .row_table_offset = in.row_off,
                                       .block_tables = in.tables,
                                       .rows = in.single_rows,
                                       .window = c.AttentionWindow(li),
                                       .softcap = c.attn_logit_softcap};
      TANDEM_RETURN_IF_ERROR(
          ok(kd::PrefillAttentionBf16(args, in.tiles, in.plan->num_tiles(), st, prefill_wide_),
             "prefill attention"));
      TANDEM_RETURN_IF_ERROR(
          ok(decode_tensor_cores_
                 ? kd::DecodeAttentionTcBf16(args, in.plan->single_max_context,
                                             scratch_.get<float>(), st)
                 : kd::PagedAttentionBf16(args, in.plan->single_max_context, scratch_.get<float>(),
                                          st, runner_opts_.attention_splits_per_block),
             "attention"));
      // x += att * Wo^T: the residual add is the GEMM's beta = 1; with
      // sandwich norms the output is normed first (into qkv, free by now).
      const bool sandwich = c.sandwich_norms;
      float* wo_out = sandwich ? qkv : x;
      TANDEM_RETURN_IF_ERROR(
          ok(gemm(l.wo, c.dim, qd, att, T, wo_out, sandwich ? 0.0f : 1.0f), "wo"));
      if (c.o_bias) {
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(wo_out, l.bo.get<float>(), T, c.dim, c.dim, st), "o bias"));
      }
      if (sandwich) {
        TANDEM_RETURN_IF_ERROR(
            ok(kd::RmsNormAddBf16(x, qkv, l.post_att_norm.get<float>(), T, c.dim, c.norm_eps, st),
               "post-attention norm"));
      }
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RmsNormBf16(x, nullptr, l.rms_ffn.get<float>(), T, c.dim, c.norm_eps, xn, st),
             "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(ok(gemm(l.w13, 2 * c.hidden_dim, c.dim, xn, T, qkv, 0.0f), "w13"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::SiluMulBf16(qkv, T, c.hidden_dim, xn, st, ToKernel(c.activation)), "activation"));
      TANDEM_RETURN_IF_ERROR(
          ok(gemm(l.w2, c.dim, c.hidden_dim, xn, T, sandwich ? qkv : x, sandwich ? 0.0f : 1.0f),
             "w2"));
      if (sandwich) {
        TANDEM_RETURN_IF_ERROR(
            ok(kd::RmsNormAddBf16(x, qkv, l.post_ffn_norm.get<float>(), T, c.dim, c.norm_eps, st),
               "post-MLP norm"));
      }
    }
    TANDEM_RETURN_IF_ERROR(
        ok(kd::RmsNormBf16(x, in.last_rows, rms_final_.get<float>(), B, c.dim, c.norm_eps, xn, st),
           "rmsnorm"));
    TANDEM_RETURN_IF_ERROR(ok(
        gemm(classifier_, c.vocab_size, c.dim, xn, B, logits_.get<float>(), 0.0f), "classifier"));
    if (c.final_logit_softcap == 0) return absl::OkStatus();
    return ok(
        kd::Softcap(logits_.get<float>(), int64_t{B} * c.vocab_size, c.final_logit_softcap, st),
        "logit softcap");
  }

  DeviceBuffer embedding_, rms_final_, classifier_;
  std::vector<Bf16Layer> layers_;
  DeviceBuffer x_, xn_, qkv_, att_, scratch_;
};

}  // namespace

std::unique_ptr<CudaRunnerBase> NewCudaBf16Runner(const Model* model, KvCacheOptions opts,
                                                  ModelRunnerOptions runner_opts) {
  return std::make_unique<CudaBf16Runner>(model, opts, runner_opts);
}

}  // namespace tandem::model::internal
