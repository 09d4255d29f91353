#include "http_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "boost/beast/ssl.hpp"
#include "cors.h"
#include "http_tls.h"
#include "tandem/common/logging.h"

namespace tandem::frontend {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

struct HttpServer::Impl {
  explicit Impl(HttpServerOptions o, Handler h) : options(std::move(o)), handler(std::move(h)) {}
  void Accept();
  // Rereads the TLS files when they changed; then again after the interval.
  void ReloadTlsLater();

  std::shared_ptr<net::ssl::context> tls() {
    std::lock_guard<std::mutex> lock(tls_mu);
    return tls_ctx;
  }

  HttpServerOptions options;
  Handler handler;
  net::io_context ioc;
  // Keeps the I/O threads in ioc.run() until Stop(). Without it they return
  // once the listener is closed (the drain) and no connection has work, and
  // what is posted after that never runs: a job's end posted by its gRPC
  // call (HttpExchange::Post) then never came, and a request already
  // answered held the drain until --drain-timeout-s cut it off.
  net::executor_work_guard<net::io_context::executor_type> keep_running = net::make_work_guard(ioc);
  tcp::acceptor acceptor{ioc};
  std::atomic<int64_t> open{0};
  std::mutex tls_mu;
  std::shared_ptr<net::ssl::context> tls_ctx;  // null: plain HTTP
  int64_t tls_stamp = 0;
  std::unique_ptr<net::steady_timer> tls_timer;
  // Accept's pause while the process is out of descriptors (EMFILE).
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};
  net::steady_timer accept_timer{ioc};
  bool accept_backing_off = false;  // the acceptor's alone
};

void HttpServer::Impl::ReloadTlsLater() {
  tls_timer->expires_after(std::chrono::seconds(std::max(1, options.tls_reload_interval_s)));
  tls_timer->async_wait([this](beast::error_code ec) {
    if (ec) return;
    const int64_t stamp = TlsFilesStamp(options);
    if (stamp != 0 && stamp != tls_stamp) {
      absl::StatusOr<std::shared_ptr<net::ssl::context>> ctx = LoadTlsContext(options);
      if (ctx.ok()) {
        std::lock_guard<std::mutex> lock(tls_mu);
        tls_ctx = *std::move(ctx);
        tls_stamp = stamp;
        TANDEM_LOG(INFO) << "HTTPS: reloaded " << options.tls_cert_file;
      } else {
        TANDEM_LOG(WARNING) << "HTTPS: keeping the old certificate: " << ctx.status();
      }
    }
    ReloadTlsLater();
  });
}

