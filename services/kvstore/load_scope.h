// What both Load paths (the gRPC stream and the bulk load port) do around
// the blocks: check the request's namespace and hashes, act on the reader's
// corrupt-block reports, and release the request's lease when the load ends,
// however it ends.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "tandem/common/block_hash.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvstore_service {

class LoadScope {
 public:
  // `store` and `request` must outlive the scope. Verifies (and drops when
  // corrupt) the blocks in request.corrupt_block_hashes.
  LoadScope(kvstore::KvStoreEngine* store, const v1::LoadRequest& request);
  // Releases the request's lease (if any, and not released yet).
  ~LoadScope();
  LoadScope(const LoadScope&) = delete;
  LoadScope& operator=(const LoadScope&) = delete;

  // OK, NOT_FOUND (unknown namespace), INVALID_ARGUMENT (a hash that is not
  // 32 bytes, naming its field and index) or an I/O error re-verifying a
  // reported block.
  [[nodiscard]] const absl::Status& status() const { return status_; }
  [[nodiscard]] const std::vector<BlockHash>& hashes() const { return hashes_; }
  // Releases the lease now: call it before telling the client the load is
  // over, so a client that sees the end also sees the lease gone.
  void ReleaseLease();

 private:
  kvstore::KvStoreEngine* const store_;
  const v1::LoadRequest& request_;
  absl::Status status_;
  bool released_ = false;
  std::vector<BlockHash> hashes_;
};

}  // namespace tandem::kvstore_service
