#include "hf_weights.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/model/checkpoint.h"
#include "tandem/model/json.h"

namespace tandem::model::internal {
namespace {

int64_t DtypeSize(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Parses one safetensors header and adds its tensors to `tensors`.
absl::Status IndexSafetensors(const std::string& path, std::string_view bytes,
                              std::map<std::string, TensorInfo>* tensors) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: ", bytes.size(), " bytes, no safetensors header"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds the file (", bytes.size(),
                                                   " bytes): truncated or not safetensors"));
  }
  absl::StatusOr<nlohmann::json> header = ParseJson(bytes.substr(8, header_len));
  if (!header.ok()) return Annotate(header.status(), absl::StrCat(path, ": header"));
  if (!header->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_len = static_cast<int64_t>(bytes.size()) - data_start;
  for (const auto& [name, v] : header->items()) {
    if (name == "__metadata__") continue;
    const nlohmann::json* dtype = JsonMember(v, "dtype");
    const nlohmann::json* shape = JsonMember(v, "shape");
    const nlohmann::json* offsets = JsonMember(v, "data_offsets");
    if (dtype == nullptr || !dtype->is_string() || shape == nullptr || !shape->is_array() ||
        offsets == nullptr || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number() || !(*offsets)[1].is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    TensorInfo t;
    t.file = path;
    t.dtype = dtype->get<std::string>();
    int64_t numel = 1;
    for (const nlohmann::json& d : *shape) {
      // Bounded so that numel * element size cannot overflow (2^40 elements
      // is far past any tensor this loader reads into memory).
      constexpr double kMaxElements = 1099511627776.0;  // 2^40
      const double n = d.is_number() ? d.get<double>() : -1;
      if (n < 0 || n != std::floor(n) || n * static_cast<double>(numel) > kMaxElements) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", name, "' bad shape (negative, fractional, or over 2^40 elements)"));
      }
      t.shape.push_back(static_cast<int64_t>(n));
      numel *= t.shape.back();
    }
    const double b = (*offsets)[0].get<double>(), e = (*offsets)[1].get<double>();
    if (!(b >= 0 && e >= b && e <= static_cast<double>(data_len))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tensor '%s' data_offsets [%.0f, %.0f] outside the %d data bytes (truncated?)", path,
          name, b, e, data_len));
    }
    t.begin = data_start + static_cast<int64_t>(b);
    t.end = data_start + static_cast<int64_t>(e);
    const int64_t esize = DtypeSize(t.dtype);
    if (esize != 0 && t.end - t.begin != numel * esize) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' holds ", t.end - t.begin, " bytes, its shape ",
                       ShapeString(t.shape), " and dtype ", t.dtype, " need ", numel * esize));
    }
    if (tensors->count(name) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' also appears in ", tensors->at(name).file));
    }
    (*tensors)[name] = std::move(t);
  }
  return absl::OkStatus();
}
// With a sharded index, every tensor must sit in the shard its weight_map
// entry names, and every entry must name a tensor that exists.
absl::Status CheckIndexMatchesShards(const std::string& dir, const std::string& index_path,
                                     const std::map<std::string, TensorInfo>& tensors) {
  std::error_code ec;
  if (!std::filesystem::exists(index_path, ec)) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(std::string text, internal::ReadFile(index_path));
  absl::StatusOr<nlohmann::json> index = ParseJson(text);
  if (!index.ok()) return Annotate(index.status(), index_path);
  for (const auto& [name, file] : JsonMember(*index, "weight_map")->items()) {
    auto it = tensors.find(name);
    const std::string want = JoinPath(dir, file.get<std::string>());
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map names tensor '",
                                                     name, "' in ", want, ", which lacks it"));
    }
    if (it->second.file != want) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map puts '", name,
                                                     "' in ", want, " but it is in ",
                                                     it->second.file));
    }
  }
  return absl::OkStatus();
}

// The first of `options` (prefixes of `name`, or whole names with name "")
// whose tensor the checkpoint holds; the first of all when none is, so that
// errors name it.
const std::string& FirstPresent(const std::vector<std::string>& options, const std::string& name,
                                const std::map<std::string, TensorInfo>& tensors) {
  for (const std::string& o : options) {
    if (tensors.count(o + name) != 0) return o;
  }
  return options.front();
}

