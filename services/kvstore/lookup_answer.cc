#include "lookup_answer.h"

#include <thread>
#include <vector>

#include "tandem/common/block_hash.h"
#include "tandem/rpc/kvstore_convert.h"

namespace tandem::kvstore_service {

absl::Status AnswerLookup(kvstore::KvStoreEngine* store, const v1::LookupRequest& req,
                          const LookupAnswerOptions& options, v1::LookupResponse* resp) {
  std::vector<BlockHash> hashes;
  if (absl::Status s = rpc::ParseBlockHashes(req.block_hashes(), "block_hashes", &hashes);
      !s.ok()) {
    return s;
  }
  for (uint64_t id : req.release_lease_ids()) store->Release(LeaseId(id));
  if (options.debug_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options.debug_delay_ms));
  }
  absl::StatusOr<kvstore::LookupResult> r =
      store->Lookup(req.namespace_(), hashes,
                    {.take_lease = req.take_lease(),
                     .lease_ttl_ms = static_cast<int64_t>(req.lease_ttl_ms()),
                     .stage_to_hot = req.stage_to_hot()});
  if (!r.ok()) return r.status();
  if (options.deadline && std::chrono::system_clock::now() > *options.deadline) {
    if (r->lease.value() != 0) store->Release(r->lease);
    return absl::CancelledError("lookup cancelled by the client");
  }
  resp->set_num_hits(r->num_hits);
  resp->set_num_hot_hits(r->num_hot_hits);
  resp->set_lease_id(r->lease.value());
  return absl::OkStatus();
}

}  // namespace tandem::kvstore_service