// One connection. Reading requests, the socket watch, TLS and the async
// writes run on the connection's strand (the executor of its socket). The
// exchange's state and the bytes to send are under `mu_`, so the exchange
// API runs on whatever thread calls it: a stream's token goes out with a
// non-blocking send() from the thread that has it (the gRPC thread that read
// it), not after a hop to an I/O thread that must first be woken. Only when
// the socket is full, under TLS, or at the end of an exchange does work go
// to the strand. Lock order: a caller's own lock (the frontend's job) ->
// `mu_`; nothing here calls out while holding `mu_`.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  // `tls`: the server's context (null: plain HTTP).
  HttpSession(tcp::socket socket, HttpServer::Impl* server, std::shared_ptr<net::ssl::context> tls)
      : server_(server), tls_ctx_(std::move(tls)) {
    if (tls_ctx_ != nullptr) {
      tls_.emplace(std::move(socket), *tls_ctx_);
    } else {
      plain_.emplace(std::move(socket));
    }
    server_->open.fetch_add(1);
  }
  ~HttpSession() { server_->open.fetch_sub(1); }

  void Run() {
    net::dispatch(transport().get_executor(), [self = shared_from_this()] {
      if (!self->tls_) {
        self->DoRead();
        return;
      }
      self->transport().expires_after(self->server_->options.read_timeout);
      self->tls_->async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
        if (ec) {
          self->Close();  // not TLS, or a certificate refused
          return;
        }
        self->DoRead();
      });
    });
  }
  void Post(std::function<void()> fn) { net::post(transport().get_executor(), std::move(fn)); }

  // The exchange API, from any thread.
  // `seq` names the exchange: calls for an exchange that is over are
  // ignored, so a late call never lands on the next request of the
  // connection.
  void Respond(uint64_t seq, int status, const std::string& content_type, const std::string& body,
               const std::vector<std::pair<std::string, std::string>>& headers) {
    std::unique_lock<std::mutex> lock(mu_);
    if (seq != seq_ || !active_ || started_) return;
    started_ = true;
    AppendHead(status, content_type);
    for (const auto& [name, value] : headers) absl::StrAppend(&outbox_, name, ": ", value, "\r\n");
    absl::StrAppend(&outbox_, "Content-Length: ", body.size(), "\r\n\r\n");
    if (!head_) outbox_ += body;  // HEAD: the GET's head alone (RFC 9110 9.3.2)
    complete_ = true;
    Kick(lock);
  }
  void StartStream(uint64_t seq, int status, const std::string& content_type) {
    std::unique_lock<std::mutex> lock(mu_);
    if (seq != seq_ || !active_ || started_) return;
    started_ = true;
    // HTTP/1.0 has no chunked coding (RFC 9112 6.1): the stream ends with
    // the connection.
    if (http10_) keep_alive_ = false;
    AppendHead(status, content_type);
    outbox_ += http10_ ? "Cache-Control: no-cache\r\n\r\n"
                       : "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    // No send yet: the head goes out with the first chunk (or the end), in
    // one send() and one wake-up of the client.
  }
  void Write(uint64_t seq, const std::string& data) {
    std::unique_lock<std::mutex> lock(mu_);
    if (seq != seq_ || !active_ || !started_ || complete_ || closed_ || data.empty()) return;
    // Framed straight into the outbox: one copy of the chunk per token.
    if (http10_) {
      outbox_ += data;
    } else {
      absl::StrAppend(&outbox_, absl::Hex(data.size()), "\r\n", data, "\r\n");
    }
    Kick(lock);
  }
  void End(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    if (seq != seq_ || !active_ || !started_ || complete_) return;
    if (!http10_) outbox_ += "0\r\n\r\n";
    complete_ = true;
    Kick(lock);
  }
  void SetOnClientGone(uint64_t seq, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (seq == seq_ && active_) on_gone_ = std::move(fn);
  }
  bool gone() const { return gone_.load(); }

 private:
  // Under mu_.
  void AppendHead(int status, const std::string& content_type) {
    const auto reason = http::obsolete_reason(static_cast<http::status>(status));
    absl::StrAppend(&outbox_, "HTTP/1.1 ", status, " ", std::string(reason.data(), reason.size()),
                    "\r\nServer: tandem-frontend\r\nContent-Type: ", content_type,
                    "\r\nConnection: ", keep_alive_ ? "keep-alive" : "close", "\r\n");
    if (!cors_origin_.empty()) {
      absl::StrAppend(&outbox_, "Access-Control-Allow-Origin: ", cors_origin_, "\r\n");
      if (cors_origin_ != "*") outbox_ += "Vary: Origin\r\n";
    }
    if (!request_id_.empty()) absl::StrAppend(&outbox_, "X-Request-Id: ", request_id_, "\r\n");
  }

  // Under mu_ (held by `lock`; may let it go): sends what the outbox holds.
  // Plain HTTP tries a non-blocking send() here first; what it leaves
  // (a full socket, or TLS) goes to the strand as one async write, and an
  // exchange whose last byte is out is finished there. `busy_` keeps any
  // other thread out until the strand is done.
  void Kick(std::unique_lock<std::mutex>& lock) {
    if (busy_ || closed_) return;
    if (!outbox_.empty() && plain_) {
      const ssize_t n = ::send(plain_->socket().native_handle(), outbox_.data(), outbox_.size(),
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        outbox_.erase(0, static_cast<size_t>(n));
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        busy_ = true;  // nothing more goes out: the client is gone
        lock.unlock();
        Post([self = shared_from_this()] { self->ClientGone(); });
        return;
      }
    }
    if (outbox_.empty()) {
      if (!complete_) return;
      busy_ = true;
      lock.unlock();
      Post([self = shared_from_this()] { self->FinishExchange(); });
      return;
    }
    busy_ = true;
    inflight_.swap(outbox_);
    outbox_.clear();
    lock.unlock();
    Post([self = shared_from_this()] { self->WriteInflight(); });
  }

  // On the strand, with busy_ set: the async write of inflight_.
  void WriteInflight() {
    WithStream([&](auto& stream) {
      net::async_write(stream, net::buffer(inflight_),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         std::unique_lock<std::mutex> lock(self->mu_);
                         self->inflight_.clear();
                         if (ec) {
                           lock.unlock();
                           self->ClientGone();  // busy_ stays set: nothing more goes out
                           return;
                         }
                         self->busy_ = false;
                         self->Kick(lock);
                       });
    });
  }

  void DoRead() {
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(server_->options.max_header_bytes));
    transport().expires_after(server_->options.read_timeout);
    WithStream([&](auto& stream) {
      http::async_read_header(
          stream, buffer_, *parser_,
          [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
    });
  }

  // With the head read (a body over the limit by its Content-Length is
  // refused here, before it is sent): answers "Expect: 100-continue" (RFC
  // 9110 10.1.1; curl sends it with a body over 1 MiB and waits a second
  // for the answer), then reads the body. No response is going out while a
  // request is read, so the interim answer may be written here.
  void OnHeader(beast::error_code ec) {
    if (ec || parser_->is_done()) {
      OnRead(ec);
      return;
    }
    const auto& head = parser_->get();
    const auto expect = head[http::field::expect];
    if (head.version() < 11 ||
        !absl::EqualsIgnoreCase(absl::string_view(expect.data(), expect.size()), "100-continue")) {
      ReadBody();
      return;
    }
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    WithStream([&](auto& stream) {
      net::async_write(stream, net::buffer(kContinue.data(), kContinue.size()),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         if (ec) {
                           self->Close();
                           return;
                         }
                         self->ReadBody();
                       });
    });
  }

  void ReadBody() {
    WithStream([&](auto& stream) {
      http::async_read(
          stream, buffer_, *parser_,
          [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
    });
  }

  // Refuses the request that was read (or not) with `status` and closes the
  // connection after the answer.
  // Errors of the request's framing (the parser's: Beast also refuses every
  // HTTP version but 1.0 and 1.1 as bad_version), as opposed to the
  // connection's (EOF, reset) or the limits' (answered with 413/414/431).
  static bool IsMalformed(beast::error_code ec) {
    for (http::error e :
         {http::error::bad_line_ending, http::error::bad_method, http::error::bad_target,
          http::error::bad_version, http::error::bad_field, http::error::bad_value,
          http::error::bad_content_length, http::error::bad_transfer_encoding,
          http::error::bad_chunk, http::error::bad_chunk_extension, http::error::bad_obs_fold}) {
      if (ec == e) return true;
    }
    return false;
  }

  void Refuse(int status, const std::string& message) {
    const uint64_t seq = BeginExchange(HttpRequest{}, /*keep_alive=*/false);
    Respond(seq, status, "application/json",
            absl::StrCat(R"({"error":{"message":")", message,
                         R"(","type":"invalid_request_error","param":null,"code":null}})"),
            {});
  }

  // The bytes of the request line read so far: the parsed target's when
  // Beast got that far, else up to the first CRLF buffered (all of it when
  // there is none).
  size_t RequestLineBytes() {
    const size_t target = parser_->get().target().size();
    if (target > 0) return target;
    const std::string_view data(static_cast<const char*>(buffer_.data().data()), buffer_.size());
    const size_t eol = data.find("\r\n");
    return eol == std::string_view::npos ? data.size() : eol;
  }

  void OnRead(beast::error_code ec) {
    const HttpServerOptions& o = server_->options;
    if (ec == http::error::header_limit) {
      // Beast counts the request line with the headers; tell them apart.
      if (RequestLineBytes() > o.max_target_bytes) {
        Refuse(414, absl::StrCat("the request's URL is longer than ", o.max_target_bytes,
                                 " bytes"));
      } else {
        Refuse(431, absl::StrCat("the request's headers are larger than ", o.max_header_bytes,
                                 " bytes"));
      }
      return;
    }
    if (ec == http::error::body_limit) {
      Refuse(413, absl::StrCat("the request's body is larger than ", o.max_body_bytes, " bytes"));
      return;
    }
    if (IsMalformed(ec)) {
      // A client's framing error gets an answer, not a silent close.
      Refuse(400, absl::StrCat("malformed HTTP request: ", ec.message()));
      return;
    }
    if (ec) {
      Close();
      return;
    }
    if (parser_->get().target().size() > o.max_target_bytes) {
      Refuse(414, absl::StrCat("the request's URL is longer than ", o.max_target_bytes, " bytes"));
      return;
    }
    http::request<http::string_body> msg = parser_->release();
    HttpRequest request;
    request.method = std::string(msg.method_string());
    const std::string_view target(msg.target().data(), msg.target().size());
    const size_t q = target.find('?');
    request.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) request.query = std::string(target.substr(q + 1));
    for (const auto& field : msg) {
      request.headers[absl::AsciiStrToLower(std::string(
          field.name_string().data(), field.name_string().size()))] = std::string(field.value());
    }
    request.body = std::move(msg.body());
    transport().expires_never();
    BeginExchange(std::move(request), msg.keep_alive(), msg.version() == 10);
  }

  // Starts the next exchange and hands it to the handler (not for a request
  // without a method: the caller answers that itself). Returns its seq.
  uint64_t BeginExchange(HttpRequest request, bool keep_alive, bool http10 = false) {
    uint64_t seq;
    std::string cors;  // Access-Control-Allow-Origin, if any
    {
      std::lock_guard<std::mutex> lock(mu_);
      seq = ++seq_;
      active_ = true;
      started_ = complete_ = busy_ = false;
      keep_alive_ = keep_alive;
      head_ = request.method == "HEAD";
      http10_ = http10;
      cors_origin_ = CorsAllowOrigin(server_->options.allowed_origins, request);
      cors = cors_origin_;
      request_id_ = server_->options.request_id_headers ? AnswerRequestId(request) : "";
      on_gone_ = nullptr;
    }
    Watch();
    if (auto preflight = PreflightHeaders(request, cors)) {
      Respond(seq, 200, "text/plain; charset=utf-8", "OK", *preflight);
      return seq;
    }
    if (!request.method.empty()) {
      server_->handler(std::make_shared<HttpExchange>(shared_from_this(), seq, std::move(request)));
    }
    return seq;
  }

  // Notices a client that closes the connection while we answer.
  void Watch() {
    if (watching_) return;
    watching_ = true;
    transport().socket().async_wait(
        tcp::socket::wait_read,
        [self = shared_from_this()](beast::error_code ec) { self->OnWatch(ec); });
  }

  void OnWatch(beast::error_code ec) {
    watching_ = false;
    if (read_after_watch_) {
      read_after_watch_ = false;
      DoRead();
      return;
    }
    bool active;
    {
      std::lock_guard<std::mutex> lock(mu_);
      active = active_;
    }
    if (ec || !active) return;
    // The peek must not block: a wait can complete with nothing to read
    // (epoll reports readiness by edges, and an old edge may arrive late);
    // a blocking peek would then hold this strand, and the response, until
    // the client gives up.
    char byte;
    beast::error_code peek_ec;
    transport().socket().non_blocking(true, peek_ec);
    const size_t n =
        transport().socket().receive(net::buffer(&byte, 1), tcp::socket::message_peek, peek_ec);
    if (peek_ec == net::error::would_block || peek_ec == net::error::try_again) {
      Watch();  // nothing there after all: keep watching
      return;
    }
    if (peek_ec || n == 0) {
      ClientGone();
    }
    // Else: a pipelined request waits in the socket; it is read after this
    // response (and a close behind it is noticed then).
  }

  // On the strand.
  void ClientGone() {
    if (gone_.exchange(true)) return;
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn = std::move(on_gone_);
      on_gone_ = nullptr;
    }
    if (fn) fn();
    Close();
  }

  // On the strand, once the exchange's last byte is out (busy_ set).
  void FinishExchange() {
    bool keep_alive;
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_ = false;
      on_gone_ = nullptr;
      keep_alive = keep_alive_;
    }
    if (!keep_alive) {
      Close();
      return;
    }
    if (watching_) {
      // OnWatch reads the next request once the wait completes.
      read_after_watch_ = true;
      beast::error_code ignored;
      transport().socket().cancel(ignored);
    } else {
      DoRead();
    }
  }

  // On the strand. Under mu_, so no send() runs on the descriptor as it
  // closes (and no later one on a number the system has reused).
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    beast::error_code ignored;
    transport().socket().shutdown(tcp::socket::shutdown_both, ignored);
    transport().socket().close(ignored);
  }

  // The TCP layer (under TLS, the ssl stream's next layer).
  beast::tcp_stream& transport() { return tls_ ? tls_->next_layer() : *plain_; }
  // Runs `fn` with the stream HTTP reads and writes: TLS or plain.
  template <class Fn>
  void WithStream(Fn&& fn) {
    if (tls_) {
      fn(*tls_);
    } else {
      fn(*plain_);
    }
  }

  HttpServer::Impl* server_;
  std::shared_ptr<net::ssl::context> tls_ctx_;  // kept alive for tls_
  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  std::atomic<bool> gone_{false};
  // The strand's alone.
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool watching_ = false;
  bool read_after_watch_ = false;
  std::string inflight_;  // while busy_ with a write

  std::mutex mu_;
  uint64_t seq_ = 0;        // of the current (or last) exchange
  bool keep_alive_ = true;  // the current exchange's
  bool head_ = false;       // it is a HEAD: no body goes out
  bool http10_ = false;     // an HTTP/1.0 request: no chunked coding
  std::string cors_origin_;  // Access-Control-Allow-Origin of its answer, if any
  std::string request_id_;   // X-Request-Id of its answer, if any
  bool active_ = false;     // an exchange is being answered
  bool started_ = false;    // its status line is queued
  bool complete_ = false;   // its last byte is queued
  bool busy_ = false;       // the strand writes inflight_ or finishes the exchange
  bool closed_ = false;
  std::string outbox_;
  std::function<void()> on_gone_;
};

