#include "tandem/rpc/framed_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

// Sends every byte of `iov` (advancing it), restarting after partial sends.
absl::Status SendAll(int fd, iovec* iov, int count, const char* what) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
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

}  // namespace

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

FramedSocket::FramedSocket(int fd) : fd_(fd), buf_(kInitialBuffer) {
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

FramedSocket::~FramedSocket() { close(fd_); }

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
      return std::make_unique<FramedSocket>(fd);
    }
    last_error = errno == EINPROGRESS || errno == EAGAIN ? "timed out" : std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(addrs);
  return absl::UnavailableError(absl::StrCat("connecting to ", host, ":", port, ": ", last_error));
}

void FramedSocket::SetTimeouts(int64_t send_ms, int64_t receive_ms) {
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
  return SendAll(fd_, iov, payload.empty() ? 1 : 2, "sending a frame");
}

absl::Status FramedSocket::WriteRaw(std::span<const uint8_t> bytes) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  return SendAll(fd_, &iov, 1, "sending");
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
  while (len_ - pos_ < n) {
    const ssize_t r = recv(fd_, buf_.data() + len_, buf_.size() - len_, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return RecvError(r, "receiving a frame", /*between_frames=*/pos_ == len_);
    len_ += static_cast<size_t>(r);
    bytes_received_ += static_cast<uint64_t>(r);
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
  const size_t buffered = std::min(dst.size(), len_ - pos_);
  if (buffered > 0) {  // an empty dst may have no data() at all (memcpy's null is UB)
    std::memcpy(dst.data(), buf_.data() + pos_, buffered);
    pos_ += buffered;
    on_piece(dst.first(buffered));
  }
  size_t got = buffered;
  while (got < dst.size()) {
    // The buffer is empty here: receive the rest straight into dst and let
    // whatever follows it land in the buffer.
    pos_ = len_ = 0;
    iovec iov[2] = {{dst.data() + got, dst.size() - got}, {buf_.data(), buf_.size()}};
    const ssize_t r = readv(fd_, iov, 2);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return RecvError(r, "receiving payload", /*between_frames=*/false);
    bytes_received_ += static_cast<uint64_t>(r);
    const size_t into_dst = std::min(static_cast<size_t>(r), dst.size() - got);
    on_piece(dst.subspan(got, into_dst));
    got += into_dst;
    len_ = static_cast<size_t>(r) - into_dst;
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
