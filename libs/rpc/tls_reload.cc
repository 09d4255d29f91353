#include "tandem/rpc/tls_reload.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "openssl_ptr.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tandem/common/logging.h"
#include "tandem/metrics/metrics.h"

namespace tandem::rpc {
namespace {

using internal::BioPtr;
using internal::PkeyPtr;
using internal::X509Ptr;

// OpenSSL's last error, then its queue cleared.
std::string OpenSslError() {
  const unsigned long e = ERR_peek_last_error();
  char buf[256] = "no PEM block";
  if (e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::Status Bad(const char* flag, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": ", what));
}

// Every certificate of `pem`, in order, as gRPC's handshaker reads them (the
// same OpenSSL call, the same empty password); other PEM blocks are skipped.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& pem, const char* flag,
                                                        const std::string& path) {
  if (pem.empty()) return Bad(flag, path, "is empty");
  ERR_clear_error();
  BioPtr bio = MemBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, const_cast<char*>(""))) {
    certs.emplace_back(cert);
  }
  const unsigned long e = ERR_peek_last_error();
  const bool clean_end = ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
  if (certs.empty()) {
    return Bad(flag, path, absl::StrCat("holds no PEM certificate (", OpenSslError(), ")"));
  }
  if (!clean_end) {
    return Bad(flag, path,
               absl::StrCat("certificate ", certs.size() + 1, " is cut off or does not parse (",
                            OpenSslError(), ")"));
  }
  ERR_clear_error();
  return certs;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot read ", path, " (", std::strerror(errno), ")"));
  }
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read ", path));
  return text.str();
}

// Process-wide reload counts and the registries that mirror them.
struct TlsMetrics {
  std::mutex mu;
  uint64_t failures = 0;
  uint64_t reloads = 0;
  std::vector<std::shared_ptr<prometheus::Registry>> registries;
  std::vector<prometheus::Counter*> failure_counters;
  std::vector<prometheus::Counter*> reload_counters;
};
TlsMetrics& Metrics() {
  static TlsMetrics* m = new TlsMetrics();  // never freed: reload threads outlive main
  return *m;
}
void CountFailure() {
  TlsMetrics& m = Metrics();
  std::lock_guard<std::mutex> lock(m.mu);
  ++m.failures;
  for (prometheus::Counter* c : m.failure_counters) c->Increment();
}
void CountReload() {
  TlsMetrics& m = Metrics();
  std::lock_guard<std::mutex> lock(m.mu);
  ++m.reloads;
  for (prometheus::Counter* c : m.reload_counters) c->Increment();
}

// One key for "these contents were refused already" (or this read error).
std::string BadKey(const absl::StatusOr<TlsFiles>& files) {
  if (!files.ok()) return absl::StrCat("error\n", files.status().message());
  return absl::StrCat("files\n", files->cert_pem.size(), ":", files->cert_pem,
                      files->key_pem.size(), ":", files->key_pem, files->ca_pem);
}

absl::Status WriteFile(const std::string& path, const std::string& text, int64_t mtime_s) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("creating ", path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("writing ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  const timespec times[2] = {{.tv_sec = mtime_s, .tv_nsec = 0}, {.tv_sec = mtime_s, .tv_nsec = 0}};
  const int rc = ::futimens(fd, times);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("touching ", path, ": ", std::strerror(err)));
  return absl::OkStatus();
}

using ReloaderKey = std::tuple<std::string, std::string, std::string, int32_t>;
std::mutex reloaders_mu;
std::map<ReloaderKey, std::shared_ptr<TlsReloader>>& Reloaders() {
  static auto* m = new std::map<ReloaderKey, std::shared_ptr<TlsReloader>>();  // never freed
  return *m;
}

// "tandem-tls-<pid namespace>-<pid>-": a private directory's name prefix,
// so that only processes of this pid namespace are judged dead or alive.
std::string PrivateDirPrefix(pid_t pid) {
  struct stat ns {};
  const unsigned long long ns_id =
      ::stat("/proc/self/ns/pid", &ns) == 0 ? static_cast<unsigned long long>(ns.st_ino) : 0;
  return absl::StrCat("tandem-tls-", ns_id, "-", pid, "-");
}

// The private copies of processes that ended without their exit handlers
// (killed, e.g. a probe's `tandem health` past its timeout): they hold keys.
void RemoveDirsOfDeadProcesses(const std::string& tmp_dir) {
  const std::string ours = PrivateDirPrefix(0);  // "tandem-tls-<ns>-0-"
  const std::string ns_prefix = ours.substr(0, ours.size() - 2);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tmp_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(ns_prefix, 0) != 0) continue;
    int pid = 0;
    if (std::sscanf(name.c_str() + ns_prefix.size(), "%d-", &pid) != 1 || pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code remove_ec;
    std::filesystem::remove_all(entry.path(), remove_ec);
  }
}

}  // namespace

