#include "bulk_load_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "load_scope.h"
#include "lookup_answer.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/rpc/method_roles.h"

namespace tandem::kvstore_service {
namespace {

// Binds and listens on host:port; returns the socket and the bound port.
absl::StatusOr<std::pair<int, int>> Listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* addrs = nullptr;
  const std::string port_str = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &addrs);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("bulk load port: resolving ", host, ": ",
                                               gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      const int bound_port =
          bound.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      freeaddrinfo(addrs);
      return std::pair{fd, bound_port};
    }
    error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(addrs);
  return absl::UnavailableError(
      absl::StrCat("bulk load port: cannot listen on ", host, ":", port, ": ", error));
}

}  // namespace

bool SendDone(rpc::FramedSocket* sock, const absl::Status& status) {
  v1::BulkLoadFrame done;
  done.set_done(true);
  done.set_status_code(static_cast<int32_t>(status.code()));
  done.set_status_message(std::string(status.message()));
  return sock->Write(done).ok();
}

absl::Status BulkLoadServerOptions::Validate() const {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bulk load port ", port, " is not a TCP port"));
  }
  if (max_connections <= 0) {
    return absl::InvalidArgumentError("bulk load max_connections must be > 0");
  }
  if (io_timeout_ms <= 0 || idle_timeout_ms <= 0) {
    return absl::InvalidArgumentError("bulk load io and idle timeouts must be > 0");
  }
  if (tls.enabled() && tls.cert_file.empty()) {
    return absl::InvalidArgumentError("bulk load port: TLS needs a certificate (--tls-cert)");
  }
  return absl::OkStatus();
}

struct BulkLoadServer::Connection {
  std::unique_ptr<rpc::FramedSocket> sock;
  bool local = false;  // accepted on the local socket
  rpc::CallerRole role = rpc::CallerRole::kUnverified;
  std::thread thread;
  std::atomic<bool> finished{false};
};

absl::StatusOr<std::unique_ptr<BulkLoadServer>> BulkLoadServer::Start(
    kvstore::KvStoreEngine* store, const BulkLoadServerOptions& options) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  TANDEM_ASSIGN_OR_RETURN(auto bound, Listen(options.host, options.port));
  std::unique_ptr<BulkLoadServer> server(
      new BulkLoadServer(store, options, bound.first, bound.second));
  if (options.tls.enabled()) {
    TANDEM_ASSIGN_OR_RETURN(server->tls_, rpc::SocketTlsContext::Create(
                                              options.tls, rpc::SocketTlsContext::Side::kServer));
  }
  if (!options.local_socket.empty()) {
    if (store->hot_tier_memory().fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "local socket ", options.local_socket,
          ": the store's hot tier is not shared memory (KvStoreOptions.share_hot_tier) or is off"));
    }
    TANDEM_ASSIGN_OR_RETURN(server->local_fd_, ListenLocal(options.local_socket));
  }
  if (pipe2(server->wake_pipe_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("bulk load port: pipe: ", std::strerror(errno)));
  }
  server->acceptor_ = std::thread([s = server.get()] {
    pthread_setname_np(pthread_self(), "kv-bulk-accept");
    s->AcceptLoop();
  });
  return server;
}

BulkLoadServer::BulkLoadServer(kvstore::KvStoreEngine* store, BulkLoadServerOptions options,
                               int listen_fd, int port)
    : store_(store), options_(std::move(options)), listen_fd_(listen_fd), port_(port) {}

BulkLoadServer::~BulkLoadServer() {
  Shutdown();
  for (int fd : wake_pipe_) {
    if (fd >= 0) close(fd);
  }
}

void BulkLoadServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    // Wakes every connection thread out of its recv/send.
    for (auto& c : connections_) shutdown(c->sock->fd(), SHUT_RDWR);
  }
  if (wake_pipe_[1] >= 0) {
    const char b = 1;
    (void)!write(wake_pipe_[1], &b, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  // New connections are refused from here on (clients then use gRPC).
  close(listen_fd_);
  if (local_fd_ >= 0) {
    close(local_fd_);
    unlink(options_.local_socket.c_str());
  }
  std::list<std::unique_ptr<Connection>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns.swap(connections_);
  }
  for (auto& c : conns) c->thread.join();
}

void BulkLoadServer::ReapLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->finished.load()) {
      (*it)->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

BulkLoadServerStats BulkLoadServer::GetStats() const {
  BulkLoadServerStats s;
  s.connections_accepted = accepted_.load();
  s.connections_rejected = rejected_.load();
  s.bad_prefaces = bad_prefaces_.load();
  s.tls_handshake_failures = tls_failures_.load();
  s.permission_denied = permission_denied_.load();
  s.loads = loads_.load();
  s.lookups = lookups_.load();
  s.blocks_sent = blocks_sent_.load();
  s.bytes_sent = bytes_sent_.load();
  s.stores = stores_.load();
  s.blocks_stored = blocks_stored_.load();
  s.bytes_stored = bytes_stored_.load();
  s.local_loads = local_loads_.load();
  s.blocks_shared = blocks_shared_.load();
  s.local_stores = local_stores_.load();
  s.blocks_written_in_place = blocks_written_in_place_.load();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& c : connections_) s.connections_open += c->finished.load() ? 0 : 1;
  return s;
}

