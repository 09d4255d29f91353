// The KV-store connector (DESIGN §5): the scheduler role
// (KvStoreConnectorScheduler, a sched::KvConnectorScheduler) and the worker
// role (KvStoreConnectorWorker), both talking to tandem-kvstore through
// KvStoreClient.
//
// Namespace: both roles derive the same KV-store namespace from the model
// fingerprint and the KV layout (NamespaceFor), and create it at start-up
// with the block byte size (CreateNamespace is idempotent). Block keys are
// the scheduler's chained block hashes, whose root already covers the model,
// layout, block size, dtype and cache salt (tenant), so tenants never share
// blocks even within one namespace.
//
// Ordering (DESIGN §5 "Ordering"): Tandem takes the first option. The worker
// executes steps strictly in order on one thread; a step's loads are copied
// into the cache *before* its forward pass (so after every earlier step's
// forward pass, which may still have written a block the scheduler freed and
// reused), and a step's stores copy their blocks out of the cache right
// *after* its forward pass, before the next step runs (so a later step never
// overwrites a block before it is read). On the CUDA backend the copies only
// begin there: they run on a stream of their own into pinned staging, and a
// later step that writes one of those blocks waits for its copy on the
// device (ModelRunner::CopyBlocksToHostAsync); the store thread waits for
// the copies, then sends the bytes to the store. Hence the scheduler never has to hold blocks back
// for a store: RequestFinished() returns false, and finished_sending is only
// bookkeeping (stores in flight). A store of a request that had ended when
// the step was built (KvStoreOp::before_forward) is copied out before the
// step's loads and forward pass, which may reuse its blocks.
//
// Loads run beside the steps: step N's LoadBlocks hands its loads to the
// load threads, one of which reads them from the store into pinned staging
// while steps N, N+1, ... compute the other requests (and other threads
// read later steps' loads). A later step's LoadBlocks
// (before its forward pass) or FinishLoads (after it) copies the arrived
// blocks into the cache on the step thread, so the copy still follows
// every earlier forward pass (DESIGN §5 "Ordering"; the blocks belong to a
// request in kWaitingForRemoteKv, which no step computes, and the
// scheduler holds them until finished_recving even when the request is
// aborted). That step reports finished_recving, with the blocks that failed
// (missing, checksum, timeout/RPC failure) in invalid_block_ids; the
// scheduler then keeps only the blocks before the first invalid one and
// recomputes the rest (outputs are unchanged). A step with nothing to
// compute waits in FinishLoads (up to StepExecutorOptions::
// empty_step_load_wait, or until the next step arrives) so that an engine
// with only loads in flight neither spins empty steps nor learns late.
//
// Lookups and leases (scheduler role): a lookup asks for the request's block
// hashes beyond its local hit, with a lease and stage_to_hot. The answer is
// kept (the scheduler may ask again when a step had no room) and refreshed
// when it missed blocks and is older than lookup_refresh_ms. The lease is
// released when the request is admitted without a load, when its load is
// reported finished (held until then so the store cannot evict the blocks
// before the worker reads them), or when the request finishes or is aborted.
//
// What is stored (scheduler role): per scheduled request, the full blocks
// below ScheduledRequestView::num_storable_tokens() (never a placeholder)
// that the store is not known to hold; and when a request ends, the full
// blocks below RequestFinished's num_storable_tokens that no step covered
// (in async mode the outputs that end a request often complete its last
// block), as a KvStoreOp with before_forward set: the worker reads those
// blocks before the next step's loads and forward pass, since the
// scheduler has freed them. "Known" = emitted for storing or seen
// as a lookup hit; a lookup miss or a failed load forgets the hash so the
// block is stored again. The worker reports every store entry in
// finished_sending once it is done (stored, failed, or dropped when its
// queue was full or its step failed), and an entry that did not store all
// its blocks in failed_sending as well; the scheduler role forgets the
// hashes of that request's entries, so a lost store is retried by a later
// request instead of never.
//
// The engine's side (engine::EngineCore): while a lookup is pending and
// nothing else can run, it sends an empty step at most every
// EngineCore::kEmptyStepPace, or at once when the answer arrives
// (on_lookup_answer). finished_sending only arrives with a step: while idle
// with store entries not reported (stats().stores_in_flight), it sends an
// empty step every 100 ms to collect them, so stores_in_flight settles at 0.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/common/block_hash.h"
#include "tandem/common/flags.h"
#include "tandem/common/pinned_memory.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/sched/kv_connector.h"
#include "tandem/sched/scheduler_output.h"

