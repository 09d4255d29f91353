#include "load_scope.h"

#include "tandem/common/ids.h"
#include "tandem/rpc/kvstore_convert.h"

namespace tandem::kvstore_service {

LoadScope::LoadScope(kvstore::KvStore* store, const v1::LoadRequest& request)
    : store_(store), request_(request) {
  absl::StatusOr<kvstore::NamespaceSpec> spec = store_->GetNamespace(request_.namespace_());
  status_ = spec.ok() ? rpc::ParseBlockHashes(request_.block_hashes(), "block_hashes", &hashes_)
                      : spec.status();
}

LoadScope::~LoadScope() { ReleaseLease(); }

void LoadScope::ReleaseLease() {
  if (released_) return;
  released_ = true;
  if (request_.lease_id() != 0) store_->Release(LeaseId(request_.lease_id()));
}

}  // namespace tandem::kvstore_service
