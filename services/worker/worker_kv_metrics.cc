#include "worker_kv_metrics.h"

namespace tandem::worker {
namespace {

using metrics::AddCounter;
using metrics::AddGauge;

// 100 us .. 10 s: a step's loads, from a few blocks in shared memory to
// thousands over a slow link.
const prometheus::Histogram::BucketBoundaries& LoadBuckets() {
  static const prometheus::Histogram::BucketBoundaries b = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return b;
}

}  // namespace

WorkerKvMetrics::WorkerKvMetrics(prometheus::Registry& r)
    : load_seconds_(prometheus::BuildHistogram()
                        .Name("tandem_worker_kvstore_load_seconds")
                        .Help("A step's KV-store loads by phase: read (from the store into host "
                              "memory, checksums included), copy (host memory into the KV cache)")
                        .Register(r)),
      read_seconds_(load_seconds_.Add({{"phase", "read"}}, LoadBuckets())),
      copy_seconds_(load_seconds_.Add({{"phase", "copy"}}, LoadBuckets())),
      loaded_bytes_(AddCounter(r, "tandem_worker_kvstore_loaded_bytes_total",
                               "Bytes of KV blocks loaded from the KV-store intact")),
      load_failed_(prometheus::BuildCounter()
                       .Name("tandem_worker_kvstore_load_failed_blocks_total")
                       .Help("Blocks a load asked for and did not get (recomputed), by reason")
                       .Register(r)),
      store_failed_(prometheus::BuildCounter()
                        .Name("tandem_worker_kvstore_store_failed_blocks_total")
                        .Help("Blocks not stored, by reason: failed (refused, transfer failed or "
                              "not copied out of the cache), dropped (staging full, or the step "
                              "failed first)")
                        .Register(r)),
      staging_(prometheus::BuildGauge()
                   .Name("tandem_worker_kvstore_staging_bytes")
                   .Help("Host memory allocated for KV-store transfers, by use")
                   .Register(r)),
      loads_(&AddCounter(r, "tandem_worker_kvstore_loads_total",
                         "Requests whose KV blocks were loaded from the KV-store")),
      blocks_loaded_(&AddCounter(r, "tandem_worker_kvstore_blocks_loaded_total",
                                 "KV blocks loaded from the KV-store into the cache")),
      failed_not_found_(&load_failed_.Add({{"reason", "not_found"}})),
      failed_checksum_(&load_failed_.Add({{"reason", "checksum"}})),
      failed_transfer_(&load_failed_.Add({{"reason", "failed"}})),
      blocks_stored_(&AddCounter(r, "tandem_worker_kvstore_blocks_stored_total",
                                 "KV blocks the KV-store acknowledged")),
      store_failed_rejected_(&store_failed_.Add({{"reason", "failed"}})),
      store_dropped_(&store_failed_.Add({{"reason", "dropped"}})),
      stores_in_flight_(AddGauge(r, "tandem_worker_kvstore_stores_in_flight",
                                 "Store entries queued or being sent")),
      loads_in_flight_(AddGauge(r, "tandem_worker_kvstore_loads_in_flight",
                                "Steps' loads begun and not yet copied into the KV cache")),
      load_staging_bytes_(staging_.Add({{"use", "load"}})),
      store_staging_bytes_(staging_.Add({{"use", "store"}})) {}

void WorkerKvMetrics::OnLoad(const kvconnector::KvLoadTiming& timing) {
  read_seconds_.Observe(timing.read_seconds);
  copy_seconds_.Observe(timing.copy_seconds);
  loaded_bytes_.Increment(static_cast<double>(timing.bytes));
}

void WorkerKvMetrics::Mirror(const kvconnector::KvConnectorWorkerStats& s) {
  loads_.Set(s.loads);
  blocks_loaded_.Set(s.blocks_loaded);
  failed_not_found_.Set(s.load_failed_not_found);
  failed_checksum_.Set(s.load_failed_checksum);
  failed_transfer_.Set(s.load_failed_rpc);
  blocks_stored_.Set(s.blocks_stored);
  store_failed_rejected_.Set(s.blocks_store_failed);
  store_dropped_.Set(s.blocks_store_dropped);
  stores_in_flight_.Set(static_cast<double>(s.stores_in_flight));
  loads_in_flight_.Set(static_cast<double>(s.loads_in_flight));
  load_staging_bytes_.Set(static_cast<double>(s.staging_bytes));
  store_staging_bytes_.Set(static_cast<double>(s.store_staging_bytes));
}

}  // namespace tandem::worker
