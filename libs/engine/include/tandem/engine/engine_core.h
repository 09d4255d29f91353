// EngineCore: the scheduler side of the step contract (DESIGN §2), free of
// gRPC and protos. It owns the sched::Scheduler, the KV connector's
// scheduler role and the table of live requests. The one queue of steps in
// flight is the scheduler's (it keeps each step it built until the step's
// output is processed). The services are adapters around it: tandem-scheduler's Engine
// runs it on its loop thread, feeds it requests and worker outputs and
// sends its steps through a StepTransport over the worker's Execute stream;
// tests drive it with a fake transport (tests/engine/engine_core_test.cc).
//
// One turn, as the loop reads it:
//
//   core.ProcessOutput(output);   // the worker answered the oldest step
//   core.Step();                  // schedule -> send, while the window has room
//
// Step() sends at most 2 steps ahead with async scheduling, else 1. Outputs
// must answer the steps in the order they were sent; an output for any other
// step drops the worker.
//
// The placeholder invariant (DESIGN §2): with async scheduling, step N+1 is
// built before step N's tokens are known; the scheduler advances the
// request's counters by the tokens it scheduled and the worker fills the
// placeholders from its own sampled tokens (libs/worker StepExecutor checks
// them). The engine hands the outputs to the scheduler only for the oldest
// step in flight, so a request's placeholders resolve in the order they were
// made; a failed step fails the steps built on it (the scheduler recomputes
// their requests).
//
// Worker loss: with worker_loss_grace_s > 0, every live request is kept and
// resumes on the next worker (re-added with the tokens it already streamed);
// requests that arrive meanwhile wait with them. Otherwise, and when the
// grace runs out, they end with UNAVAILABLE.
//
// Threading: not thread-safe. One thread (the service's loop) makes every
// call, and every RequestSink and StepTransport call happens on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "tandem/common/finish_reason.h"
#include "tandem/common/model_info.h"
#include "tandem/common/sampling_params.h"
#include "tandem/sched/kv_connector.h"
#include "tandem/sched/scheduler.h"

namespace tandem::engine {

// Where one request's results go: the service's Generate call, or a recorder
// in tests.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // The request is in a step sent to the worker as a new request: its first
  // step, or its first after a preemption or a worker loss (vLLM's SCHEDULED
  // event; for the phase timings). May come again after OnTokens.
  virtual void OnScheduled() {}
  // Tokens to stream (out.new_token_ids, never empty), with their logprobs
  // and the prompt's when the request asked (RequestOutput).
  virtual void OnTokens(const sched::RequestOutput& out) = 0;
  // The request ended; the last call it gets. `out` is the scheduler's last
  // output for it (its final tokens and usage), or null when it ended without
  // one (the worker was lost, shutdown). `status` is OK for stop, length and
  // an Abort(); else the error the client gets.
  virtual void OnFinished(FinishReason reason, const sched::RequestOutput* out,
                          const absl::Status& status) = 0;
  // The request was refused (invalid, duplicate id, queue full, no worker);
  // the last call it gets.
  virtual void OnRejected(const absl::Status& status) = 0;
};

// The link to the worker, as the engine sees it.
class StepTransport {
 public:
  virtual ~StepTransport() = default;
  // Sends one step. false when the link broke: the engine drops the worker.
  virtual bool Send(const sched::SchedulerOutput& step) = 0;
};

// What a worker says about itself (the service converts its Describe).
struct WorkerDescription {
  std::string model_name;
  std::string model_fingerprint;
  std::string kv_layout;
  int32_t block_size = 0;
  int32_t num_kv_blocks = 0;
  int32_t vocab_size = 0;
  int32_t eos_token_id = -1;
  // More ids that end a request as eos_token_id does (Llama 3's list).
  std::vector<int32_t> extra_eos_token_ids;
  int32_t max_model_len = 0;
  int64_t block_bytes = 0;  // one block of every layer's K and V
  // The model's sampling defaults; ConnectWorker refuses invalid ones.
  GenerationDefaults generation;
  // It applies structured outputs (SchedulerConfig::structured_outputs).
  bool structured_outputs = false;
};

