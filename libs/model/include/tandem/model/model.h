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
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/common/sampling_params.h"

namespace tandem::model {

enum class RopeStyle {
  // llama2.c: rotate adjacent pairs (2p, 2p + 1) of each head.
  kAdjacentPairs,
  // Hugging Face: rotate (p, p + head_size / 2); wq/wk rows are permuted to match.
  kRotateHalf,
};

// The model families the loader knows (hf.cc dispatches on config.json's
// "architectures" / "model_type" and refuses any other by name). They differ
// only in the ModelConfig switches below and in tensor names.
enum class ModelFamily {
  kLlama2c,  // llama2.c .bin
  kLlama,    // LlamaForCausalLM
  kMistral,  // MistralForCausalLM
  kQwen2,    // Qwen2ForCausalLM: q/k/v biases
  kQwen3,    // Qwen3ForCausalLM: per-head RMSNorm of q and k
  kPhi3,     // Phi3ForCausalLM: fused qkv_proj and gate_up_proj, split at load
  kGemma,    // GemmaForCausalLM: (1 + w) norms folded at load, scaled embeddings, GeLU
  // Gemma2ForCausalLM: Gemma's, plus the sandwich norms, every other layer
  // sliding, and tanh softcapping of attention scores and final logits.
  kGemma2,
  // Gemma3ForCausalLM: Gemma's, plus q/k norms, norms around the attention
  // and MLP outputs (sandwich_norms), local layers with their own window and
  // RoPE base, query_pre_attn_scalar folded into the q norm at load.
  kGemma3,
};
const char* ModelFamilyName(ModelFamily family);

// The MLP's activation: act(gate) * up.
enum class Activation {
  kSilu,      // x * sigmoid(x)
  kGeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ("gelu_pytorch_tanh")
};

// RoPE frequency scaling, as transformers 5's rope_init_functions compute it.
// "dynamic" (frequencies that depend on the sequence length) is refused by
// the loader. "longrope" switches from its short to its long factors once a
// sequence passes original_max_position_embeddings; the loader serves the
// short factors and caps the context there, where that switch never happens,
// unless LoadOptions::max_model_len asks for more: then the long factors
// serve every position (vLLM's choice).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kYarn, kLongRope };
  Type type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;                  // llama3
  float high_freq_factor = 4.0f;                 // llama3
  int32_t original_max_position_embeddings = 0;  // llama3, yarn, longrope
  double beta_fast = 32.0;                       // yarn
  double beta_slow = 1.0;                        // yarn
  bool truncate = true;                          // yarn: whole dimensions for the ramp's ends
  std::vector<float> ext_factors;                // longrope: [rotary_dim / 2], short or long
  // yarn and longrope: cos and sin are multiplied by this (transformers'
  // attention_scaling), so every attention logit by its square. 1 otherwise.
  float attention_factor = 1.0f;
  // yarn and longrope: the types with an attention factor.
  bool ScalesAttention() const { return type == Type::kYarn || type == Type::kLongRope; }
};

