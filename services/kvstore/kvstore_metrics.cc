#include "kvstore_metrics.h"

#include <mutex>

namespace tandem::kvstore_service {

using metrics::AddCounter;
using metrics::AddGauge;
using metrics::MirroredCounter;

struct KvStoreMetrics::Series {
  explicit Series(prometheus::Registry& r)
      : hot_blocks(AddGauge(r, "tandem_kvstore_hot_blocks",
                            "Blocks in the hot tier (pinned host memory)")),
        hot_capacity_blocks(
            AddGauge(r, "tandem_kvstore_hot_capacity_blocks", "Slots of the hot tier")),
        hot_usage(AddGauge(r, "tandem_kvstore_hot_usage_ratio",
                           "Fraction of the hot tier's slots holding a block (0-1)")),
        cold_blocks(AddGauge(r, "tandem_kvstore_cold_blocks", "Blocks in the cold tier (RocksDB)")),
        cold_bytes(AddGauge(r, "tandem_kvstore_cold_bytes", "Payload bytes in the cold tier")),
        cold_capacity_bytes(AddGauge(r, "tandem_kvstore_cold_capacity_bytes",
                                     "Cold tier capacity in payload bytes (0: unlimited)")),
        active_leases(AddGauge(r, "tandem_kvstore_active_leases",
                               "Leases pinning blocks now (granted by lookups, not yet "
                               "released or expired)")),
        bulk_connections_open(AddGauge(r, "tandem_kvstore_bulk_connections_open",
                                       "Connections open on the bulk port (loads and lookups)")),
        lookups(&AddCounter(r, "tandem_kvstore_lookups_total", "Lookups answered")),
        lookup_hit_blocks(&AddCounter(r, "tandem_kvstore_lookup_hit_blocks_total",
                                      "Leading blocks found by lookups")),
        block_reads(
            &AddCounter(r, "tandem_kvstore_block_reads_total", "Blocks asked for by loads")),
        blocks_loaded(
            &AddCounter(r, "tandem_kvstore_blocks_loaded_total", "Blocks served by loads")),
        load_misses(&AddCounter(r, "tandem_kvstore_load_misses_total",
                                "Blocks asked for by loads and not served (absent or corrupt)")),
        blocks_stored(&AddCounter(r, "tandem_kvstore_blocks_stored_total", "Blocks written")),
        stores_already_present(&AddCounter(r, "tandem_kvstore_stores_already_present_total",
                                           "Stores of a block that was already there")),
        stores_mismatched(&AddCounter(
            r, "tandem_kvstore_stores_mismatched_total",
            "Stores of a block already there with other bytes (the first write was kept)")),
        stores_made_durable(&AddCounter(
            r, "tandem_kvstore_stores_made_durable_total",
            "Stores of a block already there with a weaker durability, written again with theirs")),
        checksum_failures(&AddCounter(r, "tandem_kvstore_checksum_failures_total",
                                      "Blocks found corrupt and dropped")),
        corrupt_reports(&AddCounter(r, "tandem_kvstore_corrupt_reports_total",
                                    "Readers' checksum mismatch reports (each re-verified)")),
        blocks_dropped_at_open(&AddCounter(
            r, "tandem_kvstore_blocks_dropped_at_open_total",
            "Blocks and records the start-up check dropped (damaged or lost files, repaired)")),
        load_failures(&AddCounter(r, "tandem_kvstore_load_failures_total",
                                  "Blocks dropped because reading their file failed")),
        leases_expired(&AddCounter(r, "tandem_kvstore_leases_expired_total",
                                   "Leases that expired before they were released")),
        promotions(&AddCounter(r, "tandem_kvstore_promotions_total",
                               "Cold blocks copied into the hot tier")),
        evictions_family(prometheus::BuildCounter()
                             .Name("tandem_kvstore_evictions_total")
                             .Help("Blocks evicted, by tier (a hot eviction keeps the cold copy)")
                             .Register(r)),
        evictions_hot(&evictions_family.Add({{"tier", "hot"}})),
        evictions_cold(&evictions_family.Add({{"tier", "cold"}})),
        bulk_loads(
            &AddCounter(r, "tandem_kvstore_bulk_loads_total", "Loads answered on the bulk port")),
        bulk_lookups(&AddCounter(r, "tandem_kvstore_bulk_lookups_total",
                                 "Lookups answered on the bulk port's lookup connections")),
        bulk_sent_bytes(&AddCounter(r, "tandem_kvstore_bulk_sent_bytes_total",
                                    "Payload bytes sent on the bulk port")),
        bulk_rejected(&AddCounter(r, "tandem_kvstore_bulk_connections_rejected_total",
                                  "Bulk port connections refused over the connection limit")),
        bulk_tls_failures(&AddCounter(r, "tandem_kvstore_bulk_tls_handshake_failures_total",
                                      "Bulk port connections closed by a failed TLS handshake")),
        bulk_permission_denied(
            &AddCounter(r, "tandem_kvstore_bulk_permission_denied_total",
                        "Bulk port connections refused by the role check (mutual TLS)")),
        local_loads(&AddCounter(r, "tandem_kvstore_local_loads_total",
                                "Loads answered on the local socket (shared memory)")),
        local_shared_blocks(&AddCounter(
            r, "tandem_kvstore_local_shared_blocks_total",
            "Blocks the local socket answered with their place in shared memory")),
        local_stores(&AddCounter(r, "tandem_kvstore_local_stores_total",
                                 "Store batches answered on the local socket (shared memory)")),
        local_written_blocks(&AddCounter(
            r, "tandem_kvstore_local_written_in_place_blocks_total",
            "Blocks a local store wrote straight into their hot-tier slot")) {}

