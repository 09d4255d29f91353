#include "tandem/sched/request_id.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tandem::sched {

absl::Status ValidateRequestId(std::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("request_id is empty");
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id is ", id.size(), " bytes long; at most ", kMaxRequestIdBytes, " are allowed"));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id byte ", i, " is 0x", absl::Hex(c, absl::kZeroPad2),
                       "; only printable ASCII without spaces is allowed"));
    }
  }
  return absl::OkStatus();
}

std::string LoggableRequestId(std::string_view id) {
  constexpr size_t kShown = 64;
  std::string shown = absl::CHexEscape(absl::string_view(id.data(), std::min(id.size(), kShown)));
  if (id.size() > kShown) absl::StrAppend(&shown, "...(", id.size(), " bytes)");
  return shown;
}

}  // namespace tandem::sched
