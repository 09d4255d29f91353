#include "tandem/model/model.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "file_util.h"
#include "tandem/common/status.h"
#include "tandem/model/checkpoint.h"
#include "hf_config.h"
#include "hf_weights.h"
#include "tandem/common/logging.h"

namespace tandem::model {
namespace {

std::string Fingerprint(const ModelConfig& c, const ModelWeights& w) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  const int32_t header[] = {
      c.dim,          c.hidden_dim, c.num_layers,  c.num_heads,
      c.num_kv_heads, c.vocab_size, c.max_seq_len, static_cast<int32_t>(c.rope_style)};
  EVP_DigestUpdate(ctx, header, sizeof(header));
  const float fheader[] = {c.rope_theta, c.norm_eps};
  EVP_DigestUpdate(ctx, fheader, sizeof(fheader));
  // What the Hugging Face families added; llama2.c models hash as before.
  if (c.family != ModelFamily::kLlama2c) {
    const int32_t family[] = {static_cast<int32_t>(c.family), static_cast<int32_t>(c.activation),
                              static_cast<int32_t>(c.rope_scaling.type), c.head_size,
                              c.qkv_bias, c.o_bias, c.qk_norm,
                              c.rope_scaling.original_max_position_embeddings};
    EVP_DigestUpdate(ctx, family, sizeof(family));
    const float ffamily[] = {c.embedding_scale, c.rope_scaling.factor,
                             c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor};
    EVP_DigestUpdate(ctx, ffamily, sizeof(ffamily));
    // Sliding windows change every K/V past the window (nothing when none slides).
    EVP_DigestUpdate(ctx, c.layer_window.data(), c.layer_window.size() * sizeof(int32_t));
    internal::HashRopeScaling(ctx, c);
  }
  auto add = [&](const std::vector<float>& v) {
    const uint64_t n = v.size();
    EVP_DigestUpdate(ctx, &n, sizeof(n));
    EVP_DigestUpdate(ctx, v.data(), v.size() * sizeof(float));
  };
  add(w.token_embedding);
  for (const LayerWeights& l : w.layers) {
    for (const auto* t :
         {&l.rms_att, &l.wq, &l.wk, &l.wv, &l.wo, &l.rms_ffn, &l.w1, &l.w2, &l.w3}) {
      add(*t);
    }
    if (c.family != ModelFamily::kLlama2c) {
      for (const auto* t : {&l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm, &l.k_norm}) add(*t);
      if (c.sandwich_norms) {
        for (const auto* t : {&l.post_att_norm, &l.post_ffn_norm}) add(*t);
      }
    }
  }
  add(w.rms_final);
  add(w.wcls);
  return internal::FinishSha256Hex(ctx);
}

absl::Status CheckSize(const std::string& name, const std::vector<float>& v, int64_t expected) {
  if (static_cast<int64_t>(v.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight ", name, " has ", v.size(), " elements, config implies ", expected));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  auto positive = [](const char* field, int32_t v) -> absl::Status {
    if (v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", field, " = ", v, " must be positive"));
    }
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(positive("dim", dim));
  TANDEM_RETURN_IF_ERROR(positive("hidden_dim", hidden_dim));
  TANDEM_RETURN_IF_ERROR(positive("num_layers", num_layers));
  TANDEM_RETURN_IF_ERROR(positive("num_heads", num_heads));
  TANDEM_RETURN_IF_ERROR(positive("num_kv_heads", num_kv_heads));
  TANDEM_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  TANDEM_RETURN_IF_ERROR(positive("max_seq_len", max_seq_len));
  TANDEM_RETURN_IF_ERROR(positive("head_size", head_size));
  // Upper bounds far past any real model, so that size arithmetic on a
  // corrupt header cannot overflow int64.
  auto at_most = [](const char* field, int32_t v, int32_t max) -> absl::Status {
    if (v > max) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", field, " = ", v, " exceeds the limit of ", max));
    }
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(at_most("dim", dim, 1 << 20));
  TANDEM_RETURN_IF_ERROR(at_most("hidden_dim", hidden_dim, 1 << 20));
  TANDEM_RETURN_IF_ERROR(at_most("num_layers", num_layers, 1 << 12));
  TANDEM_RETURN_IF_ERROR(at_most("vocab_size", vocab_size, 1 << 24));
  TANDEM_RETURN_IF_ERROR(at_most("max_seq_len", max_seq_len, 1 << 24));
  TANDEM_RETURN_IF_ERROR(at_most("head_size", head_size, 1 << 12));
  TANDEM_RETURN_IF_ERROR(at_most("num_heads", num_heads, 1 << 12));
  if (family == ModelFamily::kLlama2c && (dim % num_heads != 0 || head_size != dim / num_heads)) {
    return absl::InvalidArgumentError(absl::StrCat("model config: head_size ", head_size,
                                                   " != dim ", dim, " / num_heads ", num_heads));
  }
  if (!layer_window.empty()) {
    if (static_cast<int32_t>(layer_window.size()) != num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("model config: ", layer_window.size(),
                                                     " layer windows for ", num_layers, " layers"));
    }
    for (int32_t w : layer_window) {
      if (w < 0) return absl::InvalidArgumentError("model config: a negative sliding window");
    }
  }
  if (!local_rope_layers.empty()) {
    if (static_cast<int32_t>(local_rope_layers.size()) != num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("model config: ", local_rope_layers.size(),
                                                     " local RoPE flags for ", num_layers,
                                                     " layers"));
    }
    if (!(local_rope_theta > 0) || !std::isfinite(local_rope_theta)) {
      return absl::InvalidArgumentError("model config: local_rope_theta must be positive");
    }
  }
  for (float cap : {attn_logit_softcap, final_logit_softcap}) {
    if (cap < 0 || !std::isfinite(cap)) {
      return absl::InvalidArgumentError("model config: a softcap must be positive (0: none)");
    }
  }
  if (query_pre_attn_scalar < 0 || !std::isfinite(query_pre_attn_scalar)) {
    return absl::InvalidArgumentError(
        "model config: query_pre_attn_scalar must be positive (0: head_size)");
  }
  if (head_size % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_size ", head_size, " must be even for RoPE"));
  }
  if (rotary_dim < 0 || rotary_dim > head_size || rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: rotary_dim ", rotary_dim,
                                                   " must be even and at most head_size ",
                                                   head_size));
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: num_heads ", num_heads, " not a multiple of num_kv_heads ", num_kv_heads));
  }
  if (!(rope_theta > 0) || !(norm_eps > 0) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError("model config: rope_theta and norm_eps must be positive");
  }
  if (!(embedding_scale > 0) || !std::isfinite(embedding_scale)) {
    return absl::InvalidArgumentError("model config: embedding_scale must be positive");
  }
  if (rope_scaling.type != RopeScaling::Type::kNone &&
      (!(rope_scaling.factor > 0) || !std::isfinite(rope_scaling.factor))) {
    return absl::InvalidArgumentError("model config: rope scaling factor must be positive");
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3 &&
      (rope_scaling.original_max_position_embeddings <= 0 ||
       !(rope_scaling.low_freq_factor > 0) ||
       !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor))) {
    return absl::InvalidArgumentError(
        "model config: llama3 rope scaling needs original_max_position_embeddings > 0 and "
        "0 < low_freq_factor < high_freq_factor");
  }
  if (rope_scaling.ScalesAttention() &&
      (rope_scaling.original_max_position_embeddings <= 0 || !(rope_scaling.attention_factor > 0) ||
       !std::isfinite(rope_scaling.attention_factor))) {
    return absl::InvalidArgumentError(
        "model config: yarn and longrope need original_max_position_embeddings > 0 and a "
        "positive attention factor");
  }
  if (rope_scaling.type == RopeScaling::Type::kLongRope) {
    if (rope_scaling.ext_factors.size() != static_cast<size_t>(RotaryDim() / 2)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: longrope needs rotary_dim / 2 = ", RotaryDim() / 2,
                       " factors, got ", rope_scaling.ext_factors.size()));
    }
    for (float f : rope_scaling.ext_factors) {
      if (!(f > 0) || !std::isfinite(f)) {
        return absl::InvalidArgumentError("model config: longrope factors must be positive");
      }
    }
  }
  if (!rope_scaling.ScalesAttention() && rope_scaling.attention_factor != 1.0f) {
    return absl::InvalidArgumentError(
        "model config: only yarn and longrope scale attention (attention_factor)");
  }
  if (bos_token_id < 0 || bos_token_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("model config: bos token id ", bos_token_id,
                                                   " outside vocab of ", vocab_size));
  }
  for (int32_t id : EosTokenIds()) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("model config: eos token id ", id,
                                                     " outside vocab of ", vocab_size));
    }
  }
  return absl::OkStatus();
}

