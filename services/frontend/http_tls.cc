#include "http_tls.h"

#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "boost/beast/core/error.hpp"

namespace tandem::frontend {

namespace beast = boost::beast;
namespace net = boost::asio;

absl::StatusOr<std::shared_ptr<net::ssl::context>> LoadTlsContext(const HttpServerOptions& o) {
  auto ctx = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
  ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                   net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                   net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use);
  beast::error_code ec;
  ctx->use_certificate_chain_file(o.tls_cert_file, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--https-cert ", o.tls_cert_file, ": ", ec.message()));
  }
  ctx->use_private_key_file(o.tls_key_file, net::ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--https-key ", o.tls_key_file, ": ", ec.message()));
  }
  if (!o.tls_ca_file.empty()) {
    ctx->load_verify_file(o.tls_ca_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--https-ca ", o.tls_ca_file, ": ", ec.message()));
    }
    ctx->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert);
  }
  return ctx;
}

int64_t TlsFilesStamp(const HttpServerOptions& o) {
  uint64_t stamp = 1;
  for (const std::string& f : {o.tls_cert_file, o.tls_key_file, o.tls_ca_file}) {
    if (f.empty()) continue;
    std::error_code ec;
    const auto t = std::filesystem::last_write_time(f, ec);
    if (ec) return 0;
    stamp = stamp * 1000003u + static_cast<uint64_t>(t.time_since_epoch().count());
  }
  return stamp == 0 ? 1 : static_cast<int64_t>(stamp);
}

}  // namespace tandem::frontend