// Sampling defaults from generation_config.json (see tandem/common); a
// request's own value wins.
using GenerationDefaults = ::tandem::GenerationDefaults;

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama2c;
  int32_t dim = 0;         // model (residual) width
  int32_t hidden_dim = 0;  // FFN width
  int32_t num_layers = 0;
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // KV heads; num_heads % num_kv_heads == 0
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;  // longest context the model supports
  // The checkpoint's dtype as config.json names it (torch_dtype, or dtype):
  // "bfloat16", "float16", "float32"; "float32" for llama2.c files; empty
  // when config.json says none.
  std::string torch_dtype;
  // Per head; even. dim / num_heads for llama2.c; Hugging Face's head_dim may
  // differ (Qwen3, Gemma): q is num_heads * head_size wide (q_dim()).
  int32_t head_size = 0;
  RopeStyle rope_style = RopeStyle::kAdjacentPairs;
  // RoPE rotates each q and k head's first rotary_dim elements and passes the
  // rest through (Phi-3's partial_rotary_factor); 0: the whole head.
  int32_t rotary_dim = 0;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  float norm_eps = 1e-5f;  // RMSNorm epsilon
  Activation activation = Activation::kSilu;
  // The embedding rows are multiplied by this before the first layer (Gemma:
  // sqrt(dim) rounded to fp32); 1 = no multiply.
  float embedding_scale = 1.0f;
  // The factor a run in bfloat16 (bf16) or float32 multiplies by: in
  // bfloat16 the scale rounded to bfloat16 first, as transformers
  // (embed_scale.to(the weights' dtype)) and vLLM (its normalizer, cast with
  // the model) multiply; gemma-3-1b's sqrt(1152) = 33.94 becomes 34.
  [[nodiscard]] float EmbeddingScale(bool bf16) const;
  // Biases on the q/k/v projections (Qwen2; Llama's attention_bias) and on
  // o_proj (Llama's attention_bias).
  bool qkv_bias = false;
  bool o_bias = false;
  // Qwen3: RMSNorm over each head of q and k (weights [head_size]) before RoPE.
  bool qk_norm = false;
  // Gemma 3: the attention's and the MLP's outputs pass an RMSNorm
  // (post_att_norm, post_ffn_norm) before their residual adds.
  bool sandwich_norms = false;
  // Gemma 3's and 2's query_pre_attn_scalar: attention logits are scaled by
  // its inverse square root instead of head_size's. Folded at load into
  // q_norm (Gemma 3) or wq (Gemma 2), times sqrt(head_size / it), so no
  // kernel reads it: a model's weights carry it; 0 = head_size.
  float query_pre_attn_scalar = 0.0f;
  // Gemma 3: the layers of layer_types' "sliding_attention" (whether or not
  // their window is served, see --disable-sliding-window) rotate by the
  // default frequencies of local_rope_theta, without rope_scaling or its
  // attention factor; empty: every layer by rope_theta and rope_scaling.
  std::vector<bool> local_rope_layers;
  float local_rope_theta = 0.0f;
  // Gemma 2's tanh softcapping: attention scores (after the 1/sqrt(head)
  // scale) and the final logits become cap * tanh(x / cap); 0 = none.
  float attn_logit_softcap = 0.0f;
  float final_logit_softcap = 0.0f;
  // Sliding-window attention (Mistral, Phi-3, Qwen's layers past
  // max_window_layers, layer_types): empty when no layer slides, else one
  // window per layer, 0 for a layer that attends to every earlier position.
  // A query at p sees positions kernels::WindowStart(p, window) .. p.
  std::vector<int32_t> layer_window;
  int32_t bos_token_id = 1;
  // The end-of-sequence id, and any others: config.json's "eos_token_id" may
  // be a list (the first is eos_token_id), and generation_config.json's adds
  // to it. Any of EosTokenIds() ends a request.
  int32_t eos_token_id = 1;
  std::vector<int32_t> extra_eos_token_ids;
  GenerationDefaults generation;

  int32_t kv_dim() const { return num_kv_heads * head_size; }
  int32_t RotaryDim() const { return rotary_dim > 0 ? rotary_dim : head_size; }
  int32_t q_dim() const { return num_heads * head_size; }
  int32_t AttentionWindow(int32_t layer) const {
    return layer_window.empty() ? 0 : layer_window[static_cast<size_t>(layer)];
  }
  bool LocalRope(int32_t layer) const {
    return !local_rope_layers.empty() && local_rope_layers[static_cast<size_t>(layer)];
  }
  // The RoPE base and amplitude (rope_scaling.attention_factor) of a layer.
  float RopeTheta(int32_t layer) const { return LocalRope(layer) ? local_rope_theta : rope_theta; }
  float RopeAmplitude(int32_t layer) const {
    return LocalRope(layer) ? 1.0f : rope_scaling.attention_factor;
  }
  // eos_token_id, then extra_eos_token_ids (no duplicates).
  std::vector<int32_t> EosTokenIds() const;
  // RoPE's inverse frequency of each pair p < RotaryDim() / 2:
  // 1 / theta^(2p / RotaryDim()), then rope_scaling. Computed on the host, so
  // every backend rotates by the same angles. `local`: the local layers'
  // (local_rope_theta, unscaled).
  std::vector<float> RopeInverseFrequencies(bool local = false) const;
  // Checks positivity and the divisibility rules above.
  [[nodiscard]] absl::Status Validate() const;
};

// Weights in llama2.c's layout: every matrix W[out][in] row-major, y = W x.
// Optional tensors are empty when the config's switch is off.
struct LayerWeights {
  std::vector<float> rms_att;  // [dim]
  std::vector<float> wq;       // [q_dim][dim]
  std::vector<float> wk;       // [kv_dim][dim]
  std::vector<float> wv;       // [kv_dim][dim]
  std::vector<float> wo;       // [dim][q_dim]
  std::vector<float> bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim] when qkv_bias
  std::vector<float> bo;          // [dim] when o_bias
  std::vector<float> q_norm, k_norm;  // [head_size] when qk_norm
  std::vector<float> rms_ffn;  // [dim]
  std::vector<float> w1;       // [hidden][dim] (gate)
  std::vector<float> w2;       // [dim][hidden] (down)
  std::vector<float> w3;       // [hidden][dim] (up)
  std::vector<float> post_att_norm, post_ffn_norm;  // [dim] when sandwich_norms
};

struct ModelWeights {
  std::vector<float> token_embedding;  // [vocab][dim]
  std::vector<LayerWeights> layers;
  std::vector<float> rms_final;  // [dim]
  std::vector<float> wcls;       // [vocab][dim]; empty = shares token_embedding

