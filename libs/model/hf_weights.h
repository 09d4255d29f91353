// Private: the tensors of a Hugging Face directory, mapped (never read
// whole), indexed, and resolved to the model's weights once at open: every
// weight the config needs is found with its shape checked, and every tensor
// the checkpoint holds is used by one (or the open fails naming it). Values
// are converted per tensor on request, so a caller holds at most one
// tensor's conversion at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "file_util.h"
#include "hf_config.h"
#include "tandem/model/model.h"

namespace tandem::model::internal {

struct TensorInfo {
  std::string file;  // path of the safetensors file
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // absolute byte offsets in the file
  int64_t end = 0;
};

class HfWeights {
 public:
  static absl::StatusOr<std::shared_ptr<HfWeights>> Open(const std::string& dir,
                                                         const HfConfig& config);

  // Empty for an optional weight the config does not have.
  absl::StatusOr<std::vector<float>> Fp32(WeightId id) const;
  absl::StatusOr<WeightView<uint16_t>> Bf16(WeightId id) const;
  // SHA-256 hex over the config and every stored tensor (name, dtype, shape,
  // bytes), in name order.
  std::string Fingerprint(const ModelConfig& config) const;
  int64_t total_bytes() const { return total_bytes_; }
  // The classifier is the embedding table.
  bool tied() const { return classifier_.tensor == embedding_.tensor; }
  size_t num_tensors() const { return tensors_.size(); }

 private:
  // Rows [row_begin, row_begin + rows) of a [*][cols] tensor (Phi-3's fused
  // projections are split this way); one_plus: Gemma's (1 + w) norms;
  // scale: query_pre_attn_scalar folded into Gemma 3's q norm or Gemma 2's q_proj.
  struct Ref {
    const TensorInfo* tensor = nullptr;  // nullptr: absent optional weight
    int64_t row_begin = 0, rows = 0, cols = 0;
    bool one_plus = false;
    float scale = 1.0f;  // times this after one_plus
  };
  HfWeights() = default;
  absl::Status Resolve(const HfConfig& hf);
  const Ref& Find(WeightId id) const;

  std::string dir_;
  std::string prefix_;  // the language model's tensors' ("model.")
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::unique_ptr<MappedFile>> files_;  // by path
  int64_t total_bytes_ = 0;
  Ref embedding_, rms_final_, classifier_;
  std::vector<std::map<WeightKind, Ref>> layers_;
};

// The field of `l` that a per-layer kind (kRmsAtt .. kPostFfnNorm) names; nullptr
// for the model-wide kinds.
std::vector<float>* LayerWeight(LayerWeights& l, WeightKind kind);

// Every weight of `source` in fp32 (Model::Load with host weights), with
// per-layer progress in the log.
absl::StatusOr<ModelWeights> MaterializeWeights(const HfWeights& source, const ModelConfig& c,
                                                const std::string& dir);

}  // namespace tandem::model::internal
