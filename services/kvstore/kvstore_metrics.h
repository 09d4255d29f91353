// Prometheus series of tandem-kvstore (DESIGN §7), mirrored from the
// engine's and the bulk port's counters when /metrics is scraped.
#pragma once

#include <memory>

#include "bulk_load_server.h"
#include "prometheus/registry.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/metrics/metrics.h"

namespace tandem::kvstore_service {

class KvStoreMetrics {
 public:
  // Registers the series in `registry`. `bulk` may be null (port off).
  KvStoreMetrics(prometheus::Registry& registry, const kvstore::KvStoreEngine* store,
                 const BulkLoadServer* bulk);
  ~KvStoreMetrics();
  // Copies the current counters into the series (MetricsServer's on_scrape).
  void Update();

 private:
  struct Series;
  const kvstore::KvStoreEngine* const store_;
  const BulkLoadServer* const bulk_;
  std::unique_ptr<Series> s_;
};

}  // namespace tandem::kvstore_service
