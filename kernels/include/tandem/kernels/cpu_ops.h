// CPU implementations of the ops of DESIGN §6. They are the reference: the
// CUDA ops are tested against them, and they follow llama2.c's order of
// operations so the CPU backend matches it bit for bit. All tensors are
// row-major float32; "rows" are tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/kernels/kv_layout.h"
#include "tandem/kernels/logprobs.h"
#include "tandem/kernels/math.h"
#include "tandem/kernels/sampling.h"

namespace tandem::kernels::cpu {

// out[r][:] = table[tokens[r]][:]. Token ids must be in range.
void EmbeddingGather(const float* table, int32_t dim, std::span<const int32_t> tokens, float* out);

// out[r] = rmsnorm(x[r]) * w for `rows` rows of `dim`.
void RmsNorm(const float* x, const float* w, int32_t rows, int32_t dim, float eps, float* out);

// y[r][i] = sum_j w[i][j] * x[r][j], summed sequentially over j. w is
// [out_dim][in_dim]. The plain reference; see PackedMatrix for the fast one.
void Matmul(const float* w, int32_t out_dim, int32_t in_dim, const float* x, int32_t rows,
            float* y);

// A weight matrix repacked into panels of kPanelRows output rows,
// [num_panels][in_dim][kPanelRows], so a step reads each weight once for all
// of its tokens while every output element is still summed sequentially over
// the input: results equal Matmul() bit for bit.
class PackedMatrix {
 public:
  static constexpr int32_t kPanelRows = 16;
  PackedMatrix() = default;
  PackedMatrix(const float* w, int32_t out_dim, int32_t in_dim);
  int32_t out_dim() const { return out_dim_; }
  int32_t in_dim() const { return in_dim_; }
  // y[rows][out_dim] = x[rows][in_dim] * W^T.
  void Apply(const float* x, int32_t rows, float* y) const;
  // Apply() for rows [row_begin, row_end) only (x and y are the full arrays).
  void ApplyRows(const float* x, int32_t row_begin, int32_t row_end, float* y) const;

 private:
  int32_t out_dim_ = 0;
  int32_t in_dim_ = 0;
  std::vector<float> panels_;
};

// RoPE in place on vec[rows][num_heads][head_size] at positions[r], by the
// inverse frequencies inv_freq[rotary_dim / 2] when given, else theta's; cos
// and sin times `amplitude` (RopeCosSin); only each head's first rotary_dim
// elements (0: all; partial_rotary_factor), the rest as they are.
void Rope(float* vec, int32_t rows, const int32_t* positions, int32_t num_heads, int32_t head_size,
          RopeKind kind, float theta, const float* inv_freq = nullptr, float amplitude = 1.0f,
          int32_t rotary_dim = 0);

// Writes k[r], v[r] ([rows][num_kv_heads][head_size]) into cache slot
// slots[r] (block_id * block_size + offset) of `layer`; slot < 0 skips a row.
void KvWrite(float* cache, const KvCacheShape& shape, int32_t layer, const float* k, const float* v,
             int32_t rows, const int64_t* slots);

// Causal grouped-query attention over the paged cache (see PagedAttentionArgs).
// Bitwise equal to PagedAttentionReference, arranged for speed.
void PagedAttention(const PagedAttentionArgs& args);
// PagedAttention for rows [row_begin, row_end) only.
void PagedAttentionRows(const PagedAttentionArgs& args, int32_t row_begin, int32_t row_end);
// AttendRowHead (RowHeadAttention's operations, which the CUDA float32
// kernel runs too) for every row and head.
void PagedAttentionReference(const PagedAttentionArgs& args);

// out[i] = silu(gate[i]) * up[i] (or another activation of the gate).
void SiluMul(const float* gate, const float* up, int64_t n, float* out,
             ActKind kind = ActKind::kSilu);

// x[r][:width] += bias for `rows` rows of `width` (contiguous).
void AddBias(float* x, const float* bias, int32_t rows, int32_t width);

// x[i] *= scale.
void Scale(float* x, int64_t n, float scale);
// x[i] = TanhSoftcap(x[i], cap) (math.h).
void Softcap(float* x, int64_t n, float cap);

// x[i] += y[i].
void ResidualAdd(float* x, const float* y, int64_t n);

// One token from logits[0, vocab) (sampling.h's SampleRowProgram);
// banned[0, args.num_banned) count as -inf, and so does every id not in
// banned[num_banned, num_banned + args.num_allowed) when num_allowed > 0,
// and every id the mask words after them do not allow (num_mask_words);
// penalties[0, args.num_penalties) are the row's history.
int32_t SampleRow(const float* logits, int32_t vocab, const SampleArgs& args,
                  const int32_t* banned = nullptr, const SamplePenalty* penalties = nullptr);

// out_tokens[r] = a token from row args[r].row of logits[][vocab], with the
// banned and allowed ids, mask and penalties args[r] names in `banned` and `penalties`
// (nullptr when no row has any).
void Sample(const float* logits, int32_t rows, int32_t vocab, const SampleArgs* args,
            const int32_t* banned, const SamplePenalty* penalties, int32_t* out_tokens);

// log Z of logits[0, vocab) (logprobs.h's LogNormalizerProgram): a token's
// raw logprob is AddRn(logit, -log Z).
float LogNormalizer(const float* logits, int32_t vocab);

// logprobs.h's program for jobs[0, n) over logits[][vocab]: results[j], and
// job j's top ids and logprobs at top_ids / top_logprobs + jobs[j].top_begin.
// What cuda::Logprobs computes, to the bit (the device test's reference).
void Logprobs(const float* logits, int32_t vocab, const LogprobJob* jobs, int32_t n,
              LogprobResult* results, int32_t* top_ids, float* top_logprobs);
// How many ids the last job of this thread's Logprobs gathered at or before
// tau (LogprobShared::count; 0 for a job that gathered none), for tests of
// the gather's bound.
int32_t LogprobCandidatesOfLastJob();

// Gather: staging[i] = cache block block_ids[i]; scatter: the reverse.
// block_floats = KvCacheShape::BlockFloats().
void BlockGather(const float* cache, int64_t block_floats, std::span<const int32_t> block_ids,
                 float* staging);
void BlockScatter(float* cache, int64_t block_floats, std::span<const int32_t> block_ids,
                  const float* staging);

}  // namespace tandem::kernels::cpu