// A checkpoint holding more layers than config.json declares disagrees with
// it: loading the first num_hidden_layers would silently run another model.
absl::Status CheckNoLayersBeyondConfig(const std::string& dir, const ModelConfig& c,
                                       const std::string& text_prefix,
                                       const std::map<std::string, TensorInfo>& tensors) {
  const std::string prefix = text_prefix + "layers.";
  for (const auto& [name, info] : tensors) {
    if (!absl::StartsWith(name, prefix)) continue;
    const std::string rest = name.substr(prefix.size());
    int64_t layer = 0;
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer)) continue;
    if (layer >= c.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": ", info.file, " holds tensor '", name, "' of layer ", layer,
                       " but config.json has num_hidden_layers = ", c.num_layers));
    }
  }
  return absl::OkStatus();
}
// Converts `n` stored values at p to fp32.
void ToFp32(const std::string& dtype, const char* p, int64_t n, float* out) {
  if (dtype == "F32") {
    std::memcpy(out, p, static_cast<size_t>(n) * 4);
    return;
  }
  const bool half = dtype == "F16";
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = half ? HalfToFloat(h) : BFloat16ToFloat(h);
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<HfWeights>> HfWeights::Open(const std::string& dir,
                                                           const HfConfig& hf) {
  std::shared_ptr<HfWeights> w(new HfWeights());
  w->dir_ = dir;
  const std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  std::vector<std::string> shard_paths;
  std::error_code ec;
  if (std::filesystem::exists(index_path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(index_path));
    absl::StatusOr<nlohmann::json> index = ParseJson(text);
    if (!index.ok()) return Annotate(index.status(), index_path);
    const nlohmann::json* map = JsonMember(*index, "weight_map");
    if (map == nullptr || !map->is_object()) {
      return absl::InvalidArgumentError(index_path + ": missing \"weight_map\" object");
    }
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string()) {
        return absl::InvalidArgumentError(index_path + ": weight_map['" + name +
                                          "'] is not a file name");
      }
      const std::string p = JoinPath(dir, file.get<std::string>());
      if (std::find(shard_paths.begin(), shard_paths.end(), p) == shard_paths.end()) {
        shard_paths.push_back(p);
      }
    }
  } else {
    shard_paths.push_back(JoinPath(dir, "model.safetensors"));
  }
  for (const std::string& p : shard_paths) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(p));
    TANDEM_RETURN_IF_ERROR(IndexSafetensors(p, file->view(), &w->tensors_));
    w->total_bytes_ += static_cast<int64_t>(file->size());
    w->files_[p] = std::move(file);
  }
  TANDEM_RETURN_IF_ERROR(CheckIndexMatchesShards(dir, index_path, w->tensors_));
  // The language model's layout: the first whose embedding is there (the
  // first named in errors when none is).
  w->prefix_ = FirstPresent(hf.text_prefixes, "embed_tokens.weight", w->tensors_);
  TANDEM_RETURN_IF_ERROR(CheckNoLayersBeyondConfig(dir, hf.config, w->prefix_, w->tensors_));
  const ModelConfig& c = hf.config;
  TANDEM_LOG(INFO) << "loading " << dir << ": " << hf.architecture << " ("
                   << ModelFamilyName(c.family)
                   << (hf.text_architecture.empty()
                           ? std::string()
                           : ", its " + hf.text_architecture + " under " + w->prefix_)
                   << "), " << c.num_layers << " layers, " << w->tensors_.size() << " tensors, "
                   << w->total_bytes_ / (1 << 20) << " MiB in " << shard_paths.size() << " file(s)"
                   << (hf.torch_dtype.empty() ? "" : ", " + hf.torch_dtype);
  if (absl::Status s = w->Resolve(hf); !s.ok()) {
    return Annotate(s, absl::StrCat(dir, " (", absl::StrJoin(shard_paths, ", "), ")"));
  }
  return w;
}

