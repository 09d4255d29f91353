// A Llama-family model: its configuration and its fp32 weights in memory.
//
//   TANDEM_ASSIGN_OR_RETURN(auto model, Model::Load("../shared/models/stories260K.bin"));
//
// Load() reads a llama2.c .bin checkpoint (format in shared/models/README.md)
// or a Hugging Face directory (config.json + model.safetensors or
// model.safetensors.index.json with shards; F32, F16 and BF16 tensors are
// converted to fp32). Any problem - a missing or truncated file, a bad
// header, a tensor of the wrong shape or dtype, a config that disagrees with
// the tensors - is a Status naming the file and the problem; nothing is
// half-loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::model {

enum class RopeStyle {
  // llama2.c: rotate adjacent pairs (2p, 2p + 1) of each head.
  kAdjacentPairs,
  // Hugging Face: rotate (p, p + head_size / 2); wq/wk rows are permuted to match.
  kRotateHalf,
};

struct ModelConfig {
  int32_t dim = 0;         // model (residual) width
  int32_t hidden_dim = 0;  // FFN width
  int32_t num_layers = 0;
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // KV heads; num_heads % num_kv_heads == 0
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;  // longest context the model supports
  int32_t head_size = 0;    // dim / num_heads; even
  RopeStyle rope_style = RopeStyle::kAdjacentPairs;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;  // RMSNorm epsilon
  int32_t bos_token_id = 1;
  int32_t eos_token_id = 1;

  int32_t kv_dim() const { return num_kv_heads * head_size; }
  // Checks positivity and the divisibility rules above.
  [[nodiscard]] absl::Status Validate() const;
};

// Weights in llama2.c's layout: every matrix W[out][in] row-major, y = W x.
struct LayerWeights {
  std::vector<float> rms_att;  // [dim]
  std::vector<float> wq;       // [dim][dim]
  std::vector<float> wk;       // [kv_dim][dim]
  std::vector<float> wv;       // [kv_dim][dim]
  std::vector<float> wo;       // [dim][dim]
  std::vector<float> rms_ffn;  // [dim]
  std::vector<float> w1;       // [hidden][dim] (gate)
  std::vector<float> w2;       // [dim][hidden] (down)
  std::vector<float> w3;       // [hidden][dim] (up)
};

struct ModelWeights {
  std::vector<float> token_embedding;  // [vocab][dim]
  std::vector<LayerWeights> layers;
  std::vector<float> rms_final;  // [dim]
  std::vector<float> wcls;       // [vocab][dim]; empty = shares token_embedding

  const std::vector<float>& classifier() const { return wcls.empty() ? token_embedding : wcls; }
};

class Model {
 public:
  // `path`: a llama2.c .bin file or a Hugging Face directory.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path);
  // Builds a model from weights in memory (checks every shape against config).
  static absl::StatusOr<std::unique_ptr<Model>> FromWeights(ModelConfig config,
                                                            ModelWeights weights, std::string name);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // File or directory base name.
  const std::string& name() const { return name_; }
  // SHA-256 hex over the config and the fp32 weights (for block hashing).
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  Model() = default;
  ModelConfig config_;
  ModelWeights weights_;
  std::string name_;
  std::string fingerprint_;
};

// Checks that every weight has the size `config` implies; the message names
// the first tensor that does not.
[[nodiscard]] absl::Status CheckWeightShapes(const ModelConfig& config,
                                             const ModelWeights& weights);

}  // namespace tandem::model
