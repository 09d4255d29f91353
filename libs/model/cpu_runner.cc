// The CPU backend: the kernels' CPU ops composed in llama2.c's order, with
// every matmul batched over all tokens of the step (PackedMatrix).
#include "cpu_runner.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "tandem/common/pinned_memory.h"
#include "tandem/common/status.h"
#include "tandem/kernels/cpu_ops.h"
#include "thread_pool.h"

namespace tandem::model::internal {
namespace {

namespace kc = ::tandem::kernels::cpu;
using kernels::KvCacheShape;
using kernels::PagedAttentionArgs;
using kernels::RopeKind;

// A layer's weights as this backend holds them: the matrices packed, the
// vectors borrowed from the model's host weights or owned (a model loaded
// without them).
struct PackedLayer {
  kc::PackedMatrix wq, wk, wv, wo, w1, w2, w3;
  WeightView<float> rms_att, rms_ffn, bq, bk, bv, bo, q_norm, k_norm, post_att_norm, post_ffn_norm;
};

kernels::ActKind ToKernel(Activation a) {
  return a == Activation::kGeluTanh ? kernels::ActKind::kGeluTanh : kernels::ActKind::kSilu;
}

RopeKind ToKernel(RopeStyle s) {
  switch (s) {
    case RopeStyle::kAdjacentPairs:
      return RopeKind::kAdjacentPairs;
    case RopeStyle::kRotateHalf:
      return RopeKind::kRotateHalf;
  }
  return RopeKind::kAdjacentPairs;
}

class CpuModelRunner final : public ModelRunner {
 public:
  CpuModelRunner(const Model* model, KvCacheOptions opts, int32_t num_threads)
      : ModelRunner(model, opts, Backend::kCpu), pool_(num_threads) {}

  // Reads the weights one tensor at a time: a matrix is packed and its fp32
  // conversion (for a model without host weights) dropped before the next.
  absl::Status Init() {
    const ModelConfig& c = model_->config();
    shape_ = KvCacheShape{.num_blocks = opts_.num_blocks,
                          .num_layers = c.num_layers,
                          .block_size = opts_.block_size,
                          .num_kv_heads = c.num_kv_heads,
                          .head_size = c.head_size};
    // Anonymous zero pages: a block costs memory once it is first written,
    // so a large default cache (DefaultCpuKvCacheBytes) is free until used.
    TANDEM_ASSIGN_OR_RETURN(
        cache_, PinnedBuffer::Allocate(
                    static_cast<size_t>(block_bytes()) * static_cast<size_t>(opts_.num_blocks),
                    {.use_cuda_host_alloc = false, .lock = false, .what = "CPU KV cache"}));
    inv_freq_ = c.RopeInverseFrequencies();
    if (!c.local_rope_layers.empty()) local_inv_freq_ = c.RopeInverseFrequencies(/*local=*/true);
    auto pack = [&](WeightKind kind, int32_t layer, int32_t out_dim, int32_t in_dim,
                    kc::PackedMatrix* m) -> absl::Status {
      TANDEM_ASSIGN_OR_RETURN(WeightView<float> w, model_->Fp32({kind, layer}));
      *m = kc::PackedMatrix(w.data(), out_dim, in_dim);
      return absl::OkStatus();
    };
    layers_.resize(static_cast<size_t>(c.num_layers));
    for (int32_t i = 0; i < c.num_layers; ++i) {
      PackedLayer& l = layers_[static_cast<size_t>(i)];
      TANDEM_RETURN_IF_ERROR(pack(WeightKind::kWq, i, c.q_dim(), c.dim, &l.wq));
      TANDEM_RETURN_IF_ERROR(pack(WeightKind::kWk, i, c.kv_dim(), c.dim, &l.wk));
      TANDEM_RETURN_IF_ERROR(pack(WeightKind::kWv, i, c.kv_dim(), c.dim, &l.wv));
      TANDEM_RETURN_IF_ERROR(pack(WeightKind::kWo, i, c.dim, c.q_dim(), &l.wo));
      TANDEM_RETURN_IF_ERROR(pack(WeightKind::kW1, i, c.hidden_dim, c.dim, &l.w1));
      TANDEM_RETURN_IF_ERROR(pack(WeightKind::kW2, i, c.dim, c.hidden_dim, &l.w2));
      TANDEM_RETURN_IF_ERROR(pack(WeightKind::kW3, i, c.hidden_dim, c.dim, &l.w3));
      for (auto [view, kind] : std::initializer_list<std::pair<WeightView<float>*, WeightKind>>{
               {&l.rms_att, WeightKind::kRmsAtt},
               {&l.rms_ffn, WeightKind::kRmsFfn},
               {&l.bq, WeightKind::kBq},
               {&l.bk, WeightKind::kBk},
               {&l.bv, WeightKind::kBv},
               {&l.bo, WeightKind::kBo},
               {&l.q_norm, WeightKind::kQNorm},
               {&l.k_norm, WeightKind::kKNorm},
               {&l.post_att_norm, WeightKind::kPostAttNorm},
               {&l.post_ffn_norm, WeightKind::kPostFfnNorm}}) {
        TANDEM_ASSIGN_OR_RETURN(*view, model_->Fp32({kind, i}));
      }
    }
    TANDEM_ASSIGN_OR_RETURN(embedding_, model_->Fp32({WeightKind::kEmbedding}));
    TANDEM_ASSIGN_OR_RETURN(rms_final_, model_->Fp32({WeightKind::kRmsFinal}));
    return pack(WeightKind::kClassifier, 0, c.vocab_size, c.dim, &classifier_);
  }