void BulkLoadServer::AcceptLoop() {
  for (;;) {
    pollfd fds[3] = {
        {wake_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}, {local_fd_, POLLIN, 0}};
    if (poll(fds, local_fd_ >= 0 ? 3 : 2, -1) < 0) {
      if (errno == EINTR) continue;
      TANDEM_LOG(ERROR) << "bulk load port: poll: " << std::strerror(errno);
      return;
    }
    if (fds[0].revents != 0) return;  // Shutdown()
    const bool local = fds[1].revents == 0;
    const int fd = accept4(local ? local_fd_ : listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        TANDEM_LOG(WARNING) << "bulk load port: accept: " << std::strerror(errno);
      }
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ReapLocked();
    if (shut_down_ || connections_.size() >= static_cast<size_t>(options_.max_connections)) {
      close(fd);  // the client falls back to gRPC Load
      ++rejected_;
      continue;
    }
    ++accepted_;
    auto conn = std::make_unique<Connection>();
    conn->local = local;
    conn->sock = std::make_unique<rpc::FramedSocket>(fd);
    conn->sock->SetTimeouts(options_.io_timeout_ms, options_.idle_timeout_ms);
    Connection* raw = conn.get();
    connections_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] {
      pthread_setname_np(pthread_self(), "kv-bulk-conn");
      Serve(raw);
      // The peer sees the end now; the socket is closed when reaped.
      shutdown(raw->sock->fd(), SHUT_RDWR);
      raw->finished.store(true);
    });
  }
}

absl::Status BulkLoadServer::StartTls(Connection* conn) {
  absl::StatusOr<std::shared_ptr<ssl_ctx_st>> context = tls_->Current();
  absl::Status s =
      context.ok() ? conn->sock->StartTls(context->get(), /*server=*/true) : context.status();
  if (!s.ok()) {
    ++tls_failures_;
    TANDEM_LOG(WARNING) << "bulk load port: TLS handshake failed, connection closed: " << s;
    return s;
  }
  conn->role = tls_->RoleOf(*conn->sock);
  if (!logged_kernel_tls_.exchange(true)) {
    TANDEM_LOG(INFO) << "bulk load port: TLS records "
                     << (conn->sock->kernel_tls_send() ? "sent by the kernel (kernel TLS)"
                                                       : "encrypted by OpenSSL (no kernel TLS)");
  }
  return absl::OkStatus();
}

absl::Status BulkLoadServer::Authorize(const Connection& conn, std::string_view method) {
  const std::string peer = absl::StrCat("peer [", absl::StrJoin(conn.sock->PeerUris(), ", "), "]");
  grpc::Status allowed = rpc::AuthorizeMethod(method, conn.role, peer);
  if (allowed.ok()) return absl::OkStatus();
  ++permission_denied_;
  return absl::PermissionDeniedError(absl::StrCat("bulk port: ", allowed.error_message()));
}

void BulkLoadServer::Serve(Connection* conn) {
  rpc::FramedSocket* sock = conn->sock.get();
  if (conn->local) {
    ServeLocal(sock);
    return;
  }
  if (tls_ != nullptr && !StartTls(conn).ok()) return;
  uint8_t preface[rpc::kKvBulkLoadPreface.size()];
  if (!sock->ReadRaw(preface).ok()) return;
  if (std::memcmp(preface, rpc::kKvBulkLookupPreface.data(), sizeof preface) == 0) {
    ServeLookups(sock, Authorize(*conn, "/tandem.v1.KvStore/Lookup"));
    return;
  }
  if (std::memcmp(preface, rpc::kKvBulkStorePreface.data(), sizeof preface) == 0) {
    ServeStores(sock, Authorize(*conn, "/tandem.v1.KvStore/Store"));
    return;
  }
  if (std::memcmp(preface, rpc::kKvBulkLoadPreface.data(), sizeof preface) != 0) {
    ++bad_prefaces_;
    TANDEM_LOG(WARNING)
        << "bulk load port: a connection did not start with a bulk load, "
           "lookup or store preface (a gRPC or HTTP client on the wrong port?); closed";
    return;
  }
  const absl::Status allowed = Authorize(*conn, "/tandem.v1.KvStore/Load");
  for (;;) {
    v1::LoadRequest request;
    absl::Status s = sock->Read(&request, rpc::kKvBulkLoadMaxRequestBytes);
    if (s.code() == absl::StatusCode::kInvalidArgument) {
      SendDone(sock, Annotate(s, "bulk load"));
      return;
    }
    if (!s.ok()) return;  // closed, reset, or idle past the timeout
    if (!allowed.ok()) {
      SendDone(sock, allowed);
      return;
    }
    if (!ServeLoad(sock, request)) return;
  }
}

