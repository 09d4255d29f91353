#include "metrics_relay.h"

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "tandem/common/logging.h"
#include "tandem/metrics/metrics.h"
#include "tandem/rpc/framed_socket.h"

namespace tandem::frontend {

namespace {
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr auto kTimeout = std::chrono::seconds(2);
}  // namespace

absl::StatusOr<MetricsUrl> ParseMetricsUrl(absl::string_view url) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-from '", url, "': ", why, " (give http://HOST:PORT/metrics)"));
  };
  constexpr absl::string_view kScheme = "http://";
  if (!absl::StartsWith(url, kScheme)) return bad("only plain http:// is supported");
  const absl::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  absl::StatusOr<std::pair<std::string, std::string>> host_port =
      rpc::SplitHostPort(std::string(rest.substr(0, slash)));
  if (!host_port.ok()) return bad("no host:port");
  int port = 0;
  if (!absl::SimpleAtoi(host_port->second, &port) || port <= 0 || port > 65535) {
    return bad("the port is not 1..65535");
  }
  return MetricsUrl{
      .host = std::move(host_port->first),
      .port = std::to_string(port),
      .target = slash == absl::string_view::npos ? "/" : std::string(rest.substr(slash))};
}

MetricsRelay::MetricsRelay(MetricsUrl url, prometheus::Registry& registry,
                           std::function<std::string()> render_own)
    : url_(std::move(url)),
      render_own_(std::move(render_own)),
      up_(metrics::AddGauge(registry, "tandem_frontend_metrics_from_up",
                            "1 when the last scrape of --metrics-from (the scheduler's /metrics, "
                            "served after the frontend's own series) succeeded, else 0")),
      thread_([this] { Loop(); }) {}

MetricsRelay::~MetricsRelay() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& e : waiting_) e->Respond(503, "text/plain", "the frontend is stopping\n");
}

void MetricsRelay::Serve(std::shared_ptr<HttpExchange> exchange) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      waiting_.push_back(std::move(exchange));
      cv_.notify_one();
      return;
    }
  }
  exchange->Respond(503, "text/plain", "the frontend is stopping\n");
}

void MetricsRelay::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !waiting_.empty(); });
    if (stop_) return;
    std::vector<std::shared_ptr<HttpExchange>> batch = std::exchange(waiting_, {});
    lock.unlock();
    std::string error;
    const std::optional<std::string> upstream = Fetch(&error);
    up_.Set(upstream ? 1 : 0);
    if (upstream.has_value() != last_up_) {  // one line per change, not per scrape
      last_up_ = upstream.has_value();
      if (last_up_) {
        TANDEM_LOG(INFO) << "--metrics-from " << url_.host << ":" << url_.port << url_.target
                         << " answers again";
      } else {
        TANDEM_LOG(WARNING) << "--metrics-from " << url_.host << ":" << url_.port << url_.target
                            << ": " << error << "; /metrics serves the frontend's series only";
      }
    }
    const std::string text = metrics::AppendExposition(render_own_(), upstream.value_or(""));
    for (auto& e : batch) e->Respond(200, kContentType, text);
    lock.lock();
  }
}

std::optional<std::string> MetricsRelay::Fetch(std::string* error) const {
  namespace beast = boost::beast;
  namespace http = beast::http;
  try {
    boost::asio::io_context io;
    boost::asio::ip::tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    http::request<http::empty_body> req{http::verb::get, url_.target, 11};
    req.set(http::field::host, url_.host);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    // Asynchronous calls, run here to the end: Beast's timeout applies to
    // those only ("Timeouts are not available when performing blocking
    // calls"), and an upstream that accepts and never answers held the
    // blocking read, and every later scrape behind it, for good. One
    // kTimeout covers connect, write and read.
    beast::error_code failed;
    stream.expires_after(kTimeout);
    stream.async_connect(resolver.resolve(url_.host, url_.port),
                         [&](beast::error_code ec, const auto&) {
                           if (ec) {
                             failed = ec;
                             return;
                           }
                           http::async_write(stream, req, [&](beast::error_code ec, size_t) {
                             if (ec) {
                               failed = ec;
                               return;
                             }
                             http::async_read(stream, buffer, parser,
                                              [&](beast::error_code ec, size_t) { failed = ec; });
                           });
                         });
    io.run();
    if (failed) {
      *error = failed == beast::error::timeout
                   ? absl::StrCat("no answer within ", kTimeout.count(), " s")
                   : failed.message();
      return std::nullopt;
    }
    beast::error_code ignored;
    stream.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
    if (parser.get().result_int() != 200) {
      *error = absl::StrCat("HTTP ", parser.get().result_int());
      return std::nullopt;
    }
    return std::move(parser.get().body());
  } catch (const std::exception& e) {
    *error = e.what();
    return std::nullopt;
  }
}

}  // namespace tandem::frontend
