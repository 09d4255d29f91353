#include <algorithm>
#include <chrono>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvconnector/kvstore_connector.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem::kvconnector {

void PinGrpcCallbackQueue() {
  static std::once_flag once;
  std::call_once(once, [] {
    // gRPC 1.51 shares one "callback alternative" completion queue among the
    // channels that made callback calls and shuts it down when the last such
    // channel goes; a channel created right then (a connector rebuilt after a
    // worker reconnect) races that shutdown and aborts in
    // grpc_cq_internal_unref. A channel that made one callback call and is
    // never destroyed keeps the queue alive for the life of the process.
    // (Held by static pointers: reachable to the end, so not a leak to LSan.)
    static auto* channel = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
    static auto* stub = new std::unique_ptr<v1::KvStore::Stub>(v1::KvStore::NewStub(*channel));
    struct Call {
      grpc::ClientContext ctx;
      v1::ReleaseRequest req;
      v1::ReleaseResponse resp;
    };
    auto call = std::make_shared<Call>();
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
    (*stub)->async()->Release(&call->ctx, &call->req, &call->resp, [call](grpc::Status) {});
  });
}

std::string NamespaceFor(const std::string& model_fingerprint, const std::string& kv_layout) {
  // The hash-root function is SHA-256 over length-prefixed fields; reuse it
  // with a marker dtype and no salt as a plain digest of (fingerprint, layout).
  const BlockHash h = ComputeRootHash(HashRootParams{.model_fingerprint = model_fingerprint,
                                                     .kv_layout = kv_layout,
                                                     .block_size = 1,
                                                     .dtype = "kvstore-namespace",
                                                     .cache_salt = ""});
  return "tandem-" + h.ToHex().substr(0, 32);
}

absl::Status KvStoreConnectorOptions::ValidateBulkLoad(std::string_view value,
                                                       const char* what) {
  if (value == "auto" || value == "off") return absl::OkStatus();
  if (absl::Status s = rpc::SplitHostPort(value).status(); !s.ok()) {
    return Annotate(s, absl::StrCat(what, " must be auto, off or host:port"));
  }
  return absl::OkStatus();
}

void AddKvStoreFlags(FlagSet* flags, std::string_view use, std::string* target,
                     std::string* bulk_port) {
  flags->Add(
      "kvstore", target,
      absl::StrCat("host:port of tandem-kvstore: ", std::string(use), " (empty: no KV-store)"));
  flags->Add("kvstore-bulk-port", bulk_port,
             "how KV-store loads, lookups and stores travel: auto (the store's bulk port, TLS "
             "under --tls-*, when it advertises one; else gRPC), off (gRPC only), or host:port "
             "of the bulk port");
  flags->Alias("kvstore-bulk-load", "kvstore-bulk-port");
}

absl::Status KvStoreConnectorOptions::Validate() const {
  if (target.empty()) return absl::InvalidArgumentError("--kvstore (host:port) is empty");
  TANDEM_RETURN_IF_ERROR(ValidateBulkLoad(bulk_load, "bulk_load"));
  if (lookup_deadline_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lookup_deadline_ms must be > 0, got ", lookup_deadline_ms));
  }
  if (transfer_deadline_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer_deadline_ms must be > 0, got ", transfer_deadline_ms));
  }
  if (max_pending_store_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pending_store_bytes must be > 0, got ", max_pending_store_bytes));
  }
  if (load_threads < 1 || load_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("load_threads must be in [1, 64], got ", load_threads));
  }
  if (lookup_refresh_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lookup_refresh_ms must be > 0, got ", lookup_refresh_ms));
  }
  if (max_known_hashes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_known_hashes must be > 0, got ", max_known_hashes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvStoreConnectorScheduler>> KvStoreConnectorScheduler::Create(
    const KvStoreConnectorOptions& options, const std::string& model_fingerprint,
    const std::string& kv_layout, int64_t block_bytes, int32_t block_size) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  PinGrpcCallbackQueue();
  if (block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("block_size must be > 0, got ", block_size));
  }
  TANDEM_ASSIGN_OR_RETURN(
      std::unique_ptr<KvStoreClient> client,
      KvStoreClient::Create(KvStoreClientOptions{.target = options.target,
                                                 .lookup_deadline_ms = options.lookup_deadline_ms,
                                                 .rpc_deadline_ms = 1000,
                                                 .bulk_load = false,  // the scheduler does not load
                                                 .bulk_lookup = options.bulk_load != "off",
                                                 .bulk_load_target = options.BulkPortTarget()}));
  const std::string ns = NamespaceFor(model_fingerprint, kv_layout);
  const kvstore::NamespaceSpec spec{
      .name = ns, .block_bytes = static_cast<uint64_t>(block_bytes), .layout = kv_layout};
  TANDEM_RETURN_IF_ERROR(spec.Validate());
  // Best effort, and not waited for: the worker creates it too (and again
  // after a store restart), and lookups miss until it exists.
  client->CreateNamespaceAsync(spec, [target = options.target, ns, block_bytes, kv_layout,
                                      on_namespace =
                                          options.on_namespace](absl::StatusOr<bool> created) {
    if (!created.ok()) {
      TANDEM_LOG(WARNING) << "KV-store " << target << ": creating namespace " << ns << " failed ("
                          << created.status() << "); lookups miss until the store is up";
    } else {
      TANDEM_LOG(INFO) << "KV-store " << target << " namespace " << ns
                       << (*created ? " created" : " exists") << " (block " << block_bytes
                       << " bytes, " << kv_layout << ")";
    }
    if (on_namespace) on_namespace(created.status());
  });
  return std::unique_ptr<KvStoreConnectorScheduler>(
      new KvStoreConnectorScheduler(options, std::move(client), ns, block_size));
}

