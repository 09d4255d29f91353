#include "tandem/model/model.h"

#include <openssl/evp.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "file_util.h"
#include "tandem/common/status.h"
#include "tandem/model/checkpoint.h"

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
  }
  add(w.rms_final);
  add(w.wcls);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
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
  if (dim % num_heads != 0 || head_size != dim / num_heads) {
    return absl::InvalidArgumentError(absl::StrCat("model config: head_size ", head_size,
                                                   " != dim ", dim, " / num_heads ", num_heads));
  }
  if (head_size % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_size ", head_size, " must be even for RoPE"));
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: num_heads ", num_heads, " not a multiple of num_kv_heads ", num_kv_heads));
  }
  if (!(rope_theta > 0) || !(norm_eps > 0)) {
    return absl::InvalidArgumentError("model config: rope_theta and norm_eps must be positive");
  }
  if (bos_token_id < 0 || bos_token_id >= vocab_size || eos_token_id < 0 ||
      eos_token_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("model config: bos/eos token ids ", bos_token_id,
                                                   "/", eos_token_id, " outside vocab of ",
                                                   vocab_size));
  }
  return absl::OkStatus();
}

absl::Status CheckWeightShapes(const ModelConfig& c, const ModelWeights& w) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim(), vocab = c.vocab_size;
  TANDEM_RETURN_IF_ERROR(CheckSize("token_embedding", w.token_embedding, vocab * dim));
  if (static_cast<int32_t>(w.layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", w.layers.size(), " layers, config implies ", c.num_layers));
  }
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = absl::StrCat("layers.", i, ".");
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "rms_att", l.rms_att, dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "wq", l.wq, dim * dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "wk", l.wk, kv * dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "wv", l.wv, kv * dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "wo", l.wo, dim * dim));
    TANDEM_RETURN_IF_ERROR(CheckSize(p + "rms_ffn", l.rms_ffn, dim));
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

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(path, ec);
  absl::StatusOr<LoadedCheckpoint> ckpt =
      is_dir ? ReadHfCheckpoint(path) : ReadLlama2cCheckpoint(path);
  if (!ckpt.ok()) return ckpt.status();
  absl::StatusOr<std::unique_ptr<Model>> m =
      FromWeights(ckpt->config, std::move(ckpt->weights), internal::BaseName(path));
  if (!m.ok()) return Annotate(m.status(), path);
  return m;
}

}  // namespace tandem::model
