#include "tandem/rpc/tls.h"

#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "tandem/rpc/method_roles.h"
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
             "certificates signed by it (mutual TLS: each gRPC method is open only to the roles "
             "that rpc/method_roles.h lists, a role named by a URI SAN "
             "spiffe://<--tls-trust-domain>/tandem/<role>)");
  flags->Add("tls-reload-interval-s", &options->reload_interval_s,
             "how often the TLS files are read again (a rotated Secret takes effect without a "
             "restart)");
  flags->Add("tls-trust-domain", &options->trust_domain,
             "SPIFFE trust domain of the client certificates' role URI SANs "
             "(spiffe://<domain>/tandem/<role>); a URI under any other domain grants no role, so "
             "its caller may use only health and reflection. Set it to the chart's "
             "tls.trustDomain");
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
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::experimental::TlsServerCredentials(options);
  // Mutual TLS: every call of every service passes the role table first.
  if (!o.ca_file.empty()) {
    creds->SetAuthMetadataProcessor(std::make_shared<RoleCheckProcessor>(o.trust_domain));
  }
  return creds;
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
    case CallerRole::kClient:
      return "client";
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

CallerRole RoleFromUris(const std::vector<std::string>& uris, std::string_view trust_domain) {
  constexpr std::string_view kScheme = "spiffe://";
  for (const std::string& uri : uris) {
    std::string_view rest(uri);
    if (!absl::StartsWithIgnoreCase(absl::string_view(rest.data(), rest.size()), "spiffe://")) {
      continue;
    }
    rest.remove_prefix(kScheme.size());
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos) continue;
    if (trust_domain.empty() ||
        !absl::EqualsIgnoreCase(absl::string_view(rest.data(), slash),
                                absl::string_view(trust_domain.data(), trust_domain.size()))) {
      continue;  // another trust domain names no role here
    }
    const std::string_view path = rest.substr(slash);
    const size_t at = path.rfind("/tandem/");
    if (at == std::string_view::npos) continue;
    const std::string_view role = path.substr(at + 8);
    if (role == "worker") return CallerRole::kWorker;
    if (role == "scheduler") return CallerRole::kScheduler;
    if (role == "frontend") return CallerRole::kFrontend;
    if (role == "client") return CallerRole::kClient;
  }
  return CallerRole::kNone;
}

CallerRole RoleOf(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return CallerRole::kUnverified;
  // RoleCheckProcessor recorded it under the server's trust domain; a
  // verified call without it (a server built without ServerCredentialsFor)
  // has no role.
  for (const grpc::string_ref& v : auth->FindPropertyValues(kRolePropertyName)) {
    const std::string_view name(v.data(), v.size());
    for (CallerRole r : {CallerRole::kWorker, CallerRole::kScheduler, CallerRole::kFrontend,
                         CallerRole::kClient}) {
      if (name == CallerRoleName(r)) return r;
    }
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