KvStoreConnectorScheduler::KvStoreConnectorScheduler(const KvStoreConnectorOptions& options,
                                                     std::unique_ptr<KvStoreClient> client,
                                                     std::string ns, int32_t block_size)
    : options_(options), client_(std::move(client)), ns_(std::move(ns)), block_size_(block_size) {}

KvStoreConnectorScheduler::~KvStoreConnectorScheduler() {
  // A PendingLookup releases a lease it never handed out; those it did are ours.
  for (auto& [id, l] : lookups_) {
    if (l.result.has_value()) ReleaseLease(l.result->lease);
  }
  lookups_.clear();
  for (auto& [id, load] : loads_) ReleaseLease(load.lease);
}

void KvStoreConnectorScheduler::ReleaseLease(LeaseId lease) {
  if (lease.value() != 0) client_->ReleaseAsync(lease);
}

void KvStoreConnectorScheduler::NoteKnown(const BlockHash& h) {
  if (static_cast<int64_t>(known_.size()) >= options_.max_known_hashes) {
    // Forgetting only costs idempotent re-stores.
    known_.clear();
  }
  known_.insert(h);
}

std::optional<sched::ExternalMatch> KvStoreConnectorScheduler::GetNumNewMatchedTokens(
    const sched::Request& request, int32_t num_local_computed_tokens) {
  const int32_t local_blocks = num_local_computed_tokens / block_size_;
  const int32_t num_hashes = static_cast<int32_t>(request.block_hashes.size());
  if (local_blocks >= num_hashes) return sched::ExternalMatch{};

  auto it = lookups_.find(request.request_id);
  if (it != lookups_.end()) {
    const Lookup& l = it->second;
    // Ask again when the local hit shrank since we asked (blocks evicted), or
    // when a partial answer has grown stale (the store may hold more now).
    const bool stale = l.result.has_value() && l.result->num_hits < l.num_asked &&
                       MonotonicNanos() - l.answered_ns > options_.lookup_refresh_ms * 1'000'000;
    if (local_blocks < l.first_block || stale) {
      if (l.result.has_value()) ReleaseLease(l.result->lease);
      lookups_.erase(it);
      it = lookups_.end();
    }
  }
  if (it == lookups_.end()) {
    Lookup l;
    l.first_block = local_blocks;
    l.num_asked = num_hashes - local_blocks;
    l.sent_ns = MonotonicNanos();
    l.pending =
        client_->Lookup(ns_, std::span<const BlockHash>(request.block_hashes).subspan(local_blocks),
                        RemoteLookupOptions{.take_lease = true,
                                      .lease_ttl_ms = options_.lease_ttl_ms,
                                      .stage_to_hot = options_.stage_to_hot,
                                      .deadline_ms = options_.lookup_deadline_ms,
                                      .on_answer = options_.on_lookup_answer});
    lookups_.emplace(request.request_id, std::move(l));
    return std::nullopt;
  }
  Lookup& l = it->second;
  if (!l.result.has_value()) {
    std::optional<RemoteLookupResult> r = l.pending->Poll();
    if (!r.has_value()) return std::nullopt;
    l.result = std::move(r);
    l.answered_ns = MonotonicNanos();
    const uint64_t latency =
        static_cast<uint64_t>(std::max<int64_t>(0, MonotonicNanos() - l.sent_ns));
    ++stats_.lookups;
    stats_.lookup_latency_ns_sum += latency;
    stats_.lookup_latency_ns_max = std::max(stats_.lookup_latency_ns_max, latency);
    if (options_.on_lookup_latency) options_.on_lookup_latency(static_cast<double>(latency) * 1e-9);
    if (!l.result->status.ok()) {
      ++stats_.lookups_failed;
      l.result->num_hits = 0;
    } else {
      const int32_t hits = std::clamp(l.result->num_hits, 0, l.num_asked);
      l.result->num_hits = hits;
      if (hits > 0) ++stats_.lookups_with_hits;
      stats_.lookup_hit_tokens += static_cast<uint64_t>(hits) * block_size_;
      for (int32_t i = 0; i < l.num_asked; ++i) {
        const BlockHash& h = request.block_hashes[l.first_block + i];
        if (i < hits) {
          NoteKnown(h);
        } else {
          known_.erase(h);  // the store does not hold it (evicted, restarted): store again
        }
      }
    }
  }
  const int32_t end_block = l.first_block + l.result->num_hits;
  const int32_t external_blocks = std::max(0, end_block - local_blocks);
  return sched::ExternalMatch{.num_external_tokens = external_blocks * block_size_,
                              .load_async = true};
}

