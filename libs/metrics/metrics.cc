#include "tandem/metrics/metrics.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace tandem::metrics {

namespace {

// "host:port", "[v6]:port", ":port". Empty host: every address.
bool SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  } else if (host->find(':') != std::string::npos) {
    return false;  // a bare IPv6 address needs brackets
  }
  return absl::SimpleAtoi(address.substr(colon + 1), port) && *port >= 0 && *port <= 65535;
}

}  // namespace

absl::Status ExposerOptions::Validate() const {
  if (listen_address.empty()) return absl::OkStatus();
  std::string host;
  int port = 0;
  if (!SplitHostPort(listen_address, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", listen_address,
                                                   "' is not host:port (IPv6: [addr]:port)"));
  }
  return absl::OkStatus();
}

MetricsServer::MetricsServer() : http_(std::make_unique<httplib::Server>()) {}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const ExposerOptions& options, std::shared_ptr<prometheus::Registry> registry,
    std::function<void()> on_scrape) {
  if (options.listen_address.empty()) return std::unique_ptr<MetricsServer>();
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::string host;
  int port = 0;
  SplitHostPort(options.listen_address, &host, &port);
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::move(registry);
  server->on_scrape_ = std::move(on_scrape);
  httplib::Server& http = *server->http_;
  http.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  http.set_read_timeout(kReadTimeoutS, 0);
  http.set_keep_alive_timeout(kReadTimeoutS);
  MetricsServer* raw = server.get();
  http.Get("/metrics", [raw](const httplib::Request&, httplib::Response& res) {
    std::string body;
    {
      std::lock_guard<std::mutex> lock(raw->scrape_mu_);
      if (raw->on_scrape_) raw->on_scrape_();
      body = prometheus::TextSerializer().Serialize(raw->registry_->Collect());
    }
    res.set_content(std::move(body), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("see /metrics\n", "text/plain");
  });
  // Empty or "*": every address, IPv6 and IPv4 (a dual-stack socket), or
  // IPv4 only where the host has no IPv6.
  std::vector<std::string> hosts = {host};
  if (host.empty() || host == "*") hosts = {"::", "0.0.0.0"};
  bool bound = false;
  for (const std::string& h : hosts) {
    const int got = port == 0 ? http.bind_to_any_port(h) : (http.bind_to_port(h, port) ? port : -1);
    if (got > 0) {
      host = h;
      server->port_ = got;
      bound = true;
      break;
    }
  }
  if (!bound) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", options.listen_address,
                                               " (address in use or not local?)"));
  }
  const std::string url_host =
      host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
  server->url_ = absl::StrCat("http://", url_host, ":", server->port_, "/metrics");
  server->thread_ = std::thread([raw] { raw->http_->listen_after_bind(); });
  return server;
}

MetricsServer::~MetricsServer() {
  http_->stop();
  if (thread_.joinable()) thread_.join();
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

prometheus::Histogram::BucketBoundaries TimeToFirstTokenBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

prometheus::Histogram::BucketBoundaries InterTokenLatencyBuckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}

prometheus::Histogram::BucketBoundaries RequestLatencyBuckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

namespace {

// The family a "# HELP name ..." or "# TYPE name ..." line names, or "".
std::string_view CommentFamily(std::string_view line) {
  for (std::string_view prefix : {"# HELP ", "# TYPE "}) {
    if (line.substr(0, prefix.size()) == prefix) {
      line.remove_prefix(prefix.size());
      return line.substr(0, line.find(' '));
    }
  }
  return {};
}

}  // namespace

std::string AppendExposition(std::string own, std::string_view upstream) {
  std::set<std::string_view> own_families;  // views into `own`, which grows only after
  for (std::string_view rest = own; !rest.empty();) {
    const size_t end = rest.find('\n');
    const std::string_view family = CommentFamily(rest.substr(0, end));
    if (!family.empty()) own_families.insert(family);
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 1);
  }
  std::string tail;
  bool skipping = false;
  for (std::string_view rest = upstream; !rest.empty();) {
    const size_t end = rest.find('\n');
    const std::string_view line = rest.substr(0, end);
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 1);
    if (const std::string_view family = CommentFamily(line); !family.empty()) {
      skipping = own_families.count(family) != 0;
    }
    if (skipping || line.empty()) continue;
    tail.append(line);
    tail += '\n';
  }
  if (!own.empty() && own.back() != '\n') own += '\n';
  own += tail;
  return own;
}

}  // namespace tandem::metrics
