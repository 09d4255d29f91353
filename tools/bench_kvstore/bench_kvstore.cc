// bench_kvstore: the KV-store over loopback (gRPC and the bulk port) against
// redis-server.
//
// Starts two in-process tandem-kvstore services (the real gRPC service on
// 127.0.0.1): one with a hot tier big enough for every block, one with no hot
// tier (every load reads RocksDB). Measures through the KV-store client:
//   - Lookup latency of a 64-hash prefix (p50, p99), over the bulk port's
//     lookup connection (the client's default) and over gRPC; DESIGN §8
//     target p50 <= 100 us, p99 <= 1 ms; anchors: 1-2 ms published for
//     Mooncake's batched existence check, and redis EXISTS of the same 64
//     keys measured in the same run.
//   - Store GB/s for 64 KiB and 2 MiB blocks, over the bulk port (the
//     client's default) and over the gRPC stream, with durability wal, none
//     and memory (the hot tier only, as redis keeps them), beside redis SET:
//     median of interleaved trials, each storing fresh blocks into a new
//     namespace.
//   - Load GB/s for 64 KiB and 2 MiB blocks, per tier (loads
//     after one untimed pass over the blocks, as redis GETs), Load both over
//     the bulk load port (the client's default) and over the gRPC stream,
//     and (hot tier) with mutual TLS, over the bulk port (as tandem-kvstore
//     serves it under TLS) and over the gRPC stream: what TLS costs a load;
//     and (hot tier) through the local socket, reading the hot tier in place
//     from shared memory, as a worker on the store's host does. Certificates
//     come from the openssl CLI.
// Then starts Debian's redis-server on a loopback port (no persistence) and
// measures pipelined SET/GET of the same blocks with a small RESP client
// that, like our Load, copies each value into a caller-provided buffer; and
// GET over redis's TLS port with mutual TLS, the same certificates, as the
// anchor of our loads under mutual TLS.
//
//   build/tools/bench_kvstore/bench_kvstore [--rounds=5] [--redis-server=/usr/bin/redis-server]
#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "kvstore_server.h"
#include "bench_service.h"
#include "redis_client.h"
#include "tandem/common/flags.h"
#include "tandem/common/logging.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/rpc/tls.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem {
namespace {

using bench::Service;
using bench::StartService;
using bench::StartTls;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

BlockHash MakeHash(uint64_t i, uint8_t tag) {
  BlockHash h;
  std::mt19937_64 rng(i * 1315423911u + tag);
  for (auto& b : h.bytes) b = static_cast<uint8_t>(rng());
  return h;
}

std::vector<uint8_t> RandomBytes(uint64_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  std::mt19937_64 rng(seed);
  for (uint64_t k = 0; k + 8 <= n; k += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + k, &v, 8);
  }
  return out;
}

// ---- measurements --------------------------------------------------------------------

struct Case {
  const char* name;
  uint64_t block_bytes;
  uint64_t num_blocks;
  uint64_t batch;  // blocks per Load/Store call (and per redis pipeline)
};

// The blocks of one case, the same bytes for the KV-store and for redis.
struct Blocks {
  std::vector<BlockHash> hashes;
  std::vector<std::string> keys;  // redis keys: the hashes in hex
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<std::vector<uint8_t>> bufs;  // one batch of destination buffers
  std::vector<std::span<uint8_t>> dst;

  Blocks(const Case& c) {
    for (uint64_t i = 0; i < c.num_blocks; ++i) {
      hashes.push_back(MakeHash(i, static_cast<uint8_t>(c.block_bytes >> 16)));
      keys.push_back(hashes.back().ToHex());
      payloads.push_back(RandomBytes(c.block_bytes, i));
    }
    bufs.assign(c.batch, std::vector<uint8_t>(c.block_bytes));
    dst.assign(bufs.begin(), bufs.end());
  }
  // The last batch's first block is in bufs[0] after a full pass.
  void CheckLastBatch(const Case& c) const {
    TANDEM_CHECK(bufs[0] == payloads[((c.num_blocks - 1) / c.batch) * c.batch]);
  }
};

