// TLS and mutual TLS for every gRPC port and client (issue 16).
//
// One set of flags on every binary: --tls-cert and --tls-key are this
// process's identity, presented by its servers and, for mutual TLS, by its
// clients; --tls-ca is the CA bundle it verifies peers with. On a server,
// --tls-ca also DEMANDS a client certificate that the CA signed (mutual TLS);
// without it the server takes any client (TLS for privacy only). A process
// with none of the flags serves and dials in plain text, as before.
//
// The files are read again every --tls-reload-interval-s and new contents
// take effect for new connections without a restart (within a second more:
// gRPC's poll of the private copy, tls_reload.h): Kubernetes rewrites a
// mounted Secret in place when cert-manager rotates it. A new set is checked
// first (tls_reload.h): an empty, cut-off, unparsable or mismatched file keeps
// the last good set, logs a warning and counts in
// tandem_tls_reload_failures_total. At start-up (Validate) bad files are an
// error.
//
// Roles (CallerRole) come from the verified client certificate: a URI SAN
// spiffe://<trust domain>/.../tandem/<role>, e.g.
// spiffe://cluster.local/tandem/worker, whose trust domain is the server's
// --tls-trust-domain (default cluster.local, the Helm chart's default); a URI
// under another trust domain grants no role. Only a server with --tls-ca knows
// its callers; without it every caller has kUnverified and roles are not
// enforced. Which role may call which method is one table (method_roles.h),
// checked for every call of every server in one place: the
// AuthMetadataProcessor that ServerCredentialsFor installs under mutual TLS.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"
#include "tandem/common/flags.h"

namespace tandem::rpc {

// The default --tls-trust-domain: the Helm chart's tls.trustDomain default.
inline constexpr char kDefaultTrustDomain[] = "cluster.local";

struct TlsOptions {
  std::string cert_file;  // PEM certificate chain of this process
  std::string key_file;   // PEM private key of cert_file
  std::string ca_file;    // PEM CA bundle that verifies peers (and demands client certs)
  int32_t reload_interval_s = 10;
  // The SPIFFE trust domain (URI authority) whose /tandem/<role> URI SANs
  // name roles on this server (--tls-trust-domain).
  std::string trust_domain = std::string(kDefaultTrustDomain);

  // TLS is on when a certificate or a CA is given.
  [[nodiscard]] bool enabled() const { return !cert_file.empty() || !ca_file.empty(); }
  // Mutual TLS on a server: client certificates are demanded and verified.
  [[nodiscard]] bool mutual() const { return !cert_file.empty() && !ca_file.empty(); }
  // The files are readable and valid (CheckTlsFiles: PEM that parses, a key
  // that matches the certificate, a CA bundle of certificates); cert and key
  // come together. With `server`, TLS needs a certificate (a CA alone is a
  // client's setting). The errors name the flag and the file.
  [[nodiscard]] absl::Status Validate(bool server) const;

  bool operator==(const TlsOptions&) const = default;
};

// --tls-cert, --tls-key, --tls-ca, --tls-reload-interval-s and --tls-trust-domain.
void AddTlsFlags(FlagSet* flags, TlsOptions* options);

// Credentials for a server's listening port (insecure when TLS is off).
// Under mutual TLS they carry the role check (method_roles.h): every call's
// role is taken from its certificate under options.trust_domain and checked
// against MethodRoleTable() before any handler runs.
[[nodiscard]] std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(
    const TlsOptions& options);
// Credentials a client dials with (insecure when TLS is off): verifies the
// server against ca_file (the system roots when empty) and presents
// cert_file when given.
[[nodiscard]] std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const TlsOptions& options);

// The TLS settings of this process's clients: every rpc::CreateChannel and
// the KV-store client dial with them. Set once in main(), before the first
// channel; plain text until then.
void SetClientTls(const TlsOptions& options);
[[nodiscard]] TlsOptions ClientTls();

// Who called, from the verified client certificate.
enum class CallerRole {
  kUnverified,  // the server does not verify clients (no --tls-ca): roles are not enforced
  kNone,        // a verified certificate without a Tandem role
  kWorker,
  kScheduler,
  kFrontend,
  kClient,  // an operator's or tool's certificate (tandem CLI, tandem-generate): Generation only
};
[[nodiscard]] const char* CallerRoleName(CallerRole role);
// The role named by the first of `uris` that is
// spiffe://<trust_domain>/.../tandem/<role> with a known role (the trust
// domain compared case-insensitively, as SPIFFE does); kNone when none is.
[[nodiscard]] CallerRole RoleFromUris(const std::vector<std::string>& uris,
                                      std::string_view trust_domain);
// The role of the caller of `context`, as the server's role check took it
// (RoleFromUris under the server's trust domain); kUnverified without a
// verified client certificate.
[[nodiscard]] CallerRole RoleOf(const grpc::ServerContextBase& context);
// The URI SANs of the caller's certificate, for error messages.
[[nodiscard]] std::string PeerIdentity(const grpc::ServerContextBase& context);

}  // namespace tandem::rpc