absl::Status HfWeights::Resolve(const HfConfig& hf) {
  const ModelConfig& c = hf.config;
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim(), q = c.q_dim(),
                hs = c.head_size, vocab = c.vocab_size;
  std::set<std::string> used;
  // The whole tensor `name`, which must have `shape`.
  auto whole = [&](const std::string& name, std::vector<int64_t> shape,
                   Ref* ref) -> absl::Status {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing tensor '", name, "'"));
    }
    const TensorInfo& t = it->second;
    if (t.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(t.file, ": tensor '", name, "' has shape ",
                                                     ShapeString(t.shape), ", config.json implies ",
                                                     ShapeString(shape)));
    }
    if (DtypeSize(t.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(t.file, ": tensor '", name,
                                                     "' has unsupported dtype ", t.dtype,
                                                     " (want F32, F16 or BF16)"));
    }
    used.insert(name);
    *ref = Ref{.tensor = &t,
               .row_begin = 0,
               .rows = shape[0],
               .cols = shape.size() > 1 ? shape[1] : 1};
    return absl::OkStatus();
  };
  const bool gemma = c.family == ModelFamily::kGemma || c.family == ModelFamily::kGemma2 ||
                     c.family == ModelFamily::kGemma3;
  auto norm_of = [&](const std::string& name, int64_t size, Ref* ref) -> absl::Status {
    TANDEM_RETURN_IF_ERROR(whole(name, {size}, ref));
    ref->one_plus = gemma;  // Gemma's RMSNorm scales by (1 + w)
    return absl::OkStatus();
  };
  auto norm = [&](const std::string& name, Ref* ref) { return norm_of(name, dim, ref); };
  const std::string embedding_name = prefix_ + "embed_tokens.weight";
  TANDEM_RETURN_IF_ERROR(whole(embedding_name, {vocab, dim}, &embedding_));
  layers_.assign(static_cast<size_t>(c.num_layers), {});
  for (int32_t i = 0; i < c.num_layers; ++i) {
    std::map<WeightKind, Ref>& l = layers_[static_cast<size_t>(i)];
    const std::string p = absl::StrCat(prefix_, "layers.", i, ".");
    TANDEM_RETURN_IF_ERROR(norm(p + "input_layernorm.weight", &l[WeightKind::kRmsAtt]));
    if (c.sandwich_norms) {
      // Gemma 3: post_attention_layernorm normalizes the attention's output;
      // pre_feedforward_layernorm is the MLP's input norm.
      TANDEM_RETURN_IF_ERROR(
          norm(p + "post_attention_layernorm.weight", &l[WeightKind::kPostAttNorm]));
      TANDEM_RETURN_IF_ERROR(norm(p + "pre_feedforward_layernorm.weight", &l[WeightKind::kRmsFfn]));
      TANDEM_RETURN_IF_ERROR(
          norm(p + "post_feedforward_layernorm.weight", &l[WeightKind::kPostFfnNorm]));
    } else {
      TANDEM_RETURN_IF_ERROR(norm(p + "post_attention_layernorm.weight", &l[WeightKind::kRmsFfn]));
    }
    if (c.family == ModelFamily::kPhi3) {
      // Fused [q; k; v] and [gate; up]: split by rows.
      Ref qkv, gate_up;
      TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.qkv_proj.weight", {q + 2 * kv, dim}, &qkv));
      l[WeightKind::kWq] = Ref{qkv.tensor, 0, q, dim};
      l[WeightKind::kWk] = Ref{qkv.tensor, q, kv, dim};
      l[WeightKind::kWv] = Ref{qkv.tensor, q + kv, kv, dim};
      TANDEM_RETURN_IF_ERROR(
          whole(p + "mlp.gate_up_proj.weight", {2 * hidden, dim}, &gate_up));
      l[WeightKind::kW1] = Ref{gate_up.tensor, 0, hidden, dim};
      l[WeightKind::kW3] = Ref{gate_up.tensor, hidden, hidden, dim};
    } else {
      TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.q_proj.weight", {q, dim}, &l[WeightKind::kWq]));
      TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.k_proj.weight", {kv, dim}, &l[WeightKind::kWk]));
      TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.v_proj.weight", {kv, dim}, &l[WeightKind::kWv]));
      TANDEM_RETURN_IF_ERROR(whole(p + "mlp.gate_proj.weight", {hidden, dim}, &l[WeightKind::kW1]));
      TANDEM_RETURN_IF_ERROR(whole(p + "mlp.up_proj.weight", {hidden, dim}, &l[WeightKind::kW3]));
    }
    TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.o_proj.weight", {dim, q}, &l[WeightKind::kWo]));
    TANDEM_RETURN_IF_ERROR(whole(p + "mlp.down_proj.weight", {dim, hidden}, &l[WeightKind::kW2]));
    if (c.qkv_bias) {
      TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.q_proj.bias", {q}, &l[WeightKind::kBq]));
      TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.k_proj.bias", {kv}, &l[WeightKind::kBk]));
      TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.v_proj.bias", {kv}, &l[WeightKind::kBv]));
    }
    if (c.o_bias) {
      TANDEM_RETURN_IF_ERROR(whole(p + "self_attn.o_proj.bias", {dim}, &l[WeightKind::kBo]));
    }
    // Logits (q . k) / sqrt(query_pre_attn_scalar) are the kernels'
    // (q' . k) / sqrt(head_size) with q' = q * sqrt(head_size / scalar), and
    // RoPE is linear: the factor rides on the q norm's weights (Gemma 3) or,
    // without one, on q_proj's (Gemma 2 27B; no q bias to scale with it).
    const float q_factor =
        c.query_pre_attn_scalar == 0
            ? 1.0f
            : static_cast<float>(std::sqrt(static_cast<double>(hs) /
                                           static_cast<double>(c.query_pre_attn_scalar)));
    if (!c.qk_norm && q_factor != 1.0f) {
      if (c.qkv_bias) return absl::InvalidArgumentError("query_pre_attn_scalar with a q bias");
      l[WeightKind::kWq].scale = q_factor;
    }
    if (c.qk_norm) {
      TANDEM_RETURN_IF_ERROR(norm_of(p + "self_attn.q_norm.weight", hs, &l[WeightKind::kQNorm]));
      TANDEM_RETURN_IF_ERROR(norm_of(p + "self_attn.k_norm.weight", hs, &l[WeightKind::kKNorm]));
      l[WeightKind::kQNorm].scale = q_factor;
    }
  }
  TANDEM_RETURN_IF_ERROR(norm(prefix_ + "norm.weight", &rms_final_));
  const std::string head_name = FirstPresent(hf.head_names, "", tensors_);
  if (!hf.tied_embeddings) {
    if (tensors_.count(head_name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "missing tensor '", head_name, "' and config.json does not set tie_word_embeddings"));
    }
    TANDEM_RETURN_IF_ERROR(whole(head_name, {vocab, dim}, &classifier_));
  } else {
    classifier_ = embedding_;
    if (tensors_.count(head_name) != 0) {
      // Tied, yet stored: transformers would use the embedding; a different
      // table means the config and the weights disagree.
      Ref head;
      TANDEM_RETURN_IF_ERROR(whole(head_name, {vocab, dim}, &head));
      std::vector<float> a(static_cast<size_t>(vocab * dim)), b(a.size());
      ToFp32(head.tensor->dtype, files_.at(head.tensor->file)->data() + head.tensor->begin,
             vocab * dim, a.data());
      ToFp32(embedding_.tensor->dtype,
             files_.at(embedding_.tensor->file)->data() + embedding_.tensor->begin, vocab * dim,
             b.data());
      if (a != b) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.json ties the embeddings (tie_word_embeddings) but ", head_name,
                         " differs from ", embedding_name));
      }
    }
  }
  std::vector<std::string> unused;
  int64_t unserved = 0;
  for (const auto& tensor : tensors_) {
    const std::string& name = tensor.first;
    if (used.count(name) != 0) continue;
    // Old checkpoints store RoPE's inverse frequencies: derived from
    // config.json, not weights.
    if (absl::EndsWith(name, ".rotary_emb.inv_freq")) continue;
    if (std::any_of(hf.unserved_prefixes.begin(), hf.unserved_prefixes.end(),
                    [&](const std::string& p) { return absl::StartsWith(name, p); })) {
      ++unserved;
      continue;
    }
    unused.push_back(name);
  }
  if (unserved > 0) {
    TANDEM_LOG(INFO) << dir_ << ": " << unserved << " tensors of " << hf.architecture
                     << "'s vision tower and projector are not loaded (Tandem serves its "
                     << hf.text_architecture << "; requests with images are refused)";
  }
  if (!unused.empty()) {
    const size_t shown = std::min<size_t>(unused.size(), 5);
    return absl::InvalidArgumentError(absl::StrCat(
        unused.size(), " tensor(s) that a ", hf.architecture,
        " with this config.json does not use, e.g. '",
        absl::StrJoin(unused.begin(), unused.begin() + static_cast<std::ptrdiff_t>(shown), "', '"),
        "': config.json and the weights disagree (refusing rather than running another model)"));
  }
  return absl::OkStatus();
}

