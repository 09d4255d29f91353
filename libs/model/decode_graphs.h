// CUDA graphs for decode steps (issue 31): which captured graph a step
// replays, and the padded layout it replays with. Host code, tested on the
// CPU; the capture and replay are CudaRunnerBase::RunGraph (cuda_runner.cc).
//
// A decode step (every sequence feeds one token) of B <= kMaxGraphRows
// sequences replays the graph captured for (GraphBatchBucket(B), the power
// of two of attention splits its longest context needs), as vLLM captures
// per batch-size bucket: the step is padded to the bucket with rows that
// write no KV and whose outputs nobody reads. At a bucket's own size the
// replay computes exactly what the eager step computes (same kernels, same
// shapes, a row's attention split by its own length); padded, only the
// cuBLAS GEMMs see more rows and may pick another algorithm, as they may for
// any change of batch size.
#pragma once

#include <cstdint>
#include <span>

#include "cpu_runner.h"
#include "tandem/model/model_runner.h"

namespace tandem::model::internal {

inline constexpr int32_t kMaxGraphRows = 256;

// The smallest captured batch size >= rows: 1, 2, 4, 8, then multiples of 8
// to 64, then of 32 to kMaxGraphRows (17 sizes; at most 7 padding rows up to
// 64, 31 beyond). 0 when rows > kMaxGraphRows (the step runs eagerly).
int32_t GraphBatchBucket(int32_t rows);

// The smallest power of two >= splits (>= 1).
int32_t GraphSplitsBucket(int32_t splits);

// Whether every sequence feeds exactly one token.
bool IsDecodeBatch(std::span<const SequenceInput> batch);

// Pads a decode layout to `rows` rows: each padding row is token 0 at
// position 0 over a one-entry block table of block 0, writes no KV (slot -1)
// and is its own sequence's last row. max_context is unchanged.
void PadDecodeLayout(BatchLayout* lay, int32_t rows);

}  // namespace tandem::model::internal
