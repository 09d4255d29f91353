// The headers an answer takes from its request, as vLLM's middlewares set
// them. CORS as vLLM's (Starlette's CORSMiddleware with vLLM's defaults: any
// method, any header, no credentials): which origin an answer names, and
// the answer to a browser's preflight; and X-Request-Id. The HTTP server
// applies them to every exchange (HttpServerOptions::allowed_origins,
// request_id_headers).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "http_server.h"

namespace tandem::frontend {

// --allowed-origins: a JSON list of strings (vLLM's form) or comma-separated
// origins.
absl::StatusOr<std::vector<std::string>> ParseAllowedOrigins(const std::string& value);

// The Access-Control-Allow-Origin value of the answer to `request`: "*" when
// `allowed` has it, the request's Origin when listed, else "" (no header).
std::string CorsAllowOrigin(const std::vector<std::string>& allowed, const HttpRequest& request);

// When `request` is a preflight (OPTIONS naming the method it means to use)
// from an allowed origin (`allow_origin` from CorsAllowOrigin, not ""): the
// headers of its answer, allowing what it asks for. Else nullopt.
std::optional<std::vector<std::pair<std::string, std::string>>> PreflightHeaders(
    const HttpRequest& request, const std::string& allow_origin);

// vLLM's XRequestIdMiddleware (--enable-request-id-headers): the answer's
// X-Request-Id, the request's own, else (none, or one that could not be
// written back as a header) 32 random hex digits.
std::string AnswerRequestId(const HttpRequest& request);

}  // namespace tandem::frontend
