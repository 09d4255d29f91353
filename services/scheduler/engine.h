// The scheduler service's engine: the gRPC adapter around engine::EngineCore
// (libs/engine), which owns the scheduler, the KV connector's scheduler role,
// the live requests and the steps in flight. ONE loop thread drives the core
// (DESIGN §2); RPC handlers, the worker reader and the connector only post
// events here.
//
// Per iteration the loop drains its events (new requests, cancels, aborts,
// worker outputs, worker up/down) into the core, then lets it schedule and
// send (EngineCore::Step) through the worker's Execute stream, which this
// class is the StepTransport of.
//
// Worker failure: the core keeps or fails the live requests (see
// EngineCore); the connector reconnects, and a fresh scheduler is sized from
// the new worker's Describe.
//
// Drain: TryAccept() is the one gate for new Generate calls. A call it let in
// counts as open until the engine finishes it, whether or not the engine has
// seen it yet, so SetDraining() + waiting for num_calls_open() == 0 lets every
// accepted call finish while every later one gets UNAVAILABLE.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "call.h"
#include "engine_metrics.h"
#include "tandem/engine/engine_core.h"
#include "tandem/metrics/metrics.h"
#include "tandem/sched/scheduler.h"
#include "tandem/v1/generation.pb.h"
#include "vllm_metrics.h"
#include "worker_link.h"

namespace tandem::scheduler {

struct EngineOptions {
  // The core's settings: scheduler config, max_model_len, the worker-loss
  // grace, the served model name and the worker's address (host:port of the
  // tandem-worker, which the engine connects to). The engine sets the
  // callbacks (make_kv_connector, on_*) itself.
  engine::EngineCoreOptions core{.worker_address = "127.0.0.1:50061"};
  // host:port of tandem-kvstore; empty = no KV-store connector (DESIGN §5).
  std::string kvstore_target;
  // A KV-store lookup unanswered after this long counts as zero hits.
  int64_t kvstore_lookup_deadline_ms = 50;
  // How lookups reach the store: "auto" (the store's bulk port lookup
  // connection when it advertises one, else gRPC), "off" (gRPC only) or
  // host:port of the bulk port. See KvStoreConnectorOptions::bulk_load.
  std::string kvstore_bulk_port = "auto";
  // Log a line per finished or refused request (vLLM's
  // --disable-log-requests turns it off).
  bool log_requests = true;
  // TEST-ONLY: the loop sleeps this long before taking each new request, so
  // tests can hold accepted calls in the queue (the drain test). 0 = off.
  int32_t debug_submit_delay_ms = 0;

  [[nodiscard]] absl::Status Validate() const;
};

// What GetStats reports (GenerationService converts it to the proto).
struct ServiceStats {
  engine::EngineStats engine;
  bool draining = false;
  // The cost of putting steps on the wire, summed over the steps sent.
  uint64_t step_message_bytes_sum = 0;  // serialized SchedulerOutput bytes
  int64_t step_to_proto_ns_sum = 0;     // struct -> proto conversion
  // One step in kSerializeSampleEvery is serialized a second time to time it
  // (gRPC's own serialization happens inside Write()).
  uint64_t step_serialize_samples = 0;
  int64_t step_serialize_ns_sum = 0;
};

class Engine final : private engine::StepTransport {
 public:
  // `registry` receives the engine's metrics; may be null.
  explicit Engine(EngineOptions options, prometheus::Registry* registry = nullptr);
  ~Engine() override;

  void Start();
  // Fails every live call with UNAVAILABLE and joins the threads.
  void Stop();

  // Admits a new call unless draining: true = the call is open and must be
  // Submit()ted; false = answer UNAVAILABLE. Never blocks.
  [[nodiscard]] bool TryAccept();
  // Calls TryAccept() let in that have not finished yet.
  int32_t num_calls_open() const { return num_calls_open_.load(); }
  // When the engine loop last went round (MonotonicNanos); it goes round at
  // least every kIdleHeartbeat while idle. The liveness watchdog reads it.
  int64_t last_loop_ns() const { return last_loop_ns_.load(); }
  static constexpr std::chrono::milliseconds kIdleHeartbeat{500};
  // An accepted call; the core validates the request. The engine answers
  // through `call`.
  void Submit(std::shared_ptr<GenerateCall> call, sched::RequestSpec spec);
  // Why a call went away before it finished.
  enum class CancelCause { kClient, kDeadline };
  // The client cancelled or its deadline passed.
  void Cancel(std::shared_ptr<GenerateCall> call, CancelCause cause);
  // The Abort RPC; `done(found)` runs on the engine thread. `stop_string`:
  // the frontend matched a stop string, so the request finishes as "stop".
  void Abort(std::string request_id, std::function<void(bool)> done, bool stop_string = false);

