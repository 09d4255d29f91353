#include "tandem/rpc/framed_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {
namespace {

constexpr size_t kInitialBuffer = 16 << 10;

timeval ToTimeval(int64_t ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

void PutLe32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetLe32(const uint8_t* in) {
  return static_cast<uint32_t>(in[0]) | static_cast<uint32_t>(in[1]) << 8 |
         static_cast<uint32_t>(in[2]) << 16 | static_cast<uint32_t>(in[3]) << 24;
}

absl::Status SendError(const char* what) {
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": no progress within the send timeout"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Waits until `fd` is ready for `events` (POLLIN / POLLOUT), at most
// `timeout_ms` (0 = forever).
absl::Status WaitReady(int fd, short events, int64_t timeout_ms, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, timeout_ms > 0 ? static_cast<int>(timeout_ms) : -1);
    if (rc > 0) return absl::OkStatus();
    if (rc == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, events == POLLIN ? ": nothing received within the receive timeout"
                                              : ": no progress within the send timeout"));
    }
    if (errno != EINTR)
      return absl::UnavailableError(absl::StrCat(what, ": poll: ", std::strerror(errno)));
  }
}

// Keeps SIGPIPE from this thread while it lives. OpenSSL writing to the
// socket itself (TlsWrites::kSocket) uses write(2), not
// send(MSG_NOSIGNAL), so a write to a connection the peer has
// reset would raise SIGPIPE and kill the process; blocked, it stays pending
// and is taken back here (unless it was pending before), and the write
// fails with EPIPE instead.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

std::atomic<FramedSocket::TlsWrites> tls_writes_override{FramedSocket::TlsWrites::kAuto};

FramedSocket::TlsWrites ResolveTlsWrites() {
  const FramedSocket::TlsWrites forced = tls_writes_override.load();
  if (forced != FramedSocket::TlsWrites::kAuto) return forced;
  static const bool kernel_tls = access("/sys/module/tls", F_OK) == 0;
  return kernel_tls ? FramedSocket::TlsWrites::kSocket : FramedSocket::TlsWrites::kBuffered;
}

}  // namespace

std::string TakeOpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no reason given" : out;
}

void FramedSocket::TEST_SetTlsWrites(TlsWrites writes) { tls_writes_override.store(writes); }

absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(std::string_view address) {
  std::string_view a = address;
  for (std::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (a.substr(0, scheme.size()) == scheme) {
      a.remove_prefix(scheme.size());
      break;
    }
  }
  std::string_view host, port;
  if (!a.empty() && a.front() == '[') {
    const size_t close = a.find(']');
    if (close != std::string_view::npos && close + 1 < a.size() && a[close + 1] == ':') {
      host = a.substr(1, close - 1);
      port = a.substr(close + 2);
    }
  } else if (const size_t colon = a.rfind(':'); colon != std::string_view::npos) {
    host = a.substr(0, colon);
    port = a.substr(colon + 1);
  }
  const bool numeric_port =
      !port.empty() && port.size() <= 5 &&
      port.find_first_not_of("0123456789") == std::string_view::npos;
  const bool bare_v6 = host.find(':') != std::string_view::npos && a.front() != '[';
  if (host.empty() || !numeric_port || bare_v6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address \"", std::string(address), "\" is not host:port, [ipv6]:port or dns:///host:port"));
  }
  return std::pair{std::string(host), std::string(port)};
}

struct FramedSocket::Tls {
  SSL* ssl = nullptr;
  bool server = false;
  // Buffered writes: the memory BIO OpenSSL writes records into (owned by
  // ssl); null when OpenSSL writes to the socket.
  BIO* out = nullptr;
  // Guards `ssl`; never held across a wait, so a reader blocked for data
  // does not hold up a writer.
  std::mutex mu;
  ~Tls() { SSL_free(ssl); }
};

FramedSocket::FramedSocket(int fd) : fd_(fd), buf_(kInitialBuffer) {
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

FramedSocket::~FramedSocket() {
  tls_.reset();
  close(fd_);
}

absl::StatusOr<std::unique_ptr<FramedSocket>> FramedSocket::Connect(const std::string& host,
                                                                    const std::string& port,
                                                                    int64_t timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addrs = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &addrs); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolving ", host, ":", port, ": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    // On Linux the send timeout also bounds connect().
    const timeval tv = ToTimeval(timeout_ms);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      freeaddrinfo(addrs);
      auto sock = std::make_unique<FramedSocket>(fd);
      sock->SetTimeouts(timeout_ms, timeout_ms);
      return sock;
    }
    last_error = errno == EINPROGRESS || errno == EAGAIN ? "timed out" : std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(addrs);
  return absl::UnavailableError(absl::StrCat("connecting to ", host, ":", port, ": ", last_error));
}