const char* ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama2c:
      return "llama2.c";
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kQwen3:
      return "qwen3";
    case ModelFamily::kPhi3:
      return "phi3";
    case ModelFamily::kGemma:
      return "gemma";
    case ModelFamily::kGemma2:
      return "gemma2";
    case ModelFamily::kGemma3:
      return "gemma3";
  }
  return "?";
}

float ModelConfig::EmbeddingScale(bool bf16) const {
  return bf16 ? BFloat16ToFloat(FloatToBFloat16(embedding_scale)) : embedding_scale;
}

std::vector<int32_t> ModelConfig::EosTokenIds() const {
  std::vector<int32_t> ids = {eos_token_id};
  for (int32_t id : extra_eos_token_ids) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

std::vector<float> ModelConfig::RopeInverseFrequencies(bool local) const {
  const int32_t dim = RotaryDim();
  const int32_t half = dim / 2;
  const float theta = local ? local_rope_theta : rope_theta;
  // theta^(2p / dim) and its inverse, the expression llama2.c's run.c
  // evaluates per element (fp32 powf); the scalings below start from them.
  std::vector<float> pos_freq(static_cast<size_t>(half)), inv(static_cast<size_t>(half));
  for (int32_t p = 0; p < half; ++p) {
    pos_freq[static_cast<size_t>(p)] =
        powf(theta, static_cast<float>(2 * p) / static_cast<float>(dim));
    inv[static_cast<size_t>(p)] = 1.0f / pos_freq[static_cast<size_t>(p)];
  }
  if (local) return inv;
  const RopeScaling& rs = rope_scaling;
  switch (rs.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLinear:
      for (float& f : inv) f /= rs.factor;
      break;
    case RopeScaling::Type::kLlama3: {
      // transformers' _compute_llama3_parameters, in fp32 as torch runs it.
      const float old_len = static_cast<float>(rs.original_max_position_embeddings);
      const float low_wavelen = old_len / rs.low_freq_factor;
      const float high_wavelen = old_len / rs.high_freq_factor;
      const float two_pi = static_cast<float>(2.0 * M_PI);
      for (float& f : inv) {
        const float wavelen = two_pi / f;
        if (wavelen > low_wavelen) {
          f = f / rs.factor;  // low frequencies: scaled
        } else if (!(wavelen < high_wavelen)) {
          // Medium: interpolate between scaled and unscaled.
          const float smooth =
              (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
          f = (1.0f - smooth) * f / rs.factor + smooth * f;
        }
      }
      break;
    }
    case RopeScaling::Type::kYarn: {
      // transformers' _compute_yarn_parameters: the correction range in
      // double (Python floats), the frequencies and the ramp in fp32 (torch).
      const double base = rope_theta;
      const double old_len = rs.original_max_position_embeddings;
      auto correction_dim = [&](double rotations) {
        return dim * std::log(old_len / (rotations * 2 * M_PI)) / (2 * std::log(base));
      };
      double low = correction_dim(rs.beta_fast);
      double high = correction_dim(rs.beta_slow);
      if (rs.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
      const float low_f = static_cast<float>(low);
      const float width_f = static_cast<float>(high - low);
      for (int32_t p = 0; p < half; ++p) {
        float& f = inv[static_cast<size_t>(p)];  // the extrapolated frequency
        const float interpolation = 1.0f / (rs.factor * pos_freq[static_cast<size_t>(p)]);
        const float ramp = std::clamp((static_cast<float>(p) - low_f) / width_f, 0.0f, 1.0f);
        const float extrapolation_share = 1.0f - ramp;
        f = interpolation * (1.0f - extrapolation_share) + f * extrapolation_share;
      }
      break;
    }
    case RopeScaling::Type::kLongRope:
      // transformers' _compute_longrope_parameters with the factors served
      // (short or long): 1 / (factor * base^(2p / dim)).
      for (int32_t p = 0; p < half; ++p) {
        inv[static_cast<size_t>(p)] =
            1.0f / (rs.ext_factors[static_cast<size_t>(p)] * pos_freq[static_cast<size_t>(p)]);
      }
      break;
  }
  return inv;
}

absl::Status CheckWeightShapes(const ModelConfig& c, const ModelWeights& w) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim(), vocab = c.vocab_size,
                q = c.q_dim(), hs = c.head_size;
  TANDEM_RETURN_IF_ERROR(CheckSize("token_embedding", w.token_embedding, vocab * dim));
  if (static_cast<int32_t>(w.layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", w.layers.size(), " layers, config implies ", c.num_layers));
  }
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = absl::StrCat("layers.", i, ".");
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "rms_att", l.rms_att, dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "wq", l.wq, q * dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "wk", l.wk, kv * dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "wv", l.wv, kv * dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "wo", l.wo, dim * q));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "bq", l.bq, c.qkv_bias ? q : 0));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "bk", l.bk, c.qkv_bias ? kv : 0));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "bv", l.bv, c.qkv_bias ? kv : 0));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "bo", l.bo, c.o_bias ? dim : 0));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "q_norm", l.q_norm, c.qk_norm ? hs : 0));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "k_norm", l.k_norm, c.qk_norm ? hs : 0));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "rms_ffn", l.rms_ffn, dim));
    TANDEM_RETURN_IF_ERROR(
        CheckSize(p + "post_att_norm", l.post_att_norm, c.sandwich_norms ? dim : 0));
    TANDEM_RETURN_IF_ERROR(
        CheckSize(p + "post_ffn_norm", l.post_ffn_norm, c.sandwich_norms ? dim : 0));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "w1", l.w1, hidden * dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "w2", l.w2, dim * hidden));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "w3", l.w3, hidden * dim));
  }
  TANDEM_RETURN_IF_ERROR(CheckSize("rms_final", w.rms_final, dim));
  if (!w.wcls.empty()) TANDEM_RETURN_IF_ERROR(CheckSize("wcls", w.wcls, vocab * dim));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::FromWeights(ModelConfig config, ModelWeights weights,
                                                          std::string name) {
  TANDEM_RETURN_IF_ERROR(config.Validate());
  TANDEM_RETURN_IF_ERROR(CheckWeightShapes(config, weights));
  std::unique_ptr<Model> m(new Model());
  m->fingerprint_ = Fingerprint(config, weights);
  m->config_ = config;
  m->weights_ = std::move(weights);
  m->name_ = std::move(name);
  return m;
}

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                                   const LoadOptions& options) {
  // vLLM refuses a --max-model-len past the model's context too.
  auto fits = [&](const ModelConfig& c) -> absl::Status {
    if (options.max_model_len < 0 || options.max_model_len > c.max_seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": --max-model-len ", options.max_model_len,
                       " is outside the model's context [0, ", c.max_seq_len, "]"));
    }
    return absl::OkStatus();
  };
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(LoadedCheckpoint ckpt, ReadLlama2cCheckpoint(path));
    TANDEM_RETURN_IF_ERROR(fits(ckpt.config));
    absl::StatusOr<std::unique_ptr<Model>> m =
        FromWeights(ckpt.config, std::move(ckpt.weights), internal::BaseName(path));
    if (!m.ok()) return Annotate(m.status(), path);
    return m;
  }
  TANDEM_ASSIGN_OR_RETURN(internal::HfConfig hf, internal::ReadHfConfig(path, options));
  TANDEM_RETURN_IF_ERROR(fits(hf.config));
  if (hf.sliding_window_cap > 0) {
    TANDEM_LOG(WARNING) << path << ": "
                        << (options.disable_sliding_window ? "--disable-sliding-window"
                                                           : hf.architecture +
                                                                 " sets a sliding window that its "
                                                                 "transformers code does not read")
                        << "; serving contexts of at most the window, " << hf.sliding_window_cap
                        << " tokens, where sliding changes nothing";
  }
  if (hf.rope_context_cap > 0) {
    TANDEM_LOG(WARNING) << path << ": longrope RoPE scaling: serving contexts of at most "
                        << "original_max_position_embeddings, " << hf.rope_context_cap
                        << " tokens, with the short factors (past it transformers switches "
                        << "to the long factors for the whole sequence, so a token's keys "
                        << "would depend on how long its sequence grows); --max-model-len "
                        << "above it serves the long factors at every position, as vLLM does";
  }
  if (hf.rope_long_factors) {
    TANDEM_LOG(WARNING) << path << ": longrope RoPE scaling with the long factors at every "
                        << "position (--max-model-len " << options.max_model_len
                        << " passes original_max_position_embeddings "
                        << hf.config.rope_scaling.original_max_position_embeddings
                        << "), as vLLM serves it; transformers gives other tokens for "
                        << "sequences shorter than that";
  }
  if (const std::vector<int32_t>& w = hf.config.layer_window; !w.empty()) {
    const auto sliding = std::count_if(w.begin(), w.end(), [](int32_t x) { return x > 0; });
    TANDEM_LOG(INFO) << path << ": sliding-window attention in " << sliding << " of " << w.size()
                     << " layers, window " << *std::max_element(w.begin(), w.end());
  }
  const auto start = std::chrono::steady_clock::now();
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<internal::HfWeights> source,
                          internal::HfWeights::Open(path, hf));
  std::unique_ptr<Model> m(new Model());
  m->config_ = hf.config;
  m->name_ = internal::BaseName(path);
  m->fingerprint_ = source->Fingerprint(hf.config);
  if (options.host_weights) {
    TANDEM_ASSIGN_OR_RETURN(m->weights_, internal::MaterializeWeights(*source, hf.config, path));
    if (absl::Status s = CheckWeightShapes(m->config_, m->weights_); !s.ok()) {
      return Annotate(s, path);
    }
  } else {
    m->checkpoint_ = std::move(source);
  }
  TANDEM_LOG(INFO) << "loaded " << path << " (" << (options.host_weights ? "fp32 on the host" : "mapped")
                   << ") in "
                   << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                   << " s";
  return m;
}