  // y = W x over `rows` tokens, split across the pool by token ranges
  // (multiples of 4, the kernel's token tile): each output element is
  // computed by one thread with the same arithmetic.
  void Matmul(const kc::PackedMatrix& w, const float* x, int32_t rows, float* y) {
    const int32_t parts = std::min<int32_t>(pool_.num_threads(), (rows + 7) / 8);
    if (parts <= 1) {
      w.Apply(x, rows, y);
      return;
    }
    const int32_t per = ((rows + parts - 1) / parts + 3) / 4 * 4;
    pool_.ParallelFor(parts, [&](int64_t p) {
      const int32_t begin = static_cast<int32_t>(p) * per;
      const int32_t end = std::min(rows, begin + per);
      if (begin < end) w.ApplyRows(x, begin, end, y);
    });
  }

  void Attention(const PagedAttentionArgs& args) {
    const int32_t parts = std::min(pool_.num_threads(), args.num_rows);
    if (parts <= 1) {
      kc::PagedAttention(args);
      return;
    }
    pool_.ParallelFor(parts, [&](int64_t p) {
      kc::PagedAttentionRows(args, static_cast<int32_t>(p * args.num_rows / parts),
                             static_cast<int32_t>((p + 1) * args.num_rows / parts));
    });
  }

  absl::Status Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) override {
    TANDEM_RETURN_IF_ERROR(ValidateBatch(batch));
    const ModelConfig& c = model_->config();
    const BatchLayout lay = MakeBatchLayout(batch, opts_.block_size);
    const int32_t T = lay.num_rows;
    const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, qd = c.q_dim();
    x_.resize(static_cast<size_t>(T * dim));
    xb_.resize(static_cast<size_t>(T * dim));
    q_.resize(static_cast<size_t>(T * qd));
    att_.resize(static_cast<size_t>(T * qd));
    k_.resize(static_cast<size_t>(T * kv));
    v_.resize(static_cast<size_t>(T * kv));
    hb_.resize(static_cast<size_t>(T * hidden));
    hb2_.resize(static_cast<size_t>(T * hidden));
    const RopeKind rope = ToKernel(c.rope_style);

    kc::EmbeddingGather(embedding_.data(), c.dim, lay.tokens, x_.data());
    if (c.embedding_scale != 1.0f) kc::Scale(x_.data(), T * dim, c.embedding_scale);
    for (int32_t li = 0; li < c.num_layers; ++li) {
      const PackedLayer& pl = layers_[static_cast<size_t>(li)];
      kc::RmsNorm(x_.data(), pl.rms_att.data(), T, c.dim, c.norm_eps, xb_.data());
      Matmul(pl.wq, xb_.data(), T, q_.data());
      Matmul(pl.wk, xb_.data(), T, k_.data());
      Matmul(pl.wv, xb_.data(), T, v_.data());
      if (c.qkv_bias) {
        kc::AddBias(q_.data(), pl.bq.data(), T, c.q_dim());
        kc::AddBias(k_.data(), pl.bk.data(), T, c.kv_dim());
        kc::AddBias(v_.data(), pl.bv.data(), T, c.kv_dim());
      }
      if (c.qk_norm) {  // per head, in place
        kc::RmsNorm(q_.data(), pl.q_norm.data(), T * c.num_heads, c.head_size, c.norm_eps,
                    q_.data());
        kc::RmsNorm(k_.data(), pl.k_norm.data(), T * c.num_kv_heads, c.head_size, c.norm_eps,
                    k_.data());
      }
      const float amplitude = c.RopeAmplitude(li), theta = c.RopeTheta(li);
      const float* inv_freq = c.LocalRope(li) ? local_inv_freq_.data() : inv_freq_.data();
      kc::Rope(q_.data(), T, lay.row_pos.data(), c.num_heads, c.head_size, rope, theta, inv_freq,
               amplitude, c.rotary_dim);
      kc::Rope(k_.data(), T, lay.row_pos.data(), c.num_kv_heads, c.head_size, rope, theta, inv_freq,
               amplitude, c.rotary_dim);
      // Every token's K/V first: later rows (and other sequences sharing
      // prefix blocks) read them below.
      kc::KvWrite(cache(), shape_, li, k_.data(), v_.data(), T, lay.slots.data());
      Attention(PagedAttentionArgs{.q = q_.data(),
                                   .out = att_.data(),
                                   .cache = cache(),
                                   .shape = shape_,
                                   .layer = li,
                                   .num_heads = c.num_heads,
                                   .num_rows = T,
                                   .row_pos = lay.row_pos.data(),
                                   .row_table_offset = lay.row_table_offset.data(),
                                   .block_tables = lay.block_tables.data(),
                                   .window = c.AttentionWindow(li),
                                   .softcap = c.attn_logit_softcap});
      Matmul(pl.wo, att_.data(), T, xb_.data());
      if (c.o_bias) kc::AddBias(xb_.data(), pl.bo.data(), T, c.dim);
      if (c.sandwich_norms) {
        kc::RmsNorm(xb_.data(), pl.post_att_norm.data(), T, c.dim, c.norm_eps, xb_.data());
      }
      kc::ResidualAdd(x_.data(), xb_.data(), T * dim);
      kc::RmsNorm(x_.data(), pl.rms_ffn.data(), T, c.dim, c.norm_eps, xb_.data());
      Matmul(pl.w1, xb_.data(), T, hb_.data());
      Matmul(pl.w3, xb_.data(), T, hb2_.data());
      kc::SiluMul(hb_.data(), hb2_.data(), T * hidden, hb_.data(), ToKernel(c.activation));
      Matmul(pl.w2, hb_.data(), T, xb_.data());
      if (c.sandwich_norms) {
        kc::RmsNorm(xb_.data(), pl.post_ffn_norm.data(), T, c.dim, c.norm_eps, xb_.data());
      }
      kc::ResidualAdd(x_.data(), xb_.data(), T * dim);
    }
    const int32_t B = static_cast<int32_t>(lay.last_rows.size());
    last_.resize(static_cast<size_t>(B * dim));
    for (int32_t i = 0; i < B; ++i) {
      std::memcpy(&last_[static_cast<size_t>(i * dim)],
                  &x_[static_cast<size_t>(lay.last_rows[static_cast<size_t>(i)] * dim)],
                  static_cast<size_t>(dim) * sizeof(float));
    }
    xb_.resize(std::max(xb_.size(), last_.size()));
    kc::RmsNorm(last_.data(), rms_final_.data(), B, c.dim, c.norm_eps, xb_.data());
    logits->resize(static_cast<size_t>(B) * c.vocab_size);
    Matmul(classifier_, xb_.data(), B, logits->data());
    if (c.final_logit_softcap > 0) {
      kc::Softcap(logits->data(), int64_t{B} * c.vocab_size, c.final_logit_softcap);
    }
    return absl::OkStatus();
  }

