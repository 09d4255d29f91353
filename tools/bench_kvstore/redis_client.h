// A minimal RESP client of redis-server and a way to start one, for
// bench_kvstore's anchor: pipelined SET/GET of block-sized values, each GET
// copied into a caller-provided buffer as our Load does; over plain TCP,
// (ConnectTls) redis's own TLS port with a client certificate, or
// (ConnectUnix) its Unix-domain socket.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "tandem/common/logging.h"

namespace tandem {

class Redis {
 public:
  bool Connect(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd_);
      fd_ = -1;
      return false;
    }
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return true;
  }
  // Connects to redis-server's Unix-domain socket at `path`.
  bool ConnectUnix(const std::string& path) {
    sockaddr_un addr{};
    if (path.size() >= sizeof addr.sun_path) return false;
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd_);
      fd_ = -1;
      return false;
    }
    return true;
  }
  // Connect, then a TLS handshake with `ctx` (which holds the client's
  // certificate and the CA the server's must chain to).
  bool ConnectTls(int port, SSL_CTX* ctx) {
    if (!Connect(port)) return false;
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1 || SSL_connect(ssl_) != 1) {
      SSL_free(ssl_);
      ssl_ = nullptr;
      close(fd_);
      fd_ = -1;
      return false;
    }
    return true;
  }
  ~Redis() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) close(fd_);
  }

  // Pipelined SETs of (key, value) pairs; waits for every +OK.
  void SetAll(const std::vector<std::string>& keys,
              const std::vector<std::span<const uint8_t>>& values) {
    std::vector<std::string> headers;
    std::vector<iovec> iov;
    static const char kCrlf[] = "\r\n";
    for (size_t i = 0; i < keys.size(); ++i) {
      headers.push_back("*3\r\n$3\r\nSET\r\n$" + std::to_string(keys[i].size()) + "\r\n" + keys[i] +
                        "\r\n$" + std::to_string(values[i].size()) + "\r\n");
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      iov.push_back({headers[i].data(), headers[i].size()});
      iov.push_back({const_cast<uint8_t*>(values[i].data()), values[i].size()});
      iov.push_back({const_cast<char*>(kCrlf), 2});
    }
    WriteAll(iov);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::string line = ReadLine();
      TANDEM_CHECK(line == "+OK") << "redis SET answered " << line;
    }
  }

  // EXISTS of `keys` in one command (redis's batched existence check);
  // returns how many exist.
  int64_t Exists(const std::vector<std::string>& keys) {
    std::string req = "*" + std::to_string(keys.size() + 1) + "\r\n$6\r\nEXISTS\r\n";
    for (const auto& k : keys) req += "$" + std::to_string(k.size()) + "\r\n" + k + "\r\n";
    std::vector<iovec> iov{{req.data(), req.size()}};
    WriteAll(iov);
    std::string line = ReadLine();
    TANDEM_CHECK(!line.empty() && line[0] == ':') << "redis EXISTS answered " << line;
    return std::stoll(line.substr(1));
  }

  // Pipelined GETs into `dst` (each the value's size).
  void GetAll(const std::vector<std::string>& keys, const std::vector<std::span<uint8_t>>& dst) {
    std::string req;
    for (const auto& k : keys) {
      req += "*2\r\n$3\r\nGET\r\n$" + std::to_string(k.size()) + "\r\n" + k + "\r\n";
    }
    std::vector<iovec> iov{{req.data(), req.size()}};
    WriteAll(iov);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::string line = ReadLine();
      TANDEM_CHECK(!line.empty() && line[0] == '$') << "redis GET answered " << line;
      const size_t n = std::stoull(line.substr(1));
      TANDEM_CHECK(n == dst[i].size());
      ReadExact(dst[i].data(), n);
      char crlf[2];
      ReadExact(reinterpret_cast<uint8_t*>(crlf), 2);
    }
  }

 private:
  void WriteAll(std::vector<iovec> iov) {
    if (ssl_ != nullptr) {
      for (const iovec& v : iov) {
        size_t done = 0;
        TANDEM_CHECK(v.iov_len == 0 || SSL_write_ex(ssl_, v.iov_base, v.iov_len, &done) == 1)
            << "TLS write to redis failed";
      }
      return;
    }
    size_t idx = 0;
    while (idx < iov.size()) {
      const int cnt = static_cast<int>(std::min<size_t>(iov.size() - idx, 512));
      ssize_t w = writev(fd_, iov.data() + idx, cnt);
      TANDEM_CHECK(w > 0) << "writev to redis failed";
      size_t left = static_cast<size_t>(w);
      while (idx < iov.size() && left >= iov[idx].iov_len) left -= iov[idx++].iov_len;
      if (left > 0) {
        iov[idx].iov_base = static_cast<char*>(iov[idx].iov_base) + left;
        iov[idx].iov_len -= left;
      }
    }
  }
  void Fill() {
    if (pos_ == len_) pos_ = len_ = 0;
    const ssize_t r = ReadSome(buf_.data() + len_, buf_.size() - len_);
    TANDEM_CHECK(r > 0) << "redis connection closed";
    len_ += r;
  }
  std::string ReadLine() {
    for (;;) {
      for (size_t i = pos_; i + 1 < len_; ++i) {
        if (buf_[i] == '\r' && buf_[i + 1] == '\n') {
          std::string line(buf_.data() + pos_, i - pos_);
          pos_ = i + 2;
          return line;
        }
      }
      if (pos_ > 0) {  // compact
        std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
        len_ -= pos_;
        pos_ = 0;
      }
      Fill();
    }
  }
  void ReadExact(uint8_t* dst, size_t n) {
    const size_t buffered = std::min(n, len_ - pos_);
    std::memcpy(dst, buf_.data() + pos_, buffered);
    pos_ += buffered;
    size_t got = buffered;
    while (got < n) {
      const ssize_t r = ReadSome(dst + got, n - got);
      TANDEM_CHECK(r > 0) << "redis connection closed";
      got += r;
    }
  }
  ssize_t ReadSome(void* dst, size_t n) {
    if (ssl_ == nullptr) return read(fd_, dst, n);
    size_t done = 0;
    return SSL_read_ex(ssl_, dst, n, &done) == 1 ? static_cast<ssize_t>(done) : -1;
  }

  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::vector<char> buf_ = std::vector<char>(1 << 20);
  size_t pos_ = 0, len_ = 0;
};

