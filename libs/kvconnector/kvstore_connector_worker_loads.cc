// The worker role's loads (kvstore_connector.h): a step's loads go to the
// load threads, one of which reads them from the store into pinned staging
// while the steps go on; a later step begins their copy into the cache (on a
// GPU, beside the next steps' kernels), and the first step after it has
// ended reports them. Split from kvstore_connector_worker.cc (the stores) along that seam.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"
#include "tandem/kvconnector/kvstore_connector.h"

namespace tandem::kvconnector {
namespace {

StagingMemory KindOf(PinnedKind kind) {
  switch (kind) {
    case PinnedKind::kCudaPinned:
      return StagingMemory::kCudaPinned;
    case PinnedKind::kLocked:
      return StagingMemory::kLocked;
    case PinnedKind::kPageable:
      return StagingMemory::kPageable;
  }
  return StagingMemory::kNone;
}

using Seconds = std::chrono::duration<double>;

}  // namespace

const char* StagingMemoryName(StagingMemory m) {
  switch (m) {
    case StagingMemory::kNone:
      return "none";
    case StagingMemory::kCudaPinned:
      return "cuda-pinned";
    case StagingMemory::kLocked:
      return "locked";
    case StagingMemory::kPageable:
      return "pageable";
  }
  return "?";
}

void KvStoreConnectorWorker::LoadBlocks(const sched::KvConnectorMetadata& meta,
                                        sched::KvConnectorReport* report) {
  // A step whose stores were never snapshotted failed before its forward
  // pass ended: its store entries still finish (as dropped).
  AbandonUnsnapshotted();
  for (const sched::KvStoreOp& s : meta.stores) {
    if (s.before_forward) {
      SnapshotStore(s);
    } else {
      unsnapshotted_.emplace_back(s.request_id,
                                  std::min(s.block_ids.size(), s.block_hashes.size()));
    }
  }
  FinishLoads(report, std::chrono::microseconds(0));
  if (!meta.loads.empty()) BeginLoad(meta.loads);
}

absl::StatusOr<PinnedBuffer> KvStoreConnectorWorker::TakeLoadStaging(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    auto fits = std::find_if(load_staging_free_.begin(), load_staging_free_.end(),
                             [&](const PinnedBuffer& b) { return b.size() >= bytes; });
    if (fits != load_staging_free_.end()) {
      PinnedBuffer b = std::move(*fits);
      load_staging_free_.erase(fits);
      return b;
    }
    // None is large enough: the largest free one goes, so that the kept
    // buffers stay as many as the loads that were ever in flight at once.
    if (!load_staging_free_.empty()) {
      auto largest = std::max_element(
          load_staging_free_.begin(), load_staging_free_.end(),
          [](const PinnedBuffer& a, const PinnedBuffer& b) { return a.size() < b.size(); });
      load_staging_bytes_ -= static_cast<int64_t>(largest->size());
      load_staging_free_.erase(largest);
    }
  }
  constexpr size_t kRound = size_t{2} << 20;
  absl::StatusOr<PinnedBuffer> b = PinnedBuffer::Allocate(
      (bytes + kRound - 1) / kRound * kRound,
      {.use_cuda_host_alloc = options_.use_cuda_host_alloc, .what = "KV load staging"});
  if (b.ok()) {
    std::lock_guard<std::mutex> lock(load_mu_);
    load_staging_bytes_ += static_cast<int64_t>(b->size());
  }
  return b;
}

void KvStoreConnectorWorker::BeginLoad(std::span<const sched::KvLoad> loads) {
  LoadJob job;
  for (const sched::KvLoad& l : loads) {
    const size_t n = std::min(l.block_hashes.size(), l.block_ids.size());
    job.request_ids.push_back(l.request_id);
    job.hashes.insert(job.hashes.end(), l.block_hashes.begin(), l.block_hashes.begin() + n);
    job.block_ids.insert(job.block_ids.end(), l.block_ids.begin(), l.block_ids.begin() + n);
  }
  job.misses.assign(job.hashes.size(), LoadMiss::kFailed);
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    job.epoch = load_epoch_;
    ++loads_in_flight_;
    // Nothing to read: it has arrived at once.
    if (job.hashes.empty()) {
      loads_done_.push_back(std::move(job));
    } else {
      load_queue_.push_back(std::move(job));
    }
  }
  load_cv_.notify_all();
}

