// Private: backend factories behind ModelRunner::Create.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/model/model_runner.h"

namespace tandem::model::internal {

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuRunner(const Model* model,
                                                             KvCacheOptions opts,
                                                             ModelRunnerOptions runner_opts);
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(const Model* model,
                                                              KvCacheOptions opts,
                                                              ModelRunnerOptions runner_opts);

// Per-token metadata of one batch, shared by the backends.
struct BatchLayout {
  int32_t num_rows = 0;
  std::vector<int32_t> tokens;            // [num_rows]
  std::vector<int32_t> row_pos;           // [num_rows]
  std::vector<int32_t> row_table_offset;  // [num_rows]
  std::vector<int32_t> block_tables;      // concatenated block tables
  std::vector<int64_t> slots;             // [num_rows] cache slot of each token
  // The rows Forward returns logits for: each sequence's last token, then the
  // other tokens of all_logits sequences (ModelRunner::Forward's layout).
  std::vector<int32_t> last_rows;
  int32_t max_context = 0;                // max row_pos + 1
};
BatchLayout MakeBatchLayout(std::span<const SequenceInput> batch, int32_t block_size);
// The block ids a validated batch writes KV into (with read_too, also those
// it reads it from), in batch order (repeats possible).
std::vector<int32_t> WrittenBlocks(std::span<const SequenceInput> batch, int32_t block_size,
                                   bool read_too = false);

}  // namespace tandem::model::internal
