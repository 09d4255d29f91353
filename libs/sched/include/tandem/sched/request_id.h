// What a request id may be. It is a map key on every side, crosses the
// scheduler -> worker stream in every step, and is written in log lines, so
// it is bounded and plain: 1 to kMaxRequestIdBytes printable ASCII
// characters, no spaces or control characters (a newline in an id forged
// log lines; a 1 MB id was logged whole). The frontend's ids
// ("cmpl-<hex>-<n>") and the scheduler's own ("req-<n>") are of this form.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tandem::sched {

inline constexpr size_t kMaxRequestIdBytes = 256;

// OK, or INVALID_ARGUMENT naming what is wrong (without echoing the id).
[[nodiscard]] absl::Status ValidateRequestId(std::string_view id);

// The id as a log line may show it: at most 64 bytes, anything but
// printable ASCII escaped. For ids that failed ValidateRequestId.
[[nodiscard]] std::string LoggableRequestId(std::string_view id);

}  // namespace tandem::sched
