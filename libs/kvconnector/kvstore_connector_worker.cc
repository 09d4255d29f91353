#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "store_staging.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvconnector/kvstore_connector.h"

namespace tandem::kvconnector {

absl::StatusOr<std::unique_ptr<KvStoreConnectorWorker>> KvStoreConnectorWorker::Create(
    const KvStoreConnectorOptions& options, const std::string& model_fingerprint,
    const std::string& kv_layout, int64_t block_bytes, CopyToHost to_host, CopyFromHost from_host) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  if (block_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("block_bytes must be > 0, got ", block_bytes));
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvStoreClient> client,
                          KvStoreClient::Create(KvStoreClientOptions{
                              .target = options.target,
                              .lookup_deadline_ms = options.lookup_deadline_ms,
                              .rpc_deadline_ms = options.transfer_deadline_ms,
                              .bulk_load = options.bulk_load != "off",
                              .bulk_lookup = false,  // the worker does not look up
                              .bulk_load_target = options.BulkPortTarget()}));
  const std::string ns = NamespaceFor(model_fingerprint, kv_layout);
  kvstore::NamespaceSpec spec{
      .name = ns, .block_bytes = static_cast<uint64_t>(block_bytes), .layout = kv_layout};
  TANDEM_RETURN_IF_ERROR(spec.Validate());
  auto w = std::unique_ptr<KvStoreConnectorWorker>(new KvStoreConnectorWorker(
      options, std::move(client), ns, std::move(spec), std::move(to_host), std::move(from_host)));
  w->EnsureNamespace();
  return w;
}

KvStoreConnectorWorker::KvStoreConnectorWorker(const KvStoreConnectorOptions& options,
                                               std::unique_ptr<KvStoreClient> client,
                                               std::string ns, kvstore::NamespaceSpec spec,
                                               CopyToHost to_host, CopyFromHost from_host)
    : options_(options),
      client_(std::move(client)),
      ns_(std::move(ns)),
      spec_(std::move(spec)),
      block_bytes_(static_cast<int64_t>(spec_.block_bytes)),
      to_host_(std::move(to_host)),
      from_host_(std::move(from_host)),
      store_staging_(std::make_unique<StoreStaging>(block_bytes_, options.max_pending_store_bytes,
                                                    options.use_cuda_host_alloc)) {
  store_thread_ = std::thread([this] { StoreLoop(); });
  for (int32_t i = 0; i < options.load_threads; ++i) {
    load_threads_.emplace_back([this] { LoadLoop(); });
  }
}

KvStoreConnectorWorker::~KvStoreConnectorWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    load_stopping_ = true;
  }
  load_cv_.notify_all();
  if (store_thread_.joinable()) store_thread_.join();
  // A read under way ends by its transfer deadline.
  for (std::thread& t : load_threads_) t.join();
  // A copy into the cache still reads its staging, freed with the job.
  for (LoadJob& job : copying_) (void)job.copy.wait();
}

void KvStoreConnectorWorker::EnsureNamespace() {
  if (namespace_ok_.load()) return;
  absl::StatusOr<bool> created = client_->CreateNamespace(spec_);
  if (created.ok()) {
    namespace_ok_.store(true);
    TANDEM_LOG(INFO) << "KV-store " << options_.target << " namespace " << ns_
                     << (*created ? " created" : " exists");
  } else {
    TANDEM_LOG(WARNING) << "KV-store " << options_.target << ": namespace " << ns_ << ": "
                        << created.status();
  }
}

void KvStoreConnectorWorker::EnqueueLocked(StoreJob job) {
  pending_bytes_ += static_cast<int64_t>(job.blocks.size()) * block_bytes_;
  ++stats_.stores_in_flight;
  jobs_.push_back(std::move(job));
  cv_.notify_all();
}

void KvStoreConnectorWorker::AbandonUnsnapshotted() {
  if (unsnapshotted_.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [request_id, num_blocks] : unsnapshotted_) {
    stats_.blocks_store_dropped += num_blocks;
    EnqueueLocked(StoreJob{.request_id = std::move(request_id), .dropped = true, .failed = true});
  }
  unsnapshotted_.clear();
}

void KvStoreConnectorWorker::SnapshotStores(const sched::KvConnectorMetadata& meta) {
  unsnapshotted_.clear();
  for (const sched::KvStoreOp& s : meta.stores) {
    if (!s.before_forward) SnapshotStore(s);
  }
}