namespace internal {

std::vector<float>* LayerWeight(LayerWeights& l, WeightKind kind) {
  switch (kind) {
    case WeightKind::kRmsAtt: return &l.rms_att;
    case WeightKind::kWq: return &l.wq;
    case WeightKind::kWk: return &l.wk;
    case WeightKind::kWv: return &l.wv;
    case WeightKind::kWo: return &l.wo;
    case WeightKind::kBq: return &l.bq;
    case WeightKind::kBk: return &l.bk;
    case WeightKind::kBv: return &l.bv;
    case WeightKind::kBo: return &l.bo;
    case WeightKind::kQNorm: return &l.q_norm;
    case WeightKind::kKNorm: return &l.k_norm;
    case WeightKind::kRmsFfn: return &l.rms_ffn;
    case WeightKind::kW1: return &l.w1;
    case WeightKind::kW2: return &l.w2;
    case WeightKind::kW3: return &l.w3;
    case WeightKind::kPostAttNorm:
      return &l.post_att_norm;
    case WeightKind::kPostFfnNorm:
      return &l.post_ffn_norm;
    default: return nullptr;
  }
}

}  // namespace internal

namespace {

// The host weight `id` names (empty for an absent optional one).
const std::vector<float>* HostWeight(const ModelWeights& w, WeightId id) {
  static const std::vector<float> kEmpty;
  switch (id.kind) {
    case WeightKind::kEmbedding:
      return &w.token_embedding;
    case WeightKind::kRmsFinal:
      return &w.rms_final;
    case WeightKind::kClassifier:
      return &w.classifier();
    default:
      break;
  }
  if (id.layer < 0 || id.layer >= static_cast<int32_t>(w.layers.size())) return &kEmpty;
  // LayerWeight only hands out the field; nothing is written through it.
  const std::vector<float>* v = internal::LayerWeight(
      const_cast<LayerWeights&>(w.layers[static_cast<size_t>(id.layer)]), id.kind);
  return v != nullptr ? v : &kEmpty;
}

absl::Status Released(const std::string& name) {
  return absl::FailedPreconditionError(
      absl::StrCat("model ", name, ": the checkpoint was released (ReleaseCheckpoint)"));
}

}  // namespace

absl::StatusOr<WeightView<float>> Model::Fp32(WeightId id) const {
  if (released_) return Released(name_);
  if (checkpoint_ == nullptr) return WeightView<float>::Borrow(*HostWeight(weights_, id));
  TANDEM_ASSIGN_OR_RETURN(std::vector<float> v, checkpoint_->Fp32(id));
  return WeightView<float>::Own(std::move(v));
}

absl::StatusOr<WeightView<uint16_t>> Model::Bf16(WeightId id) const {
  if (released_) return Released(name_);
  if (checkpoint_ != nullptr) return checkpoint_->Bf16(id);
  const std::vector<float>& f = *HostWeight(weights_, id);
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = FloatToBFloat16(f[i]);
  return WeightView<uint16_t>::Own(std::move(out));
}

void Model::ReleaseCheckpoint() {
  if (checkpoint_ == nullptr) return;
  checkpoint_.reset();
  released_ = true;
}

}  // namespace tandem::model