// The engine's state as plain numbers (the service maps them onto
// GetStatsResponse and Prometheus).
struct EngineStats {
  bool worker_connected = false;
  bool async_scheduling = false;
  int32_t num_requests = 0;  // live requests, including those kept through a worker loss
  int32_t num_steps_in_flight = 0;
  int32_t max_steps_in_flight = 0;  // the most ever out at once
  uint64_t num_worker_connects = 0;
  uint64_t num_steps_sent = 0;
  uint64_t step_scheduled_reqs_sum = 0;  // requests scheduled, summed over steps
  // The most requests running plus loading their prefix at once.
  int32_t max_running_plus_loading = 0;
  // Requests kept through worker losses (the scheduler, rebuilt on every
  // connect, cannot count them).
  uint64_t num_worker_lost_preemptions = 0;
  // KV-store load failures by reason, summed over the worker's reports.
  uint64_t load_failed_not_found = 0;
  uint64_t load_failed_checksum = 0;
  uint64_t load_failed_rpc = 0;
  // Present while a worker serves.
  bool has_scheduler = false;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_free_blocks = 0;
  int32_t num_total_blocks = 0;
  sched::SchedulerStats scheduler;
  bool has_kv_connector = false;
  sched::KvConnectorSchedulerStats kv_connector;
};

struct EngineCoreOptions {
  // Scheduler settings; block size, number of blocks, vocabulary, EOS and the
  // hash root come from the worker's description.
  sched::SchedulerConfig scheduler;
  // Upper bound on prompt + output tokens; 0 = the model's max_seq_len.
  int32_t max_model_len = 0;
  // When the worker is lost, live requests wait this long for a worker to
  // serve again and then resume where they stopped (the tokens a run without
  // the loss gives: greedy, or seeded by the server); after it they end with
  // UNAVAILABLE. Requests that arrive meanwhile wait with them (validated
  // when they start). 0: they end at once. See the file comment.
  double worker_loss_grace_s = 30;
  // A worker with steps in flight that returns none for this long is
  // wedged (a hung kernel, a deadlocked loop: its process and connection
  // live on, so nothing else notices) and is dropped as if its stream had
  // broken; its requests wait out the grace above. vLLM's multiprocess
  // executor gives a step 300 s (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS).
  // 0: never.
  double step_timeout_s = 300;
  // The model's name in ModelInfo and the model_name label of the service's
  // metrics (vLLM's --served-model-name); empty: the worker's.
  std::string served_model_name;
  // The worker's address (host:port), for messages.
  std::string worker_address;
  // Makes the KV connector's scheduler role for a worker that connected;
  // empty, or a null result: no connector.
  std::function<std::unique_ptr<sched::KvConnectorScheduler>(const WorkerDescription&)>
      make_kv_connector;
  // Each Schedule() call's duration in seconds (a histogram); may be empty.
  std::function<void(double)> on_schedule_duration;
  // Each step sent to the worker: its number of tokens to compute. May be
  // empty.
  std::function<void(int32_t)> on_step_sent;
  // The worker was dropped (after the engine let go of its transport); the
  // service reconnects. May be empty.
  std::function<void(const std::string& reason)> on_worker_lost;
};

class EngineCore {
 public:
  using Clock = std::chrono::steady_clock;

  explicit EngineCore(EngineCoreOptions options);
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // --- The worker ---
  // A worker serves through `transport` (not owned; valid until the engine
  // drops the worker or ConnectWorker is called again). Builds a fresh
  // scheduler (and connector) from its description and resumes the requests
  // kept since a loss. An error when the description is unusable: nothing
  // changed.
  absl::Status ConnectWorker(const WorkerDescription& worker, StepTransport* transport);
  // The worker is gone (its stream broke, or the engine saw it misbehave):
  // the steps in flight, the scheduler and the connector go; live requests
  // are kept for the grace or end. Calls options.on_worker_lost.
  void DropWorker(std::string_view reason);
  [[nodiscard]] bool has_worker() const { return transport_ != nullptr; }

  // --- Requests ---
  // Takes a request; the sink hears of it until OnFinished or OnRejected.
  void AddRequest(sched::RequestSpec spec, std::shared_ptr<RequestSink> sink, int64_t arrival_ns);
  // Ends a live request with `reason` (kAbort; kStop where the caller
  // matched a stop string) and `status` (OK for the Abort API, CANCELLED or
  // DEADLINE_EXCEEDED for the client's cancel). When `sink` is not null it
  // must be the request's (a late cancel of a reused id changes nothing).
  // false when no such request is live.
  bool Abort(const std::string& request_id, const RequestSink* sink, const absl::Status& status,
             FinishReason reason = FinishReason::kAbort);
  // Ends every live request with kError and `status` (shutdown).
  void FailAll(const absl::Status& status);
  [[nodiscard]] size_t num_requests() const { return requests_.size(); }

  // --- Steps ---
  // The worker's output for the oldest step in flight.
  void ProcessOutput(const sched::ModelRunnerOutput& output);
  // Schedules and sends steps while a worker serves, the window has room,
  // requests are unfinished and the last step was not empty (an empty step
  // waits for news: a request, an output, a Wake()), unless paced (see
  // kEmptyStepPace).
  void Step();
  // Something outside may have unblocked a request (a KV-store lookup
  // answered, a drain began): the next Step() schedules at once, even
  // while the empty step sent before the news is in flight, if the window
  // has room.
  void Wake();

