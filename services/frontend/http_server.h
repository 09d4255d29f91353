// The HTTP/1.1 server of tandem-frontend, on Boost.Beast and Asio (Debian's
// libboost-dev): a fixed pool of I/O threads runs every connection
// asynchronously, so 1,000 open SSE streams cost 1,000 sockets and small
// buffers, not 1,000 threads.
//
// A connection reads one request at a time (keep-alive; pipelined requests
// wait their turn) and hands it to the handler as an HttpExchange on the
// connection's strand. The handler answers at once (Respond) or later from
// any thread (Respond, or StartStream + Write + End for chunked streams
// such as SSE), without a trip through the strand. While a request is being answered the connection watches its
// socket: a client that closes it fires the exchange's on-client-gone
// callback once (the frontend aborts the generation then).
//
// HTTPS (issue 16): with a certificate the port speaks TLS only (OpenSSL
// through Asio's ssl::stream). The files are reread every
// reload_interval_s when their modification time changes (Kubernetes
// rotates mounted Secrets that way): new connections get the new
// certificate, open ones keep theirs; a pair that does not load is logged
// and the old one kept. With a CA, clients must present a certificate it
// signed. Under TLS a client's close is noticed by the next failed write
// rather than by the socket watch (its close_notify reads as data).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::frontend {

class HttpSession;

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // without the query
  std::string query;                           // after '?', "" when none
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  // The header's value, or "".
  [[nodiscard]] std::string Header(const std::string& lower_name) const;
};

class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  // `seq`: which exchange of the session's connection this is.
  HttpExchange(std::shared_ptr<HttpSession> session, uint64_t seq, HttpRequest request);
  ~HttpExchange();

  const HttpRequest& request() const { return request_; }

  // Every method below is safe from any thread and takes effect at once,
  // in call order: the bytes go to the socket from the calling thread when
  // it takes them without blocking (plain HTTP), else to the connection's
  // strand, which writes them asynchronously. A stream's per-token Write
  // from a gRPC thread therefore costs no hop to an I/O thread. Calls for an
  // exchange that is over, or whose client is gone, are ignored.

  // A complete response with Content-Length. Once per exchange; ignored
  // after the client is gone.
  void Respond(int status, const std::string& content_type, const std::string& body,
               const std::vector<std::pair<std::string, std::string>>& headers = {});
  // Starts a chunked response (SSE: "text/event-stream"). Then Write any
  // number of times and End once. The head is sent with the first Write
  // (or End).
  void StartStream(int status, const std::string& content_type);
  void Write(const std::string& data);
  void End();
  // Runs `fn` on the connection's strand (the handler's own state machine
  // uses it to stay single-threaded).
  void Post(std::function<void()> fn);
  // `fn` runs once, on the strand, if the client closes the connection
  // before the response is complete. Set it on the strand.
  void SetOnClientGone(std::function<void()> fn);
  bool client_gone() const;

 private:
  friend class HttpSession;
  std::shared_ptr<HttpSession> session_;
  uint64_t seq_;  // which exchange of the connection this is
  HttpRequest request_;
};

struct HttpServerOptions {
  std::string listen_address = "127.0.0.1:8000";  // host:port; port 0 = any free one
  int threads = 2;
  // Larger bodies get 413.
  size_t max_body_bytes = 32 << 20;
  // The request line and headers together (Beast's header limit); more gets
  // 431, or 414 when the URL alone is over max_target_bytes.
  size_t max_header_bytes = 64 << 10;
  // The URL (request target, query included); longer gets 414.
  size_t max_target_bytes = 16 << 10;
  // Open connections at most; one more is answered 503 and closed at once.
  // Keep it under the process's open-file limit (ulimit -n) with room for
  // gRPC and files: running out of descriptors makes accept() fail, and the
  // server then retries every 100 ms rather than at once, leaving the
  // connections waiting in the listen backlog.
  int64_t max_connections = 10000;
  // A request's headers and body must arrive within this; an idle
  // keep-alive connection is closed after it.
  std::chrono::seconds read_timeout{60};
  // HTTPS: PEM certificate chain and key of the port (both, or neither:
  // plain HTTP), and optionally a CA bundle that client certificates must
  // chain to.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  int32_t tls_reload_interval_s = 10;
  // CORS: the origins whose browsers may read the answers ("*": any, as
  // vLLM's default --allowed-origins); empty: no CORS headers. A request
  // with an allowed Origin gets Access-Control-Allow-Origin on its answer;
  // a preflight (OPTIONS with Access-Control-Request-Method) is answered
  // here, before any route or key check, with the methods and headers it
  // asks for.
  std::vector<std::string> allowed_origins;
  // vLLM's --enable-request-id-headers: every answer carries X-Request-Id,
  // the request's own (the header it came with) or 32 random hex digits.
  bool request_id_headers = false;
};

class HttpServer {
 public:
  using Handler = std::function<void(std::shared_ptr<HttpExchange>)>;

  ~HttpServer();
  // Binds, listens and starts the I/O threads. UNAVAILABLE when the address
  // cannot be bound, INVALID_ARGUMENT when it does not parse.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, Handler handler);
  int port() const { return port_; }
  // The port speaks HTTPS.
  bool tls() const;
  // Connections open now (a gauge for /metrics).
  int64_t open_connections() const;
  // Stops taking new connections; open ones go on.
  void StopAccepting();
  // Closes every connection and joins the threads.
  void Stop();

  struct Impl;

 private:
  HttpServer() = default;
  std::shared_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
  int port_ = 0;
};

}  // namespace tandem::frontend
