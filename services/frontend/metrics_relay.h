// Serves another process's /metrics on the frontend's own (issue 33): `vllm
// serve` answers every series, the engine's included, on its API port, and
// what scrapes a vLLM pod (the production-stack router reads
// vllm:num_requests_waiting there) finds them there. `tandem serve` gives the
// frontend --metrics-from with its scheduler's /metrics URL, so the API
// port's /metrics holds the frontend's series and then the scheduler's
// (tandem_scheduler_*, vllm:*), one scrape.
//
// One thread fetches the upstream (plain HTTP, 2 s to connect and to read)
// and answers the scrapes: scrapes that arrive while a fetch runs share the
// next one, and no I/O thread of the frontend ever waits on the upstream.
// When the fetch fails the scrape still answers with the frontend's own
// series, and tandem_frontend_metrics_from_up reads 0 (Prometheus's `up`
// for the upstream).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "http_server.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace tandem::frontend {

struct MetricsUrl {
  std::string host;  // without brackets for IPv6
  std::string port;
  std::string target;  // "/metrics"
};
// http://HOST:PORT/PATH ("[v6]" hosts too); anything else is refused by name.
absl::StatusOr<MetricsUrl> ParseMetricsUrl(absl::string_view url);

class MetricsRelay {
 public:
  // `render_own` gives the frontend's own exposition; it runs on the relay's
  // thread after each fetch.
  MetricsRelay(MetricsUrl url, prometheus::Registry& registry,
               std::function<std::string()> render_own);
  ~MetricsRelay();  // answers the scrapes still waiting with 503
  MetricsRelay(const MetricsRelay&) = delete;
  MetricsRelay& operator=(const MetricsRelay&) = delete;

  // Answers `exchange` from the relay's thread.
  void Serve(std::shared_ptr<HttpExchange> exchange);

 private:
  void Loop();
  // The upstream's body on a 200, else nullopt and why in `error`.
  std::optional<std::string> Fetch(std::string* error) const;

  const MetricsUrl url_;
  const std::function<std::string()> render_own_;
  prometheus::Gauge& up_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<HttpExchange>> waiting_;  // guarded by mu_
  bool stop_ = false;                                   // guarded by mu_
  bool last_up_ = true;                                 // the relay's thread only
  std::thread thread_;
};

}  // namespace tandem::frontend
