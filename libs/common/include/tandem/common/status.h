// Status helpers. Abseil 20220623 has no public RETURN_IF_ERROR macros, so we
// define ours. Every library boundary returns absl::Status / StatusOr.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define TANDEM_STATUS_CONCAT_INNER_(a, b) a##b
#define TANDEM_STATUS_CONCAT_(a, b) TANDEM_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function when `expr` (an absl::Status) is not OK.
#define TANDEM_RETURN_IF_ERROR(expr)                   \
  do {                                                 \
    ::absl::Status _tandem_status = (expr);            \
    if (!_tandem_status.ok()) return _tandem_status;   \
  } while (0)

// TANDEM_ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define TANDEM_ASSIGN_OR_RETURN(lhs, rexpr)                                   \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_STATUS_CONCAT_(_tandem_sor_, __LINE__), \
                                lhs, rexpr)
#define TANDEM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

namespace tandem {

// Returns `status` with "context: " prepended to its message, keeping the code.
// Annotate(NotFoundError("x"), "loading layer 3") -> NOT_FOUND "loading layer 3: x".
[[nodiscard]] absl::Status Annotate(const absl::Status& status,
                                    absl::string_view context);

}  // namespace tandem
