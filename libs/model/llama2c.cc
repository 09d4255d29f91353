// llama2.c .bin checkpoints (shared/models/README.md) and random ones.
#include <climits>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "file_util.h"
#include "tandem/common/status.h"
#include "tandem/kernels/sampling.h"
#include "tandem/model/checkpoint.h"

namespace tandem::model {
namespace {

constexpr int64_t kHeaderBytes = 7 * sizeof(int32_t);

// Float count of the arrays after the header, in file order.
int64_t NumFloats(const ModelConfig& c, bool shared) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim(), L = c.num_layers;
  int64_t n = int64_t{c.vocab_size} * dim;                // token_embedding
  n += L * dim;                                           // rms_att
  n += L * dim * dim + 2 * L * kv * dim + L * dim * dim;  // wq wk wv wo
  n += L * dim;                                           // rms_ffn
  n += 3 * L * hidden * dim;                              // w1 w2 w3
  n += dim;                                               // rms_final
  n += int64_t{c.max_seq_len} * c.head_size;              // two unused RoPE tables
  if (!shared) n += int64_t{c.vocab_size} * dim;          // wcls
  return n;
}

}  // namespace

absl::StatusOr<LoadedCheckpoint> ReadLlama2cCheckpoint(const std::string& path) {
  // Mapped, not read: the weights are copied out once, straight from the file.
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<internal::MappedFile> file,
                          internal::MappedFile::Open(path));
  const std::string_view bytes = file->view();
  if (static_cast<int64_t>(bytes.size()) < kHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated llama2.c header: ", bytes.size(), " bytes, need 28"));
  }
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof(h));
  LoadedCheckpoint out;
  ModelConfig& c = out.config;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.num_layers = h[2];
  c.num_heads = h[3];
  c.num_kv_heads = h[4];
  const bool shared = h[5] > 0;
  c.vocab_size = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -h[5] : h[5]);
  c.max_seq_len = h[6];
  c.torch_dtype = "float32";
  c.head_size = c.num_heads > 0 ? c.dim / c.num_heads : 0;
  c.rope_style = RopeStyle::kAdjacentPairs;
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad llama2.c header (dim=", h[0], " hidden_dim=", h[1],
                     " n_layers=", h[2], " n_heads=", h[3], " n_kv_heads=", h[4],
                     " vocab_size=", h[5], " seq_len=", h[6], "): ", s.message()));
  }
  const int64_t expected = kHeaderBytes + NumFloats(c, shared) * int64_t{sizeof(float)};
  if (static_cast<int64_t>(bytes.size()) < expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated: the header implies ", expected, " bytes, the file has ", bytes.size()));
  }
  if (static_cast<int64_t>(bytes.size()) > expected) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": size mismatch: the header implies ",
                                                   expected, " bytes, the file has ", bytes.size(),
                                                   " (wrong header?)"));
  }
  const char* p = bytes.data() + kHeaderBytes;
  auto take = [&p](std::vector<float>* v, int64_t n) {
    v->resize(static_cast<size_t>(n));
    std::memcpy(v->data(), p, static_cast<size_t>(n) * sizeof(float));
    p += n * sizeof(float);
  };
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim();
  ModelWeights& w = out.weights;
  w.layers.resize(static_cast<size_t>(c.num_layers));
  take(&w.token_embedding, c.vocab_size * dim);
  for (auto& l : w.layers) take(&l.rms_att, dim);
  for (auto& l : w.layers) take(&l.wq, dim * dim);
  for (auto& l : w.layers) take(&l.wk, kv * dim);
  for (auto& l : w.layers) take(&l.wv, kv * dim);
  for (auto& l : w.layers) take(&l.wo, dim * dim);
  for (auto& l : w.layers) take(&l.rms_ffn, dim);
  for (auto& l : w.layers) take(&l.w1, hidden * dim);
  for (auto& l : w.layers) take(&l.w2, dim * hidden);
  for (auto& l : w.layers) take(&l.w3, hidden * dim);
  take(&w.rms_final, dim);
  p += int64_t{c.max_seq_len} * c.head_size * int64_t{sizeof(float)};
  if (!shared) take(&w.wcls, c.vocab_size * dim);
  return out;
}