absl::StatusOr<std::unique_ptr<FramedSocket>> FramedSocket::ConnectUnix(const std::string& path,
                                                                        int64_t timeout_ms) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix socket path \"", path, "\" is empty or too long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  auto sock = std::make_unique<FramedSocket>(fd);
  sock->SetTimeouts(timeout_ms, timeout_ms);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return absl::UnavailableError(absl::StrCat("connecting to ", path, ": ", std::strerror(errno)));
  }
  return sock;
}

absl::Status FramedSocket::SendWithFd(std::span<const uint8_t> bytes, int fd) {
  if (tls_ != nullptr) return absl::FailedPreconditionError("SendWithFd under TLS");
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  ssize_t w;
  do {
    w = sendmsg(fd_, &msg, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  if (w < 0) return SendError("sending a descriptor");
  if (static_cast<size_t>(w) != bytes.size()) {
    // The descriptor went with the first byte; the rest as plain bytes.
    return WriteRaw(bytes.subspan(static_cast<size_t>(w)));
  }
  return absl::OkStatus();
}

absl::Status FramedSocket::ReceiveWithFd(std::span<uint8_t> bytes, int* fd) {
  *fd = -1;
  if (tls_ != nullptr) return absl::FailedPreconditionError("ReceiveWithFd under TLS");
  iovec iov{bytes.data(), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t r;
  do {
    r = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return RecvError(r, "receiving a descriptor", false);
  bytes_received_ += static_cast<uint64_t>(r);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int))) {
      std::memcpy(fd, CMSG_DATA(c), sizeof *fd);
    }
  }
  if (static_cast<size_t>(r) < bytes.size()) {
    absl::Status s = ReadRaw(bytes.subspan(static_cast<size_t>(r)));
    if (!s.ok() && *fd >= 0) close(std::exchange(*fd, -1));
    return s;
  }
  return absl::OkStatus();
}

std::string LocalHostId() {
  char buf[64] = {};
  const int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  std::string id(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

void FramedSocket::SetTimeouts(int64_t send_ms, int64_t receive_ms) {
  send_timeout_ms_ = send_ms;
  receive_timeout_ms_ = receive_ms;
  const timeval snd = ToTimeval(send_ms);
  const timeval rcv = ToTimeval(receive_ms);
  setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof snd);
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof rcv);
}

absl::Status FramedSocket::Write(const google::protobuf::MessageLite& frame,
                                 std::span<const uint8_t> payload) {
  const size_t n = frame.ByteSizeLong();
  if (n > UINT32_MAX) return absl::InvalidArgumentError("frame over 4 GiB");
  scratch_.resize(4 + n);
  PutLe32(static_cast<uint32_t>(n), scratch_.data());
  if (!frame.SerializeToArray(scratch_.data() + 4, static_cast<int>(n))) {
    return absl::InternalError("serializing a frame failed");
  }
  iovec iov[2] = {{scratch_.data(), scratch_.size()},
                  {const_cast<uint8_t*>(payload.data()), payload.size()}};
  return SendAll(iov, payload.empty() ? 1 : 2, "sending a frame");
}

absl::Status FramedSocket::WriteRaw(std::span<const uint8_t> bytes) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  return SendAll(&iov, 1, "sending");
}