  const std::vector<float>& classifier() const { return wcls.empty() ? token_embedding : wcls; }
};

// Names one weight of the model (ModelWeights' fields; layer for per-layer ones).
enum class WeightKind : int32_t {
  kEmbedding,
  kRmsFinal,
  kClassifier,  // model-wide (kClassifier: the embedding when tied)
  // Per layer, contiguous from kRmsAtt to kPostFfnNorm (loops walk them in order).
  kRmsAtt,
  kWq,
  kWk,
  kWv,
  kWo,
  kBq,
  kBk,
  kBv,
  kBo,
  kQNorm,
  kKNorm,
  kRmsFfn,
  kW1,
  kW2,
  kW3,
  kPostAttNorm,
  kPostFfnNorm,
};
struct WeightId {
  WeightKind kind;
  int32_t layer = 0;
};

// A weight's values, borrowed (from the Model's host weights or its mapped
// checkpoint, valid while the Model holds them) or owned.
template <typename T>
class WeightView {
 public:
  WeightView() = default;
  static WeightView Borrow(std::span<const T> s) {
    WeightView v;
    v.borrowed_ = s;
    return v;
  }
  static WeightView Own(std::vector<T> values) {
    WeightView v;
    v.owned_ = std::move(values);
    v.is_owned_ = true;
    return v;
  }
  std::span<const T> span() const { return is_owned_ ? std::span<const T>(owned_) : borrowed_; }
  const T* data() const { return span().data(); }
  size_t size() const { return span().size(); }
  bool empty() const { return span().empty(); }

 private:
  std::span<const T> borrowed_;
  std::vector<T> owned_;
  bool is_owned_ = false;
};

struct LoadOptions {
  // true: weights() holds every tensor in fp32 (what the tools and tests
  // read). false, for a Hugging Face directory: weights() stays empty and a
  // runner reads each tensor from the mapped checkpoint, in its own dtype,
  // through Fp32() / Bf16(); ReleaseCheckpoint() unmaps it once the runner
  // holds its copy. This is how the worker loads: no fp32 copy of a bf16
  // checkpoint on the host, nothing kept after a GPU upload.
  bool host_weights = true;
  // vLLM's --disable-sliding-window: a model whose layers slide is served
  // without the window and with its context capped at the smallest window,
  // where sliding changes nothing (ModelConfig::layer_window empty).
  bool disable_sliding_window = false;
  // vLLM's --max-model-len on the worker: the longest context it serves
  // (0: the model's; more than the model's is refused at load). A longrope
  // model takes its long factors for every position when this passes
  // original_max_position_embeddings, as vLLM does, and is otherwise capped
  // there with its short factors (RopeScaling).
  int32_t max_model_len = 0;
};

namespace internal {
class HfWeights;
}

class Model {
 public:
  // `path`: a llama2.c .bin file or a Hugging Face directory.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                                     const LoadOptions& options = {});
  // Builds a model from weights in memory (checks every shape against config).
  static absl::StatusOr<std::unique_ptr<Model>> FromWeights(ModelConfig config,
                                                            ModelWeights weights, std::string name);
  ~Model();

  const ModelConfig& config() const { return config_; }
  // Empty (no layers) unless has_host_weights(); runners read Fp32()/Bf16().
  const ModelWeights& weights() const { return weights_; }
  bool has_host_weights() const { return checkpoint_ == nullptr && !released_; }
  // One weight in fp32: borrowed from weights() when the model holds them,
  // else converted from the checkpoint. Empty for an optional weight the
  // config does not have (biases, q/k norms). FAILED_PRECONDITION after
  // ReleaseCheckpoint().
  absl::StatusOr<WeightView<float>> Fp32(WeightId id) const;
  // One weight as bf16 bits (round to nearest even): borrowed from the mapped
  // checkpoint when it stores the tensor as BF16, else converted.
  absl::StatusOr<WeightView<uint16_t>> Bf16(WeightId id) const;
  // Unmaps the checkpoint of a model loaded without host weights (a no-op
  // otherwise); Fp32()/Bf16() fail afterwards.
  void ReleaseCheckpoint();
  // File or directory base name.
  const std::string& name() const { return name_; }
  // SHA-256 hex over the config and the weights (for block hashing): the
  // fp32 values for llama2.c and in-memory models, the stored tensors
  // (name, dtype, shape, bytes) for a Hugging Face directory, so both load
  // modes agree.
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  Model() = default;
  ModelConfig config_;
  ModelWeights weights_;
  std::string name_;
  std::string fingerprint_;
  std::shared_ptr<const internal::HfWeights> checkpoint_;  // lazy Hugging Face models
  bool released_ = false;
};

// Checks that every weight has the size `config` implies; the message names
// the first tensor that does not.
[[nodiscard]] absl::Status CheckWeightShapes(const ModelConfig& config,
                                             const ModelWeights& weights);

}  // namespace tandem::model
