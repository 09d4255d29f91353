// The HTTPS port's TLS context from its PEM files, and the files' stamp
// that tells the server's reload loop when to read them again.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "boost/asio/ssl/context.hpp"
#include "http_server.h"

namespace tandem::frontend {

// A server context from the PEM files; the error names the file at fault.
absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> LoadTlsContext(
    const HttpServerOptions& o);

// The TLS files' modification times, folded into one value that changes
// when any of them does (0 when one is missing). (libstdc++'s file clock
// counts from 2174: the times are negative.)
int64_t TlsFilesStamp(const HttpServerOptions& o);

}  // namespace tandem::frontend
