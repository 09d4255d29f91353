// Hugging Face directories: config.json (hf_config.h) + safetensors (single
// file or sharded with model.safetensors.index.json; hf_weights.h), and the
// writer of the offline tools.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "file_util.h"
#include "hf_config.h"
#include "hf_weights.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/model/checkpoint.h"
#include "tandem/model/json.h"

namespace tandem::model {
namespace {

using internal::JoinPath;

// Row permutation between llama2.c's adjacent pairs and HF's halves, per head:
// hf_row(h, half * hs/2 + p) = llama_row(h, 2p + half).
std::vector<float> PermuteForRotateHalf(const std::vector<float>& w, int32_t heads,
                                        int32_t head_size, int32_t cols, bool to_hf) {
  std::vector<float> out(w.size());
  const int32_t half = head_size / 2;
  for (int32_t h = 0; h < heads; ++h) {
    for (int32_t p = 0; p < half; ++p) {
      for (int32_t s = 0; s < 2; ++s) {
        const int64_t hf_row = int64_t{h} * head_size + s * half + p;
        const int64_t ll_row = int64_t{h} * head_size + 2 * p + s;
        const int64_t src = to_hf ? ll_row : hf_row;
        const int64_t dst = to_hf ? hf_row : ll_row;
        std::memcpy(&out[static_cast<size_t>(dst * cols)], &w[static_cast<size_t>(src * cols)],
                    static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
  return out;
}

}  // namespace

namespace internal {

absl::StatusOr<ModelWeights> MaterializeWeights(const HfWeights& source, const ModelConfig& c,
                                                const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  auto last_log = start;
  ModelWeights w;
  auto get = [&](std::vector<float>* dst, WeightKind kind, int32_t layer) -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(*dst, source.Fp32(WeightId{kind, layer}));
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(get(&w.token_embedding, WeightKind::kEmbedding, 0));
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    for (int32_t k = static_cast<int32_t>(WeightKind::kRmsAtt);
         k <= static_cast<int32_t>(WeightKind::kPostFfnNorm); ++k) {
      const auto kind = static_cast<WeightKind>(k);
      TANDEM_RETURN_IF_ERROR(get(LayerWeight(l, kind), kind, i));
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log > std::chrono::seconds(5) || i + 1 == c.num_layers) {
      last_log = now;
      TANDEM_LOG(INFO) << "loading " << dir << ": layer " << i + 1 << "/" << c.num_layers
                       << " in fp32, " << std::chrono::duration<double>(now - start).count()
                       << " s";
    }
  }
  TANDEM_RETURN_IF_ERROR(get(&w.rms_final, WeightKind::kRmsFinal, 0));
  if (!source.tied()) {
    TANDEM_RETURN_IF_ERROR(get(&w.wcls, WeightKind::kClassifier, 0));
  }
  return w;
}

}  // namespace internal

absl::StatusOr<LoadedCheckpoint> ReadHfCheckpoint(const std::string& dir) {
  TANDEM_ASSIGN_OR_RETURN(internal::HfConfig hf, internal::ReadHfConfig(dir));
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<internal::HfWeights> source,
                          internal::HfWeights::Open(dir, hf));
  LoadedCheckpoint out;
  out.config = hf.config;
  TANDEM_ASSIGN_OR_RETURN(out.weights, internal::MaterializeWeights(*source, hf.config, dir));
  return out;
}

absl::Status HfWriteOptions::Validate() const {
  if (num_shards < 1 || num_shards > 99) {
    return absl::InvalidArgumentError(
        absl::StrCat("HfWriteOptions.num_shards = ", num_shards, " must be in [1, 99]"));
  }
  return absl::OkStatus();
}

absl::Status WriteHfCheckpoint(const ModelConfig& c, const ModelWeights& w, const std::string& dir,
                               const HfWriteOptions& options) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  TANDEM_RETURN_IF_ERROR(c.Validate());
  TANDEM_RETURN_IF_ERROR(CheckWeightShapes(c, w));
  if (c.rope_style != RopeStyle::kAdjacentPairs) {
    return absl::InvalidArgumentError("WriteHfCheckpoint converts adjacent-pairs models only");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(dir + ": cannot create: " + ec.message());

  // A tensor to write: the weight itself, or (permuted q/k) a copy. Borrowed,
  // so writing a large model does not double it in memory.
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    std::span<const float> data;
  };
  std::vector<std::vector<float>> permuted;
  permuted.reserve(static_cast<size_t>(2 * c.num_layers));
  auto keep = [&](std::vector<float> v) -> std::span<const float> {
    permuted.push_back(std::move(v));
    return permuted.back();
  };
  std::vector<Entry> entries;
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim(), vocab = c.vocab_size;
  entries.push_back({"model.embed_tokens.weight", {vocab, dim}, w.token_embedding});
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    entries.push_back({p + "input_layernorm.weight", {dim}, l.rms_att});
    entries.push_back({p + "self_attn.q_proj.weight",
                       {dim, dim},
                       keep(PermuteForRotateHalf(l.wq, c.num_heads, c.head_size, c.dim, true))});
    entries.push_back({p + "self_attn.k_proj.weight",
                       {kv, dim},
                       keep(PermuteForRotateHalf(l.wk, c.num_kv_heads, c.head_size, c.dim, true))});
    entries.push_back({p + "self_attn.v_proj.weight", {kv, dim}, l.wv});
    entries.push_back({p + "self_attn.o_proj.weight", {dim, dim}, l.wo});
    entries.push_back({p + "post_attention_layernorm.weight", {dim}, l.rms_ffn});
    entries.push_back({p + "mlp.gate_proj.weight", {hidden, dim}, l.w1});
    entries.push_back({p + "mlp.down_proj.weight", {dim, hidden}, l.w2});
    entries.push_back({p + "mlp.up_proj.weight", {hidden, dim}, l.w3});
  }
  entries.push_back({"model.norm.weight", {dim}, w.rms_final});
  const bool tied = w.wcls.empty();
  if (!tied) entries.push_back({"lm_head.weight", {vocab, dim}, w.wcls});

