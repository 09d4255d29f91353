// One Generate stream as the engine sees it: the request's
// engine::RequestSink, and a thread-safe queue of response messages and the
// final status in front of a gRPC ServerWriteReactor.
//
// The engine thread (and the handler, for a call it refuses) push messages
// and call Finish(); the reactor writes them one at a time. No thread ever
// blocks on a slow client: messages queue here.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_callback.h"
#include "tandem/engine/engine_core.h"
#include "tandem/sched/scheduler.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::scheduler {

class Engine;

class GenerateCall final : public engine::RequestSink {
 public:
  GenerateCall(grpc::ServerWriteReactor<v1::GenerateResponse>* reactor, Engine* engine)
      : reactor_(reactor), engine_(engine) {}

  // engine::RequestSink, on the engine thread (defined in engine.cc: metrics,
  // the log line, the drain count).
  void OnTokens(std::span<const int32_t> token_ids) override;
  void OnFinished(engine::FinishReason reason, const sched::RequestOutput* out,
                  const absl::Status& status) override;
  void OnRejected(const absl::Status& status) override;

  // Queues a message (dropped after Finish was requested).
  void Push(v1::GenerateResponse message) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finish_requested_) return;
    pending_.push_back(std::move(message));
    MaybeStart(lock);
  }
  // Finishes the call once every queued message is written. Idempotent.
  void Finish(grpc::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finish_requested_) return;
    finish_requested_ = true;
    finish_status_ = std::move(status);
    MaybeStart(lock);
  }
  void OnWriteDone(bool ok) {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) pending_.clear();  // cancelled: OnCancel tells the engine
    MaybeStart(lock);
  }

  // Set by the handler before the call reaches the engine.
  std::string request_id;
  int64_t start_ns = 0;
  int64_t first_token_ns = 0;  // engine thread only
  int64_t last_token_ns = 0;   // engine thread only
  int32_t num_prompt_tokens = 0;

 private:
  void MaybeStart(std::unique_lock<std::mutex>& lock) {
    if (writing_ || finish_issued_) return;
    if (!pending_.empty()) {
      writing_ = true;
      current_ = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      // The reactor lives until OnDone, which cannot come before Finish.
      reactor_->StartWrite(&current_);
      return;
    }
    if (finish_requested_) {
      finish_issued_ = true;
      grpc::Status status = finish_status_;
      lock.unlock();
      reactor_->Finish(status);
    }
  }

  grpc::ServerWriteReactor<v1::GenerateResponse>* const reactor_;
  Engine* const engine_;
  std::mutex mu_;
  std::deque<v1::GenerateResponse> pending_;
  v1::GenerateResponse current_;
  bool writing_ = false;
  bool finish_requested_ = false;
  bool finish_issued_ = false;
  grpc::Status finish_status_;
};

}  // namespace tandem::scheduler
