#include "bulk_lookup_client.h"

#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"

namespace tandem::kvconnector {
namespace {

constexpr auto kFirstRetry = std::chrono::seconds(1);
constexpr auto kMaxRetry = std::chrono::seconds(10);
constexpr uint32_t kMaxAnswerBytes = 1 << 20;

}  // namespace

BulkLookupClient::BulkLookupClient(BulkLoadClient* ports, int64_t io_timeout_ms)
    : ports_(ports), io_timeout_ms_(io_timeout_ms) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "kv-lookup-conn");
    Run();
  });
}

BulkLookupClient::~BulkLookupClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (sock_) shutdown(sock_->fd(), SHUT_RDWR);  // wakes the thread's recv
  }
  cv_.notify_all();
  thread_.join();
}

bool BulkLookupClient::Send(const v1::LookupRequest& req, OnAnswer on_answer) {
  const size_t bytes = req.ByteSizeLong() + 4;
  std::lock_guard<std::mutex> lock(mu_);
  if (!sock_ || stopping_) return false;
  // One lookup of any size may go when none waits (the store is reading).
  if (!unanswered_.empty() && unanswered_bytes_ + bytes > kMaxUnansweredBytes) return false;
  // Under the lock, so the queue's order is the order on the wire.
  if (!sock_->Write(req).ok()) {
    shutdown(sock_->fd(), SHUT_RDWR);  // the thread sees it, fails the rest, reconnects
    return false;
  }
  unanswered_.push_back({std::move(on_answer), bytes});
  unanswered_bytes_ += bytes;
  return true;
}

uint64_t BulkLookupClient::answered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answered_;
}

bool BulkLookupClient::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sock_ != nullptr;
}

void BulkLookupClient::Run() {
  auto retry = kFirstRetry;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    std::unique_ptr<rpc::FramedSocket> sock;
    if (std::optional<BulkLoadClient::Address> addr = ports_->FindAddress()) {
      sock =
          ports_->Dial(*addr, rpc::kKvBulkLookupPreface, std::min<int64_t>(io_timeout_ms_, 5'000));
      if (sock != nullptr) {
        // Sends are bounded; the wait for an answer is not (the connection
        // is idle between lookups).
        sock->SetTimeouts(io_timeout_ms_, 0);
      } else {
        ports_->ForgetAddress();
      }
    }
    if (sock) {
      rpc::FramedSocket* raw = sock.get();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
        sock_ = std::move(sock);
      }
      retry = kFirstRetry;
      ServeConnection(raw);
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, retry, [&] { return stopping_; });
    retry = std::min<std::chrono::seconds>(retry * 2, kMaxRetry);
  }
}

void BulkLookupClient::ServeConnection(rpc::FramedSocket* sock) {
  v1::BulkLookupAnswer answer;
  absl::Status io;
  for (;;) {
    io = sock->Read(&answer, kMaxAnswerBytes);
    if (!io.ok()) break;
    OnAnswer done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (unanswered_.empty()) {
        io = absl::InternalError("an answer to no lookup");
        break;
      }
      done = std::move(unanswered_.front().on_answer);
      unanswered_bytes_ -= unanswered_.front().bytes;
      unanswered_.pop_front();
      ++answered_;
    }
    done(absl::Status(static_cast<absl::StatusCode>(answer.status_code()), answer.status_message()),
         answer.response());
  }
  std::unique_ptr<rpc::FramedSocket> closed;
  std::deque<Unanswered> failed;
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed = std::move(sock_);
    failed.swap(unanswered_);
    unanswered_bytes_ = 0;
    stopping = stopping_;
  }
  if (!stopping) {
    TANDEM_LOG(WARNING) << "KV-store lookup connection (bulk port) lost: " << io
                        << "; lookups go over gRPC until it reconnects";
  }
  const absl::Status lost =
      absl::UnavailableError(absl::StrCat("KV-store lookup connection lost: ", io.message()));
  for (Unanswered& f : failed) f.on_answer(lost, v1::LookupResponse());
}

}  // namespace tandem::kvconnector
