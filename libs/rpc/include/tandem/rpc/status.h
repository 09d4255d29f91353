// absl::Status <-> grpc::Status. The canonical codes have the same numbers in
// both; messages are kept verbatim.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tandem::rpc {

[[nodiscard]] grpc::Status ToGrpcStatus(const absl::Status& status);
[[nodiscard]] absl::Status FromGrpcStatus(const grpc::Status& status);
// Prefixes the message with `context: ` and keeps the code.
[[nodiscard]] absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& context);
// The code's canonical name ("DEADLINE_EXCEEDED"), for log lines.
[[nodiscard]] std::string StatusCodeName(const grpc::Status& status);

}  // namespace tandem::rpc
