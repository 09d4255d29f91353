// Per-element math and kernel functors shared by the CPU and CUDA ops. The
// order of every floating-point operation follows llama2.c's run.c, so the
// CPU backend reproduces its logits bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "tandem/kernels/hd.h"
#include "tandem/kernels/kv_layout.h"

namespace tandem::kernels {

enum class RopeKind : int32_t {
  // llama2.c: rotate pairs (2p, 2p + 1) of each head.
  kAdjacentPairs = 0,
  // Hugging Face: rotate pairs (p, p + head_size / 2) of each head.
  kRotateHalf = 1,
};

// The MLP's activation of the gate: act(gate) * up.
enum class ActKind : int32_t {
  kSilu = 0,
  // PyTorch's gelu(approximate="tanh") ("gelu_pytorch_tanh").
  kGeluTanh = 1,
};

// ---- Row functions (one row = one token) ----------------------------------

// o = w * (x / sqrt(mean(x^2) + eps)), summing x^2 in index order.
TANDEM_HD inline void RmsNormRow(const float* x, const float* w, int32_t dim, float eps, float* o) {
  float ss = 0.0f;
  for (int32_t j = 0; j < dim; ++j) ss += x[j] * x[j];
  ss /= static_cast<float>(dim);
  ss += eps;
  ss = 1.0f / sqrtf(ss);
  for (int32_t j = 0; j < dim; ++j) o[j] = w[j] * (ss * x[j]);
}

// y = W x for one output row: sequential accumulation over the input.
TANDEM_HD inline float DotRow(const float* w_row, const float* x, int32_t n) {
  float val = 0.0f;
  for (int32_t j = 0; j < n; ++j) val += w_row[j] * x[j];
  return val;
}

// silu(g) * u, written as run.c writes it.
TANDEM_HD inline float SiluMul(float g, float u) {
  float val = g;
  val *= (1.0f / (1.0f + expf(-val)));
  val *= u;
  return val;
}

// gelu_tanh(g) * u, in the order of PyTorch's scalar CPU kernel.
TANDEM_HD inline float GeluTanhMul(float g, float u) {
  const float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  const float kKappa = 0.044715f;
  const float cube = g * g * g;
  const float inner = kBeta * (g + kKappa * cube);
  const float act = 0.5f * g * (1.0f + tanhf(inner));
  return act * u;
}

TANDEM_HD inline float ActMul(ActKind kind, float g, float u) {
  return kind == ActKind::kGeluTanh ? GeluTanhMul(g, u) : SiluMul(g, u);
}

// RoPE rotates the first rotary_dim elements of each head (the whole head
// but for partial_rotary_factor < 1) in rotary_dim / 2 pairs; the rest pass
// through.
// Rotation angle of pair `pair` (0 .. rotary_dim/2) at position `pos`: from
// the table of inverse frequencies when given (the model's, with any RoPE
// scaling), else 1 / theta^(2 pair / rotary_dim) as llama2.c computes it.
// cos and sin are multiplied by `amplitude` (yarn's and longrope's attention
// factor, 1 for the others), as transformers scales them.
TANDEM_HD inline void RopeCosSin(int32_t pos, int32_t pair, int32_t rotary_dim, float theta,
                                 const float* inv_freq, float amplitude, float* c, float* s) {
  const int32_t head_dim = 2 * pair;
  const float freq =
      inv_freq != nullptr
          ? inv_freq[pair]
          : 1.0f / powf(theta, static_cast<float>(head_dim) / static_cast<float>(rotary_dim));
  const float val = static_cast<float>(pos) * freq;
  *c = cosf(val) * amplitude;
  *s = sinf(val) * amplitude;
}

// The two elements of a head vector that RoPE's pair `pair` rotates: (p,
// p + rotary_dim / 2) for rotate-half, (2p, 2p + 1) for adjacent pairs. The
// pairs past rotary_dim / 2 split the elements that pass through, (2p,
// 2p + 1), so pairs 0 .. head_size / 2 cover every element once.
TANDEM_HD inline void RopePairIndices(int32_t pair, int32_t rotary_dim, RopeKind kind, int32_t* i0,
                                      int32_t* i1) {
  const bool adjacent = kind == RopeKind::kAdjacentPairs || 2 * pair >= rotary_dim;
  *i0 = adjacent ? 2 * pair : pair;
  *i1 = adjacent ? 2 * pair + 1 : pair + rotary_dim / 2;
}

// Rotates one pair (< rotary_dim / 2) of one head vector in place.
TANDEM_HD inline void RopePair(float* head_vec, int32_t pair, int32_t rotary_dim, RopeKind kind,
                               float c, float s) {
  int32_t i0, i1;
  RopePairIndices(pair, rotary_dim, kind, &i0, &i1);
  const float v0 = head_vec[i0];
  const float v1 = head_vec[i1];
  head_vec[i0] = v0 * c - v1 * s;
  head_vec[i1] = v0 * s + v1 * c;
}

// ---- Paged attention ------------------------------------------------------

// The first position a query at `pos` attends to under a sliding window of
// `window` positions (0: none): transformers' mask keeps key kv when
// kv > pos - window, so the query sees itself and the window - 1 before it.
TANDEM_HD inline int32_t WindowStart(int32_t pos, int32_t window) {
  return window > 0 && pos >= window ? pos - window + 1 : 0;
}

// Whether a query at `pos` attends to the key at `key`: causal, and from
// WindowStart(pos, window) on.
TANDEM_HD inline bool KeySeen(int32_t key, int32_t pos, int32_t window) {
  return key <= pos && (window == 0 || key > pos - window);
}

// Whether every query at positions min_pos .. max_pos sees every key of
// first_key .. last_key, so that a kernel may skip the per-key mask there.
TANDEM_HD inline bool KeysAllSeen(int32_t first_key, int32_t last_key, int32_t min_pos,
                                  int32_t max_pos, int32_t window) {
  return last_key <= min_pos && (window == 0 || first_key > max_pos - window);
}

// Arguments of a paged attention over `num_rows` query rows. Row r attends,
// causally, to positions WindowStart(row_pos[r], window) .. row_pos[r] of its
// sequence, whose block table starts at block_tables[row_table_offset[r]].
// Query head h reads KV head h / (num_heads / num_kv_heads).
struct PagedAttentionArgs {
  const float* q = nullptr;      // [num_rows][num_heads][head_size]
  float* out = nullptr;          // [num_rows][num_heads][head_size]
  const float* cache = nullptr;  // the whole cache, KvCacheShape layout
  KvCacheShape shape;
  int32_t layer = 0;
  int32_t num_heads = 0;
  int32_t num_rows = 0;
  const int32_t* row_pos = nullptr;
  const int32_t* row_table_offset = nullptr;
  const int32_t* block_tables = nullptr;
  int32_t window = 0;  // sliding window of this layer; 0: every earlier position
  float softcap = 0.0f;  // Gemma 2: scores become softcap * tanh(score / softcap); 0: none
};

// Gemma 2's tanh softcapping of an attention score or a logit (cap > 0).
TANDEM_HD inline float TanhSoftcap(float x, float cap) { return cap * tanhf(x / cap); }

// One (row, head) of a paged attention, and run.c's operations on it, each
// in run.c's order: AttendRowHead runs them in turn, the CUDA float32
// kernel spreads the independent ones over a block's threads.
struct RowHeadAttention {
  const PagedAttentionArgs* a;
  const int32_t* table;  // the row's block table
  const float* q;
  float* out;
  int32_t kv_head, pos, lo;  // the row attends to positions lo .. pos
  float scale;