namespace tandem::kvconnector {

class StoreStaging;

// Keeps gRPC's shared callback completion queue alive for the life of the
// process (works around a gRPC 1.51 shutdown race; see the .cc). Called by
// the connectors' Create; idempotent.
void PinGrpcCallbackQueue();

// "tandem-" + 32 hex digits of SHA-256 over (model fingerprint, KV layout).
[[nodiscard]] std::string NamespaceFor(const std::string& model_fingerprint,
                                       const std::string& kv_layout);

// One step's loads, as the worker role ran them (KvStoreConnectorOptions::
// on_load): where a load's time goes, for the worker's metrics.
struct KvLoadTiming {
  int64_t blocks = 0;  // asked for
  int64_t bytes = 0;   // of the blocks that arrived intact
  // From the store into host memory (the client's Load: the store's answer,
  // the transfer and the checksums).
  double read_seconds = 0;
  // From host memory into the KV cache (CopyFromHost: on a GPU, the DMA).
  double copy_seconds = 0;
};

struct KvStoreConnectorOptions {
  // host:port of tandem-kvstore. Required.
  std::string target;
  // A lookup unanswered after this long counts as zero hits. Default 50 ms.
  int64_t lookup_deadline_ms = 50;
  // Ask the store to stage cold-tier hits into its hot tier before the
  // lookup answers, so the worker's load never waits on disk. Default true.
  bool stage_to_hot = true;
  // A lookup answer that missed some blocks is asked again when the request
  // is still waiting this long after the answer (the blocks may have been
  // stored meanwhile, e.g. by an earlier request of the same burst).
  // Default 100 ms.
  int64_t lookup_refresh_ms = 100;
  // Lease time-to-live of a lookup's hits (released earlier when the load
  // finishes or the request ends); 0 = the store's default. Default 30 s.
  uint32_t lease_ttl_ms = 30'000;
  // Worker: deadline of one step's Load / one Store RPC. Default 5 s.
  int64_t transfer_deadline_ms = 5'000;
  // Worker: block bytes queued for the background store thread at most;
  // stores beyond it are dropped (counted). Default 256 MiB.
  int64_t max_pending_store_bytes = int64_t{256} << 20;
  // Worker: threads that read steps' loads from the store, so that many
  // steps' loads are read at once: one step's loads are one read, and a
  // slow read (a long prefix, a far or busy store) holds up no other
  // step's. Each read in progress holds its own staging. 1 to 64. Default 4.
  int32_t load_threads = 4;
  // Scheduler: hashes remembered as held by the store (stored or seen in a
  // lookup), so they are not stored again. Default 1,000,000.
  int64_t max_known_hashes = 1'000'000;
  // Worker: allocate the loads' staging memory with cudaHostAlloc (pinned,
  // so its copies into a GPU cache are DMA) when built with CUDA and a
  // device is present; otherwise it is page-aligned and mlock()ed where the
  // OS allows. Set false for a CPU backend on a machine with a GPU.
  // Default true.
  bool use_cuda_host_alloc = true;
  // Scheduler: called (on a gRPC thread) whenever a lookup's answer
  // arrives; the engine wakes its loop with it instead of sending empty
  // steps to poll the lookup. May be empty.
  std::function<void()> on_lookup_answer;
  // Scheduler: called on the scheduler's thread with each lookup's latency
  // (sent -> answer seen, seconds; late or failed ones too), for a
  // histogram. May be empty.
  std::function<void(double)> on_lookup_latency;
  // Scheduler: called on a gRPC thread with the outcome of creating the
  // namespace, which Create sends without waiting for (the engine loop
  // creates the connector and must not wait for a store that hangs). May be
  // empty; the outcome is logged either way.
  std::function<void(const absl::Status&)> on_namespace;
  // Worker: called on the worker's loop thread after each step's loads
  // (only steps that load). May be empty.
  std::function<void(const KvLoadTiming&)> on_load;
  // Worker: how loads and stores reach the store; scheduler: how lookups do.
  // "auto": the store's bulk port (TCP, under TLS with the process's client
  // TLS; see services/kvstore/bulk_load_server.h)
  // when it advertises one, else gRPC; "off": gRPC only; host:port: the bulk
  // port at this address (when a proxy or a Kubernetes Service maps ports).
  // Default auto.
  std::string bulk_load = "auto";