absl::Status WriteLlama2cCheckpoint(const ModelConfig& c, const ModelWeights& w,
                                    const std::string& path) {
  TANDEM_RETURN_IF_ERROR(c.Validate());
  TANDEM_RETURN_IF_ERROR(CheckWeightShapes(c, w));
  if (c.rope_style != RopeStyle::kAdjacentPairs) {
    return absl::InvalidArgumentError("llama2.c checkpoints need adjacent-pairs RoPE");
  }
  std::string bytes;
  const bool shared = w.wcls.empty();
  const int32_t h[7] = {c.dim,        c.hidden_dim,   c.num_layers,
                        c.num_heads,  c.num_kv_heads, shared ? c.vocab_size : -c.vocab_size,
                        c.max_seq_len};
  bytes.append(reinterpret_cast<const char*>(h), sizeof(h));
  auto put = [&bytes](const std::vector<float>& v) {
    bytes.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  put(w.token_embedding);
  for (auto& l : w.layers) put(l.rms_att);
  for (auto& l : w.layers) put(l.wq);
  for (auto& l : w.layers) put(l.wk);
  for (auto& l : w.layers) put(l.wv);
  for (auto& l : w.layers) put(l.wo);
  for (auto& l : w.layers) put(l.rms_ffn);
  for (auto& l : w.layers) put(l.w1);
  for (auto& l : w.layers) put(l.w2);
  for (auto& l : w.layers) put(l.w3);
  put(w.rms_final);
  put(std::vector<float>(static_cast<size_t>(c.max_seq_len) * c.head_size, 0.0f));
  if (!shared) put(w.wcls);
  return internal::WriteFile(path, bytes);
}

absl::Status RandomModelOptions::Validate() const {
  ModelConfig c{.dim = dim,
                .hidden_dim = hidden_dim,
                .num_layers = num_layers,
                .num_heads = num_heads,
                .num_kv_heads = num_kv_heads,
                .vocab_size = vocab_size,
                .max_seq_len = max_seq_len,
                .head_size = num_heads > 0 ? dim / num_heads : 0};
  return c.Validate();
}

absl::StatusOr<LoadedCheckpoint> MakeRandomCheckpoint(const RandomModelOptions& o) {
  TANDEM_RETURN_IF_ERROR(o.Validate());
  LoadedCheckpoint out;
  ModelConfig& c = out.config;
  c = ModelConfig{.dim = o.dim,
                  .hidden_dim = o.hidden_dim,
                  .num_layers = o.num_layers,
                  .num_heads = o.num_heads,
                  .num_kv_heads = o.num_kv_heads,
                  .vocab_size = o.vocab_size,
                  .max_seq_len = o.max_seq_len,
                  .head_size = o.dim / o.num_heads};
  uint64_t counter = 0;
  auto uniform = [&]() {  // [-1, 1)
    const uint64_t r = kernels::SplitMix64(o.seed * 0x9E3779B97F4A7C15ull + counter++);
    return static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
  };
  auto matrix = [&](int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
    for (float& x : v) x = uniform() * scale;
    return v;
  };
  auto norm = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = 1.0f + 0.1f * uniform();
    return v;
  };
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim();
  ModelWeights& w = out.weights;
  w.token_embedding = matrix(c.vocab_size, dim);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (auto& l : w.layers) {
    l.rms_att = norm(dim);
    l.wq = matrix(dim, dim);
    l.wk = matrix(kv, dim);
    l.wv = matrix(kv, dim);
    l.wo = matrix(dim, dim);
    l.rms_ffn = norm(dim);
    l.w1 = matrix(hidden, dim);
    l.w2 = matrix(dim, hidden);
    l.w3 = matrix(hidden, dim);
  }
  w.rms_final = norm(dim);
  if (!o.shared_classifier) w.wcls = matrix(c.vocab_size, dim);
  return out;
}

}  // namespace tandem::model