// How a load or a store is meant to go.
enum class Via { kGrpc, kBulk, kLocal };

// Stores every block once (fresh blocks) through `client` into `ns`; GB/s.
// Checks each store went the way it is labelled (local socket, bulk port or
// gRPC stream).
double StoreAll(kvconnector::KvStoreClient* client, Via via, const std::string& ns, const Case& c,
                const Blocks& b, std::optional<kvstore::Durability> durability) {
  TANDEM_CHECK(client->CreateNamespace({.name = ns, .block_bytes = c.block_bytes}).ok());
  const uint64_t bulk_before = client->bulk_stores();
  const uint64_t local_before = client->local_stores();
  uint64_t calls = 0;
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < c.num_blocks; i += c.batch, ++calls) {
    const uint64_t n = std::min(c.batch, c.num_blocks - i);
    std::vector<std::span<const uint8_t>> src(b.payloads.begin() + i, b.payloads.begin() + i + n);
    auto r = client->Store(ns, std::span(b.hashes).subspan(i, n), src, durability);
    TANDEM_CHECK(r.ok()) << r.status();
    for (const auto& br : *r) TANDEM_CHECK(br.status.ok() && !br.already_present) << br.status;
  }
  const double gbps = c.block_bytes * c.num_blocks / SecondsSince(t0) / 1e9;
  TANDEM_CHECK(client->bulk_stores() - bulk_before == (via == Via::kBulk ? calls : 0));
  TANDEM_CHECK(client->local_stores() - local_before == (via == Via::kLocal ? calls : 0));
  return gbps;
}

// `rounds` passes of Load over every block; GB/s. Checks each load went the
// way it is labelled (local socket, bulk load port or gRPC stream).
double LoadAll(kvconnector::KvStoreClient* client, Via via, const std::string& ns, const Case& c,
               int rounds, Blocks* b) {
  const uint64_t bulk_before = client->bulk_loads();
  const uint64_t local_before = client->local_loads();
  uint64_t calls = 0;
  const auto t0 = Clock::now();
  for (int r = 0; r < rounds; ++r) {
    for (uint64_t i = 0; i < c.num_blocks; i += c.batch, ++calls) {
      const uint64_t n = std::min(c.batch, c.num_blocks - i);
      auto res = client->Load(ns, std::span(b->hashes).subspan(i, n), std::span(b->dst).first(n));
      TANDEM_CHECK(res.ok()) << res.status();
      for (const auto& br : *res) TANDEM_CHECK(br.ok()) << LoadMissName(br.miss);
    }
  }
  const double gbps = c.block_bytes * c.num_blocks * rounds / SecondsSince(t0) / 1e9;
  b->CheckLastBatch(c);
  TANDEM_CHECK(client->bulk_loads() - bulk_before == (via == Via::kBulk ? calls : 0));
  TANDEM_CHECK(client->local_loads() - local_before == (via == Via::kLocal ? calls : 0));
  return gbps;
}

double RedisSetAll(Redis* redis, const Case& c, const Blocks& b) {
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < c.num_blocks; i += c.batch) {
    const uint64_t n = std::min(c.batch, c.num_blocks - i);
    std::vector<std::string> k(b.keys.begin() + i, b.keys.begin() + i + n);
    std::vector<std::span<const uint8_t>> v(b.payloads.begin() + i, b.payloads.begin() + i + n);
    redis->SetAll(k, v);
  }
  return c.block_bytes * c.num_blocks / SecondsSince(t0) / 1e9;
}