  [[nodiscard]] absl::Status Validate() const;
  // Checks a bulk-port setting like bulk_load ("auto", "off" or host:port);
  // `what` names the setting in the error.
  [[nodiscard]] static absl::Status ValidateBulkLoad(std::string_view value, const char* what);
  // bulk_load's host:port, or empty for auto and off.
  [[nodiscard]] std::string BulkPortTarget() const {
    return bulk_load == "auto" || bulk_load == "off" ? "" : bulk_load;
  }
};

// --kvstore and --kvstore-bulk-port, which the scheduler and the worker both
// take, registered in one place so that they keep one name and one meaning
// (the bulk port's values are KvStoreConnectorOptions::bulk_load's). `use`
// says what the service does with the store, for --kvstore's help.
// --kvstore-bulk-load, the worker's old name, stays an alias.
void AddKvStoreFlags(FlagSet* flags, std::string_view use, std::string* target,
                     std::string* bulk_port);

// The scheduler role's totals and gauges (sched::KvConnectorScheduler::stats).
using KvConnectorSchedulerStats = sched::KvConnectorSchedulerStats;

class KvStoreConnectorScheduler final : public sched::KvConnectorScheduler {
 public:
  // Creates the namespace (with `block_bytes`) and the client. Fails when
  // the options are invalid; an unreachable store is not an error (lookups
  // then miss until it comes up; the namespace is created again lazily).
  static absl::StatusOr<std::unique_ptr<KvStoreConnectorScheduler>> Create(
      const KvStoreConnectorOptions& options, const std::string& model_fingerprint,
      const std::string& kv_layout, int64_t block_bytes, int32_t block_size);
  ~KvStoreConnectorScheduler() override;

  std::optional<sched::ExternalMatch> GetNumNewMatchedTokens(
      const sched::Request& request, int32_t num_local_computed_tokens) override;
  void UpdateStateAfterAlloc(const sched::Request& request, std::span<const int32_t> block_ids,
                             int32_t num_external_tokens) override;
  sched::KvConnectorMetadata BuildConnectorMeta(
      const sched::SchedulerOutput& output,
      std::span<const sched::ScheduledRequestView> scheduled) override;
  bool RequestFinished(const sched::Request& request, std::span<const int32_t> block_ids,
                       int32_t num_storable_tokens) override;
  void OnLoadFinished(const sched::Request& request, int32_t num_loaded_tokens) override;
  void OnConnectorReport(const sched::KvConnectorReport& report) override;

  // Totals plus the gauges as of now.
  [[nodiscard]] KvConnectorSchedulerStats stats() const override;
  [[nodiscard]] const std::string& ns() const { return ns_; }

 private:
  struct Lookup {
    std::unique_ptr<PendingLookup> pending;
    int32_t first_block = 0;  // index of the first hash asked
    int32_t num_asked = 0;
    int64_t sent_ns = 0;
    int64_t answered_ns = 0;
    std::optional<RemoteLookupResult> result;
  };
  struct Load {
    LeaseId lease{0};
    std::vector<BlockHash> hashes;
    std::vector<int32_t> block_ids;
    bool emitted = false;
  };
  struct StoreCursor {
    uint64_t epoch = 0;
    int32_t next_block = 0;  // blocks below were stored or skipped
  };

