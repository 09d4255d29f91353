// Hugging Face directories: config.json (hf_config.h) + safetensors (single
// file or sharded with model.safetensors.index.json), mapped, every tensor
// read or the load fails naming it.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "file_util.h"
#include "hf_config.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/model/checkpoint.h"
#include "tandem/model/json.h"

namespace tandem::model {
namespace {

using internal::JoinPath;

struct TensorInfo {
  std::string file;  // path of the safetensors file
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // absolute byte offsets in the file
  int64_t end = 0;
};

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
  absl::StatusOr<JsonValue> header = JsonValue::Parse(std::string(bytes.substr(8, header_len)));
  if (!header.ok()) return Annotate(header.status(), absl::StrCat(path, ": header"));
  if (!header->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_len = static_cast<int64_t>(bytes.size()) - data_start;
  for (const auto& [name, v] : header->object()) {
    if (name == "__metadata__") continue;
    const JsonValue* dtype = v.Find("dtype");
    const JsonValue* shape = v.Find("shape");
    const JsonValue* offsets = v.Find("data_offsets");
    if (dtype == nullptr || !dtype->is_string() || shape == nullptr || !shape->is_array() ||
        offsets == nullptr || !offsets->is_array() || offsets->array().size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    TensorInfo t;
    t.file = path;
    t.dtype = dtype->str();
    int64_t numel = 1;
    for (const JsonValue& d : shape->array()) {
      // Bounded so that numel * element size cannot overflow (2^40 elements
      // is far past any tensor this loader reads into memory).
      constexpr double kMaxElements = 1099511627776.0;  // 2^40
      if (!d.is_number() || d.number() < 0 || d.number() != std::floor(d.number()) ||
          d.number() * static_cast<double>(numel) > kMaxElements) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", name, "' bad shape (negative, fractional, or over 2^40 elements)"));
      }
      t.shape.push_back(static_cast<int64_t>(d.number()));
      numel *= t.shape.back();
    }
    const double b = offsets->array()[0].number(), e = offsets->array()[1].number();
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

// Reads tensors from the mapped shards, converting to fp32, and remembers
// which it read: a tensor left unread at the end fails the load.
class TensorReader {
 public:
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::unique_ptr<internal::MappedFile>> files;  // by path
  std::set<std::string> consumed;
  int64_t bytes_read = 0;

  bool Has(const std::string& name) const { return tensors.count(name) != 0; }

  absl::StatusOr<std::vector<float>> Read(const std::string& name,
                                          std::vector<int64_t> expected) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing tensor '", name, "'"));
    }
    const TensorInfo& t = it->second;
    if (t.shape != expected) {
      return absl::InvalidArgumentError(absl::StrCat(t.file, ": tensor '", name, "' has shape ",
                                                     ShapeString(t.shape), ", config.json implies ",
                                                     ShapeString(expected)));
    }
    if (DtypeSize(t.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(t.file, ": tensor '", name,
                                                     "' has unsupported dtype ", t.dtype,
                                                     " (want F32, F16 or BF16)"));
    }
    const internal::MappedFile& file = *files.at(t.file);
    const char* p = file.data() + t.begin;
    const int64_t n = (t.end - t.begin) / DtypeSize(t.dtype);
    std::vector<float> out(static_cast<size_t>(n));
    if (t.dtype == "F32") {
      std::memcpy(out.data(), p, static_cast<size_t>(n) * 4);
    } else {
      const bool half = t.dtype == "F16";
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[static_cast<size_t>(i)] = half ? HalfToFloat(h) : BFloat16ToFloat(h);
      }
    }
    // The mapped pages are not needed again: out of the RSS.
    file.Release(t.begin, t.end);
    consumed.insert(name);
    bytes_read += t.end - t.begin;
    return out;
  }

