// The worker's KV-store series (issue 32): its side of the loads and stores
// (tandem_kvstore_* are the store's side). Registered by every worker; they
// stay at 0 without --kvstore. Load times are split at the host memory a
// load lands in: `read` (from the store, checksums included) and `copy`
// (into the KV cache: on a GPU, the DMA), so a slow load says which side
// is slow.
#pragma once

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/metrics/metrics.h"

namespace tandem::worker {

class WorkerKvMetrics {
 public:
  explicit WorkerKvMetrics(prometheus::Registry& registry);

  // One step's loads (KvStoreConnectorOptions::on_load; the loop thread).
  void OnLoad(const kvconnector::KvLoadTiming& timing);
  // The connector's cumulative counters and current gauges, after a step.
  void Mirror(const kvconnector::KvConnectorWorkerStats& stats);

 private:
  prometheus::Family<prometheus::Histogram>& load_seconds_;
  prometheus::Histogram& read_seconds_;
  prometheus::Histogram& copy_seconds_;
  prometheus::Counter& loaded_bytes_;
  prometheus::Family<prometheus::Counter>& load_failed_;
  prometheus::Family<prometheus::Counter>& store_failed_;
  prometheus::Family<prometheus::Gauge>& staging_;
  metrics::MirroredCounter loads_, blocks_loaded_, failed_not_found_, failed_checksum_,
      failed_transfer_, blocks_stored_, store_failed_rejected_, store_dropped_;
  prometheus::Gauge& stores_in_flight_;
  prometheus::Gauge& loads_in_flight_;
  prometheus::Gauge& load_staging_bytes_;
  prometheus::Gauge& store_staging_bytes_;
};

}  // namespace tandem::worker
