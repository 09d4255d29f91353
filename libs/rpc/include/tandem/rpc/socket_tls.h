// TLS for Tandem's plain-TCP port, the KV-store's bulk port
// (services/kvstore/bulk_load_server.h), with the gRPC ports' files, roles
// and reloads (tls.h), so that a TLS deployment keeps its fast path.
//
// A SocketTlsContext turns a TlsOptions into OpenSSL contexts for
// rpc::FramedSocket::StartTls:
//   - server: presents --tls-cert; with --tls-ca it demands a client
//     certificate the CA signed (mutual TLS), and the caller's role is the
//     one its URI SANs name under --tls-trust-domain (RoleFromUris), checked
//     against method_roles.h's table as gRPC checks it;
//   - client: verifies the server against --tls-ca (the system roots when
//     empty) and the host it dialled, and presents --tls-cert when given.
// TLS 1.2 or 1.3; OpenSSL hands the record layer to the kernel (kernel TLS)
// where the kernel offers it, and encrypts in user space otherwise.
//
// Reloads: the context is built from the set the process's TlsReloader last
// published (the files checked together: a half-written rotation keeps the
// last good set) and rebuilt when that set changes, so new connections take
// rotated files within a reload interval, as gRPC's do; a connection keeps
// the context it started with.
#pragma once

#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/tls.h"
#include "tandem/rpc/tls_reload.h"

namespace tandem::rpc {

class SocketTlsContext {
 public:
  enum class Side { kServer, kClient };

  // INVALID_ARGUMENT when `options` turn TLS off, or a server has no
  // certificate.
  static absl::StatusOr<std::shared_ptr<SocketTlsContext>> Create(const TlsOptions& options,
                                                                  Side side);

  // The OpenSSL context for a new connection, built from the files in
  // effect now. UNAVAILABLE before a good set was ever published, or when
  // OpenSSL refuses the set (naming its reason).
  absl::StatusOr<std::shared_ptr<ssl_ctx_st>> Current();

  [[nodiscard]] const TlsOptions& options() const { return options_; }
  // A server that demands and verifies client certificates: roles apply.
  [[nodiscard]] bool mutual() const { return side_ == Side::kServer && !options_.ca_file.empty(); }
  // The role of the peer of `sock` after StartTls: kUnverified unless this
  // is a mutual-TLS server, else RoleFromUris of its certificate.
  [[nodiscard]] CallerRole RoleOf(const FramedSocket& sock) const;

 private:
  SocketTlsContext(TlsOptions options, Side side, std::shared_ptr<TlsReloader> reloader)
      : options_(std::move(options)), side_(side), reloader_(std::move(reloader)) {}

  const TlsOptions options_;
  const Side side_;
  const std::shared_ptr<TlsReloader> reloader_;

  std::mutex mu_;
  TlsFiles built_from_;  // guarded by mu_
  std::shared_ptr<ssl_ctx_st> context_;
};

// The client context of this process (ClientTls(), tls.h), shared by its
// connections; null when client TLS is off. Follows SetClientTls.
[[nodiscard]] std::shared_ptr<SocketTlsContext> ClientSocketTls();

}  // namespace tandem::rpc
