#include "tandem/rpc/socket_tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "openssl_ptr.h"

namespace tandem::rpc {
namespace {

using internal::BioPtr;

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate of a PEM bundle, in order, handed to `take` (which owns it).
template <typename Take>
int ForEachCertificate(const std::string& pem, Take take) {
  BioPtr bio = MemoryBio(pem);
  int n = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    take(cert);
    ++n;
  }
  ERR_clear_error();  // the end of the bundle reads as an error
  return n;
}

absl::StatusOr<std::shared_ptr<ssl_ctx_st>> Build(const TlsOptions& options, const TlsFiles& files,
                                                  SocketTlsContext::Side side) {
  const bool server = side == SocketTlsContext::Side::kServer;
  ERR_clear_error();
  std::shared_ptr<ssl_ctx_st> ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()),
                                  SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("TLS: ", TakeOpenSslErrors()));
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  // Kernel TLS where the kernel has it; an EOF without close_notify is an
  // ordinary close (the framing above knows whether it cut a message).
  SSL_CTX_set_options(c,
                      SSL_OP_ENABLE_KTLS | SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_read_ahead(c, 1);
  SSL_CTX_set_default_read_buffer_len(c, 256 << 10);
  if (server) {
    // No resumption: connections are long-lived, and a resumed session
    // would skip the client certificate the role comes from.
    SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(c, 0);
  }
  auto refused = [&](const char* what) {
    return absl::UnavailableError(absl::StrCat("TLS: ", what, " (", server ? "server" : "client",
                                               "): ", TakeOpenSslErrors()));
  };
  if (!files.cert_pem.empty()) {
    bool first = true;
    bool ok = true;
    ForEachCertificate(files.cert_pem, [&](X509* cert) {
      if (first) {
        ok = ok && SSL_CTX_use_certificate(c, cert) == 1;
        X509_free(cert);
        first = false;
      } else {
        ok = ok && SSL_CTX_add0_chain_cert(c, cert) == 1;  // takes it
      }
    });
    if (first || !ok) return refused(("the certificate of " + options.cert_file).c_str());
    BioPtr key_bio = MemoryBio(files.key_pem);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
    const bool key_ok =
        key != nullptr && SSL_CTX_use_PrivateKey(c, key) == 1 && SSL_CTX_check_private_key(c) == 1;
    EVP_PKEY_free(key);
    if (!key_ok) return refused(("the key of " + options.key_file).c_str());
  }
  if (!files.ca_pem.empty()) {
    X509_STORE* store = SSL_CTX_get_cert_store(c);
    const int n = ForEachCertificate(files.ca_pem, [&](X509* cert) {
      X509_STORE_add_cert(store, cert);
      X509_free(cert);
    });
    if (n == 0) return refused(("the CA bundle " + options.ca_file).c_str());
  } else if (!server) {
    SSL_CTX_set_default_verify_paths(c);
  }
  if (server) {
    SSL_CTX_set_verify(
        c,
        files.ca_pem.empty() ? SSL_VERIFY_NONE : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
        nullptr);
  } else {
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
  }
  return ctx;
}

}  // namespace

absl::StatusOr<std::shared_ptr<SocketTlsContext>> SocketTlsContext::Create(
    const TlsOptions& options, Side side) {
  if (!options.enabled()) return absl::InvalidArgumentError("TLS is off");
  if (side == Side::kServer && options.cert_file.empty()) {
    return absl::InvalidArgumentError("a TLS server needs --tls-cert");
  }
  return std::shared_ptr<SocketTlsContext>(
      new SocketTlsContext(options, side, TlsReloader::For(options)));
}

absl::StatusOr<std::shared_ptr<ssl_ctx_st>> SocketTlsContext::Current() {
  const TlsFiles files = reloader_->published();
  std::lock_guard<std::mutex> lock(mu_);
  if (context_ != nullptr && files == built_from_) return context_;
  if (files == TlsFiles{}) {
    return absl::UnavailableError("TLS: no valid certificate set has been read yet");
  }
  absl::StatusOr<std::shared_ptr<ssl_ctx_st>> built = Build(options_, files, side_);
  if (!built.ok()) return built.status();
  context_ = *std::move(built);
  built_from_ = files;
  return context_;
}

CallerRole SocketTlsContext::RoleOf(const FramedSocket& sock) const {
  if (!mutual()) return CallerRole::kUnverified;
  return RoleFromUris(sock.PeerUris(), options_.trust_domain);
}

std::shared_ptr<SocketTlsContext> ClientSocketTls() {
  static std::mutex mu;
  static TlsOptions* built_for = new TlsOptions();  // never freed: used by any thread at exit
  static std::shared_ptr<SocketTlsContext>* context = new std::shared_ptr<SocketTlsContext>();
  const TlsOptions now = ClientTls();
  std::lock_guard<std::mutex> lock(mu);
  if (!now.enabled()) return nullptr;
  if (*context == nullptr || !(*built_for == now)) {
    absl::StatusOr<std::shared_ptr<SocketTlsContext>> c =
        SocketTlsContext::Create(now, SocketTlsContext::Side::kClient);
    if (!c.ok()) return nullptr;
    *context = *std::move(c);
    *built_for = now;
  }
  return *context;
}

}  // namespace tandem::rpc
