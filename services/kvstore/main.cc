// tandem-kvstore: the KV-store service. See kvstore_service.h and
// libs/kvstore/include/tandem/kvstore/kv_store.h; `tandem-kvstore --help`
// lists the flags and their defaults.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/server_builder.h"
#include "kvstore_metrics.h"
#include "kvstore_server.h"
#include "tandem/common/flags.h"
#include "tandem/common/logging.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/metrics/metrics.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/service_main.h"
#include "tandem/rpc/tls_reload.h"

int main(int argc, char** argv) {
  using namespace tandem;
  rpc::ServiceMain boot("tandem-kvstore", "kvstore", "tandem.v1.KvStore", "127.0.0.1:50070");
  // Block-sized buffers (messages of ~1 MiB) come and go at a high rate:
  // keep them on the heap instead of mmap/munmap (page faults) per message.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);

  std::string data_dir = "./tandem-kvstore-data";
  int64_t hot_capacity_bytes = int64_t{1} << 30;
  int64_t hot_slot_bytes = int64_t{2} << 20;
  int64_t cold_capacity_bytes = 0;
  int64_t cold_capacity_blocks = 0;
  std::string durability = "wal";
  int64_t lease_ttl_ms = 30'000;
  int64_t max_lease_ttl_ms = 600'000;
  bool store_to_hot = true;
  int64_t write_buffer_bytes = int64_t{64} << 20;
  int64_t min_free_disk_bytes = int64_t{256} << 20;
  int64_t load_chunk_bytes = 1 << 20;
  int32_t drain_timeout_s = 10;
  std::string bulk_load_listen = "auto";
  kvstore_service::BulkLoadServerOptions bulk_options;
  metrics::ExposerOptions metrics_options;

  tandem::FlagSet flags(
      "tandem-kvstore",
      "Stores KV-cache blocks outside the GPU: a pinned host-memory hot tier and a "
      "RocksDB cold tier (DESIGN §5).");
  boot.AddServerFlags(&flags);
  flags.Add("data-dir", &data_dir, "directory of the RocksDB cold tier (created if missing)");
  flags.Add("hot-capacity-bytes", &hot_capacity_bytes,
            "bytes of pinned host memory for the hot tier; 0 disables it");
  flags.Add("hot-slot-bytes", &hot_slot_bytes,
            "bytes per hot-tier slot; larger blocks are served from the cold tier only");
  flags.Add("cold-capacity-bytes", &cold_capacity_bytes,
            "payload bytes the cold tier may hold (LRU eviction); 0 = unlimited");
  flags.Add("cold-capacity-blocks", &cold_capacity_blocks,
            "blocks the cold tier may hold (LRU eviction); 0 = unlimited");
  flags.Add("durability", &durability,
            "default store durability: none (memtable only), wal (survives kill -9), fsync "
            "(survives power loss), memory (hot tier only, never on disk: gone when evicted or "
            "at a restart; stores at memory speed)");
  flags.Add("lease-ttl-ms", &lease_ttl_ms, "lease time-to-live when a lookup asks for 0");
  flags.Add("max-lease-ttl-ms", &max_lease_ttl_ms, "longest lease a lookup may ask for");
  flags.Add("store-to-hot", &store_to_hot, "also place newly stored blocks in the hot tier");
  flags.Add("write-buffer-bytes", &write_buffer_bytes,
            "RocksDB's memtable: the WAL grows to about this before a flush, and a restart "
            "after a crash flushes it, so keep twice this free on the disk beyond the blocks");
  flags.Add("min-free-disk-bytes", &min_free_disk_bytes,
            "stores are refused (RESOURCE_EXHAUSTED) while the data directory's disk has less "
            "free than this (RocksDB must not meet a full disk); 0: never");
  flags.Add("load-chunk-bytes", &load_chunk_bytes,
            "payload bytes per Load stream message (under the 4 MiB gRPC limit)");
  flags.Add("bulk-load-listen", &bulk_load_listen,
            "the bulk load port, Load and Lookup over TCP beside gRPC, under TLS when --tls-cert "
            "is given (see bulk_load_server.h): host:port, 'auto' (the --listen host, a free "
            "port, advertised in Stats) or 'off'");
  flags.Add("bulk-load-max-connections", &bulk_options.max_connections,
            "bulk load connections served at once; more are refused (clients then use gRPC)");
  flags.Add("bulk-load-io-timeout-ms", &bulk_options.io_timeout_ms,
            "a bulk load send making no progress this long closes its connection");
  flags.Add("bulk-load-idle-timeout-ms", &bulk_options.idle_timeout_ms,
            "a bulk load connection idle this long between loads is closed (lookup connections "
            "stay open)");
  flags.Add("local-socket", &bulk_options.local_socket,
            "Unix-domain path where workers on this host read blocks in place from the hot "
            "tier's shared memory, and write the blocks they store straight into it (created "
            "mode 0600; needs the bulk load port and the hot tier); empty: off");
  flags.Add("metrics-listen", &metrics_options.listen_address,
            tandem::metrics::ExposerOptions::kListenHelp);
  flags.Add("drain-timeout-s", &drain_timeout_s,
            "on SIGTERM/SIGINT, how long in-flight RPCs may finish before shutdown (seconds, as "
            "the scheduler's and the frontend's)");
  int64_t debug_lookup_delay_ms = 0;
  int64_t debug_load_delay_ms = 0;
  int32_t debug_corrupt_hot_every = 0;
  int32_t debug_corrupt_cold_every = 0;
  flags.Add("debug-lookup-delay-ms", &debug_lookup_delay_ms,
            "TESTS ONLY: answer every Lookup this many milliseconds late");
  flags.Add("debug-load-delay-ms", &debug_load_delay_ms,
            "TESTS ONLY: start every Load (gRPC, bulk port, local socket) this many "
            "milliseconds late");
  flags.Add(
      "debug-corrupt-hot-every", &debug_corrupt_hot_every,
      "TESTS ONLY: flip a byte in the hot-tier copy of every Nth newly stored block (0: off)");
  flags.Add("debug-corrupt-cold-every", &debug_corrupt_cold_every,
            "TESTS ONLY: flip a byte in the RocksDB copy of every Nth newly stored block (0: off)");
  flags.ParseOrExit(argc, argv);
  if (absl::Status s = boot.Validate(); !s.ok()) return boot.Fail(s);
  if (drain_timeout_s < 0) {
    return boot.Fail("--drain-timeout-s must be >= 0, got " + std::to_string(drain_timeout_s));
  }
  const rpc::TlsOptions& tls = boot.options().tls;
  const std::string& listen = boot.options().listen_address;
  // Under TLS the bulk port speaks TLS with the same files and roles.
  bulk_options.tls = tls;

  absl::StatusOr<kvstore::Durability> d = kvstore::ParseDurability(durability);
  if (!d.ok()) return boot.Fail("--durability: " + d.status().ToString());
  kvstore::KvStoreOptions options{
      .data_dir = data_dir,
      .hot_capacity_bytes = static_cast<uint64_t>(hot_capacity_bytes),
      .hot_slot_bytes = static_cast<uint64_t>(hot_slot_bytes),
      .cold_capacity_bytes = static_cast<uint64_t>(cold_capacity_bytes),
      .cold_capacity_blocks = static_cast<uint64_t>(cold_capacity_blocks),
      .durability = *d,
      .default_lease_ttl_ms = lease_ttl_ms,
      .max_lease_ttl_ms = max_lease_ttl_ms,
      .store_to_hot = store_to_hot,
      .write_buffer_bytes = static_cast<uint64_t>(std::max<int64_t>(write_buffer_bytes, 0)),
      .min_free_disk_bytes = static_cast<uint64_t>(std::max<int64_t>(min_free_disk_bytes, 0)),
      .share_hot_tier = !bulk_options.local_socket.empty(),
  };
  if (!bulk_options.local_socket.empty() && bulk_load_listen == "off") {
    return boot.Fail("--local-socket needs the bulk load port (--bulk-load-listen is off)");
  }
  if (!bulk_options.local_socket.empty() && hot_capacity_bytes == 0) {
    return boot.Fail("--local-socket needs the hot tier (--hot-capacity-bytes is 0)");
  }
  if (absl::Status s = options.Validate(); !s.ok()) return boot.Fail(s);
  kvstore_service::KvStoreServiceOptions service_options{
      .load_chunk_bytes = load_chunk_bytes,
      .debug_lookup_delay_ms = debug_lookup_delay_ms,
      .debug_load_delay_ms = debug_load_delay_ms,
      .debug_corrupt_hot_every = debug_corrupt_hot_every,
      .debug_corrupt_cold_every = debug_corrupt_cold_every};
  bulk_options.debug_lookup_delay_ms = debug_lookup_delay_ms;
  bulk_options.debug_load_delay_ms = debug_load_delay_ms;
  bulk_options.debug_corrupt_hot_every = debug_corrupt_hot_every;
  bulk_options.debug_corrupt_cold_every = debug_corrupt_cold_every;
  if (debug_lookup_delay_ms > 0 || debug_load_delay_ms > 0 || debug_corrupt_hot_every > 0 ||
      debug_corrupt_cold_every > 0) {
    TANDEM_LOG(WARNING) << "TEST-ONLY fault injection is on (--debug-*)";
  }
  if (absl::Status s = service_options.Validate(); !s.ok()) return boot.Fail(s.ToString());
  if (bulk_load_listen != "off") {
    absl::StatusOr<std::pair<std::string, std::string>> addr =
        rpc::SplitHostPort(bulk_load_listen == "auto" ? listen : bulk_load_listen);
    if (!addr.ok()) {
      return boot.Fail(absl::StrCat("--",
                                    bulk_load_listen == "auto" ? "listen" : "bulk-load-listen",
                                    ": ", addr.status().ToString()));
    }
    bulk_options.host = addr->first;
    bulk_options.port = bulk_load_listen == "auto" ? 0 : std::stoi(addr->second);
    if (absl::Status s = bulk_options.Validate(); !s.ok()) return boot.Fail(s.ToString());
  }
  absl::StatusOr<std::unique_ptr<kvstore_service::KvStoreServer>> server =
      kvstore_service::KvStoreServer::Open(
          {.store = options,
           .service = service_options,
           .bulk = bulk_load_listen != "off"
                       ? std::optional<kvstore_service::BulkLoadServerOptions>(bulk_options)
                       : std::nullopt});
  if (!server.ok()) return boot.Fail(server.status().ToString(), 1);
  kvstore::KvStoreEngine* const store = (*server)->engine();
  kvstore_service::BulkLoadServer* const bulk = (*server)->bulk();

  auto registry = std::make_shared<prometheus::Registry>();
  kvstore_service::KvStoreMetrics kv_metrics(*registry, store, bulk);
  rpc::RegisterTlsMetrics(registry);  // the --tls-* reloads
  absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> exposer =
      metrics::MetricsServer::Start(metrics_options, registry, [&] { kv_metrics.Update(); });
  if (!exposer.ok()) return boot.Fail(exposer.status().ToString(), 1);
  if (*exposer != nullptr) TANDEM_LOG(INFO) << "metrics on " << (*exposer)->url();

  grpc::ServerBuilder builder;
  kvstore_service::ConfigureServerBuilder(&builder);
  boot.options().max_receive_message_bytes = kvstore_service::kMaxReceiveMessageBytes;
  builder.RegisterService((*server)->service());
  if (absl::Status s = boot.Serve(&builder); !s.ok()) return boot.Fail(s.ToString(), 1);
  boot.SetServing(true);
  const int port = boot.port();
  TANDEM_LOG(INFO) << "tandem-kvstore serving on port " << port << " (data " << data_dir
                   << ", durability " << durability << ", bulk load port "
                   << (bulk ? std::to_string(bulk->port()) : std::string("off"))
                   << (bulk && !bulk->local_socket().empty()
                           ? absl::StrCat(", local socket ", bulk->local_socket())
                           : std::string())
                   << ", "
                   << (tls.mutual()    ? "mutual TLS: roles enforced"
                       : tls.enabled() ? "TLS without client certificates: roles NOT enforced"
                                       : "plain text")
                   << ")";

  boot.WaitForShutdown(absl::StrCat("draining for up to ", drain_timeout_s, " s"));
  boot.Shutdown(std::chrono::seconds(drain_timeout_s));
  (*server)->Shutdown();  // the bulk port
  exposer->reset();       // its scrapes read the store
  server->reset();        // closes the store: flushes the memtable
  TANDEM_LOG(INFO) << "tandem-kvstore stopped";
  return 0;
}
