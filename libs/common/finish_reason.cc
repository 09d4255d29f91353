#include "tandem/common/finish_reason.h"

namespace tandem {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

}  // namespace tandem