void BulkLoadServer::ServeLookups(rpc::FramedSocket* sock, const absl::Status& allowed) {
  // A scheduler's lookup connection stays open while it is idle: closing it
  // could lose a lookup sent just then.
  sock->SetTimeouts(options_.io_timeout_ms, 0);
  v1::LookupRequest request;
  v1::BulkLookupAnswer answer;
  for (;;) {
    absl::Status s = sock->Read(&request, rpc::kKvBulkLoadMaxRequestBytes);
    // A frame that is not a LookupRequest (or too long) is answered, and
    // then the connection is closed: the stream cannot be trusted. So is
    // a caller whose role may not look up.
    const bool bad_frame = s.code() == absl::StatusCode::kInvalidArgument;
    if (!s.ok() && !bad_frame) return;  // closed or reset
    answer.Clear();
    if (s.ok() && !allowed.ok()) s = allowed;
    if (s.ok()) {
      ++lookups_;
      s = AnswerLookup(store_, request, {.debug_delay_ms = options_.debug_lookup_delay_ms},
                       answer.mutable_response());
      if (!s.ok()) answer.clear_response();
    }
    s = Annotate(s, "bulk lookup");
    answer.set_status_code(static_cast<int32_t>(s.code()));
    answer.set_status_message(std::string(s.message()));
    if (!sock->Write(answer).ok() || bad_frame || !allowed.ok()) return;
  }
}

bool BulkLoadServer::ServeLoad(rpc::FramedSocket* sock, const v1::LoadRequest& request,
                               LeaseId* shared_lease) {
  ++loads_;
  if (options_.debug_load_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.debug_load_delay_ms));
  }
  if (options_.debug_before_load) options_.debug_before_load();
  LoadScope scope(store_, request);  // releases the lease however the load ends
  auto send_done = [&](const absl::Status& status) {
    scope.ReleaseLease();  // before the client can see the end
    return SendDone(sock, status);
  };
  if (!scope.status().ok()) return send_done(scope.status());
  const std::vector<BlockHash>& hashes = scope.hashes();
  // The local socket: blocks [0, shared) are pinned, and those in the hot
  // tier go by their place in `arena`.
  size_t shared = 0;
  std::span<const std::byte> arena;
  if (shared_lease != nullptr && !hashes.empty()) {
    ++local_loads_;
    absl::StatusOr<kvstore::LookupResult> pinned =
        store_->Lookup(request.namespace_(), hashes,
                       {.take_lease = true, .stage_to_hot = true, .count_in_stats = false});
    if (!pinned.ok()) return send_done(Annotate(pinned.status(), "pinning the blocks"));
    *shared_lease = pinned->lease;
    shared = static_cast<size_t>(pinned->num_hits);
    arena = store_->hot_tier_memory().bytes;
  }
  v1::BulkLoadFrame frame;
  for (size_t i = 0; i < hashes.size(); ++i) {
    frame.Clear();
    v1::LoadChunk* chunk = frame.mutable_chunk();
    chunk->set_block_index(static_cast<int32_t>(i));
    chunk->set_last(true);
    absl::Status sent;
    // The sink runs while the engine keeps the block pinned: its bytes go
    // from the store's memory to the socket. The reader verifies them against
    // the checksum written with them (sent ahead of them) and reports a
    // mismatch, so the store does not make a second pass over every block.
    absl::StatusOr<kvstore::ReadResult> r = store_->Read(
        request.namespace_(), hashes[i],
        [&](std::span<const uint8_t> data, uint32_t checksum) {
          chunk->set_ok(true);
          chunk->set_total_size(data.size());
          chunk->set_checksum(checksum);
          const auto* p = reinterpret_cast<const std::byte*>(data.data());
          if (i < shared && p >= arena.data() && p + data.size() <= arena.data() + arena.size()) {
            chunk->set_in_shared_memory(true);
            chunk->set_shared_offset(static_cast<uint64_t>(p - arena.data()));
            sent = sock->Write(frame);
            if (sent.ok()) ++blocks_shared_;
            return;
          }
          sent = sock->Write(frame, data);
          if (sent.ok()) {
            ++blocks_sent_;
            bytes_sent_ += data.size();
          }
        },
        kvstore::ReadVerify::kReader);
    if (!sent.ok()) return false;  // the connection broke mid-block
    if (!r.ok()) return send_done(Annotate(r.status(), absl::StrCat("loading block ", i)));
    if (!r->ok()) {
      chunk->set_ok(false);
      chunk->set_miss_reason(rpc::ToProto(r->miss));
      if (!sock->Write(frame).ok()) return false;
    }
  }
  return send_done(absl::OkStatus());
}

}  // namespace tandem::kvstore_service