void KvStoreConnectorWorker::SnapshotStore(const sched::KvStoreOp& s) {
  StoreJob job;
  job.request_id = s.request_id;
  size_t n = std::min(s.block_ids.size(), s.block_hashes.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    // As many of the entry's leading blocks as the queue has room for: a
    // prefix is what a later lookup can hit. An entry larger than the whole
    // queue (a long prefill of an 8B-class model: 2 MiB blocks, 128 in the
    // default 256 MiB) used to be dropped whole, every time.
    const int64_t room = options_.max_pending_store_bytes - pending_bytes_;
    const size_t fit = std::min(n, static_cast<size_t>(std::max<int64_t>(0, room / block_bytes_)));
    if (fit > 0) {
      job.blocks = store_staging_->Take(fit);
      stats_.store_staging_bytes = store_staging_->allocated_bytes();
    }
    if (fit == 0 || job.blocks.size() != fit) {
      // Queue full (or no memory for it): the entry still finishes (in
      // order, behind the queued ones), and the scheduler learns the blocks
      // are not in the store.
      stats_.blocks_store_dropped += n;
      job.dropped = true;
      job.failed = true;
      EnqueueLocked(std::move(job));
      return;
    }
    if (fit < n) {
      // The rest is dropped; failed_sending tells the scheduler to forget
      // the entry, so a later request may store the tail again.
      stats_.blocks_store_dropped += n - fit;
      job.failed = true;
      n = fit;
    }
  }
  const std::span<const int32_t> ids(s.block_ids.data(), n);
  std::vector<std::span<std::byte>> out;
  out.reserve(n);
  for (std::byte* b : job.blocks) out.emplace_back(b, static_cast<size_t>(block_bytes_));
  std::vector<std::byte*> not_copied;
  absl::StatusOr<std::function<absl::Status()>> copied = to_host_(ids, out);
  if (copied.ok()) {
    job.copied = std::move(copied).value();
    job.hashes.assign(s.block_hashes.begin(), s.block_hashes.begin() + static_cast<ptrdiff_t>(n));
  } else {
    TANDEM_LOG(WARNING) << "KV-store store of " << n
                        << " blocks: copying them out of the cache failed: " << copied.status();
    not_copied = std::move(job.blocks);
    job.blocks.clear();
  }
  job.failed = job.failed || !not_copied.empty();
  std::lock_guard<std::mutex> lock(mu_);
  store_staging_->Give(not_copied);
  stats_.blocks_store_failed += not_copied.size();
  EnqueueLocked(std::move(job));
}

void KvStoreConnectorWorker::StoreLoop() {
  for (;;) {
    // Every queued job up to kMaxBatchBytes goes in one Store RPC (a stream
    // per job would cost a round trip each and let the queue back up).
    constexpr int64_t kMaxBatchBytes = int64_t{64} << 20;
    std::vector<StoreJob> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      int64_t bytes = 0;
      while (!jobs_.empty() &&
             (batch.empty() ||
              bytes + static_cast<int64_t>(jobs_.front().blocks.size()) * block_bytes_ <=
                  kMaxBatchBytes)) {
        bytes += static_cast<int64_t>(jobs_.front().blocks.size()) * block_bytes_;
        batch.push_back(std::move(jobs_.front()));
        jobs_.pop_front();
      }
      sending_ = true;
    }
    uint64_t stored = 0, failed = 0;
    // A job whose copies out of the cache failed sends nothing.
    std::vector<bool> copied(batch.size(), true);
    std::vector<BlockHash> hashes;
    std::vector<std::span<const uint8_t>> src;
    for (size_t j = 0; j < batch.size(); ++j) {
      StoreJob& job = batch[j];
      if (job.copied) {
        if (absl::Status s = job.copied(); !s.ok()) {
          TANDEM_LOG(WARNING) << "KV-store store of " << job.hashes.size()
                              << " blocks: copying them out of the cache failed: " << s;
          copied[j] = false;
          job.failed = true;
          failed += job.hashes.size();
          continue;
        }
      }
      for (size_t i = 0; i < job.hashes.size(); ++i) {
        hashes.push_back(job.hashes[i]);
        src.emplace_back(reinterpret_cast<const uint8_t*>(job.blocks[i]),
                         static_cast<size_t>(block_bytes_));
      }
    }
    if (!hashes.empty()) {
      absl::StatusOr<std::vector<BlockStoreResult>> r;
      for (int attempt = 0; attempt < 2; ++attempt) {
        EnsureNamespace();
        r = client_->Store(ns_, hashes, std::span<const std::span<const uint8_t>>(src));
        if (r.ok() || r.status().code() != absl::StatusCode::kNotFound) break;
        namespace_ok_.store(false);  // the store lost it (restarted empty): create it again
      }
      if (!r.ok()) {
        TANDEM_LOG(WARNING) << "KV-store store of " << hashes.size()
                            << " blocks failed: " << r.status();
      }
      // The batch's blocks are its copied jobs' blocks, in job order.
      size_t i = 0;
      for (size_t j = 0; j < batch.size(); ++j) {
        if (!copied[j]) continue;
        StoreJob& job = batch[j];
        for (size_t k = 0; k < job.hashes.size(); ++k, ++i) {
          const bool ok = r.ok() && i < r->size() && (*r)[i].status.ok();
          (ok ? stored : failed) += 1;
          if (!ok) job.failed = true;
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (StoreJob& job : batch) {
      pending_bytes_ -= static_cast<int64_t>(job.blocks.size()) * block_bytes_;
      store_staging_->Give(job.blocks);
      --stats_.stores_in_flight;
      if (job.failed) failed_sending_.push_back(job.request_id);
      finished_sending_.push_back(std::move(job.request_id));
    }
    stats_.blocks_stored += stored;
    stats_.blocks_store_failed += failed;
    sending_ = false;
    cv_.notify_all();
  }
}

bool KvStoreConnectorWorker::WaitForStores(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return jobs_.empty() && !sending_; });
}

void KvStoreConnectorWorker::TakeFinishedSending(sched::KvConnectorReport* report) {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::string& id : finished_sending_) report->finished_sending.push_back(std::move(id));
  finished_sending_.clear();
  for (std::string& id : failed_sending_) report->failed_sending.push_back(std::move(id));
  failed_sending_.clear();
}

KvConnectorWorkerStats KvStoreConnectorWorker::stats() const {
  KvConnectorWorkerStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
  }
  std::lock_guard<std::mutex> lock(load_mu_);
  s.loads_in_flight = loads_in_flight_;
  s.staging_bytes = load_staging_bytes_;
  return s;
}

}  // namespace tandem::kvconnector