  // As of the loop's last turn.
  ModelInfo model_info() const;
  // Why the last worker that connected was refused (its configuration);
  // empty once one is accepted.
  std::string refused_worker() const {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_worker_;
  }
  // How long after refusing a worker the scheduler connects again.
  static constexpr std::chrono::milliseconds kRefusedWorkerRetry{2000};
  ServiceStats stats() const;
  // New calls get UNAVAILABLE; accepted ones finish.
  void SetDraining();
  bool draining() const { return draining_.load(); }
  // Called on the engine thread when the worker connection goes up or down.
  void set_on_serving_changed(std::function<void(bool)> fn) { on_serving_changed_ = std::move(fn); }

 private:
  friend class GenerateCall;  // its RequestSink methods report back here

  struct Event {
    enum Kind { kSubmit, kCancel, kAbort, kOutput, kBroken, kConnected, kWake } kind;
    std::shared_ptr<GenerateCall> call;
    sched::RequestSpec spec;
    std::string request_id;
    std::function<void(bool)> abort_done;
    FinishReason abort_reason = FinishReason::kAbort;
    uint64_t generation = 0;
    std::unique_ptr<v1::ModelRunnerOutput> output;
    std::unique_ptr<WorkerStream> stream;
    std::string reason;
    CancelCause cancel_cause = CancelCause::kClient;
  };

  void Post(Event event);
  void Loop();
  void Handle(Event& event);
  void Connect(std::unique_ptr<WorkerStream> stream);
  // engine::StepTransport: converts and writes one step.
  bool Send(const sched::SchedulerOutput& step) override;
  // The core dropped the worker.
  void OnWorkerLost();
  std::unique_ptr<sched::KvConnectorScheduler> MakeKvConnector(
      const engine::WorkerDescription& worker);
  // GenerateCall's RequestSink methods (engine thread).
  void CallTokens(GenerateCall& call, const sched::RequestOutput& out);
  void CallFinished(GenerateCall& call, FinishReason reason, const sched::RequestOutput* out,
                    const absl::Status& status);
  void CallRejected(GenerateCall& call, const absl::Status& status);
  void NoteTokens(GenerateCall& call, size_t num_tokens);
  // Hands writes_ to writer_ (engine thread).
  void HandOffWrites();
  // Idle after work: hands the heap's free pages back to the OS
  // (malloc_trim). glibc keeps what gRPC's threads freed in their arenas: a
  // round of 1,000 streams, half cancelled, left the scheduler ~30 MB above
  // its idle RSS for good (tests/integration/load_cancel_test.cc). At most
  // once per kTrimPeriod, and only on the loop thread while no call is open.
  void TrimHeapWhenIdle();
  void PublishStats();

  const EngineOptions options_;
  std::unique_ptr<WorkerConnector> connector_;
  std::function<void(bool)> on_serving_changed_;
  prometheus::Registry* const registry_;
  std::unique_ptr<EngineMetrics> metrics_;  // null until the model name is known
  // vLLM's series; made when the first worker connects (their token-count
  // buckets end at max_model_len).
  std::unique_ptr<VllmMetrics> vllm_metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  bool stopping_ = false;
  ModelInfo model_info_;          // under mu_
  std::string refused_worker_;    // under mu_
  ServiceStats stats_;            // under mu_
  std::atomic<bool> draining_{false};
  std::atomic<int32_t> num_calls_open_{0};
  std::atomic<int64_t> last_loop_ns_{0};

  // Owned by the loop thread.
  std::thread loop_;
  // Calls whose writes this loop turn queued (engine thread), handed to
  // writer_ after the turn's events and after its Step (see call.h).
  std::vector<std::shared_ptr<GenerateCall>> writes_;
  StreamWriter writer_;
  std::unique_ptr<engine::EngineCore> core_;
  std::unique_ptr<WorkerStream> worker_;  // the core's transport while set
  uint64_t max_broken_generation_ = 0;
  ServiceStats wire_;  // the step_* sums
  std::string serialize_scratch_;
  v1::SchedulerOutput step_proto_;
  static constexpr std::chrono::seconds kTrimPeriod{2};
  bool busy_since_trim_ = false;
  std::chrono::steady_clock::time_point last_trim_{};
};

}  // namespace tandem::scheduler
