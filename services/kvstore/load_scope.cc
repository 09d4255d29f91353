#include "load_scope.h"

#include "tandem/common/ids.h"
#include "tandem/rpc/kvstore_convert.h"

namespace tandem::kvstore_service {

LoadScope::LoadScope(kvstore::KvStoreEngine* store, const v1::LoadRequest& request)
    : store_(store), request_(request) {
  absl::StatusOr<kvstore::NamespaceSpec> spec = store_->GetNamespace(request_.namespace_());
  std::vector<BlockHash> corrupt;
  status_ = spec.status();
  if (status_.ok()) {
    status_ =
        rpc::ParseBlockHashes(request_.corrupt_block_hashes(), "corrupt_block_hashes", &corrupt);
  }
  if (status_.ok()) {
    status_ = rpc::ParseBlockHashes(request_.block_hashes(), "block_hashes", &hashes_);
  }
  for (size_t i = 0; status_.ok() && i < corrupt.size(); ++i) {
    status_ = store_->ReportCorrupt(request_.namespace_(), corrupt[i]).status();
  }
}

LoadScope::~LoadScope() { ReleaseLease(); }

void LoadScope::ReleaseLease() {
  if (released_) return;
  released_ = true;
  if (request_.lease_id() != 0) store_->Release(LeaseId(request_.lease_id()));
}

}  // namespace tandem::kvstore_service
