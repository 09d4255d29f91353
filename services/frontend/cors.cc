#include "cors.h"

#include <algorithm>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace tandem::frontend {

absl::StatusOr<std::vector<std::string>> ParseAllowedOrigins(const std::string& value) {
  const std::string trimmed(absl::StripAsciiWhitespace(value));
  if (trimmed.empty() || trimmed.front() != '[') {
    std::vector<std::string> out;
    for (absl::string_view o : absl::StrSplit(trimmed, ',', absl::SkipWhitespace())) {
      out.emplace_back(absl::StripAsciiWhitespace(o));
    }
    return out;
  }
  const nlohmann::json list = nlohmann::json::parse(trimmed, nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> out;
  if (list.is_array()) {
    for (const nlohmann::json& o : list) {
      if (!o.is_string()) break;
      out.push_back(o.get<std::string>());
    }
    if (out.size() == list.size()) return out;
  }
  return absl::InvalidArgumentError("--allowed-origins must be a JSON list of strings (as "
                                    "vLLM's, e.g. [\"*\"]) or comma-separated origins, got " +
                                    value);
}

std::string CorsAllowOrigin(const std::vector<std::string>& allowed, const HttpRequest& request) {
  const auto origin = request.headers.find("origin");
  if (allowed.empty() || origin == request.headers.end()) return "";
  for (const std::string& a : allowed) {
    if (a == "*") return "*";
    if (a == origin->second) return origin->second;
  }
  return "";
}

std::optional<std::vector<std::pair<std::string, std::string>>> PreflightHeaders(
    const HttpRequest& request, const std::string& allow_origin) {
  if (request.method != "OPTIONS" || allow_origin.empty() ||
      !request.headers.contains("access-control-request-method")) {
    return std::nullopt;
  }
  std::vector<std::pair<std::string, std::string>> headers = {
      {"Access-Control-Allow-Methods", "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"},
      {"Access-Control-Max-Age", "600"}};
  if (const auto asked = request.headers.find("access-control-request-headers");
      asked != request.headers.end()) {
    headers.emplace_back("Access-Control-Allow-Headers", asked->second);
  }
  return headers;
}

std::string AnswerRequestId(const HttpRequest& request) {
  if (auto it = request.headers.find("x-request-id"); it != request.headers.end()) {
    const std::string& id = it->second;
    if (std::none_of(id.begin(), id.end(),
                     [](char c) { return c == '\r' || c == '\n' || c == '\0'; })) {
      return id;
    }
  }
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%016x%016x", rng(), rng());
}

}  // namespace tandem::frontend