void KvStoreConnectorWorker::LoadLoop() {
  for (;;) {
    LoadJob job;
    {
      std::unique_lock<std::mutex> lock(load_mu_);
      load_cv_.wait(lock, [&] { return load_stopping_ || !load_queue_.empty(); });
      if (load_stopping_) return;
      job = std::move(load_queue_.front());
      load_queue_.pop_front();
      if (job.epoch != load_epoch_) {  // forgotten: not read
        loads_done_.push_back(std::move(job));
        continue;
      }
    }
    // Staging is taken when the read begins, not when the load does: a
    // burst of loads queued behind a slow one holds no memory yet.
    absl::StatusOr<PinnedBuffer> staging =
        TakeLoadStaging(job.hashes.size() * static_cast<size_t>(block_bytes_));
    if (!staging.ok()) {
      TANDEM_LOG(WARNING) << "KV-store load of " << job.hashes.size()
                          << " blocks: no staging memory (recomputed): " << staging.status();
      std::lock_guard<std::mutex> lock(load_mu_);
      loads_done_.push_back(std::move(job));
      load_cv_.notify_all();
      continue;
    }
    job.staging = std::move(staging).value();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.staging = KindOf(job.staging.kind());
    }
    std::vector<std::span<uint8_t>> dst;
    dst.reserve(job.hashes.size());
    for (size_t i = 0; i < job.hashes.size(); ++i) {
      dst.emplace_back(reinterpret_cast<uint8_t*>(job.staging.data()) + i * block_bytes_,
                       static_cast<size_t>(block_bytes_));
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<BlockLoadResult>> results =
        client_->Load(ns_, job.hashes, std::span<const std::span<uint8_t>>(dst));
    job.read_seconds = Seconds(std::chrono::steady_clock::now() - start).count();
    if (!results.ok()) {
      if (results.status().code() == absl::StatusCode::kNotFound) namespace_ok_.store(false);
      TANDEM_LOG(WARNING) << "KV-store load of " << job.hashes.size()
                          << " blocks failed (recomputed): " << results.status();
    } else {
      for (size_t i = 0; i < job.hashes.size() && i < results->size(); ++i) {
        job.misses[i] = (*results)[i].miss;
      }
    }
    {
      std::lock_guard<std::mutex> lock(load_mu_);
      loads_done_.push_back(std::move(job));
    }
    load_cv_.notify_all();
  }
}

void KvStoreConnectorWorker::FinishLoads(sched::KvConnectorReport* report,
                                         std::chrono::microseconds wait) {
  std::vector<LoadJob> arrived;
  uint64_t epoch = 0;
  {
    std::unique_lock<std::mutex> lock(load_mu_);
    // A step with nothing to compute waits for a load to arrive, unless a
    // copy into the cache is under way: then for that copy (below).
    if (wait.count() > 0 && loads_in_flight_ > 0 && copying_.empty()) {
      load_cv_.wait_for(lock, wait, [&] {
        return step_queued_ || load_stopping_ ||
               std::any_of(loads_done_.begin(), loads_done_.end(),
                           [&](const LoadJob& j) { return j.epoch == load_epoch_; });
      });
    }
    arrived.swap(loads_done_);
    epoch = load_epoch_;
  }
  std::vector<PinnedBuffer> freed;
  for (LoadJob& job : arrived) {
    if (job.epoch != epoch) {  // forgotten (ForgetLoads): never copied in
      freed.push_back(std::move(job.staging));
      continue;
    }
    BeginCopyIn(job);
    copying_.push_back(std::move(job));
  }
  if (wait.count() > 0 && !copying_.empty()) (void)copying_.front().copy.wait();
  // Each load is reported (and its staging reused) once its copy has ended.
  int64_t completed = 0;
  size_t kept = 0;
  for (size_t i = 0; i < copying_.size(); ++i) {
    LoadJob& job = copying_[i];
    if (!job.copy.done()) {
      if (kept != i) copying_[kept] = std::move(job);
      ++kept;
      continue;
    }
    const bool current = job.epoch == epoch;
    CompleteLoad(job, current ? report : nullptr);
    completed += current ? 1 : 0;
    freed.push_back(std::move(job.staging));
  }
  copying_.resize(kept);
  std::lock_guard<std::mutex> lock(load_mu_);
  loads_in_flight_ -= completed;
  for (PinnedBuffer& b : freed) {
    if (b.size() > 0) load_staging_free_.push_back(std::move(b));
  }
}