  // Tensors no Read() took, sorted.
  std::vector<std::string> Unread() const {
    std::vector<std::string> names;
    for (const auto& [name, info] : tensors) {
      if (consumed.count(name) == 0) names.push_back(name);
    }
    return names;
  }
};

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

// With a sharded index, every tensor must sit in the shard its weight_map
// entry names, and every entry must name a tensor that exists.
absl::Status CheckIndexMatchesShards(const std::string& dir, const std::string& index_path,
                                     const std::map<std::string, TensorInfo>& tensors) {
  std::error_code ec;
  if (!std::filesystem::exists(index_path, ec)) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(std::string text, internal::ReadFile(index_path));
  absl::StatusOr<JsonValue> index = JsonValue::Parse(text);
  if (!index.ok()) return Annotate(index.status(), index_path);
  for (const auto& [name, file] : index->Find("weight_map")->object()) {
    auto it = tensors.find(name);
    const std::string want = JoinPath(dir, file.str());
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

// A checkpoint holding more layers than config.json declares disagrees with
// it: loading the first num_hidden_layers would silently run another model.
absl::Status CheckNoLayersBeyondConfig(const std::string& dir, const ModelConfig& c,
                                       const std::map<std::string, TensorInfo>& tensors) {
  const std::string prefix = "model.layers.";
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

}  // namespace

absl::StatusOr<LoadedCheckpoint> ReadHfCheckpoint(const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  LoadedCheckpoint out;
  TANDEM_ASSIGN_OR_RETURN(internal::HfConfig hf, internal::ReadHfConfig(dir));
  out.config = hf.config;
  const ModelConfig& c = out.config;
  if (hf.sliding_window_cap > 0) {
    TANDEM_LOG(WARNING) << dir << ": sliding-window attention is not implemented; serving "
                        << "contexts of at most the window, " << hf.sliding_window_cap
                        << " tokens, where it changes nothing";
  }

  TensorReader reader;
  const std::string single = JoinPath(dir, "model.safetensors");
  const std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  std::vector<std::string> shard_paths;
  std::error_code ec;
  if (std::filesystem::exists(index_path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, internal::ReadFile(index_path));
    absl::StatusOr<JsonValue> index = JsonValue::Parse(text);
    if (!index.ok()) return Annotate(index.status(), index_path);
    const JsonValue* map = index->Find("weight_map");
    if (map == nullptr || !map->is_object()) {
      return absl::InvalidArgumentError(index_path + ": missing \"weight_map\" object");
    }
    for (const auto& [name, file] : map->object()) {
      if (!file.is_string()) {
        return absl::InvalidArgumentError(index_path + ": weight_map['" + name +
                                          "'] is not a file name");
      }
      const std::string p = JoinPath(dir, file.str());
      if (std::find(shard_paths.begin(), shard_paths.end(), p) == shard_paths.end()) {
        shard_paths.push_back(p);
      }
    }
  } else {
    shard_paths.push_back(single);
  }
  int64_t total_bytes = 0;
  for (const std::string& p : shard_paths) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<internal::MappedFile> file,
                            internal::MappedFile::Open(p));
    TANDEM_RETURN_IF_ERROR(IndexSafetensors(p, file->view(), &reader.tensors));
    total_bytes += static_cast<int64_t>(file->size());
    reader.files[p] = std::move(file);
  }
  TANDEM_RETURN_IF_ERROR(CheckIndexMatchesShards(dir, index_path, reader.tensors));
  TANDEM_RETURN_IF_ERROR(CheckNoLayersBeyondConfig(dir, c, reader.tensors));
  TANDEM_LOG(INFO) << "loading " << dir << ": " << hf.architecture << " ("
                   << ModelFamilyName(c.family) << "), " << c.num_layers << " layers, "
                   << reader.tensors.size() << " tensors, " << total_bytes / (1 << 20)
                   << " MiB in " << shard_paths.size() << " file(s)"
                   << (hf.torch_dtype.empty() ? "" : ", " + hf.torch_dtype);

  const int64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim(), q = c.q_dim(),
                hs = c.head_size, vocab = c.vocab_size;
  auto where = [&](const absl::Status& s) {
    return Annotate(s, absl::StrCat(dir, " (", absl::StrJoin(shard_paths, ", "), ")"));
  };
  ModelWeights& w = out.weights;
  auto read = [&](std::vector<float>* dst, const std::string& name,
                  std::vector<int64_t> shape) -> absl::Status {
    absl::StatusOr<std::vector<float>> v = reader.Read(name, std::move(shape));
    if (!v.ok()) return where(v.status());
    *dst = std::move(*v);
    return absl::OkStatus();
  };
  // Gemma's RMSNorm scales by (1 + w), in fp32 as transformers computes it:
  // folded into the weight once.
  auto read_norm = [&](std::vector<float>* dst, const std::string& name) -> absl::Status {
    TANDEM_RETURN_IF_ERROR(read(dst, name, {dim}));
    if (c.family == ModelFamily::kGemma) {
      for (float& x : *dst) x = 1.0f + x;
    }
    return absl::OkStatus();
  };
  // Rows [begin, begin + rows) of a fused [total][dim] projection.
  auto rows_of = [](const std::vector<float>& fused, int64_t begin, int64_t rows, int64_t cols) {
    return std::vector<float>(fused.begin() + begin * cols, fused.begin() + (begin + rows) * cols);
  };
  auto last_log = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(read(&w.token_embedding, "model.embed_tokens.weight", {vocab, dim}));
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    TANDEM_RETURN_IF_ERROR(read_norm(&l.rms_att, p + "input_layernorm.weight"));
    if (c.family == ModelFamily::kPhi3) {
      std::vector<float> qkv, gate_up;
      TANDEM_RETURN_IF_ERROR(read(&qkv, p + "self_attn.qkv_proj.weight", {q + 2 * kv, dim}));
      l.wq = rows_of(qkv, 0, q, dim);
      l.wk = rows_of(qkv, q, kv, dim);
      l.wv = rows_of(qkv, q + kv, kv, dim);
      TANDEM_RETURN_IF_ERROR(read(&gate_up, p + "mlp.gate_up_proj.weight", {2 * hidden, dim}));
      l.w1 = rows_of(gate_up, 0, hidden, dim);
      l.w3 = rows_of(gate_up, hidden, hidden, dim);
    } else {
      TANDEM_RETURN_IF_ERROR(read(&l.wq, p + "self_attn.q_proj.weight", {q, dim}));
      TANDEM_RETURN_IF_ERROR(read(&l.wk, p + "self_attn.k_proj.weight", {kv, dim}));
      TANDEM_RETURN_IF_ERROR(read(&l.wv, p + "self_attn.v_proj.weight", {kv, dim}));
      TANDEM_RETURN_IF_ERROR(read(&l.w1, p + "mlp.gate_proj.weight", {hidden, dim}));
      TANDEM_RETURN_IF_ERROR(read(&l.w3, p + "mlp.up_proj.weight", {hidden, dim}));
    }
    TANDEM_RETURN_IF_ERROR(read(&l.wo, p + "self_attn.o_proj.weight", {dim, q}));
    if (c.qkv_bias) {
      TANDEM_RETURN_IF_ERROR(read(&l.bq, p + "self_attn.q_proj.bias", {q}));
      TANDEM_RETURN_IF_ERROR(read(&l.bk, p + "self_attn.k_proj.bias", {kv}));
      TANDEM_RETURN_IF_ERROR(read(&l.bv, p + "self_attn.v_proj.bias", {kv}));
    }
    if (c.o_bias) TANDEM_RETURN_IF_ERROR(read(&l.bo, p + "self_attn.o_proj.bias", {dim}));
    if (c.qk_norm) {
      TANDEM_RETURN_IF_ERROR(read(&l.q_norm, p + "self_attn.q_norm.weight", {hs}));
      TANDEM_RETURN_IF_ERROR(read(&l.k_norm, p + "self_attn.k_norm.weight", {hs}));
    }
    TANDEM_RETURN_IF_ERROR(read_norm(&l.rms_ffn, p + "post_attention_layernorm.weight"));
    TANDEM_RETURN_IF_ERROR(read(&l.w2, p + "mlp.down_proj.weight", {dim, hidden}));
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log > std::chrono::seconds(5) || i + 1 == c.num_layers) {
      last_log = now;
      TANDEM_LOG(INFO) << "loading " << dir << ": layer " << i + 1 << "/" << c.num_layers << ", "
                       << reader.consumed.size() << "/" << reader.tensors.size() << " tensors, "
                       << reader.bytes_read / (1 << 20) << "/" << total_bytes / (1 << 20)
                       << " MiB, "
                       << std::chrono::duration<double>(now - start).count() << " s";
    }
  }
  TANDEM_RETURN_IF_ERROR(read_norm(&w.rms_final, "model.norm.weight"));
  if (!hf.tied_embeddings) {
    if (!reader.Has("lm_head.weight")) {
      return where(absl::InvalidArgumentError(
          "missing tensor 'lm_head.weight' and config.json does not set tie_word_embeddings"));
    }
    TANDEM_RETURN_IF_ERROR(read(&w.wcls, "lm_head.weight", {vocab, dim}));
  } else if (reader.Has("lm_head.weight")) {
    // Tied, yet stored: transformers would use the embedding; a different
    // table means the config and the weights disagree.
    std::vector<float> head;
    TANDEM_RETURN_IF_ERROR(read(&head, "lm_head.weight", {vocab, dim}));
    if (head != w.token_embedding) {
      return where(absl::InvalidArgumentError(
          "config.json ties the embeddings (tie_word_embeddings) but lm_head.weight differs "
          "from model.embed_tokens.weight"));
    }
  }
  // Old checkpoints store RoPE's inverse frequencies as buffers: derived from
  // config.json, not weights.
  for (const std::string& name : reader.Unread()) {
    if (absl::EndsWith(name, ".rotary_emb.inv_freq")) reader.consumed.insert(name);
  }
  if (const std::vector<std::string> unread = reader.Unread(); !unread.empty()) {
    const size_t shown = std::min<size_t>(unread.size(), 5);
    return where(absl::InvalidArgumentError(absl::StrCat(
        unread.size(), " tensor(s) that a ", hf.architecture,
        " with this config.json does not use, e.g. '",
        absl::StrJoin(unread.begin(), unread.begin() + static_cast<std::ptrdiff_t>(shown), "', '"),
        "': config.json and the weights disagree (refusing rather than running another model)")));
  }
  TANDEM_LOG(INFO) << "loaded " << dir << ": " << reader.tensors.size() << " tensors, "
                   << reader.bytes_read / (1 << 20) << " MiB in "
                   << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                   << " s";
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

  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
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
                       PermuteForRotateHalf(l.wq, c.num_heads, c.head_size, c.dim, true)});
    entries.push_back({p + "self_attn.k_proj.weight",
                       {kv, dim},
                       PermuteForRotateHalf(l.wk, c.num_kv_heads, c.head_size, c.dim, true)});
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
      header += absl::StrCat(JsonQuote(t.name), ":{\"dtype\":\"", dtype_name, "\",\"shape\":[",
                             absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", begin, ",",
                             begin + static_cast<int64_t>(t.data.size()) * esize, "]}");
      if (!weight_map.empty()) weight_map += ",";
      weight_map += absl::StrCat(JsonQuote(t.name), ":", JsonQuote(shard_names[s]));
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
