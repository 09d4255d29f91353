#include "tandem/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <fcntl.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace tandem::metrics {

absl::Status ExposerOptions::Validate() const {
  if (listen_address.empty()) return absl::OkStatus();
  const size_t colon = listen_address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen_address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", listen_address, "' is not host:port"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const ExposerOptions& options, std::shared_ptr<prometheus::Registry> registry,
    std::function<void()> on_scrape) {
  if (options.listen_address.empty()) return std::unique_ptr<MetricsServer>();
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  const size_t colon = options.listen_address.rfind(':');
  std::string host = options.listen_address.substr(0, colon);
  int port = 0;
  (void)absl::SimpleAtoi(options.listen_address.substr(colon + 1), &port);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0" || host == "*") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (host.empty() || host == "*") host = "0.0.0.0";
  } else if (host == "localhost") {
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics host '", host, "' is not an IPv4 address"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::move(registry);
  server->on_scrape_ = std::move(on_scrape);
  server->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(server->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (server->listen_fd_ < 0 ||
      bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(server->listen_fd_, 16) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", options.listen_address,
                                               ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  server->port_ = ntohs(addr.sin_port);
  server->url_ = absl::StrCat("http://", host, ":", server->port_, "/metrics");
  if (pipe2(server->wake_pipe_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  MetricsServer* raw = server.get();
  server->thread_ = std::thread([raw] { raw->Loop(); });
  return server;
}

MetricsServer::~MetricsServer() {
  if (wake_pipe_[1] >= 0) {
    char c = 0;
    (void)!write(wake_pipe_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_pipe_[0], wake_pipe_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void MetricsServer::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        Serve(fd);
        close(fd);
      }
    }
  }
}

void MetricsServer::Serve(int fd) {
  // Read the request head (bounded size and time).
  std::string request;
  char buf[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    request.append(buf, static_cast<size_t>(n));
  }
  std::string status = "200 OK";
  std::string body;
  std::string type = "text/plain; version=0.0.4; charset=utf-8";
  if (request.rfind("GET /metrics", 0) == 0) {
    if (on_scrape_) on_scrape_();
    body = prometheus::TextSerializer().Serialize(registry_->Collect());
  } else if (request.rfind("GET / ", 0) == 0) {
    body = "see /metrics\n";
  } else {
    status = "404 Not Found";
    body = "not found; try /metrics\n";
  }
  std::string response = absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                                       "\r\nContent-Length: ", body.size(),
                                       "\r\nConnection: close\r\n\r\n", body);
  size_t off = 0;
  while (off < response.size()) {
    ssize_t n = write(fd, response.data() + off, response.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({}, buckets);
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace tandem::metrics
