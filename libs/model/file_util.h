// Private file helpers of the model library.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::model::internal {

// The whole file; NOT_FOUND naming the path when it cannot be opened.
absl::StatusOr<std::string> ReadFile(const std::string& path);
absl::Status WriteFile(const std::string& path, const std::string& bytes);
std::string JoinPath(const std::string& dir, const std::string& name);
std::string BaseName(const std::string& path);

}  // namespace tandem::model::internal