absl::Status FramedSocket::StartTls(ssl_ctx_st* context, bool server,
                                    const std::string& peer_host) {
  if (tls_ != nullptr) return absl::FailedPreconditionError("TLS already started");
  auto tls = std::make_unique<Tls>();
  tls->server = server;
  tls->ssl = SSL_new(context);
  if (tls->ssl == nullptr) return absl::InternalError(absl::StrCat("TLS: ", TakeOpenSslErrors()));
  if (ResolveTlsWrites() == TlsWrites::kBuffered) {
    BIO* in = BIO_new_socket(fd_, BIO_NOCLOSE);
    BIO* out = BIO_new(BIO_s_mem());
    if (in == nullptr || out == nullptr) {
      BIO_free(in);
      BIO_free(out);
      return absl::InternalError(absl::StrCat("TLS: ", TakeOpenSslErrors()));
    }
    SSL_set_bio(tls->ssl, in, out);  // the session owns both
    tls->out = out;
  } else if (SSL_set_fd(tls->ssl, fd_) != 1) {
    return absl::InternalError(absl::StrCat("TLS: ", TakeOpenSslErrors()));
  }
  SSL_set_mode(tls->ssl, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (!server && !peer_host.empty()) {
    // The server's certificate must name the host dialled, as gRPC checks
    // its target: an IP SAN for an address, a DNS SAN for a name (also
    // sent as SNI).
    X509_VERIFY_PARAM* param = SSL_get0_param(tls->ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, peer_host.c_str()) != 1) {
      ERR_clear_error();
      if (SSL_set1_host(tls->ssl, peer_host.c_str()) != 1 ||
          SSL_set_tlsext_host_name(tls->ssl, peer_host.c_str()) != 1) {
        return absl::InternalError(absl::StrCat("TLS: ", TakeOpenSslErrors()));
      }
    }
  }
  const int flags = fcntl(fd_, F_GETFL);
  if (flags < 0 || fcntl(fd_, F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("TLS: fcntl: ", std::strerror(errno)));
  }
  tls_ = std::move(tls);
  std::optional<ScopedSigpipeBlock> no_sigpipe;
  if (!tls_writes_buffered()) no_sigpipe.emplace();
  absl::StatusOr<size_t> done = TlsCall(TlsOp::kHandshake, nullptr, 0, "TLS handshake", false);
  if (!done.ok()) {
    tls_.reset();  // the connection is not usable; the caller closes it
    return done.status();
  }
  return absl::OkStatus();
}

bool FramedSocket::tls_writes_buffered() const { return tls_ != nullptr && tls_->out != nullptr; }

absl::Status FramedSocket::FlushTlsLocked(const char* what) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(tls_->out, &data);
  size_t sent = 0;
  while (sent < static_cast<size_t>(n)) {
    const ssize_t w = send(fd_, data + sent, static_cast<size_t>(n) - sent, MSG_NOSIGNAL);
    if (w >= 0) {
      sent += static_cast<size_t>(w);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return SendError(what);
    if (absl::Status s = WaitReady(fd_, POLLOUT, send_timeout_ms_, what); !s.ok()) return s;
  }
  (void)BIO_reset(tls_->out);
  return absl::OkStatus();
}

bool FramedSocket::kernel_tls_send() const {
  return tls_ != nullptr && BIO_get_ktls_send(SSL_get_wbio(tls_->ssl)) != 0;
}

std::vector<std::string> FramedSocket::PeerUris() const {
  std::vector<std::string> uris;
  if (tls_ == nullptr) return uris;
  std::lock_guard<std::mutex> lock(tls_->mu);
  X509* cert = SSL_get0_peer_certificate(tls_->ssl);
  if (cert == nullptr || SSL_get_verify_result(tls_->ssl) != X509_V_OK) return uris;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return uris;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                      static_cast<size_t>(ASN1_STRING_length(uri)));
  }
  GENERAL_NAMES_free(names);
  return uris;
}

