#include "store_answer.h"

#include <vector>

namespace tandem::kvstore_service {

StoredCounts AnswerStoreBatch(kvstore::KvStoreEngine* store, const std::string& ns,
                              std::optional<kvstore::Durability> durability,
                              std::span<const kvstore::StoreBlock> blocks,
                              std::span<v1::BlockStatus* const> statuses,
                              const StoreAnswerOptions& options) {
  StoredCounts counts;
  if (blocks.empty()) return counts;
  std::vector<absl::StatusOr<kvstore::StoreResult>> results =
      store->StoreBatch(ns, blocks, durability, options.reserved);
  for (size_t k = 0; k < blocks.size(); ++k) {
    v1::BlockStatus* st = statuses[k];
    if (!results[k].ok()) {
      st->set_ok(false);
      st->set_code(static_cast<int32_t>(results[k].status().code()));
      st->set_error(std::string(results[k].status().message()));
      continue;
    }
    st->set_ok(true);
    st->set_already_present(results[k]->already_present);
    if (results[k]->already_present) continue;
    ++counts.blocks;
    counts.bytes += blocks[k].payload.size();
    const int64_t every_hot = options.debug_corrupt_hot_every;
    const int64_t every_cold = options.debug_corrupt_cold_every;
    if ((every_hot > 0 || every_cold > 0) && options.debug_new_blocks != nullptr) {
      const uint64_t nth = options.debug_new_blocks->fetch_add(1) + 1;
      const uint64_t middle = blocks[k].payload.size() / 2;
      if (every_hot > 0 && nth % every_hot == 0) {
        (void)store->TEST_CorruptHot(ns, blocks[k].hash, middle);
      }
      if (every_cold > 0 && nth % every_cold == 0) {
        (void)store->TEST_CorruptCold(ns, blocks[k].hash, middle);
      }
    }
  }
  return counts;
}

}  // namespace tandem::kvstore_service
