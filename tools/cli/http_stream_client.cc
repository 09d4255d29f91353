#include "http_stream_client.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "nlohmann/json.hpp"

namespace tandem::cli {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// Feeds one `data:` payload read at `now` to `out`; false once the stream
// is over ([DONE]).
bool OnPayload(std::string_view payload, Clock::time_point now, StreamResult* out) {
  if (payload == "[DONE]") return false;
  const nlohmann::json msg = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (msg.is_discarded()) {
    if (out->error.empty()) {
      out->error = "a chunk is not JSON: " + std::string(payload.substr(0, 200));
    }
    return true;
  }
  if (msg.contains("error")) {
    if (out->error.empty()) out->error = msg["error"].dump();
    return true;
  }
  auto choices = msg.find("choices");
  if (choices == msg.end() || !choices->is_array() || choices->empty()) return true;
  auto ids = (*choices)[0].find("token_ids");
  if (ids != (*choices)[0].end() && ids->is_array() && !ids->empty()) {
    out->AddTokens(static_cast<int64_t>(ids->size()), now);
  }
  return true;
}

}  // namespace

void StreamResult::AddTokens(int64_t k, Clock::time_point now) {
  if (ttft_ms < 0) {
    ttft_ms = std::chrono::duration<double, std::milli>(now - start).count();
    for (int64_t j = 1; j < k; ++j) itl_ms.push_back(0);
  } else {
    const double gap = std::chrono::duration<double, std::milli>(now - last).count() / k;
    for (int64_t j = 0; j < k; ++j) itl_ms.push_back(gap);
  }
  last = now;
  tokens += k;
}

absl::StatusOr<HttpTarget> ParseHttpUrl(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (!url.starts_with(kScheme)) {
    return absl::InvalidArgumentError("--http wants http://host:port[/base], got '" +
                                      std::string(url) + "'");
  }
  const std::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  std::string_view base = slash == std::string_view::npos ? "" : rest.substr(slash);
  if (base.ends_with('/')) base.remove_suffix(1);
  const size_t colon = authority.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == authority.size()) {
    return absl::InvalidArgumentError("--http needs host:port, got '" + std::string(url) + "'");
  }
  return HttpTarget{.host = std::string(authority.substr(0, colon)),
                    .port = std::string(authority.substr(colon + 1)),
                    .path = std::string(base) + "/v1/completions"};
}

struct HttpStreamClient::Connection {
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
};

HttpStreamClient::HttpStreamClient(HttpTarget target) : target_(std::move(target)) {}
HttpStreamClient::~HttpStreamClient() = default;

void HttpStreamClient::Open() {
  auto conn = std::make_unique<Connection>();
  tcp::resolver resolver(conn->ioc);
  conn->stream.connect(resolver.resolve(target_.host, target_.port));
  conn->stream.socket().set_option(tcp::no_delay(true));
  conn_ = std::move(conn);
}

std::string HttpStreamClient::Connect() {
  try {
    Open();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

StreamResult HttpStreamClient::Complete(const std::string& body, Clock::time_point start) {
  StreamResult out(start);
  try {
    if (conn_ == nullptr) Open();
    http::request<http::string_body> req{http::verb::post, target_.path, 11};
    req.set(http::field::host, target_.host);
    req.set(http::field::content_type, "application/json");
    if (!target_.api_key.empty()) req.set(http::field::authorization, "Bearer " + target_.api_key);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    http::write(conn_->stream, req);

    http::response_parser<http::buffer_body> parser;
    // No limit on a stream's length. (Not boost::none: Boost 1.74's parser
    // compares a Content-Length with it and refuses every such body.)
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    http::read_header(conn_->stream, conn_->buffer, parser);
    const int status = parser.get().result_int();
    std::string pending;  // body bytes not yet split into events
    char chunk[16384];
    bool done = false;
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      beast::error_code ec;
      http::read_some(conn_->stream, conn_->buffer, parser, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) throw beast::system_error(ec);
      pending.append(chunk, sizeof(chunk) - parser.get().body().size);
      if (status != 200) continue;
      const Clock::time_point now = Clock::now();
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        std::string_view event(pending.data(), end);
        while (!event.empty()) {
          const size_t eol = event.find('\n');
          std::string_view line = event.substr(0, eol);
          event = eol == std::string_view::npos ? std::string_view() : event.substr(eol + 1);
          if (!line.starts_with("data:")) continue;
          line.remove_prefix(5);
          while (!line.empty() && (line.front() == ' ' || line.front() == '\r'))
            line.remove_prefix(1);
          while (!line.empty() && (line.back() == ' ' || line.back() == '\r'))
            line.remove_suffix(1);
          if (!OnPayload(line, now, &out)) done = true;
        }
        pending.erase(0, end + 2);
      }
    }
    if (!parser.keep_alive()) conn_.reset();
    if (status != 200) {
      out.error = absl::StrCat("HTTP ", status, ": ", pending.substr(0, 200));
    } else if (!done && out.error.empty()) {
      out.error = "the stream ended without data: [DONE]";
    }
  } catch (const std::exception& e) {
    conn_.reset();
    out.error = e.what();
  }
  return out;
}

}  // namespace tandem::cli