// redis-server's TLS port: its certificate and key, and the CA that client
// certificates must chain to (--tls-auth-clients yes: mutual TLS).
struct RedisTls {
  int port = 0;  // 0: no TLS port
  std::string cert_file, key_file, ca_file;
};

// Starts redis-server on 127.0.0.1:`port` without persistence, also on the
// Unix-domain socket `unix_socket` unless it is empty; its pid.
inline pid_t StartRedis(const std::string& binary, int port, const RedisTls& tls = {},
                        const std::string& unix_socket = "") {
  pid_t pid = fork();
  if (pid == 0) {
    if (freopen("/dev/null", "w", stdout) == nullptr ||
        freopen("/dev/null", "w", stderr) == nullptr) {
      _exit(126);
    }
    const std::string p = std::to_string(port), tp = std::to_string(tls.port);
    std::vector<const char*> argv = {binary.c_str(), "--port",       p.c_str(), "--bind",
                                     "127.0.0.1",    "--save",       "",        "--appendonly",
                                     "no",           "--daemonize",  "no",      "--loglevel",
                                     "warning"};
    if (tls.port > 0) {
      for (const char* a : {"--tls-port", tp.c_str(), "--tls-cert-file", tls.cert_file.c_str(),
                            "--tls-key-file", tls.key_file.c_str(), "--tls-ca-cert-file",
                            tls.ca_file.c_str(), "--tls-auth-clients", "yes"}) {
        argv.push_back(a);
      }
    }
    if (!unix_socket.empty()) {
      for (const char* a : {"--unixsocket", unix_socket.c_str(), "--unixsocketperm", "700"}) {
        argv.push_back(a);
      }
    }
    argv.push_back(nullptr);
    execv(binary.c_str(), const_cast<char* const*>(argv.data()));
    _exit(127);
  }
  return pid;
}

}  // namespace tandem