void KvStoreConnectorScheduler::UpdateStateAfterAlloc(const sched::Request& request,
                                                      std::span<const int32_t> block_ids,
                                                      int32_t num_external_tokens) {
  LeaseId lease{0};
  if (auto it = lookups_.find(request.request_id); it != lookups_.end()) {
    if (it->second.result.has_value()) lease = it->second.result->lease;
    lookups_.erase(it);  // an unanswered lookup's lease is released on destruction
  }
  const int32_t num_blocks = num_external_tokens / block_size_;
  if (num_blocks <= 0 || block_ids.empty()) {
    ReleaseLease(lease);
    return;
  }
  const int32_t first = request.num_computed_tokens / block_size_;
  Load load;
  load.lease = lease;
  load.block_ids.assign(block_ids.begin(),
                        block_ids.begin() + std::min<size_t>(block_ids.size(), num_blocks));
  load.hashes.assign(
      request.block_hashes.begin() + first,
      request.block_hashes.begin() + first + static_cast<int32_t>(load.block_ids.size()));
  ++stats_.loads_started;
  if (auto old = loads_.find(request.request_id); old != loads_.end())
    ReleaseLease(old->second.lease);
  loads_[request.request_id] = std::move(load);
}

sched::KvConnectorMetadata KvStoreConnectorScheduler::BuildConnectorMeta(
    const sched::SchedulerOutput& /*output*/,
    std::span<const sched::ScheduledRequestView> scheduled) {
  sched::KvConnectorMetadata meta;
  meta.stores = std::move(final_stores_);  // before_forward entries come first
  final_stores_.clear();
  for (auto& [id, load] : loads_) {
    if (load.emitted) continue;
    load.emitted = true;
    meta.loads.push_back(
        sched::KvLoad{.request_id = id, .block_hashes = load.hashes, .block_ids = load.block_ids});
  }
  for (const sched::ScheduledRequestView& v : scheduled) {
    const sched::Request& r = *v.request;
    StoreCursor& c = cursors_[r.request_id];
    if (c.epoch != r.epoch) c = StoreCursor{.epoch = r.epoch, .next_block = 0};
    sched::KvStoreOp store = StoreFrom(r, r.block_ids, &c, v.num_storable_tokens());
    if (!store.block_ids.empty()) meta.stores.push_back(std::move(store));
  }
  return meta;
}

