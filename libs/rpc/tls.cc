#include "tandem/rpc/tls.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "tandem/rpc/tls_reload.h"

namespace tandem::rpc {
namespace {

std::shared_ptr<grpc::experimental::CertificateProviderInterface> ProviderFor(
    const TlsOptions& o) {
  return TlsReloader::For(o)->provider();
}

std::mutex client_tls_mu;
TlsOptions& ClientTlsStorage() {
  static TlsOptions* options = new TlsOptions();  // never freed: read by any thread at exit
  return *options;
}

}  // namespace

absl::Status TlsOptions::Validate(bool server) const {
  if (!enabled()) return absl::OkStatus();
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (server && cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca needs --tls-cert and --tls-key: a server presents a certificate");
  }
  if (reload_interval_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-reload-interval-s must be >= 1, got ", reload_interval_s));
  }
  // What a reload would refuse, a start refuses: no process runs without a
  // valid identity.
  absl::StatusOr<TlsFiles> files = ReadTlsFiles(*this);
  if (!files.ok()) return files.status();
  return CheckTlsFiles(*this, *files);
}

void AddTlsFlags(FlagSet* flags, TlsOptions* options) {
  flags->Add("tls-cert", &options->cert_file,
             "PEM certificate chain: TLS on this process's gRPC ports, and its identity as a "
             "client (empty: plain text)");
  flags->Add("tls-key", &options->key_file, "PEM private key of --tls-cert");
  flags->Add("tls-ca", &options->ca_file,
             "PEM CA bundle that verifies peers; on a server it also demands client "
             "certificates signed by it (mutual TLS, and roles from their /tandem/<role> URI SAN)");
  flags->Add("tls-reload-interval-s", &options->reload_interval_s,
             "how often the TLS files are read again (a rotated Secret takes effect without a "
             "restart)");
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TlsOptions& o) {
  if (!o.enabled()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(ProviderFor(o));
  options.watch_identity_key_cert_pairs();
  if (!o.ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsOptions& o) {
  if (!o.enabled()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(ProviderFor(o));
  if (!o.ca_file.empty()) options.watch_root_certs();  // else: the system roots
  if (!o.cert_file.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

void SetClientTls(const TlsOptions& options) {
  std::lock_guard<std::mutex> lock(client_tls_mu);
  ClientTlsStorage() = options;
}

TlsOptions ClientTls() {
  std::lock_guard<std::mutex> lock(client_tls_mu);
  return ClientTlsStorage();
}

const char* CallerRoleName(CallerRole role) {
  switch (role) {
    case CallerRole::kUnverified:
      return "unverified";
    case CallerRole::kNone:
      return "none";
    case CallerRole::kWorker:
      return "worker";
    case CallerRole::kScheduler:
      return "scheduler";
    case CallerRole::kFrontend:
      return "frontend";
  }
  return "?";
}

namespace {
std::vector<std::string> PeerUris(const grpc::AuthContext& auth) {
  std::vector<std::string> uris;
  for (const grpc::string_ref& v : auth.FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
    uris.emplace_back(v.data(), v.size());
  }
  return uris;
}
}  // namespace

CallerRole RoleOf(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return CallerRole::kUnverified;
  for (const std::string& uri : PeerUris(*auth)) {
    const size_t at = uri.rfind("/tandem/");
    if (at == std::string::npos) continue;
    const std::string_view role = std::string_view(uri).substr(at + 8);
    if (role == "worker") return CallerRole::kWorker;
    if (role == "scheduler") return CallerRole::kScheduler;
    if (role == "frontend") return CallerRole::kFrontend;
  }
  return CallerRole::kNone;
}

std::string PeerIdentity(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "an unauthenticated peer";
  std::vector<std::string> uris = PeerUris(*auth);
  if (uris.empty()) {
    for (const grpc::string_ref& v : auth->GetPeerIdentity()) uris.emplace_back(v.data(), v.size());
  }
  return absl::StrCat("peer [", absl::StrJoin(uris, ", "), "]");
}

}  // namespace tandem::rpc
