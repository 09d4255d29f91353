// Prometheus helpers shared by the services (DESIGN §7): an HTTP /metrics
// exposer on its own port, and counters that mirror a cumulative source.
//
// Names follow Prometheus conventions: prefix `tandem_`, `_total` for
// counters, `_seconds` / `_bytes` units, ratios 0-1.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace tandem::metrics {

struct ExposerOptions {
  // host:port of the /metrics HTTP endpoint; port 0 picks a free one; empty
  // turns the endpoint off.
  std::string listen_address = "127.0.0.1:0";
  // The services' --metrics-listen help text.
  static constexpr const char* kListenHelp =
      "host:port of the Prometheus /metrics endpoint (port 0: any free port; empty: off)";
  [[nodiscard]] absl::Status Validate() const;
};

// The /metrics HTTP endpoint, served by cpp-httplib (Debian's
// libcpp-httplib-dev) from a small thread pool: scrapes are served
// concurrently, over HTTP/1.1 keep-alive, on IPv4 or IPv6 ("[::]:9090";
// "*:9090" or ":9090" binds every address, IPv6 and IPv4 where the host has
// IPv6). An idle connection holds a pool thread until its read timeout
// (kReadTimeoutS), so up to kThreads - 1 idle connections never delay a
// scrape. (The hand-written one-connection-at-a-time server it replaces
// took 6 s per scrape with 3 idle connections open; prometheus-cpp's
// civetweb Exposer starts threads with a 100 KiB stack, which glibc refuses
// once CUDA libraries put ~100 KiB in static TLS, as libcublasLt does;
// httplib's pool threads have the default stack.)
class MetricsServer {
 public:
  static constexpr int kThreads = 8;
  static constexpr int kReadTimeoutS = 5;

  ~MetricsServer();
  // Serves `registry` at http://listen_address/metrics. Returns null when
  // options.listen_address is empty; UNAVAILABLE when it cannot be bound.
  // `on_scrape`, when given, runs before each scrape is serialized (one
  // scrape at a time): for series mirrored from another component's
  // counters, so a scrape sees them as they are now.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const ExposerOptions& options, std::shared_ptr<prometheus::Registry> registry,
      std::function<void()> on_scrape = {});
  [[nodiscard]] int port() const { return port_; }
  // "http://host:port/metrics" ("http://[::1]:port/metrics" for IPv6).
  [[nodiscard]] std::string url() const { return url_; }

 private:
  MetricsServer();

  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void()> on_scrape_;
  std::mutex scrape_mu_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::string url_;
  std::thread thread_;
};

// Shorthands for single-series families.
prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help);
prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help);
prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets);
// Latency buckets from 1 ms to ~60 s (internal timings: steps, schedule).
prometheus::Histogram::BucketBoundaries LatencyBuckets();
// vLLM's buckets (vllm/v1/metrics/loggers.py), so that dashboards and
// percentiles read the same: time to first token (1 ms .. 2560 s),
// inter-token latency / time per output token (10 ms .. 80 s), and end-to-end
// request latency (0.3 s .. 7680 s).
prometheus::Histogram::BucketBoundaries TimeToFirstTokenBuckets();
prometheus::Histogram::BucketBoundaries InterTokenLatencyBuckets();
prometheus::Histogram::BucketBoundaries RequestLatencyBuckets();

// Prometheus text exposition `own` followed by the families of `upstream`
// (another process's /metrics, as prometheus-cpp writes it: each family's
// # HELP and # TYPE lines, then its samples) that `own` does not already
// hold: a family both processes register (the --tls-* reload series) is
// `own`'s only, since a family may appear once in a scrape.
std::string AppendExposition(std::string own, std::string_view upstream);

// A Prometheus counter fed from a cumulative value that may restart from 0
// (e.g. a component rebuilt after a reconnect): Set(v) adds v - last, or v
// when v went down.
class MirroredCounter {
 public:
  explicit MirroredCounter(prometheus::Counter* counter) : counter_(counter) {}
  void Set(uint64_t value) {
    counter_->Increment(static_cast<double>(value >= last_ ? value - last_ : value));
    last_ = value;
  }

 private:
  prometheus::Counter* counter_;
  uint64_t last_ = 0;
};

}  // namespace tandem::metrics
