// Checkpoint readers and writers behind Model::Load, and the offline tools'
// writers (tandem-make-random-model, tandem-convert-hf).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/model/model.h"

namespace tandem::model {

struct LoadedCheckpoint {
  ModelConfig config;
  ModelWeights weights;
};

// llama2.c .bin (see shared/models/README.md).
absl::StatusOr<LoadedCheckpoint> ReadLlama2cCheckpoint(const std::string& path);
// Hugging Face Llama directory.
absl::StatusOr<LoadedCheckpoint> ReadHfCheckpoint(const std::string& dir);

// Writes a llama2.c .bin. Needs kAdjacentPairs RoPE; the classifier is
// written separately (negative vocab in the header) when weights.wcls is set.
absl::Status WriteLlama2cCheckpoint(const ModelConfig& config, const ModelWeights& weights,
                                    const std::string& path);

enum class TensorDtype { kF32, kF16, kBF16 };

struct HfWriteOptions {
  // Element type of the written tensors (rounded to nearest even).
  TensorDtype dtype = TensorDtype::kF32;
  // 1 = model.safetensors; more = model-0000i-of-0000n.safetensors + index.
  int32_t num_shards = 1;
  absl::Status Validate() const;
};

// Writes config.json + safetensors for a kAdjacentPairs model, permuting the
// rows of wq and wk so that Hugging Face's rotate-half RoPE computes the same
// attention. `dir` is created if missing.
absl::Status WriteHfCheckpoint(const ModelConfig& config, const ModelWeights& weights,
                               const std::string& dir, const HfWriteOptions& options = {});

struct RandomModelOptions {
  int32_t dim = 64;
  int32_t hidden_dim = 172;
  int32_t num_layers = 2;
  int32_t num_heads = 8;
  int32_t num_kv_heads = 4;
  int32_t vocab_size = 512;
  int32_t max_seq_len = 512;
  // Shares the classifier with the embedding table (positive vocab in the header).
  bool shared_classifier = true;
  // Weights are a pure function of the seed and the sizes.
  uint64_t seed = 1;
  absl::Status Validate() const;
};

// Deterministic random weights (uniform, scaled by 1/sqrt(fan-in); RMSNorm
// weights near 1).
absl::StatusOr<LoadedCheckpoint> MakeRandomCheckpoint(const RandomModelOptions& options);

// fp16 / bf16 <-> fp32 conversions used by the safetensors reader and writer.
float HalfToFloat(uint16_t h);
float BFloat16ToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
uint16_t FloatToBFloat16(float f);

}  // namespace tandem::model