  // --- Time ---
  // The engine's loop is: wait for an event or NextDeadline(), handle the
  // events, Tick(now), Step(), flush what the sinks wrote.
  //
  // When the loop must go round even if no event comes: at once (a time
  // already past) when Step() would send, the empty-step pace's end, the
  // worker-loss grace's end, or the next idle store collection; nullopt:
  // only an event brings work.
  [[nodiscard]] std::optional<Clock::time_point> NextDeadline() const;
  // What is due by `now`: the requests kept through a worker loss end when
  // the grace ran out; and while idle with store entries the worker has not
  // reported sent (they only come back with a step's output), an empty step
  // goes out every kIdleStoreCollectPeriod to collect them.
  void Tick(Clock::time_point now);
  static constexpr std::chrono::milliseconds kIdleStoreCollectPeriod{100};

  [[nodiscard]] const ModelInfo& model_info() const { return model_info_; }
  [[nodiscard]] EngineStats stats() const;

  // An empty step while no KV load is in flight means every unfinished
  // request waits for something outside the worker (a KV-store lookup, or
  // memory): the next step waits for an event or this long, instead of
  // sending empty steps as fast as the worker answers them (which burned a
  // core on each side and starved the lookups themselves on small machines).
  static constexpr std::chrono::milliseconds kEmptyStepPace{1};

 private:
  struct Entry {
    std::shared_ptr<RequestSink> sink;
    int64_t arrival_ns = 0;
    // Kept while worker_loss_grace_s > 0, to resume the request on the next
    // worker: the request as submitted and the tokens streamed so far.
    sched::RequestSpec spec;
    std::vector<int32_t> streamed_token_ids;
    bool started = false;  // the scheduler took it once
  };

  [[nodiscard]] size_t window() const;
  // Step() would send now, pacing aside.
  [[nodiscard]] bool CanSchedule() const;
  // Nothing to schedule and nothing in flight, but store entries are out.
  [[nodiscard]] bool StoresToCollectWhileIdle() const;
  // Set while requests wait for a worker after a loss.
  [[nodiscard]] std::optional<Clock::time_point> worker_loss_deadline() const;
  // Ends the kept requests when the grace ran out by `now`.
  void ExpireWorkerLossGrace(Clock::time_point now);
  bool SendStep(sched::SchedulerOutput step);
  void Deliver(const sched::RequestOutput& out);
  void Finish(const std::string& request_id, FinishReason reason, const sched::RequestOutput* out,
              const absl::Status& status);
  void ResumeRequests();

  const EngineCoreOptions options_;
  StepTransport* transport_ = nullptr;
  // Declared before scheduler_ so it outlives it; rebuilt with it on every
  // worker connect (the namespace follows the worker's model and layout).
  std::unique_ptr<sched::KvConnectorScheduler> kv_connector_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  // The last worker's config and pool, to validate requests that arrive
  // while none serves.
  std::optional<sched::SchedulerConfig> last_config_;
  int32_t last_num_total_blocks_ = 0;
  std::unordered_map<std::string, Entry> requests_;
  bool schedule_wanted_ = true;
  Clock::time_point pace_until_{};
  // The next idle store collection, armed by Tick() while stores are out.
  std::optional<Clock::time_point> store_collect_at_;
  std::optional<Clock::time_point> worker_lost_at_;
  std::string worker_lost_reason_;
  // Since when the worker owes a step: the send of a step into an empty
  // window, then each output while steps remain in flight (unset when none
  // is). Tick() drops the worker step_timeout_s after it.
  std::optional<Clock::time_point> owed_since_;
  // Connectors of dropped workers, being destroyed on their own threads
  // (RetireConnector); the engine's destructor waits for them.
  std::vector<std::future<void>> retiring_;
  void RetireConnector();
  [[nodiscard]] std::optional<Clock::time_point> step_deadline() const;
  ModelInfo model_info_;
  EngineStats counters_;  // the running totals; stats() adds the gauges
  // The counters of the schedulers dropped with their workers, added to the
  // current one's (stats().scheduler's counters never go down).
  sched::SchedulerStats lost_scheduler_counters_;
  // Adds the counter fields of `from` (not its gauges) to *to.
  static void AddCounters(const sched::SchedulerStats& from, sched::SchedulerStats* to);
  std::vector<sched::RequestOutput> outputs_scratch_;
};

}  // namespace tandem::engine
