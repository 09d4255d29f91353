// How a request ended: one vocabulary for the engine core, the scheduler
// service, the frontend and the wire (tandem.v1.FinishReason; libs/rpc
// converts). kNone: not finished (a frontend choice still streaming; never a
// finished request's reason).
#pragma once

namespace tandem {

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

// "stop", "length", "abort", "error"; "" for kNone. OpenAI's finish_reason
// and the reason label of the services' metrics.
[[nodiscard]] const char* FinishReasonName(FinishReason reason);

}  // namespace tandem