  KvStoreConnectorScheduler(const KvStoreConnectorOptions& options,
                            std::unique_ptr<KvStoreClient> client, std::string ns,
                            int32_t block_size);
  void NoteKnown(const BlockHash& h);
  // The store entry for the request's full blocks from c->next_block up to
  // `num_storable_tokens` that the store is not known to hold; advances the
  // cursor and records the entry as pending.
  sched::KvStoreOp StoreFrom(const sched::Request& r, std::span<const int32_t> block_ids,
                           StoreCursor* c, int32_t num_storable_tokens);
  void ReleaseLease(LeaseId lease);

  const KvStoreConnectorOptions options_;
  std::unique_ptr<KvStoreClient> client_;
  const std::string ns_;
  const int32_t block_size_;

  absl::flat_hash_map<std::string, Lookup> lookups_;
  absl::flat_hash_map<std::string, Load> loads_;
  absl::flat_hash_map<std::string, StoreCursor> cursors_;
  // Stores queued by RequestFinished for the next step (before_forward).
  std::vector<sched::KvStoreOp> final_stores_;
  // Request -> hashes of its store entries not yet reported finished, in
  // the order emitted (the worker reports them in that order).
  absl::flat_hash_map<std::string, std::deque<std::vector<BlockHash>>> stores_pending_;
  // Hashes the store holds (stored by us or seen as lookup hits).
  absl::flat_hash_set<BlockHash> known_;
  KvConnectorSchedulerStats stats_;
};

// What the worker's load staging memory is.
enum class StagingMemory {
  kNone,        // not allocated yet (no load so far)
  kCudaPinned,  // cudaHostAlloc
  kLocked,      // page-aligned, mlock()ed
  kPageable,    // page-aligned; mlock() not allowed (RLIMIT_MEMLOCK)
};
[[nodiscard]] const char* StagingMemoryName(StagingMemory m);

// Reasons a block failed to load (worker stats).
struct KvConnectorWorkerStats {
  uint64_t loads = 0;  // load entries (requests) executed
  uint64_t blocks_loaded = 0;
  uint64_t load_failed_not_found = 0;  // blocks
  uint64_t load_failed_checksum = 0;
  uint64_t load_failed_rpc = 0;       // timeout, store down, stream broken
  uint64_t blocks_stored = 0;         // acknowledged by the store
  uint64_t blocks_store_failed = 0;   // rejected, RPC failed, or not copied out of the cache
  uint64_t blocks_store_dropped = 0;  // queue full, or the step failed before its snapshot
  int64_t stores_in_flight = 0;       // store entries queued or sending
  int64_t loads_in_flight = 0;        // steps' loads begun and not yet in the cache
  StagingMemory staging = StagingMemory::kNone;
  int64_t staging_bytes = 0;  // of loads: allocated, in use or kept for reuse
  // Host memory of queued stores, allocated so far and kept for reuse (at
  // most max_pending_store_bytes; see store_staging.h).
  int64_t store_staging_bytes = 0;
};

// The worker role. LoadBlocks, FinishLoads and SnapshotStores run on the
// worker's loop thread; load threads (options.load_threads) read the loads,
// each step's at once, and a store thread sends the snapshots.
class KvStoreConnectorWorker final : public sched::KvConnectorWorker {
 public:
  // Begins copying blocks out of the cache into out[i] (block_bytes each)
  // and returns what waits for the copies (ModelRunner::CopyBlocksToHostAsync):
  // stores call it on the step thread, and the store thread waits, so a step
  // never waits for its stores' copies.
  using CopyToHost = std::function<absl::StatusOr<std::function<absl::Status()>>(
      std::span<const int32_t> block_ids, std::span<const std::span<std::byte>> out)>;
  // A copy into the cache that CopyFromHost began
  // (ModelRunner::BlockCopyIn): done() never blocks and is true once the
  // copy has ended; wait() blocks until then and returns the copy's error.
  struct CopyIn {
    std::function<bool()> done;
    std::function<absl::Status()> wait;
  };
  // Begins copying in[i] (host memory of block_bytes) into cache block
  // block_ids[i] and returns the copy (ModelRunner::CopyBlocksFromHostAsync):
  // a step's loads in one call. `in` stays untouched, and the load is not
  // reported, until the copy has ended. An error, returned or from wait(),
  // fails every block of the call.
  using CopyFromHost = std::function<absl::StatusOr<CopyIn>(
      std::span<const int32_t> block_ids, std::span<const std::span<const std::byte>> in)>;