void KvStoreConnectorWorker::SetStepQueued(bool queued) {
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    step_queued_ = queued;
  }
  load_cv_.notify_all();
}

void KvStoreConnectorWorker::ForgetLoads() {
  int64_t forgotten = 0;
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    ++load_epoch_;
    forgotten = loads_in_flight_;
    loads_in_flight_ = 0;
  }
  if (forgotten > 0) {
    TANDEM_LOG(INFO) << "KV-store: " << forgotten
                     << " loads in flight are dropped with the scheduler's stream";
  }
}

void KvStoreConnectorWorker::BeginCopyIn(LoadJob& job) {
  std::vector<int32_t> copy_ids;
  std::vector<std::span<const std::byte>> copy_from;
  for (size_t i = 0; i < job.hashes.size(); ++i) {
    if (job.misses[i] != LoadMiss::kNone) continue;
    copy_ids.push_back(job.block_ids[i]);
    copy_from.emplace_back(job.staging.data() + i * block_bytes_,
                           static_cast<size_t>(block_bytes_));
  }
  job.copy_blocks = static_cast<int64_t>(copy_ids.size());
  job.copy_start = std::chrono::steady_clock::now();
  absl::StatusOr<CopyIn> copy = CopyIn{};
  if (!copy_ids.empty()) copy = from_host_(copy_ids, copy_from);
  if (copy.ok() && copy->done && copy->wait) {
    job.copy = *std::move(copy);
    return;
  }
  if (!copy.ok()) {
    TANDEM_LOG(WARNING) << "KV-store load: copying " << copy_ids.size()
                        << " blocks into the cache failed (recomputed): " << copy.status();
    std::replace(job.misses.begin(), job.misses.end(), LoadMiss::kNone, LoadMiss::kFailed);
  }
  job.copy = CopyIn{.done = [] { return true; }, .wait = [] { return absl::OkStatus(); }};
}

void KvStoreConnectorWorker::CompleteLoad(LoadJob& job, sched::KvConnectorReport* report) {
  if (absl::Status copied = job.copy.wait(); !copied.ok()) {
    TANDEM_LOG(WARNING) << "KV-store load: copying blocks into the cache failed (recomputed): "
                        << copied;
    std::replace(job.misses.begin(), job.misses.end(), LoadMiss::kNone, LoadMiss::kFailed);
  }
  if (report == nullptr) return;  // forgotten with the scheduler's stream
  if (options_.on_load) {
    options_.on_load(KvLoadTiming{
        .blocks = static_cast<int64_t>(job.hashes.size()),
        .bytes = job.copy_blocks * block_bytes_,  // arrived intact, copied or not
        .read_seconds = job.read_seconds,
        .copy_seconds = Seconds(std::chrono::steady_clock::now() - job.copy_start).count()});
  }
  uint64_t ok = 0, not_found = 0, checksum = 0, failed = 0;
  for (size_t i = 0; i < job.hashes.size(); ++i) {
    switch (job.misses[i]) {
      case LoadMiss::kNone:
        ++ok;
        continue;
      case LoadMiss::kNotFound:
        ++not_found;
        break;
      case LoadMiss::kChecksum:
        ++checksum;
        break;
      case LoadMiss::kFailed:
        ++failed;
        break;
    }
    report->invalid_block_ids.push_back(job.block_ids[i]);
  }
  if (checksum > 0) {
    TANDEM_LOG(WARNING) << "KV-store: " << checksum
                        << " loaded block(s) failed their checksum; recomputing them";
  }
  for (std::string& id : job.request_ids) report->finished_recving.push_back(std::move(id));
  report->num_load_failed_not_found += static_cast<int32_t>(not_found);
  report->num_load_failed_checksum += static_cast<int32_t>(checksum);
  report->num_load_failed_rpc += static_cast<int32_t>(failed);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.loads += job.request_ids.size();
  stats_.blocks_loaded += ok;
  stats_.load_failed_not_found += not_found;
  stats_.load_failed_checksum += checksum;
  stats_.load_failed_rpc += failed;
}

}  // namespace tandem::kvconnector