std::string HttpRequest::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? "" : it->second;
}

HttpExchange::HttpExchange(std::shared_ptr<HttpSession> session, uint64_t seq,
                           HttpRequest request)
    : session_(std::move(session)), seq_(seq), request_(std::move(request)) {}

HttpExchange::~HttpExchange() {
  // A handler that drops an exchange unanswered must not hang the client:
  // a 500, or the end of a stream it started.
  session_->Post([s = session_, seq = seq_] {
    s->Respond(seq, 500, "application/json",
               R"({"error":{"message":"the request was dropped without a response",)"
               R"("type":"server_error","param":null,"code":null}})",
               {});
    s->End(seq);
  });
}

void HttpExchange::Respond(int status, const std::string& content_type, const std::string& body,
                           const std::vector<std::pair<std::string, std::string>>& headers) {
  session_->Respond(seq_, status, content_type, body, headers);
}
void HttpExchange::StartStream(int status, const std::string& content_type) {
  session_->StartStream(seq_, status, content_type);
}
void HttpExchange::Write(const std::string& data) { session_->Write(seq_, data); }
void HttpExchange::End() { session_->End(seq_); }
void HttpExchange::Post(std::function<void()> fn) { session_->Post(std::move(fn)); }
void HttpExchange::SetOnClientGone(std::function<void()> fn) {
  session_->SetOnClientGone(seq_, std::move(fn));
}
bool HttpExchange::client_gone() const { return session_->gone(); }

void HttpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (ec == boost::system::errc::too_many_files_open ||
        ec == boost::system::errc::too_many_files_open_in_system ||
        ec == boost::system::errc::not_enough_memory || ec == net::error::no_buffer_space) {
      // The connection stays in the listen backlog and the next accept
      // fails the same way at once: retrying now would spin a core until a
      // descriptor frees. Wait, then try again.
      if (!accept_backing_off) {
        TANDEM_LOG(WARNING) << "HTTP accept: " << ec.message() << "; retrying every "
                            << kAcceptBackoff.count() << " ms (see --max-connections)";
      }
      accept_backing_off = true;
      accept_timer.expires_after(kAcceptBackoff);
      accept_timer.async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec) Accept();
      });
      return;
    }
    accept_backing_off = false;
    if (!ec && open.load() >= options.max_connections) {
      // Over the cap: a short 503 and close, so the client knows to come
      // back (or go to another frontend) instead of waiting on a backlog.
      static constexpr std::string_view kFull =
          "HTTP/1.1 503 Service Unavailable\r\nServer: tandem-frontend\r\n"
          "Content-Type: application/json\r\nConnection: close\r\nContent-Length: 114\r\n\r\n"
          R"({"error":{"message":"too many open connections","type":"server_error",)"
          R"("param":null,"code":"too_many_connections"}})";
      (void)::send(socket.native_handle(), kFull.data(), kFull.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      beast::error_code ignored;
      socket.shutdown(tcp::socket::shutdown_send, ignored);
      socket.close(ignored);
    } else if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<HttpSession>(std::move(socket), this, tls())->Run();
    }
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              Handler handler) {
  const std::string& address = options.listen_address;
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "*") host = "0.0.0.0";
  if (host == "localhost") host = "127.0.0.1";
  beast::error_code ec;
  const net::ip::address ip = net::ip::make_address(host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "': '", host, "' is not an IP address"));
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--https-cert and --https-key come together");
  }
  if (options.tls_cert_file.empty() && !options.tls_ca_file.empty()) {
    return absl::InvalidArgumentError("--https-ca needs --https-cert and --https-key");
  }
  auto server = std::unique_ptr<HttpServer>(new HttpServer());
  server->impl_ = std::make_shared<Impl>(options, std::move(handler));
  Impl& impl = *server->impl_;
  if (!options.tls_cert_file.empty()) {
    impl.tls_stamp = TlsFilesStamp(options);
    absl::StatusOr<std::shared_ptr<net::ssl::context>> ctx = LoadTlsContext(options);
    if (!ctx.ok()) return ctx.status();
    impl.tls_ctx = *std::move(ctx);
    impl.tls_timer = std::make_unique<net::steady_timer>(impl.ioc);
    impl.ReloadTlsLater();
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
  impl.acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(endpoint, ec);
  if (!ec) impl.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", ec.message()));
  }
  server->port_ = impl.acceptor.local_endpoint().port();
  impl.Accept();
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    server->threads_.emplace_back([&impl] { impl.ioc.run(); });
  }
  return server;
}

int64_t HttpServer::open_connections() const { return impl_->open.load(); }

void HttpServer::StopAccepting() {
  net::post(impl_->ioc, [impl = impl_] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
  });
}

bool HttpServer::tls() const { return impl_->tls_ctx != nullptr; }

void HttpServer::Stop() {
  if (threads_.empty()) return;
  impl_->ioc.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace tandem::frontend
