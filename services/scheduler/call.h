// One Generate stream as the engine sees it: the request's
// engine::RequestSink, and a thread-safe queue of response messages and the
// final status in front of a gRPC ServerWriteReactor.
//
// The handler, for a call it refuses, calls Finish(), which starts the write
// at once. The engine thread only queues (Queue, QueueFinish) and hands the
// calls that need a write started to a StreamWriter, whose thread starts
// them; after that the reactor's OnWriteDone starts each next write. No
// thread ever blocks on a slow client: messages queue here.
//
// Why the engine thread does not start writes itself: gRPC 1.51 runs the
// HTTP/2 transport's write inline in the thread that calls StartWrite when
// the connection is idle, one sendmsg per message. At 256 streams that was
// 1-2 ms of every engine loop turn (tandem_scheduler_output_duration_seconds;
// ~107,000 sendmsg calls in 6 s on the engine thread, perf on the 2-core VM),
// and with a 1.9 ms step (stories260K on an H100) the worker sat idle 20-35%
// of the time waiting for the next step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_callback.h"
#include "tandem/common/clock.h"
#include "tandem/engine/engine_core.h"
#include "tandem/sched/scheduler.h"
#include "tandem/v1/generation.pb.h"
#include "vllm_metrics.h"

namespace tandem::scheduler {

class Engine;

class GenerateCall final : public engine::RequestSink,
                           public std::enable_shared_from_this<GenerateCall> {
 public:
  GenerateCall(grpc::ServerWriteReactor<v1::GenerateResponse>* reactor, Engine* engine)
      : reactor_(reactor), engine_(engine) {}

  // engine::RequestSink, on the engine thread (defined in engine.cc: metrics,
  // the log line, the drain count).
  void OnTokens(const sched::RequestOutput& out) override;
  void OnFinished(FinishReason reason, const sched::RequestOutput* out,
                  const absl::Status& status) override;
  void OnRejected(const absl::Status& status) override;

  // Queues a message (dropped after Finish was requested). True when
  // nothing will write it unless the caller has Flush() called: no write is
  // in flight and no Flush is already due. The caller then owes one Flush.
  [[nodiscard]] bool Queue(v1::GenerateResponse message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_requested_) return false;
    pending_.push_back(std::move(message));
    return NeedsFlush();
  }
  // Finishes the call once every queued message is written (idempotent);
  // the return value as Queue's.
  [[nodiscard]] bool QueueFinish(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_requested_) return false;
    finish_requested_ = true;
    finish_status_ = std::move(status);
    return NeedsFlush();
  }
  // Starts the next write, or the finish, unless a write is in flight.
  void Flush() {
    std::unique_lock<std::mutex> lock(mu_);
    flush_due_ = false;
    MaybeStart(lock);
  }
  // QueueFinish and Flush at once, on the calling thread.
  void Finish(grpc::Status status) {
    if (QueueFinish(std::move(status))) Flush();
  }
  void OnWriteDone(bool ok) {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) pending_.clear();  // cancelled: OnCancel tells the engine
    MaybeStart(lock);
  }

  void OnScheduled() override {
    if (times.scheduled_ns == 0) times.scheduled_ns = MonotonicNanos();
  }

  // Set by the handler before the call reaches the engine.
  std::string request_id;
  // arrival_ns and max_tokens set by the handler; the rest on the engine
  // thread.
  RequestTimeline times;
  int32_t num_prompt_tokens = 0;

 private:
  bool NeedsFlush() {
    if (writing_ || flush_due_ || finish_issued_) return false;
    flush_due_ = true;
    return true;
  }
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
  bool flush_due_ = false;  // a Queue* returned true; its Flush has not run
  bool finish_requested_ = false;
  bool finish_issued_ = false;
  grpc::Status finish_status_;
};

// One thread that calls Flush() on the calls the engine thread hands it, a
// batch per engine loop turn (one wake-up per turn, not per token). Stop()
// flushes what is left, then joins.
class StreamWriter {
 public:
  StreamWriter();
  ~StreamWriter();
  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  // Takes the calls out of `calls` (left empty).
  void Submit(std::vector<std::shared_ptr<GenerateCall>>& calls);
  void Stop();

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<GenerateCall>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem::scheduler