  TANDEM_HD RowHeadAttention(const PagedAttentionArgs& args, int32_t row, int32_t head)
      : a(&args),
        table(args.block_tables + args.row_table_offset[row]),
        q(args.q + (int64_t{row} * args.num_heads + head) * args.shape.head_size),
        out(args.out + (int64_t{row} * args.num_heads + head) * args.shape.head_size),
        kv_head(head / (args.num_heads / args.shape.num_kv_heads)),
        pos(args.row_pos[row]),
        lo(WindowStart(args.row_pos[row], args.window)),
        scale(sqrtf(static_cast<float>(args.shape.head_size))) {}

  // Position t's K row (kv 0) or V row (1).
  TANDEM_HD const float* Row(int32_t t, int32_t kv) const {
    const KvCacheShape& sh = a->shape;
    return a->cache + sh.Offset(table[t / sh.block_size], a->layer, kv, t % sh.block_size, kv_head);
  }
  // The score of position t: q . k over the head in increasing order,
  // divided by sqrt(head_size), then softcapped.
  TANDEM_HD float Score(int32_t t) const {
    const float* k = Row(t, 0);
    float score = 0.0f;
    for (int32_t i = 0; i < a->shape.head_size; ++i) score += q[i] * k[i];
    score /= scale;
    if (a->softcap > 0.0f) score = TanhSoftcap(score, a->softcap);
    return score;
  }
  // The largest of scores[lo .. pos].
  TANDEM_HD float Max(const float* scores) const {
    float max_val = scores[lo];
    for (int32_t t = lo + 1; t <= pos; ++t) {
      if (scores[t] > max_val) max_val = scores[t];
    }
    return max_val;
  }
  // scores[lo .. pos] summed in increasing position.
  TANDEM_HD float Sum(const float* scores) const {
    float sum = 0.0f;
    for (int32_t t = lo; t <= pos; ++t) sum += scores[t];
    return sum;
  }
  // Output element i: weights[t] * v_t[i] summed in increasing position.
  TANDEM_HD float Weighted(const float* weights, int32_t i) const {
    float o = 0.0f;
    for (int32_t t = lo; t <= pos; ++t) o += weights[t] * Row(t, 1)[i];
    return o;
  }
};

// One (row, head): scores, softmax and the weighted sum of V exactly as
// run.c computes them, over the row's window. `scores` holds row_pos[row] + 1
// floats (those below the window are not touched).
TANDEM_HD inline void AttendRowHead(const PagedAttentionArgs& a, int32_t row, int32_t head,
                                    float* scores) {
  const RowHeadAttention rh(a, row, head);
  for (int32_t t = rh.lo; t <= rh.pos; ++t) scores[t] = rh.Score(t);
  const float max_val = rh.Max(scores);
  for (int32_t t = rh.lo; t <= rh.pos; ++t) scores[t] = expf(scores[t] - max_val);
  const float sum = rh.Sum(scores);
  for (int32_t t = rh.lo; t <= rh.pos; ++t) scores[t] /= sum;
  for (int32_t i = 0; i < a.shape.head_size; ++i) rh.out[i] = rh.Weighted(scores, i);
}

// ---- Functors of (block, thread, block_dim) --------------------------------

// out[r] = table[tokens[r]]; one block per row.
struct EmbeddingGatherFn {
  const float* table;
  const int32_t* tokens;
  float* out;
  int32_t dim;
  TANDEM_HD void operator()(int64_t row, int32_t t, int32_t nt) const {
    const float* src = table + int64_t{tokens[row]} * dim;
    float* dst = out + row * dim;
    for (int32_t j = t; j < dim; j += nt) dst[j] = src[j];
  }
};

// Elementwise over n values, `per_block` values per block.
struct SiluMulFn {
  const float* gate;
  const float* up;
  float* out;
  int64_t n;
  ActKind kind = ActKind::kSilu;
  TANDEM_HD void operator()(int64_t b, int32_t t, int32_t nt) const {
    const int64_t i = b * nt + t;
    if (i < n) out[i] = ActMul(kind, gate[i], up[i]);
  }
};

// x[r][i] += bias[i] for `rows` rows of `width`, row r at x + r * stride;
// one block per row.
struct AddBiasFn {
  float* x;
  const float* bias;
  int32_t width;
  int64_t stride;
  TANDEM_HD void operator()(int64_t row, int32_t t, int32_t nt) const {
    for (int32_t i = t; i < width; i += nt) x[row * stride + i] += bias[i];
  }
};

// x[i] = TanhSoftcap(x[i], cap) (Gemma 2's final logits).
struct SoftcapFn {
  float* x;
  float cap;
  int64_t n;
  TANDEM_HD void operator()(int64_t b, int32_t t, int32_t nt) const {
    const int64_t i = b * nt + t;
    if (i < n) x[i] = TanhSoftcap(x[i], cap);
  }
};

// x[i] *= scale.
struct ScaleFn {
  float* x;
  float scale;
  int64_t n;
  TANDEM_HD void operator()(int64_t b, int32_t t, int32_t nt) const {
    const int64_t i = b * nt + t;
    if (i < n) x[i] *= scale;
  }
};

// RMSNorm in place over each of `heads` vectors of `head_size` per row (row
// r's heads start at x + r * stride), weights w[head_size], summed in index
// order as RmsNormRow; one thread per (row, head).
struct HeadRmsNormFn {
  float* x;
  const float* w;
  int32_t rows;
  int32_t heads;
  int32_t head_size;
  int64_t stride;
  float eps;
  TANDEM_HD void operator()(int64_t b, int32_t t, int32_t nt) const {
    const int64_t i = b * nt + t;
    if (i >= int64_t{rows} * heads) return;
    float* v = x + (i / heads) * stride + (i % heads) * head_size;
    RmsNormRow(v, w, head_size, eps, v);
  }
};

struct ResidualAddFn {
  float* x;
  const float* y;
  int64_t n;
  TANDEM_HD void operator()(int64_t b, int32_t t, int32_t nt) const {
    const int64_t i = b * nt + t;
    if (i < n) x[i] += y[i];
  }
};

// RoPE on vec[rows][num_heads][head_size]; one block per row, threads stride
// over (head, pair).
struct RopeFn {
  float* vec;
  const int32_t* positions;
  int32_t num_heads;
  int32_t head_size;
  RopeKind kind;
  float theta;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]; nullptr: from theta
  float amplitude = 1.0f;           // RopeCosSin's
  int32_t rotary_dim = 0;           // 0: head_size
  TANDEM_HD void operator()(int64_t row, int32_t t, int32_t nt) const {
    const int32_t rd = rotary_dim > 0 ? rotary_dim : head_size;
    const int32_t pairs = rd / 2;
    for (int32_t i = t; i < num_heads * pairs; i += nt) {
      const int32_t head = i / pairs;
      const int32_t pair = i % pairs;
      float c, s;
      RopeCosSin(positions[row], pair, rd, theta, inv_freq, amplitude, &c, &s);
      RopePair(vec + (row * num_heads + head) * head_size, pair, rd, kind, c, s);
    }
  }
};

