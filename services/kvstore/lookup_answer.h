// What both Lookup paths (the gRPC call and the bulk port's lookup
// connections) do with a LookupRequest.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvstore_service {

struct LookupAnswerOptions {
  // Tests only: sleep this long before looking up (a slow store).
  int64_t debug_delay_ms = 0;
  // When set and passed by the time the answer is ready, the caller has
  // given up and would drop it: the lease is released and the answer is
  // CANCELLED.
  std::optional<std::chrono::system_clock::time_point> deadline;
};

// Releases the leases the request carries (release_lease_ids, whatever
// becomes of the lookup), then counts the leading hits and pins them when
// asked. INVALID_ARGUMENT for a hash that is not 32 bytes, NOT_FOUND for an
// unknown namespace.
absl::Status AnswerLookup(kvstore::KvStoreEngine* store, const v1::LookupRequest& req,
                          const LookupAnswerOptions& options, v1::LookupResponse* resp);

}  // namespace tandem::kvstore_service
