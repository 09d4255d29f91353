// A CompletionJob (tandem/frontend/completion_job.h, where its behaviour is
// documented) wired into tandem-frontend: each choice's Generate call goes
// over gRPC to a replica the Router picks (a callback reactor: messages
// handled on gRPC's threads, the call's end posted to the HTTP connection's
// strand), the response to the request's HttpExchange, and the counts to
// FrontendMetrics.
#pragma once

#include <memory>
#include <string>

#include "tandem/frontend/openai.h"

namespace tandem::frontend {

class Frontend;
class HttpExchange;

// Runs the request to completion; the job keeps itself alive until the
// response is done and every call has ended.
void StartCompletionJob(Frontend* frontend, std::shared_ptr<HttpExchange> exchange,
                        CompletionRequest request, std::string endpoint);

}  // namespace tandem::frontend