sched::KvStoreOp KvStoreConnectorScheduler::StoreFrom(const sched::Request& r,
                                                    std::span<const int32_t> block_ids,
                                                    StoreCursor* c, int32_t num_storable_tokens) {
  const int32_t storable =
      std::min({num_storable_tokens / block_size_, static_cast<int32_t>(r.block_hashes.size()),
                static_cast<int32_t>(block_ids.size())});
  sched::KvStoreOp store{.request_id = r.request_id};
  for (int32_t b = c->next_block; b < storable; ++b) {
    if (known_.contains(r.block_hashes[b])) continue;
    store.block_ids.push_back(block_ids[b]);
    store.block_hashes.push_back(r.block_hashes[b]);
    NoteKnown(r.block_hashes[b]);
  }
  c->next_block = std::max(c->next_block, storable);
  if (!store.block_ids.empty()) {
    stats_.stored_blocks += store.block_ids.size();
    stores_pending_[r.request_id].push_back(store.block_hashes);
  }
  return store;
}

bool KvStoreConnectorScheduler::RequestFinished(const sched::Request& request,
                                                std::span<const int32_t> block_ids,
                                                int32_t num_storable_tokens) {
  if (num_storable_tokens > 0) {
    // The cursor is of the request's last scheduled step (its epoch moved on
    // when it finished); blocks it covered are not stored twice.
    auto it = cursors_.find(request.request_id);
    StoreCursor c = it != cursors_.end() ? it->second : StoreCursor{};
    sched::KvStoreOp store = StoreFrom(request, block_ids, &c, num_storable_tokens);
    if (!store.block_ids.empty()) {
      store.before_forward = true;  // the blocks are freed now
      final_stores_.push_back(std::move(store));
    }
  }
  if (auto it = lookups_.find(request.request_id); it != lookups_.end()) {
    if (it->second.result.has_value()) ReleaseLease(it->second.result->lease);
    lookups_.erase(it);
  }
  if (auto it = loads_.find(request.request_id); it != loads_.end()) {
    ReleaseLease(it->second.lease);
    loads_.erase(it);
  }
  cursors_.erase(request.request_id);
  // The worker copies a step's store blocks out of the cache before it runs
  // the next step, and a final store's before that step's loads and forward
  // pass (see the header), so the blocks may be reused at once.
  return false;
}

void KvStoreConnectorScheduler::OnLoadFinished(const sched::Request& request,
                                               int32_t num_loaded_tokens) {
  stats_.loaded_tokens += static_cast<uint64_t>(std::max(0, num_loaded_tokens));
  if (auto it = loads_.find(request.request_id); it != loads_.end()) {
    ReleaseLease(it->second.lease);
    loads_.erase(it);
  }
}

void KvStoreConnectorScheduler::OnConnectorReport(const sched::KvConnectorReport& report) {
  if (!report.invalid_block_ids.empty()) {
    stats_.invalid_blocks += report.invalid_block_ids.size();
    const absl::flat_hash_set<int32_t> invalid(report.invalid_block_ids.begin(),
                                               report.invalid_block_ids.end());
    // The blocks from the first invalid one on are recomputed; the store
    // does not hold them usably, so they must be stored again.
    for (auto& [id, load] : loads_) {
      for (size_t i = 0; i < load.block_ids.size(); ++i) {
        if (!invalid.contains(load.block_ids[i])) continue;
        for (size_t j = i; j < load.hashes.size(); ++j) known_.erase(load.hashes[j]);
        break;
      }
    }
  }
  // Entries arrive in the order they were emitted. Every entry of a request
  // named in failed_sending that finished in this report is forgotten (a
  // request rarely has two), so a later request stores its blocks again;
  // forgetting a block the store does hold costs only an idempotent store.
  for (const std::string& id : report.finished_sending) {
    auto it = stores_pending_.find(id);
    if (it == stores_pending_.end()) continue;
    std::vector<BlockHash> hashes = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) stores_pending_.erase(it);
    if (std::find(report.failed_sending.begin(), report.failed_sending.end(), id) ==
        report.failed_sending.end()) {
      continue;
    }
    stats_.stored_blocks_lost += hashes.size();
    for (const BlockHash& h : hashes) known_.erase(h);
  }
}

KvConnectorSchedulerStats KvStoreConnectorScheduler::stats() const {
  KvConnectorSchedulerStats s = stats_;
  s.lookups_pending = 0;
  for (const auto& [id, l] : lookups_) s.lookups_pending += !l.result.has_value();
  s.loads_in_flight = static_cast<int32_t>(loads_.size());
  s.stores_in_flight = 0;
  for (const auto& [id, entries] : stores_pending_) {
    s.stores_in_flight += static_cast<int32_t>(entries.size());
  }
  return s;
}

}  // namespace tandem::kvconnector