  prometheus::Gauge& hot_blocks;
  prometheus::Gauge& hot_capacity_blocks;
  prometheus::Gauge& hot_usage;
  prometheus::Gauge& cold_blocks;
  prometheus::Gauge& cold_bytes;
  prometheus::Gauge& cold_capacity_bytes;
  prometheus::Gauge& active_leases;
  prometheus::Gauge& bulk_connections_open;
  MirroredCounter lookups, lookup_hit_blocks, block_reads, blocks_loaded, load_misses,
      blocks_stored, stores_already_present, stores_mismatched, stores_made_durable,
      checksum_failures, corrupt_reports, blocks_dropped_at_open, load_failures, leases_expired, promotions;
  prometheus::Family<prometheus::Counter>& evictions_family;
  MirroredCounter evictions_hot, evictions_cold, bulk_loads, bulk_lookups, bulk_sent_bytes,
      bulk_rejected, bulk_tls_failures, bulk_permission_denied, local_loads, local_shared_blocks,
      local_stores, local_written_blocks;
  std::mutex mu;  // Update() may race with itself (two scrapes at once)
};

KvStoreMetrics::KvStoreMetrics(prometheus::Registry& registry, const kvstore::KvStoreEngine* store,
                               const BulkLoadServer* bulk)
    : store_(store), bulk_(bulk), s_(std::make_unique<Series>(registry)) {
  Update();
}

KvStoreMetrics::~KvStoreMetrics() = default;

void KvStoreMetrics::Update() {
  const kvstore::KvStoreStats st = store_->GetStats();
  const BulkLoadServerStats b = bulk_ ? bulk_->GetStats() : BulkLoadServerStats{};
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->hot_blocks.Set(static_cast<double>(st.hot_blocks));
  s_->hot_capacity_blocks.Set(static_cast<double>(st.hot_capacity_blocks));
  s_->hot_usage.Set(st.hot_capacity_blocks == 0 ? 0.0
                                                : static_cast<double>(st.hot_blocks) /
                                                      static_cast<double>(st.hot_capacity_blocks));
  s_->cold_blocks.Set(static_cast<double>(st.cold_blocks));
  s_->cold_bytes.Set(static_cast<double>(st.cold_bytes));
  s_->cold_capacity_bytes.Set(static_cast<double>(st.cold_capacity_bytes));
  s_->active_leases.Set(static_cast<double>(st.active_leases));
  s_->bulk_connections_open.Set(static_cast<double>(b.connections_open));
  s_->lookups.Set(st.lookups);
  s_->lookup_hit_blocks.Set(st.lookup_hits);
  s_->block_reads.Set(st.loads);
  s_->blocks_loaded.Set(st.blocks_loaded);
  s_->load_misses.Set(st.load_misses);
  s_->blocks_stored.Set(st.stores);
  s_->stores_already_present.Set(st.stores_already_present);
  s_->stores_mismatched.Set(st.stores_mismatched);
  s_->stores_made_durable.Set(st.stores_made_durable);
  s_->checksum_failures.Set(st.checksum_failures);
  s_->corrupt_reports.Set(st.corrupt_reports);
  s_->blocks_dropped_at_open.Set(st.blocks_dropped_at_open);
  s_->load_failures.Set(st.load_failures);
  s_->leases_expired.Set(st.leases_expired);
  s_->promotions.Set(st.promotions);
  s_->evictions_hot.Set(st.evictions_hot);
  s_->evictions_cold.Set(st.evictions_cold);
  s_->bulk_loads.Set(b.loads);
  s_->bulk_lookups.Set(b.lookups);
  s_->bulk_sent_bytes.Set(b.bytes_sent);
  s_->bulk_rejected.Set(b.connections_rejected);
  s_->bulk_tls_failures.Set(b.tls_handshake_failures);
  s_->bulk_permission_denied.Set(b.permission_denied);
  s_->local_loads.Set(b.local_loads);
  s_->local_shared_blocks.Set(b.blocks_shared);
  s_->local_stores.Set(b.local_stores);
  s_->local_written_blocks.Set(b.blocks_written_in_place);
}

}  // namespace tandem::kvstore_service
