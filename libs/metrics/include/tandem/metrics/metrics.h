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
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

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

// A minimal HTTP/1.0 server for GET /metrics (Prometheus text format), on
// one thread. (prometheus-cpp's civetweb Exposer starts threads with a
// 100 KiB stack, which glibc refuses once CUDA libraries put ~100 KiB in
// static TLS, as libcublasLt does; so we serve the text ourselves.)
class MetricsServer {
 public:
  ~MetricsServer();
  // Serves `registry` at http://listen_address/metrics. Returns null when
  // options.listen_address is empty; UNAVAILABLE when it cannot be bound.
  // `on_scrape`, when given, runs (on the server's thread) before each
  // scrape is serialized: for series mirrored from another component's
  // counters, so a scrape sees them as they are now.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const ExposerOptions& options, std::shared_ptr<prometheus::Registry> registry,
      std::function<void()> on_scrape = {});
  [[nodiscard]] int port() const { return port_; }
  // "http://host:port/metrics".
  [[nodiscard]] std::string url() const { return url_; }

 private:
  MetricsServer() = default;
  void Loop();
  void Serve(int fd);

  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void()> on_scrape_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
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
// Latency buckets from 1 ms to ~60 s.
prometheus::Histogram::BucketBoundaries LatencyBuckets();

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