absl::StatusOr<size_t> FramedSocket::TlsCall(TlsOp op, void* data, size_t n, const char* what,
                                             bool between_frames) {
  for (;;) {
    size_t done = 0;
    int err = SSL_ERROR_NONE;
    int saved_errno = 0;
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(tls_->mu);
      ERR_clear_error();
      int rc = 0;
      switch (op) {
        case TlsOp::kHandshake:
          rc = tls_->server ? SSL_accept(tls_->ssl) : SSL_connect(tls_->ssl);
          break;
        case TlsOp::kRead:
          rc = SSL_read_ex(tls_->ssl, data, n, &done);
          break;
        case TlsOp::kWrite:
          rc = SSL_write_ex(tls_->ssl, data, n, &done);
          break;
      }
      if (rc <= 0) {
        saved_errno = errno;
        err = SSL_get_error(tls_->ssl, rc);
      }
      // Buffered writes: whatever the call encrypted goes out now, before
      // any wait (a handshake's flight, a read's alert, a whole write).
      if (tls_->out != nullptr && BIO_pending(tls_->out) > 0) {
        if (absl::Status f = FlushTlsLocked(what); !f.ok()) return f;
      }
      if (rc <= 0) {
        if (err == SSL_ERROR_SSL) {
          reason = TakeOpenSslErrors();
          if (op == TlsOp::kHandshake && !tls_->server) {
            const long v = SSL_get_verify_result(tls_->ssl);
            if (v != X509_V_OK) {
              absl::StrAppend(&reason, " (", X509_verify_cert_error_string(v), ")");
            }
          }
        }
      }
    }
    switch (err) {
      case SSL_ERROR_NONE:
        if (op == TlsOp::kRead) bytes_received_ += done;
        return done;
      case SSL_ERROR_WANT_READ:
        if (absl::Status s = WaitReady(
                fd_, POLLIN, op == TlsOp::kRead ? receive_timeout_ms_ : send_timeout_ms_, what);
            !s.ok()) {
          return s;
        }
        continue;
      case SSL_ERROR_WANT_WRITE:
        if (absl::Status s = WaitReady(fd_, POLLOUT, send_timeout_ms_, what); !s.ok()) return s;
        continue;
      case SSL_ERROR_ZERO_RETURN:
        return RecvError(0, what, between_frames);
      case SSL_ERROR_SYSCALL:
        // errno 0: the peer closed without close_notify.
        if (saved_errno == 0) return RecvError(0, what, between_frames);
        return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(saved_errno)));
      default:
        return absl::UnavailableError(absl::StrCat(what, ": TLS: ", reason));
    }
  }
}