  std::span<std::byte> BlockBytes(int32_t block_id) override {
    if (block_id < 0 || block_id >= opts_.num_blocks) return {};
    auto* p = reinterpret_cast<std::byte*>(cache() + block_id * shape_.BlockFloats());
    return {p, static_cast<size_t>(block_bytes())};
  }

  absl::Status CopyBlockToHost(int32_t block_id, std::span<std::byte> out) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopy(block_id, out.size()));
    std::memcpy(out.data(), BlockBytes(block_id).data(), out.size());
    return absl::OkStatus();
  }
  absl::Status CopyBlockFromHost(int32_t block_id, std::span<const std::byte> in) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopy(block_id, in.size()));
    std::memcpy(BlockBytes(block_id).data(), in.data(), in.size());
    return absl::OkStatus();
  }

 private:
  ThreadPool pool_;
  KvCacheShape shape_;
  float* cache() const { return reinterpret_cast<float*>(cache_.data()); }
  PinnedBuffer cache_;
  std::vector<PackedLayer> layers_;
  kc::PackedMatrix classifier_;
  WeightView<float> embedding_, rms_final_;
  std::vector<float> inv_freq_;        // RoPE's, [rotary_dim / 2]
  std::vector<float> local_inv_freq_;  // the local layers' (Gemma 3)
  std::vector<float> x_, xb_, q_, att_, k_, v_, hb_, hb2_, last_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuRunner(const Model* model,
                                                             KvCacheOptions opts,
                                                             ModelRunnerOptions runner_opts) {
  auto runner = std::make_unique<CpuModelRunner>(model, opts, runner_opts.num_threads);
  TANDEM_RETURN_IF_ERROR(runner->Init());
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace tandem::model::internal