// Writes K and V of each row into its slot (slot = block_id * block_size +
// offset in block); one block per row. Rows with slot < 0 are skipped.
struct KvWriteFn {
  float* cache;
  KvCacheShape shape;
  int32_t layer;
  const float* k;  // [rows][num_kv_heads][head_size]
  const float* v;
  const int64_t* slots;
  TANDEM_HD void operator()(int64_t row, int32_t t, int32_t nt) const {
    const int64_t slot = slots[row];
    if (slot < 0) return;
    const int64_t block = slot / shape.block_size;
    const int32_t off = static_cast<int32_t>(slot % shape.block_size);
    const int32_t width = shape.num_kv_heads * shape.head_size;
    float* kd = cache + shape.Offset(block, layer, 0, off, 0);
    float* vd = cache + shape.Offset(block, layer, 1, off, 0);
    for (int32_t i = t; i < width; i += nt) {
      kd[i] = k[row * width + i];
      vd[i] = v[row * width + i];
    }
  }
};

// Copies whole blocks between the cache and a staging buffer: staging block
// i <-> cache block block_ids[i]. One grid block per copied block.
struct BlockCopyFn {
  float* cache;
  float* staging;
  const int32_t* block_ids;
  int64_t block_floats;
  bool to_staging;  // true: gather (cache -> staging); false: scatter
  TANDEM_HD void operator()(int64_t i, int32_t t, int32_t nt) const {
    float* c = cache + int64_t{block_ids[i]} * block_floats;
    float* s = staging + i * block_floats;
    for (int64_t j = t; j < block_floats; j += nt) {
      if (to_staging) {
        s[j] = c[j];
      } else {
        c[j] = s[j];
      }
    }
  }
};

}  // namespace tandem::kernels