absl::StatusOr<TlsFiles> ReadTlsFiles(const TlsOptions& o) {
  TlsFiles files;
  if (!o.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(o.cert_file, "tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(o.key_file, "tls-key");
    if (!key.ok()) return key.status();
    files.cert_pem = *std::move(cert);
    files.key_pem = *std::move(key);
  }
  if (!o.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(o.ca_file, "tls-ca");
    if (!ca.ok()) return ca.status();
    files.ca_pem = *std::move(ca);
  }
  return files;
}

absl::Status CheckTlsFiles(const TlsOptions& o, const TlsFiles& files) {
  if (!o.cert_file.empty()) {
    absl::StatusOr<std::vector<X509Ptr>> chain =
        ParseCertificates(files.cert_pem, "tls-cert", o.cert_file);
    if (!chain.ok()) return chain.status();
    if (files.key_pem.empty()) return Bad("tls-key", o.key_file, "is empty");
    ERR_clear_error();
    BioPtr bio = MemBio(files.key_pem);
    PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, const_cast<char*>("")));
    if (key == nullptr) {
      return Bad("tls-key", o.key_file,
                 absl::StrCat("holds no PEM private key (", OpenSslError(), ")"));
    }
    if (X509_check_private_key(chain->front().get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat("--tls-key ", o.key_file,
                                                     " does not match the certificate in --tls-cert ",
                                                     o.cert_file));
    }
  }
  if (!o.ca_file.empty()) {
    absl::StatusOr<std::vector<X509Ptr>> ca = ParseCertificates(files.ca_pem, "tls-ca", o.ca_file);
    if (!ca.ok()) return ca.status();
  }
  return absl::OkStatus();
}

std::shared_ptr<TlsReloader> TlsReloader::For(const TlsOptions& o) {
  static const bool cleanup_registered = [] {
    // The private copies hold a key: remove them when the process exits
    // (the frontend leaves by quick_exit). And stop every thread that calls
    // into OpenSSL on a reloader's behalf first: OpenSSL frees its state in
    // its own exit handler (Debian's libssl initialises it at load, before
    // anything of ours, so OPENSSL_INIT_NO_ATEXIT cannot be asked), and
    // rpc_tls_reload_test once segfaulted there under ASan while a
    // reloader's thread and gRPC's certificate watcher (it parses the files
    // with OpenSSL every second) still ran. Handlers run in the reverse
    // order of registration, so this one runs before OpenSSL's.
    static constexpr void (*kRemoveAll)() = [] {
      std::lock_guard<std::mutex> lock(reloaders_mu);
      for (auto& [key, reloader] : Reloaders()) reloader->StopForExit();
    };
    std::atexit(kRemoveAll);
    std::at_quick_exit(kRemoveAll);
    return true;
  }();
  (void)cleanup_registered;
  std::lock_guard<std::mutex> lock(reloaders_mu);
  std::shared_ptr<TlsReloader>& slot =
      Reloaders()[ReloaderKey(o.cert_file, o.key_file, o.ca_file, o.reload_interval_s)];
  if (slot == nullptr) slot.reset(new TlsReloader(o));
  return slot;
}

TlsReloader::TlsReloader(TlsOptions options) : options_(std::move(options)) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string tmp_dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  RemoveDirsOfDeadProcesses(tmp_dir);
  std::string templ = absl::StrCat(tmp_dir, "/", PrivateDirPrefix(::getpid()), "XXXXXX");
  // A directory only this user reads (mkdtemp: mode 0700).
  TANDEM_CHECK(::mkdtemp(templ.data()) != nullptr)
      << "cannot create a private directory for the TLS files: " << templ << ": "
      << std::strerror(errno) << " (TMPDIR must name a writable directory)";
  dir_ = templ;
  (void)Reload();  // logs and counts bad files
  const std::string current = dir_ + "/current/";
  const unsigned interval = kPublishedPollS;
  if (options_.cert_file.empty()) {
    provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        current + "ca.pem", interval);
  } else {
    provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        current + "key.pem", current + "cert.pem",
        options_.ca_file.empty() ? "" : current + "ca.pem", interval);
  }
  thread_ = std::thread([this] { Run(); });
}

TlsReloader::~TlsReloader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  provider_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void TlsReloader::StopForExit() {
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    provider = std::move(provider_);
  }
  wake_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  // gRPC's watcher thread ends with the provider's last reference (the
  // credentials of channels and servers still open hold others).
  provider.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> TlsReloader::provider() const {
  std::lock_guard<std::mutex> lock(mu_);
  return provider_;
}