const HfWeights::Ref& HfWeights::Find(WeightId id) const {
  static const Ref kAbsent;
  switch (id.kind) {
    case WeightKind::kEmbedding:
      return embedding_;
    case WeightKind::kRmsFinal:
      return rms_final_;
    case WeightKind::kClassifier:
      return classifier_;
    default:
      break;
  }
  if (id.layer < 0 || id.layer >= static_cast<int32_t>(layers_.size())) return kAbsent;
  const auto& l = layers_[static_cast<size_t>(id.layer)];
  auto it = l.find(id.kind);
  return it == l.end() ? kAbsent : it->second;
}

absl::StatusOr<std::vector<float>> HfWeights::Fp32(WeightId id) const {
  const Ref& r = Find(id);
  if (r.tensor == nullptr) return std::vector<float>();
  const TensorInfo& t = *r.tensor;
  const MappedFile& file = *files_.at(t.file);
  const int64_t esize = DtypeSize(t.dtype);
  const int64_t begin = t.begin + r.row_begin * r.cols * esize;
  const int64_t n = r.rows * r.cols;
  std::vector<float> out(static_cast<size_t>(n));
  ToFp32(t.dtype, file.data() + begin, n, out.data());
  if (r.one_plus) {
    for (float& x : out) x = 1.0f + x;  // in fp32, as transformers computes it
  }
  if (r.scale != 1.0f) {
    for (float& x : out) x *= r.scale;
  }
  file.Release(begin, begin + n * esize);  // out of the RSS; the page cache keeps it
  return out;
}