absl::Status FramedSocket::SendAll(iovec* iov, int count, const char* what) {
  if (tls_ != nullptr) {
    std::optional<ScopedSigpipeBlock> no_sigpipe;
    if (!tls_writes_buffered()) no_sigpipe.emplace();
    // Buffered writes go out in pieces of 256 KiB: a whole payload
    // encrypted into the memory BIO before its first byte was sent left the
    // peer nothing to decrypt meanwhile, and grew the BIO by copying. 2 MiB
    // hot-tier loads over mutual TLS (bench_kvstore): 0.68 GB/s whole, 0.87
    // in 256 KiB pieces; 64 KiB pieces slowed 64 KiB blocks (0.77 -> 0.65).
    constexpr size_t kBufferedPiece = 256 << 10;
    const size_t piece = tls_writes_buffered() ? kBufferedPiece : SIZE_MAX;
    for (int i = 0; i < count; ++i) {
      auto* p = static_cast<uint8_t*>(iov[i].iov_base);
      size_t left = iov[i].iov_len;
      while (left > 0) {
        absl::StatusOr<size_t> w = TlsCall(TlsOp::kWrite, p, std::min(left, piece), what, false);
        if (!w.ok()) return w.status();
        p += *w;
        left -= *w;
      }
    }
    return absl::OkStatus();
  }
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return SendError(what);
    }
    size_t left = static_cast<size_t>(w);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> FramedSocket::ReceiveSome(uint8_t* dst, size_t n, const char* what,
                                                 bool between_frames) {
  if (tls_ != nullptr) return TlsCall(TlsOp::kRead, dst, n, what, between_frames);
  for (;;) {
    const ssize_t r = recv(fd_, dst, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return RecvError(r, what, between_frames);
    bytes_received_ += static_cast<uint64_t>(r);
    return static_cast<size_t>(r);
  }
}

absl::Status FramedSocket::RecvError(ssize_t r, const char* what, bool between_frames) {
  if (r == 0) {
    closed_cleanly_ = between_frames;
    return absl::UnavailableError(absl::StrCat(what, ": connection closed by the peer"));
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": nothing received within the receive timeout"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status FramedSocket::Fill(size_t n) {
  if (pos_ == len_) pos_ = len_ = 0;
  if (buf_.size() - pos_ < n) {
    std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
    len_ -= pos_;
    pos_ = 0;
    if (buf_.size() < n) buf_.resize(n);
  }
  // A read may answer with an alert.
  std::optional<ScopedSigpipeBlock> no_sigpipe;
  if (tls_ != nullptr && !tls_writes_buffered()) no_sigpipe.emplace();
  while (len_ - pos_ < n) {
    absl::StatusOr<size_t> r = ReceiveSome(buf_.data() + len_, buf_.size() - len_,
                                           "receiving a frame", /*between_frames=*/pos_ == len_);
    if (!r.ok()) return r.status();
    len_ += *r;
  }
  return absl::OkStatus();
}

absl::Status FramedSocket::Read(google::protobuf::MessageLite* frame, uint32_t max_frame_bytes) {
  if (absl::Status s = Fill(4); !s.ok()) return s;
  const uint32_t n = GetLe32(buf_.data() + pos_);
  if (n > max_frame_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", n, " bytes; at most ", max_frame_bytes, " are accepted"));
  }
  if (absl::Status s = Fill(4 + size_t{n}); !s.ok()) return s;
  if (!frame->ParseFromArray(buf_.data() + pos_ + 4, static_cast<int>(n))) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", n, "-byte frame is not a valid ", frame->GetTypeName()));
  }
  pos_ += 4 + size_t{n};
  return absl::OkStatus();
}

absl::Status FramedSocket::ReadRaw(std::span<uint8_t> dst,
                                   absl::FunctionRef<void(std::span<const uint8_t>)> on_piece) {
  const std::span<uint8_t> one[1] = {dst};
  return ReadRawScatter(one, [&](size_t, std::span<const uint8_t> piece) { on_piece(piece); });
}

absl::Status FramedSocket::ReadRawScatter(
    std::span<const std::span<uint8_t>> dsts,
    absl::FunctionRef<void(size_t, std::span<const uint8_t>)> on_piece) {
  size_t k = 0;    // the dst being filled
  size_t got = 0;  // bytes of dsts[k] filled
  // Hands `n` bytes just placed at the fill point to on_piece and moves on.
  auto filled = [&](size_t n) {
    while (n > 0) {
      const size_t m = std::min(n, dsts[k].size() - got);
      on_piece(k, dsts[k].subspan(got, m));
      got += m;
      n -= m;
      while (k < dsts.size() && got == dsts[k].size()) {
        ++k;
        got = 0;
      }
    }
  };
  while (k < dsts.size() && got == dsts[k].size()) ++k;  // empty dsts
  // What the read-ahead buffer holds first. (An empty dst may have no data()
  // at all, and memcpy's null is UB: those were skipped.)
  while (k < dsts.size() && pos_ < len_) {
    const size_t n = std::min(dsts[k].size() - got, len_ - pos_);
    std::memcpy(dsts[k].data() + got, buf_.data() + pos_, n);
    pos_ += n;
    filled(n);
  }
  if (k == dsts.size()) return absl::OkStatus();
  pos_ = len_ = 0;  // the buffer is empty here
  if (tls_ != nullptr) {
    // One TLS record at a time, decrypted straight into the dsts.
    std::optional<ScopedSigpipeBlock> no_sigpipe;  // a read may answer with an alert
    if (!tls_writes_buffered()) no_sigpipe.emplace();
    while (k < dsts.size()) {
      absl::StatusOr<size_t> r =
          ReceiveSome(dsts[k].data() + got, dsts[k].size() - got, "receiving payload", false);
      if (!r.ok()) return r.status();
      filled(*r);
    }
    return absl::OkStatus();
  }
  constexpr size_t kMaxIov = 64;
  while (k < dsts.size()) {
    // Straight into the dsts; whatever follows the last of them lands in
    // the buffer (only once the last is in this call's vector).
    iovec iov[kMaxIov + 1];
    size_t n = 0;
    iov[n++] = {dsts[k].data() + got, dsts[k].size() - got};
    size_t j = k + 1;
    for (; j < dsts.size() && n < kMaxIov; ++j) {
      if (!dsts[j].empty()) iov[n++] = {dsts[j].data(), dsts[j].size()};
    }
    if (j == dsts.size()) iov[n++] = {buf_.data(), buf_.size()};
    const ssize_t r = readv(fd_, iov, static_cast<int>(n));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return RecvError(r, "receiving payload", /*between_frames=*/false);
    bytes_received_ += static_cast<uint64_t>(r);
    size_t into_dsts = static_cast<size_t>(r);
    if (j == dsts.size()) {
      size_t room = 0;
      for (size_t i = 0; i + 1 < n; ++i) room += iov[i].iov_len;
      into_dsts = std::min(into_dsts, room);
      len_ = static_cast<size_t>(r) - into_dsts;
    }
    filled(into_dsts);
  }
  return absl::OkStatus();
}

absl::Status FramedSocket::Skip(uint64_t n) {
  std::vector<uint8_t> sink(std::min<uint64_t>(n, 1 << 20));
  while (n > 0) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sink.size()));
    if (absl::Status s = ReadRaw(std::span(sink).first(k)); !s.ok()) return s;
    n -= k;
  }
  return absl::OkStatus();
}

}  // namespace tandem::rpc