void TlsReloader::Run() {
  pthread_setname_np(pthread_self(), "tls-reload");
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, std::chrono::seconds(options_.reload_interval_s),
                         [this] { return stop_; })) {
    lock.unlock();
    (void)Reload();
    lock.lock();
  }
}

absl::Status TlsReloader::Reload() {
  absl::StatusOr<TlsFiles> files = ReadTlsFiles(options_);
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return absl::OkStatus();
  if (files.ok() && have_published_ && *files == published_) {
    have_bad_ = false;  // back to the good set: a later bad one is news again
    return absl::OkStatus();
  }
  absl::Status s = files.ok() ? CheckTlsFiles(options_, *files) : files.status();
  if (s.ok()) s = Publish(*files);
  if (s.ok()) {
    have_bad_ = false;
    if (generation_ > 1) {
      CountReload();
      ++reloads_;
      TANDEM_LOG(INFO) << "TLS: reloaded " << (options_.cert_file.empty() ? options_.ca_file
                                                                            : options_.cert_file);
    }
    return absl::OkStatus();
  }
  std::string key = BadKey(files);
  if (!have_bad_ || key != last_bad_) {
    CountFailure();
    ++failures_;
    TANDEM_LOG(WARNING) << (have_published_
                                ? "TLS: keeping the last good files, refused: "
                                : "TLS: no valid files yet, handshakes fail until they are fixed: ")
                        << s.message();
    last_bad_ = std::move(key);
    have_bad_ = true;
  }
  return s;
}

absl::Status TlsReloader::Publish(const TlsFiles& files) {
  const uint64_t generation = generation_ + 1;
  const std::string name = absl::StrCat("g", generation);
  const std::string gen_dir = absl::StrCat(dir_, "/", name);
  std::error_code ec;
  std::filesystem::remove_all(gen_dir, ec);
  if (::mkdir(gen_dir.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("creating ", gen_dir, ": ", std::strerror(errno)));
  }
  // gRPC pairs a key with a certificate only when their mtimes (seconds) did
  // not change while it read them: each generation gets a later one.
  const int64_t mtime_s = std::max<int64_t>(std::time(nullptr), last_mtime_s_ + 1);
  if (!options_.cert_file.empty()) {
    if (absl::Status s = WriteFile(gen_dir + "/cert.pem", files.cert_pem, mtime_s); !s.ok()) return s;
    if (absl::Status s = WriteFile(gen_dir + "/key.pem", files.key_pem, mtime_s); !s.ok()) return s;
  }
  if (!options_.ca_file.empty()) {
    if (absl::Status s = WriteFile(gen_dir + "/ca.pem", files.ca_pem, mtime_s); !s.ok()) return s;
  }
  const std::string link = dir_ + "/current.tmp";
  ::unlink(link.c_str());
  if (::symlink(name.c_str(), link.c_str()) != 0 ||
      ::rename(link.c_str(), (dir_ + "/current").c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("publishing ", gen_dir, " as ", dir_, "/current: ", std::strerror(errno)));
  }
  // The generation before stays: gRPC may be reading it right now.
  if (generation >= 3) std::filesystem::remove_all(absl::StrCat(dir_, "/g", generation - 2), ec);
  generation_ = generation;
  last_mtime_s_ = mtime_s;
  published_ = files;
  have_published_ = true;
  return absl::OkStatus();
}

TlsFiles TlsReloader::published() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

uint64_t TlsReloader::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

uint64_t TlsReloader::reloads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reloads_;
}

uint64_t TlsReloadFailures() {
  TlsMetrics& m = Metrics();
  std::lock_guard<std::mutex> lock(m.mu);
  return m.failures;
}

uint64_t TlsReloads() {
  TlsMetrics& m = Metrics();
  std::lock_guard<std::mutex> lock(m.mu);
  return m.reloads;
}

void RegisterTlsMetrics(std::shared_ptr<prometheus::Registry> registry) {
  TlsMetrics& m = Metrics();
  prometheus::Counter& failures = metrics::AddCounter(
      *registry, "tandem_tls_reload_failures_total",
      "TLS file sets refused at a reload (empty, unparsable, or a key that does not match its "
      "certificate), each distinct content once; the last good set stays in use");
  prometheus::Counter& reloads = metrics::AddCounter(
      *registry, "tandem_tls_reloads_total", "New TLS file sets taken at a reload");
  std::lock_guard<std::mutex> lock(m.mu);
  failures.Increment(static_cast<double>(m.failures));
  reloads.Increment(static_cast<double>(m.reloads));
  m.registries.push_back(std::move(registry));
  m.failure_counters.push_back(&failures);
  m.reload_counters.push_back(&reloads);
}

}  // namespace tandem::rpc