  static absl::StatusOr<std::unique_ptr<KvStoreConnectorWorker>> Create(
      const KvStoreConnectorOptions& options, const std::string& model_fingerprint,
      const std::string& kv_layout, int64_t block_bytes, CopyToHost to_host,
      CopyFromHost from_host);
  ~KvStoreConnectorWorker();

  // Before the forward pass: first copies out the blocks of the stores with
  // before_forward set (ended requests' blocks, which this step's loads or
  // forward pass may overwrite), then finishes the loads that have arrived
  // (FinishLoads, no wait) and hands `meta.loads` to the load threads (one
  // read of all their blocks into staging memory). Call it for every step,
  // also one without loads: it notes the step's stores, so that when the
  // step fails before SnapshotStores they are reported finished (as
  // dropped, at the next step) instead of never.
  void LoadBlocks(const sched::KvConnectorMetadata& meta,
                  sched::KvConnectorReport* report) override;
  // Begins copying the arrived loads' intact blocks into the cache
  // (CopyFromHost, one call per step's loads), and reports each load whose
  // copy has ended: its request id in report->finished_recving and each
  // failed block id in report->invalid_block_ids, with their counts by
  // reason. A copy still running (on a GPU, beside the next step's kernels)
  // is reported by a later call. With `wait` (a step with nothing to
  // compute), waits for a copy running, or else up to `wait` for a load to
  // arrive.
  void FinishLoads(sched::KvConnectorReport* report, std::chrono::microseconds wait) override;
  void SetStepQueued(bool queued) override;
  void ForgetLoads() override;
  // After the forward pass: copies every block of the other `meta.stores`
  // out of the cache (begins to: see CopyToHost) into store staging memory
  // and queues it for the store. Of an entry that does not fit in the
  // queue (max_pending_store_bytes), the leading blocks that fit are
  // stored and the rest dropped (none fit: all dropped); it is still
  // reported finished, and failed.
  void SnapshotStores(const sched::KvConnectorMetadata& meta) override;
  // Request ids whose store entries completed since the last call (one id
  // per entry, in the order the entries were given to SnapshotStores):
  // stored, failed or dropped alike in finished_sending, and those that did
  // not store every block also in failed_sending.
  void TakeFinishedSending(sched::KvConnectorReport* report) override;
  // Blocks until every queued store entry has completed, or `timeout_ms`
  // passed; true when none is left (tests).
  bool WaitForStores(int64_t timeout_ms);

  [[nodiscard]] KvConnectorWorkerStats stats() const;

 private:
  struct StoreJob {
    std::string request_id;
    std::vector<BlockHash> hashes;
    std::vector<std::byte*> blocks;  // one StoreStaging slot per hash
    // Waits for the copies into `blocks` (CopyToHost); empty when nothing
    // was copied.
    std::function<absl::Status()> copied;
    // Not sent (queue full, or its step failed before the snapshot); only
    // reported finished, in order.
    bool dropped = false;
    // Some block of the entry will not be in the store (dropped, not copied
    // out of the cache, rejected, or the RPC failed): reported in
    // failed_sending too.
    bool failed = false;
  };
  KvStoreConnectorWorker(const KvStoreConnectorOptions& options,
                         std::unique_ptr<KvStoreClient> client, std::string ns,
                         kvstore::NamespaceSpec spec, CopyToHost to_host, CopyFromHost from_host);
  void StoreLoop();
  void EnsureNamespace();
  void EnqueueLocked(StoreJob job);
  void AbandonUnsnapshotted();
  // Copies one store entry's blocks out of the cache and queues it.
  void SnapshotStore(const sched::KvStoreOp& s);

