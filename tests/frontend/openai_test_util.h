// Helpers of the OpenAI request parsing tests (openai_test.cc,
// openai_structured_test.cc).
#pragma once

#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "tandem/frontend/openai.h"

namespace tandem::frontend {

inline std::optional<ApiError> Parse(const std::string& body, Endpoint e, CompletionRequest* out) {
  return ParseCompletionRequest(body, e, out);
}

// The error a body gets, or "" when it parses.
inline std::string ErrorParam(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  CompletionRequest r;
  auto error = Parse(body, e, &r);
  if (!error) return "";
  EXPECT_EQ(error->http_status, 400);
  EXPECT_EQ(error->type, "invalid_request_error");
  return error->param.empty() ? "<none>" : error->param;
}

}  // namespace tandem::frontend
