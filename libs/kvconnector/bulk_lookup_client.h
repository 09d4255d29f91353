// Lookups over the KV-store's bulk port (services/kvstore/bulk_load_server.h
// has the protocol). Private to KvStoreClient, which sends each Lookup here
// first and over gRPC when Send() refuses it.
//
// Why: a lookup is latency, not bytes. Over gRPC an answer crosses about five
// thread hand-offs between the two processes (72-135 us for an empty call on
// the 2-core benchmark VM, over DESIGN §8's 100 us lookup target in its slow
// phases); on one plain TCP connection it crosses two (a server thread
// blocked in recv, and this class's thread blocked in recv).
//
// One connection per client, opened and reopened by the client's own thread
// (never by the caller of Lookup, which must not block): it finds the port as
// BulkLoadClient does, connects, and then reads answers. Until it is
// connected, and after it breaks until it has reconnected (1 s, then up to
// 10 s apart), Send() refuses and lookups go over gRPC. The server answers a
// connection's lookups in order, so answers are matched to requests by
// order. Lookups sent but unanswered when the connection breaks get
// UNAVAILABLE (zero hits, as a failed gRPC lookup); a lease granted to one
// that its caller counted late is released by the caller's answer handler,
// as for gRPC.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "bulk_load_client.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvconnector {

class BulkLookupClient {
 public:
  // Runs on the connection's thread with the answer, or with UNAVAILABLE
  // when the connection broke first or the client is being destroyed.
  using OnAnswer = std::function<void(const absl::Status&, const v1::LookupResponse&)>;

  // Finds the port through `ports` (on the connection's thread; not owned,
  // must outlive this client).
  BulkLookupClient(BulkLoadClient* ports, int64_t io_timeout_ms);
  // Closes the connection (unanswered lookups get UNAVAILABLE) and joins.
  ~BulkLookupClient();
  BulkLookupClient(const BulkLookupClient&) = delete;
  BulkLookupClient& operator=(const BulkLookupClient&) = delete;

  // Sends `req` and returns true when the connection is up and the lookups
  // waiting on it hold fewer than kMaxUnansweredBytes; false otherwise
  // (nothing sent: use gRPC). Never waits for the connection, and the bound
  // keeps what is unanswered within the sockets' buffers, so the send does
  // not wait on a store that has stopped reading either.
  bool Send(const v1::LookupRequest& req, OnAnswer on_answer);

  // Lookups answered over the connection so far (tests).
  [[nodiscard]] uint64_t answered() const;
  // True while connected (tests).
  [[nodiscard]] bool connected() const;

  static constexpr size_t kMaxUnansweredBytes = 64 << 10;

 private:
  void Run();
  // Reads answers until the connection breaks or Shutdown.
  void ServeConnection(rpc::FramedSocket* sock);

  BulkLoadClient* const ports_;
  const int64_t io_timeout_ms_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::unique_ptr<rpc::FramedSocket> sock_;  // set while connected
  struct Unanswered {
    OnAnswer on_answer;
    size_t bytes;
  };
  std::deque<Unanswered> unanswered_;  // in send order
  size_t unanswered_bytes_ = 0;
  uint64_t answered_ = 0;
  std::thread thread_;
};

}  // namespace tandem::kvconnector