double RedisGetAll(Redis* redis, const Case& c, int rounds, Blocks* b) {
  const auto t0 = Clock::now();
  for (int r = 0; r < rounds; ++r) {
    for (uint64_t i = 0; i < c.num_blocks; i += c.batch) {
      const uint64_t n = std::min(c.batch, c.num_blocks - i);
      std::vector<std::string> k(b->keys.begin() + i, b->keys.begin() + i + n);
      redis->GetAll(k, std::vector<std::span<uint8_t>>(b->dst.begin(), b->dst.begin() + n));
    }
  }
  const double gbps = c.block_bytes * c.num_blocks * rounds / SecondsSince(t0) / 1e9;
  b->CheckLastBatch(c);
  return gbps;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The load paths measured against each other, in the order of a trial.
enum Path {
  kHotLocal,
  kHotBulk,
  kHotGrpc,
  kHotBulkTls,
  kHotTls,
  kColdBulk,
  kColdGrpc,
  kRedisGet,
  kRedisGetTls,
  kNumPaths
};
const char* const kPathNames[kNumPaths] = {"hot local", "load hot",  "hot gRPC",
                                           "bulk+mTLS", "gRPC+mTLS", "load cold",
                                           "cold gRPC", "redis GET", "redis+mTLS"};

// How many of the load paths run: redis's last, its TLS port last of all.
int LoadPaths(bool have_redis, bool have_redis_tls) {
  return !have_redis ? kRedisGet : have_redis_tls ? kNumPaths : kRedisGetTls;
}

// The store paths, in the order of a trial: the hot service over the bulk
// port (WAL, the store's default; without the WAL; and in the hot tier only,
// durability memory, which keeps blocks as redis-server without persistence
// does) and over gRPC, and redis SET.
enum StorePath {
  kStoreBulk,
  kStoreGrpc,
  kStoreBulkNone,
  kStoreGrpcNone,
  kStoreBulkMemory,
  kStoreGrpcMemory,
  kStoreLocalMemory,
  kRedisSet,
  kRedisSetUnix,
  kNumStorePaths
};
const char* const kStorePathNames[kNumStorePaths] = {"store wal", "wal gRPC",  "store none",
                                                     "none gRPC", "store mem", "mem gRPC",
                                                     "mem local", "redis SET", "redis unix"};

struct Figures {
  double store_gbps[kNumStorePaths] = {};  // median over the trials
  double load_gbps[kNumPaths] = {};        // median over the trials
  double load_min[kNumPaths] = {}, load_max[kNumPaths] = {};
};

// One case: stores (KV-store hot and cold services, redis SET), then
// `trials` interleaved trials of every load path, each `rounds` passes over
// the blocks after one untimed pass (flow-control windows grow, buffers are
// faulted in). Interleaving keeps a noisy neighbour from favouring one side.
Figures RunCase(Service* hot, Service* cold, Redis* redis, Redis* redis_tls, Redis* redis_unix,
                const Case& c, int rounds, int trials, int store_trials) {
  Figures f;
  Blocks b(c);
  const std::string ns = c.name;
  // The cold service gets the blocks for its loads.
  StoreAll(cold->client.get(), Via::kBulk, ns, c, b, std::nullopt);
  auto store = [&](int path, int trial) {
    const std::string store_ns = absl::StrCat(ns, "-", kStorePathNames[path], "-", trial);
    switch (path) {
      case kStoreBulk:
        return StoreAll(hot->client.get(), Via::kBulk, store_ns, c, b, std::nullopt);
      case kStoreGrpc:
        return StoreAll(hot->grpc_client.get(), Via::kGrpc, store_ns, c, b, std::nullopt);
      case kStoreBulkNone:
        return StoreAll(hot->client.get(), Via::kBulk, store_ns, c, b, kvstore::Durability::kNone);
      case kStoreGrpcNone:
        return StoreAll(hot->grpc_client.get(), Via::kGrpc, store_ns, c, b,
                        kvstore::Durability::kNone);
      case kStoreBulkMemory:
        return StoreAll(hot->client.get(), Via::kBulk, store_ns, c, b,
                        kvstore::Durability::kMemory);
      case kStoreLocalMemory:
        return StoreAll(hot->local_client.get(), Via::kLocal, store_ns, c, b,
                        kvstore::Durability::kMemory);
      case kStoreGrpcMemory:
        return StoreAll(hot->grpc_client.get(), Via::kGrpc, store_ns, c, b,
                        kvstore::Durability::kMemory);
      case kRedisSet:
        return RedisSetAll(redis, c, b);
      default:
        return RedisSetAll(redis_unix, c, b);
    }
  };
  // Each trial starts with RocksDB idle in both stores: the flushes and
  // compactions an earlier trial's wal and none stores leave took up to a
  // third of the two cores' samples (perf) during the trials after it.
  auto quiesce = [&] {
    for (Service* s : {hot, cold}) {
      const absl::Status idle = s->server->engine()->WaitForBackgroundWork(120'000);
      TANDEM_CHECK(idle.ok()) << idle;
    }
  };
  const int store_paths =
      redis == nullptr ? kRedisSet : redis_unix == nullptr ? kRedisSetUnix : kNumStorePaths;
  std::vector<double> store_gbps[kNumStorePaths];
  for (int t = 0; t < store_trials; ++t) {
    for (int k = 0; k < store_paths; ++k) {
      const int p = (k + t) % store_paths;
      quiesce();
      store_gbps[p].push_back(store(p, t));
    }
  }
  for (int p = 0; p < store_paths; ++p) f.store_gbps[p] = Median(store_gbps[p]);
  // The hot service's loads read blocks stored after the trials, so that they
  // are the hot tier's most recent.
  StoreAll(hot->client.get(), Via::kBulk, ns, c, b, std::nullopt);
  quiesce();
  auto run = [&](int path, int r) {
    switch (path) {
      case kHotLocal:
        return LoadAll(hot->local_client.get(), Via::kLocal, ns, c, r, &b);
      case kHotBulk:
        return LoadAll(hot->client.get(), Via::kBulk, ns, c, r, &b);
      case kHotGrpc:
        return LoadAll(hot->grpc_client.get(), Via::kGrpc, ns, c, r, &b);
      case kHotBulkTls:
        return LoadAll(hot->tls_bulk_client.get(), Via::kBulk, ns, c, r, &b);
      case kHotTls:
        return LoadAll(hot->tls_client.get(), Via::kGrpc, ns, c, r, &b);
      case kColdBulk:
        return LoadAll(cold->client.get(), Via::kBulk, ns, c, r, &b);
      case kColdGrpc:
        return LoadAll(cold->grpc_client.get(), Via::kGrpc, ns, c, r, &b);
      case kRedisGet:
        return RedisGetAll(redis, c, r, &b);
      default:
        return RedisGetAll(redis_tls, c, r, &b);
    }
  };
  const int paths = LoadPaths(redis != nullptr, redis_tls != nullptr);
  for (int p = 0; p < paths; ++p) run(p, 1);  // untimed
  std::vector<double> gbps[kNumPaths];
  for (int t = 0; t < trials; ++t) {
    for (int k = 0; k < paths; ++k) {
      const int p = (k + t) % paths;  // rotate who goes first
      gbps[p].push_back(run(p, rounds));
    }
  }
  for (int p = 0; p < paths; ++p) {
    f.load_gbps[p] = Median(gbps[p]);
    f.load_min[p] = *std::min_element(gbps[p].begin(), gbps[p].end());
    f.load_max[p] = *std::max_element(gbps[p].begin(), gbps[p].end());
  }
  return f;
}

int Main(int argc, char** argv) {
  // Block-sized buffers (messages of ~1 MiB) come and go at a high rate:
  // keep them on the heap instead of mmap/munmap (page faults) per message.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  int32_t rounds = 5;
  int32_t lookups = 3000;
  std::string redis_server = "/usr/bin/redis-server";
  int32_t redis_port = 0;
  std::string data_dir;
  int64_t load_chunk_bytes = kvstore_service::KvStoreServiceOptions{}.load_chunk_bytes;
  tandem::FlagSet flags(
      "bench_kvstore",
      "KV-store lookup latency and load/store GB/s over loopback (gRPC and the bulk port), beside "
      "redis-server SET/GET of the same blocks.");
  int32_t trials = 5;
  int32_t store_trials = 3;
  flags.Add("rounds", &rounds, "passes over every block per load trial");
  flags.Add("trials", &trials, "interleaved trials per load path (the median is reported)");
  flags.Add("store-trials", &store_trials,
            "interleaved trials per store path, each into fresh namespaces (the median is "
            "reported)");
  flags.Add("lookups", &lookups, "64-hash lookups timed for the latency percentiles");
  flags.Add("redis-server", &redis_server, "redis-server binary; empty skips redis");
  flags.Add("redis-port", &redis_port, "loopback port for redis-server (0: 16379 + pid % 1000)");
  flags.Add("data-dir", &data_dir, "scratch directory (default: a fresh one under /tmp)");
  flags.Add("load-chunk-bytes", &load_chunk_bytes,
            "payload bytes per Load stream message (the service's option; at most 3 MiB)");
  flags.ParseOrExit(argc, argv);
  SetMinLogLevel(LogLevel::kWarning);

  if (data_dir.empty()) {
    char tmpl[] = "/tmp/bench_kvstore_XXXXXX";
    data_dir = mkdtemp(tmpl);
  }
  Service hot = StartService(data_dir + "/hot", uint64_t{1} << 30, load_chunk_bytes);
  Service cold = StartService(data_dir + "/cold", 0, load_chunk_bytes);
  StartTls(&hot, data_dir + "/tls", load_chunk_bytes);

  // redis-server first: it is an anchor for lookups too.
  // Its TLS port (mutual TLS, the certificates of our TLS paths) is the
  // anchor of our loads under mutual TLS; Debian's redis-server has TLS.
  bool have_redis = false, have_redis_tls = false, have_redis_unix = false;
  pid_t redis_pid = -1;
  Redis redis, redis_tls, redis_unix;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> redis_ctx(SSL_CTX_new(TLS_client_method()),
                                                             SSL_CTX_free);
  if (!redis_server.empty() && std::filesystem::exists(redis_server)) {
    const int port = redis_port > 0 ? redis_port : 16379 + getpid() % 1000;
    const std::string tls_dir = data_dir + "/tls";
    const RedisTls tls{.port = port + 1000,
                       .cert_file = tls_dir + "/leaf.pem",
                       .key_file = tls_dir + "/leaf.key",
                       .ca_file = tls_dir + "/ca.pem"};
    // Its Unix-domain socket is the anchor of stores through our local
    // socket (a client on the store's host).
    const std::string unix_socket = data_dir + "/redis.sock";
    redis_pid = StartRedis(redis_server, port, tls, unix_socket);
    for (int i = 0; i < 200 && !have_redis; ++i) {
      have_redis = redis.Connect(port);
      if (!have_redis) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    have_redis_unix = have_redis && redis_unix.ConnectUnix(unix_socket);
    SSL_CTX* ctx = redis_ctx.get();
    if (have_redis && SSL_CTX_use_certificate_chain_file(ctx, tls.cert_file.c_str()) == 1 &&
        SSL_CTX_use_PrivateKey_file(ctx, tls.key_file.c_str(), SSL_FILETYPE_PEM) == 1 &&
        SSL_CTX_load_verify_locations(ctx, tls.ca_file.c_str(), nullptr) == 1) {
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
      have_redis_tls = redis_tls.ConnectTls(tls.port, ctx);
    }
    if (have_redis && !have_redis_tls) {
      std::fprintf(stderr, "note: redis-server's TLS port did not answer: no redis+mTLS anchor\n");
    }
  }

  // Lookup latency: a 64-block prefix, all hits, with a lease released in
  // the background (as the scheduler does) and without.
  const std::string lat_ns = "lookup";
  TANDEM_CHECK(hot.client->CreateNamespace({.name = lat_ns, .block_bytes = 4096}).ok());
  std::vector<BlockHash> prefix;
  std::vector<std::string> prefix_keys;
  std::vector<std::vector<uint8_t>> small(64, std::vector<uint8_t>(4096, 7));
  for (int i = 0; i < 64; ++i) {
    prefix.push_back(MakeHash(i, 99));
    prefix_keys.push_back(prefix.back().ToHex());
  }
  {
    std::vector<std::span<const uint8_t>> src(small.begin(), small.end());
    TANDEM_CHECK(hot.client->Store(lat_ns, prefix, src).ok());
    if (have_redis) redis.SetAll(prefix_keys, src);
  }
  // The measures, interleaved sample by sample so that a noisy neighbour
  // hits them alike: the client's Lookup over the bulk port's lookup
  // connection (the default) and over gRPC, each without and with a lease
  // (released with ReleaseAsync, as the scheduler does); the same lookup as
  // a blocking unary call of the generated stub; gRPC's floor, an empty
  // Stats RPC; and redis EXISTS of the same 64 keys.
  // For the client's Lookup: when its answer arrived (what the scheduler's
  // once-per-step Poll() sees) and when Wait() returned (one more thread
  // wake-up; Wait() sleeps: a spin on Poll() would steal the CPU the
  // in-process server needs on small machines).
  auto stub = v1::KvStore::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(hot.port),
                                                       grpc::InsecureChannelCredentials()));
  v1::LookupRequest sync_req;
  sync_req.set_namespace_(lat_ns);
  for (const BlockHash& h : prefix) sync_req.add_block_hashes(h.ToBytes());
  enum {
    kBulk,
    kBulkLease,
    kBulkWait,
    kBulkLeaseWait,
    kGrpc,
    kGrpcLease,
    kSync,
    kFloor,
    kRedisExists,
    kNumMeasures
  };
  std::vector<double> us[kNumMeasures];
  const uint64_t bulk_before = hot.client->bulk_lookups();
  for (int i = 0; i < lookups + 200; ++i) {
    const bool keep = i >= 200;  // after warm-up
    for (bool bulk : {true, false}) {
      kvconnector::KvStoreClient* client = bulk ? hot.client.get() : hot.grpc_client.get();
      for (bool lease : {false, true}) {
        auto t0 = Clock::now();
        auto r = client->Lookup(lat_ns, prefix, {.take_lease = lease})->Wait();
        const double wait_us = SecondsSince(t0) * 1e6;
        TANDEM_CHECK(r.num_hits == 64) << r.status;
        if (lease) client->ReleaseAsync(r.lease);
        if (!keep) continue;
        const double answered = static_cast<double>(r.answered_after_us);
        if (bulk) {
          us[lease ? kBulkLease : kBulk].push_back(answered);
          us[lease ? kBulkLeaseWait : kBulkWait].push_back(wait_us);
        } else {
          us[lease ? kGrpcLease : kGrpc].push_back(answered);
        }
      }
    }
    {
      grpc::ClientContext ctx;
      v1::LookupResponse resp;
      auto t0 = Clock::now();
      TANDEM_CHECK(stub->Lookup(&ctx, sync_req, &resp).ok() && resp.num_hits() == 64);
      if (keep) us[kSync].push_back(SecondsSince(t0) * 1e6);
    }
    {
      auto t0 = Clock::now();
      TANDEM_CHECK(hot.client->Stats().ok());
      if (keep) us[kFloor].push_back(SecondsSince(t0) * 1e6);
    }
    if (have_redis) {
      auto t0 = Clock::now();
      TANDEM_CHECK(redis.Exists(prefix_keys) == 64);
      if (keep) us[kRedisExists].push_back(SecondsSince(t0) * 1e6);
    }
  }
  // Every bulk-port sample went over the lookup connection, none over gRPC.
  TANDEM_CHECK(hot.client->bulk_lookups() - bulk_before == 2u * (lookups + 200))
      << "some lookups fell back to gRPC";
  for (auto& v : us) std::sort(v.begin(), v.end());
  auto p50 = [&](int m) { return us[m].empty() ? 0.0 : us[m][us[m].size() / 2]; };
  auto p99 = [&](int m) { return us[m].empty() ? 0.0 : us[m][us[m].size() * 99 / 100]; };

  const std::vector<Case> cases = {{"64KiB", 64 << 10, 512, 16}, {"2MiB", 2 << 20, 48, 4}};
  std::vector<Figures> figs;
  for (const Case& c : cases) {
    figs.push_back(
        RunCase(&hot, &cold, have_redis ? &redis : nullptr, have_redis_tls ? &redis_tls : nullptr,
                have_redis_unix ? &redis_unix : nullptr,
                c, rounds, trials, store_trials));
  }
  if (redis_pid > 0) {
    kill(redis_pid, SIGTERM);
    waitpid(redis_pid, nullptr, 0);
  }

  std::printf(
      "bench_kvstore: tandem-kvstore (in-process gRPC server, loopback) vs redis-server "
      "(loopback, no persistence), %u CPUs\n\n",
      std::thread::hardware_concurrency());
  std::printf("Lookup of a 64-hash prefix (all hits), %d lookups of each kind, interleaved:\n",
              lookups);
  std::printf("  client Lookup, answer arrived (what the scheduler's Poll() sees):\n");
  std::printf(
      "    bulk port lookup connection (default): no lease p50 %6.1f us  p99 %6.1f us | "
      "with lease p50 %6.1f us  p99 %6.1f us\n",
      p50(kBulk), p99(kBulk), p50(kBulkLease), p99(kBulkLease));
  std::printf(
      "    gRPC (the fallback):                   no lease p50 %6.1f us  p99 %6.1f us | "
      "with lease p50 %6.1f us  p99 %6.1f us\n",
      p50(kGrpc), p99(kGrpc), p50(kGrpcLease), p99(kGrpcLease));
  std::printf(
      "  client Lookup over the bulk port, Wait() returned (+1 thread wake-up): no lease "
      "p50 %6.1f us  p99 %6.1f us | with lease p50 %6.1f us  p99 %6.1f us\n",
      p50(kBulkWait), p99(kBulkWait), p50(kBulkLeaseWait), p99(kBulkLeaseWait));
  std::printf(
      "  gRPC: the same lookup as a blocking unary call p50 %.1f us, p99 %.1f us; its floor, an "
      "empty Stats RPC, p50 %.1f us, p99 %.1f us\n",
      p50(kSync), p99(kSync), p50(kFloor), p99(kFloor));
  if (have_redis) {
    std::printf(
        "  redis-server EXISTS of the same 64 keys (one round trip): p50 %.1f us, p99 %.1f "
        "us\n",
        p50(kRedisExists), p99(kRedisExists));
  }
  std::printf(
      "  target p50 <= 100 us, p99 <= 1000 us; anchor: Mooncake batched existence check "
      "1-2 ms (published)\n");
  std::printf("  bulk port lookup p50 (with lease) = %.2fx of redis EXISTS; %s the target\n\n",
              have_redis ? p50(kBulkLease) / p50(kRedisExists) : 0.0,
              p50(kBulkLease) <= 100.0 && p99(kBulkLease) <= 1000.0 ? "meets" : "misses");
  std::printf(
      "Throughput, GB/s. Blocks per Load/Store call = redis pipeline depth. Stores: median of "
      "%d interleaved trials, each of fresh blocks into a new namespace, over the bulk port (the "
      "client's default for a store on another host), over the gRPC stream, and through the "
      "local socket (mem local: written in place into the store's shared memory):\n",
      store_trials);
  std::printf("  %-6s %6s %6s |", "block", "blocks", "batch");
  for (const char* name : kStorePathNames) std::printf(" %10s", name);
  std::printf("\n");
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf("  %-6s %6llu %6llu |", cases[i].name,
                static_cast<unsigned long long>(cases[i].num_blocks),
                static_cast<unsigned long long>(cases[i].batch));
    for (int p = 0; p < kNumStorePaths; ++p) {
      if ((p != kRedisSet || have_redis) && (p != kRedisSetUnix || have_redis_unix)) {
        std::printf(" %10.2f", figs[i].store_gbps[p]);
      } else {
        std::printf(" %10s", "n/a");
      }
    }
    std::printf("\n");
  }
  if (have_redis) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const double* g = figs[i].store_gbps;
      std::printf(
          "  %s: store / redis SET (no persistence) over the bulk port: memory %.2fx (the same "
          "durability; target >= 1x), wal %.2fx (on disk); over the gRPC stream: memory %.2fx, "
          "wal %.2fx; from the same host, written in place through the local socket: memory "
          "%.2fx\n",
          cases[i].name, g[kStoreBulkMemory] / g[kRedisSet], g[kStoreBulk] / g[kRedisSet],
          g[kStoreGrpcMemory] / g[kRedisSet], g[kStoreGrpc] / g[kRedisSet],
          g[kStoreLocalMemory] / g[kRedisSet]);
      if (have_redis_unix) {
        std::printf(
            "  %s: stores from the same host / redis SET over its Unix socket (no persistence): "
            "memory %.2fx through the local socket, %.2fx over the bulk port\n",
            cases[i].name, g[kStoreLocalMemory] / g[kRedisSetUnix],
            g[kStoreBulkMemory] / g[kRedisSetUnix]);
      }
    }
  }
  std::printf(
      "Loads: median of %d interleaved trials of %d passes each, over the bulk load port (the "
      "client's default) and over the gRPC stream:\n",
      trials, rounds);
  std::printf("  %-6s %6s %6s |", "block", "blocks", "batch");
  for (const char* name : kPathNames) std::printf(" %9s", name);
  std::printf("\n");
  const int paths = LoadPaths(have_redis, have_redis_tls);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Figures& f = figs[i];
    std::printf("  %-6s %6llu %6llu |", cases[i].name,
                static_cast<unsigned long long>(cases[i].num_blocks),
                static_cast<unsigned long long>(cases[i].batch));
    for (int p = 0; p < kNumPaths; ++p) {
      if (p < paths) {
        std::printf(" %9.2f", f.load_gbps[p]);
      } else {
        std::printf(" %9s", "n/a");
      }
    }
    std::printf("\n%28s |", "(min-max)");
    for (int p = 0; p < paths; ++p) std::printf(" %4.1f-%-4.1f", f.load_min[p], f.load_max[p]);
    std::printf("\n");
  }
  if (have_redis) {
    for (size_t i = 0; i < cases.size(); ++i) {
      std::printf(
          "  %s: hot-tier load / redis GET = %.2fx (target >= 1x); over the gRPC stream %.2fx; "
          "from the same host's shared memory (local socket) %.2fx\n",
          cases[i].name, figs[i].load_gbps[kHotBulk] / figs[i].load_gbps[kRedisGet],
          figs[i].load_gbps[kHotGrpc] / figs[i].load_gbps[kRedisGet],
          figs[i].load_gbps[kHotLocal] / figs[i].load_gbps[kRedisGet]);
    }
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf(
        "  %s: mutual TLS costs a hot-tier load %.0f%% on the bulk port (%.2f -> %.2f GB/s) and "
        "%.0f%% over gRPC; the TLS bulk port is %.2fx gRPC+mTLS\n",
        cases[i].name, 100 * (1 - figs[i].load_gbps[kHotBulkTls] / figs[i].load_gbps[kHotBulk]),
        figs[i].load_gbps[kHotBulk], figs[i].load_gbps[kHotBulkTls],
        100 * (1 - figs[i].load_gbps[kHotTls] / figs[i].load_gbps[kHotGrpc]),
        figs[i].load_gbps[kHotBulkTls] / figs[i].load_gbps[kHotTls]);
    if (have_redis) {
      std::printf(
          "  %s: hot-tier load over mutual TLS (bulk port) / redis GET = %.2fx (issue 32's "
          "target >= 1x)",
          cases[i].name, figs[i].load_gbps[kHotBulkTls] / figs[i].load_gbps[kRedisGet]);
      if (have_redis_tls) {
        std::printf("; / redis GET over mutual TLS = %.2fx",
                    figs[i].load_gbps[kHotBulkTls] / figs[i].load_gbps[kRedisGetTls]);
      }
      std::printf("\n");
    }
  }
  hot.server->Shutdown();
  cold.server->Shutdown();
  hot = Service();
  cold = Service();
  std::error_code ec;
  std::filesystem::remove_all(data_dir, ec);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