absl::StatusOr<WeightView<uint16_t>> HfWeights::Bf16(WeightId id) const {
  const Ref& r = Find(id);
  if (r.tensor == nullptr) return WeightView<uint16_t>();
  const TensorInfo& t = *r.tensor;
  if (t.dtype == "BF16" && !r.one_plus && r.scale == 1.0f) {
    const char* p = files_.at(t.file)->data() + t.begin + r.row_begin * r.cols * 2;
    if (reinterpret_cast<uintptr_t>(p) % alignof(uint16_t) == 0) {
      return WeightView<uint16_t>::Borrow(
          {reinterpret_cast<const uint16_t*>(p), static_cast<size_t>(r.rows * r.cols)});
    }
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<float> f, Fp32(id));
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = FloatToBFloat16(f[i]);
  return WeightView<uint16_t>::Own(std::move(out));
}

std::string HfWeights::Fingerprint(const ModelConfig& c) const {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  const int32_t header[] = {c.dim,
                            c.hidden_dim,
                            c.num_layers,
                            c.num_heads,
                            c.num_kv_heads,
                            c.vocab_size,
                            c.max_seq_len,
                            c.head_size,
                            static_cast<int32_t>(c.family),
                            static_cast<int32_t>(c.activation),
                            static_cast<int32_t>(c.rope_scaling.type),
                            c.rope_scaling.original_max_position_embeddings,
                            c.qkv_bias,
                            c.o_bias,
                            c.qk_norm};
  EVP_DigestUpdate(ctx, header, sizeof(header));
  const float fheader[] = {c.rope_theta,
                           c.norm_eps,
                           c.embedding_scale,
                           c.rope_scaling.factor,
                           c.rope_scaling.low_freq_factor,
                           c.rope_scaling.high_freq_factor};
  EVP_DigestUpdate(ctx, fheader, sizeof(fheader));
  // Sliding windows change every K/V past the window (nothing when none slides).
  EVP_DigestUpdate(ctx, c.layer_window.data(), c.layer_window.size() * sizeof(int32_t));
  HashRopeScaling(ctx, c);
  const auto start = std::chrono::steady_clock::now();
  auto last_log = start;
  int64_t hashed = 0;
  for (const auto& [name, t] : tensors_) {
    const std::string meta = absl::StrCat(name, "|", t.dtype, "|", ShapeString(t.shape), "|");
    EVP_DigestUpdate(ctx, meta.data(), meta.size());
    const MappedFile& file = *files_.at(t.file);
    EVP_DigestUpdate(ctx, file.data() + t.begin, static_cast<size_t>(t.end - t.begin));
    file.Release(t.begin, t.end);
    hashed += t.end - t.begin;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log > std::chrono::seconds(5)) {
      last_log = now;
      TANDEM_LOG(INFO) << "loading " << dir_ << ": fingerprint " << hashed / (1 << 20) << "/"
                       << total_bytes_ / (1 << 20) << " MiB, "
                       << std::chrono::duration<double>(now - start).count() << " s";
    }
  }
  return internal::FinishSha256Hex(ctx);
}

}  // namespace tandem::model::internal