  const KvStoreConnectorOptions options_;
  std::unique_ptr<KvStoreClient> client_;
  const std::string ns_;
  const kvstore::NamespaceSpec spec_;
  const int64_t block_bytes_;
  CopyToHost to_host_;
  CopyFromHost from_host_;
  // One step's loads: read by a load thread, then copied into the cache
  // and reported by the step thread.
  struct LoadJob {
    std::vector<std::string> request_ids;
    std::vector<BlockHash> hashes;
    std::vector<int32_t> block_ids;
    // hashes.size() * block_bytes of staging memory (a tandem::PinnedBuffer:
    // CUDA-pinned when a device is present and options.use_cuda_host_alloc,
    // else page-aligned and locked where the OS allows), reused across jobs.
    PinnedBuffer staging;
    std::vector<LoadMiss> misses;  // per hash, once read
    double read_seconds = 0;
    uint64_t epoch = 0;  // load_epoch_ when begun (ForgetLoads)
    // The copy into the cache (BeginCopyIn) of copy_blocks intact blocks,
    // and when it began.
    CopyIn copy;
    int64_t copy_blocks = 0;
    std::chrono::steady_clock::time_point copy_start;
  };
  void LoadLoop();
  void BeginLoad(std::span<const sched::KvLoad> loads);
  // Begins copying the job's intact blocks into the cache (a copy that
  // cannot begin fails them: job.copy is then done).
  void BeginCopyIn(LoadJob& job);
  // After job.copy has ended: counts and reports the load (when `report`).
  void CompleteLoad(LoadJob& job, sched::KvConnectorReport* report);
  // A staging buffer of at least `bytes` (from load_staging_free_, or new).
  absl::StatusOr<PinnedBuffer> TakeLoadStaging(size_t bytes);

  // The load side, under load_mu_ (its own lock: a load never waits for the
  // store thread's bookkeeping, nor a store for a load).
  mutable std::mutex load_mu_;
  std::condition_variable load_cv_;
  std::deque<LoadJob> load_queue_;   // begun, not yet read
  std::vector<LoadJob> loads_done_;  // read, not yet copied into the cache
  int64_t loads_in_flight_ = 0;      // jobs of load_epoch_ begun, not completed
  uint64_t load_epoch_ = 0;
  bool step_queued_ = false;  // SetStepQueued
  bool load_stopping_ = false;
  std::vector<PinnedBuffer> load_staging_free_;
  int64_t load_staging_bytes_ = 0;  // allocated, in use or free
  // Loads whose copy into the cache has begun and is not yet seen to end,
  // oldest first (loop thread only; the destructor waits for them).
  std::vector<LoadJob> copying_;
  // The stores (request id, blocks) of the step whose LoadBlocks ran and
  // SnapshotStores did not yet (loop thread only).
  std::vector<std::pair<std::string, size_t>> unsnapshotted_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StoreJob> jobs_;
  int64_t pending_bytes_ = 0;                    // of the queued and sending jobs' blocks
  std::unique_ptr<StoreStaging> store_staging_;  // their memory
  std::vector<std::string> finished_sending_;
  std::vector<std::string> failed_sending_;
  bool sending_ = false;  // the store thread has a batch out
  bool stopping_ = false;
  std::atomic<bool> namespace_ok_{false};
  // Under mu_; loads_in_flight and staging_bytes come from the load side.
  KvConnectorWorkerStats stats_;
  std::thread store_thread_;
  std::vector<std::thread> load_threads_;
};

}  // namespace tandem::kvconnector
