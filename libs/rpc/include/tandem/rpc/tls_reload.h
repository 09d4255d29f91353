// A TLS file set that only ever changes to a valid one (issue 29).
//
// gRPC's FileWatcherCertificateProvider hands whatever the files hold to the
// handshaker: an empty key (an in-place writer has just truncated it) aborts
// the process in gRPC 1.51, and a garbage or mismatched pair refuses every new
// connection until the files are fixed. So gRPC never watches the operator's
// files. A TlsReloader reads them every --tls-reload-interval-s, checks them
// together (CheckTlsFiles) and only then publishes them into a private
// directory that gRPC watches (TlsReloader::provider()). A bad set keeps the
// last good one, logs one warning per distinct bad content and counts it in
// tandem_tls_reload_failures_total; a rotation written as two separate files
// (certificate first, key later) is refused while they disagree and takes
// effect once both are written.
//
// Publishing is atomic for gRPC: each set goes to a new generation directory
// and the `current` symlink is renamed onto it, with modification times that
// differ from the previous generation's, so gRPC's before/after mtime check
// cannot pair a key of one generation with a certificate of another.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "tandem/rpc/tls.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace tandem::rpc {

// The contents of a TlsOptions' files (empty strings for files not given).
struct TlsFiles {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  bool operator==(const TlsFiles&) const = default;
};

// Reads the files `options` names; the error names the flag and the file.
[[nodiscard]] absl::StatusOr<TlsFiles> ReadTlsFiles(const TlsOptions& options);
// What gRPC's handshaker needs of them: the certificate chain and the key
// parse as PEM, the key matches the chain's first certificate, and the CA
// bundle holds at least one certificate and nothing unparsable. The error
// names the flag, the file and what is wrong.
[[nodiscard]] absl::Status CheckTlsFiles(const TlsOptions& options, const TlsFiles& files);

class TlsReloader {
 public:
  // How often gRPC reads the published copy (cheap: a private directory).
  static constexpr unsigned kPublishedPollS = 1;

  // The process's reloader for these files (one per distinct TlsOptions,
  // shared by its servers and channels, never freed). The first call reads
  // and publishes the files; when they are bad then, nothing is published
  // (handshakes fail) until they become valid. TlsOptions::Validate refuses
  // bad files at start-up, before any of this.
  [[nodiscard]] static std::shared_ptr<TlsReloader> For(const TlsOptions& options);

  ~TlsReloader();
  TlsReloader(const TlsReloader&) = delete;
  TlsReloader& operator=(const TlsReloader&) = delete;

  // The provider gRPC's credentials watch: the last good set (null once
  // the process is exiting).
  [[nodiscard]] std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider() const;
  // Reads the operator's files now and publishes them if they changed and
  // are valid (what the reload thread does every interval). Returns the
  // files' error, if any.
  absl::Status Reload();
  // The directory gRPC watches: current/{cert,key,ca}.pem.
  [[nodiscard]] const std::string& published_dir() const { return dir_; }
  // The set gRPC is given now (empty before the first good one).
  [[nodiscard]] TlsFiles published() const;
  // This reloader's share of TlsReloadFailures() and TlsReloads().
  [[nodiscard]] uint64_t failures() const;
  [[nodiscard]] uint64_t reloads() const;

 private:
  explicit TlsReloader(TlsOptions options);
  absl::Status Publish(const TlsFiles& files);
  void Run();
  // At exit: ends the reload thread, drops the provider (so gRPC's watcher
  // ends too unless a live channel or server holds it) and removes dir_.
  void StopForExit();

  const TlsOptions options_;
  std::string dir_;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;  // guarded by mu_

  mutable std::mutex mu_;
  TlsFiles published_;     // guarded by mu_
  bool have_published_ = false;
  std::string last_bad_;   // the last refused contents (BadKey): warned and counted once
  bool have_bad_ = false;
  uint64_t failures_ = 0;
  uint64_t reloads_ = 0;
  uint64_t generation_ = 0;
  int64_t last_mtime_s_ = 0;
  bool stop_ = false;
  std::condition_variable wake_;
  std::thread thread_;
};

// Reloads refused (a distinct bad content each) and taken, by every
// TlsReloader of the process.
[[nodiscard]] uint64_t TlsReloadFailures();
[[nodiscard]] uint64_t TlsReloads();
// tandem_tls_reload_failures_total and tandem_tls_reloads_total in
// `registry` (kept alive with them), counting from the process's start.
void RegisterTlsMetrics(std::shared_ptr<prometheus::Registry> registry);

}  // namespace tandem::rpc