  const char* dtype_name = options.dtype == TensorDtype::kF32   ? "F32"
                           : options.dtype == TensorDtype::kF16 ? "F16"
                                                                : "BF16";
  const int64_t esize = options.dtype == TensorDtype::kF32 ? 4 : 2;
  const int32_t shards = options.num_shards;
  std::vector<std::string> shard_names;
  for (int32_t s = 0; s < shards; ++s) {
    shard_names.push_back(shards == 1
                              ? "model.safetensors"
                              : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards));
  }
  std::string weight_map;
  for (int32_t s = 0; s < shards; ++s) {
    std::string header = "{";
    std::string data;
    for (size_t e = static_cast<size_t>(s); e < entries.size(); e += shards) {
      const Entry& t = entries[e];
      const int64_t begin = static_cast<int64_t>(data.size());
      for (float f : t.data) {
        if (options.dtype == TensorDtype::kF32) {
          data.append(reinterpret_cast<const char*>(&f), 4);
        } else {
          const uint16_t h =
              options.dtype == TensorDtype::kF16 ? FloatToHalf(f) : FloatToBFloat16(f);
          data.append(reinterpret_cast<const char*>(&h), 2);
        }
      }
      if (header.size() > 1) header += ",";
      header += absl::StrCat(nlohmann::json(t.name).dump(), ":{\"dtype\":\"", dtype_name,
                             "\",\"shape\":[", absl::StrJoin(t.shape, ","), "],\"data_offsets\":[",
                             begin, ",", begin + static_cast<int64_t>(t.data.size()) * esize, "]}");
      if (!weight_map.empty()) weight_map += ",";
      weight_map +=
          absl::StrCat(nlohmann::json(t.name).dump(), ":", nlohmann::json(shard_names[s]).dump());
    }
    header += "}";
    while (header.size() % 8 != 0) header += " ";
    std::string bytes;
    const uint64_t n = header.size();
    bytes.append(reinterpret_cast<const char*>(&n), 8);
    bytes += header;
    bytes += data;
    TANDEM_RETURN_IF_ERROR(internal::WriteFile(JoinPath(dir, shard_names[s]), bytes));
  }
  if (shards > 1) {
    TANDEM_RETURN_IF_ERROR(
        internal::WriteFile(JoinPath(dir, "model.safetensors.index.json"),
                            absl::StrCat("{\"metadata\":{},\"weight_map\":{", weight_map, "}}\n")));
  }
  const std::string config = absl::StrFormat(
      "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
      "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
      "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"vocab_size\": %d,\n"
      "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.9g,\n"
      "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"tie_word_embeddings\": %s,\n"
      "  \"hidden_act\": \"silu\",\n  \"torch_dtype\": \"%s\"\n}\n",
      c.dim, c.hidden_dim, c.num_layers, c.num_heads, c.num_kv_heads, c.vocab_size, c.max_seq_len,
      c.norm_eps, c.rope_theta, c.bos_token_id, c.eos_token_id, tied ? "true" : "false",
      options.dtype == TensorDtype::kF32   ? "float32"
      : options.dtype == TensorDtype::kF16 ? "float16"
                                           : "bfloat16");
  return internal::WriteFile(JoinPath(dir, "config.json"), config);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
    return sign ? -f : f;
  }
  uint32_t bits;
  if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  std::memcpy(&f, &bits, 4);
  return f;
}

float BFloat16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // overflow (rounds to inf)
  if (abs < 0x38800000u) {                        // subnormal or zero in half
    const float a = std::fabs(f);
    const float scaled = a * 16777216.0f;  // 2^24: units of the half LSB
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t rounding = 0xFFFu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((abs - 0x38000000u + rounding) >> 13);
}

}  // namespace tandem::model
