#include "tandem/kvconnector/kvstore_client.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "bulk_load_client.h"
#include "bulk_lookup_client.h"
#include "bulk_store_client.h"
#include "local_socket_client.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/sync_stream.h"
#include "kvstore_client_wire.h"
#include "tandem/common/status.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/rpc/server.h"
#include "tandem/rpc/status.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem::kvconnector {
namespace {

using Stub = v1::KvStore::Stub;
using SteadyTime = std::chrono::steady_clock::time_point;

std::chrono::system_clock::time_point DeadlineIn(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

// rpc::DefaultChannelArguments (keepalive, backoff), plus large HTTP/2
// frames and windows for bulk block transfer.
std::shared_ptr<grpc::Channel> CreateKvChannel(const std::string& target) {
  grpc::ChannelArguments args = rpc::DefaultChannelArguments();
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  args.SetInt(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20);
  args.SetMaxReceiveMessageSize(16 << 20);
  return rpc::CreateChannel(target, args);
}

}  // namespace

absl::Status KvStoreClientOptions::Validate() const {
  if (target.empty()) return absl::InvalidArgumentError("KvStoreClientOptions.target is empty");
  if (lookup_deadline_ms <= 0 || rpc_deadline_ms <= 0) {
    return absl::InvalidArgumentError("KvStoreClientOptions deadlines must be > 0");
  }
  if (release_batch_ms < 0) {
    return absl::InvalidArgumentError("KvStoreClientOptions.release_batch_ms must be >= 0");
  }
  if (store_chunk_bytes <= 0 || store_chunk_bytes > (3 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("KvStoreClientOptions.store_chunk_bytes ",
                                                   store_chunk_bytes, " not in (0, 3 MiB]"));
  }
  if (!bulk_load_target.empty()) {
    if (absl::Status s = rpc::SplitHostPort(bulk_load_target).status(); !s.ok()) {
      return Annotate(s, "KvStoreClientOptions.bulk_load_target");
    }
  }
  return absl::OkStatus();
}

const char* LoadMissName(LoadMiss m) {
  switch (m) {
    case LoadMiss::kNone:
      return "none";
    case LoadMiss::kNotFound:
      return "not_found";
    case LoadMiss::kChecksum:
      return "checksum";
    case LoadMiss::kFailed:
      return "failed";
  }
  return "?";
}

// ---- PendingLookup -----------------------------------------------------------

void ReleaseLeaseInBackground(KvStoreClient::Impl* impl, uint64_t lease);

struct PendingLookup::State {
  KvStoreClient::Impl* impl = nullptr;  // for releases of unwanted leases
  grpc::ClientContext ctx;
  v1::LookupRequest req;
  v1::LookupResponse resp;
  SteadyTime deadline;
  SteadyTime started;
  int64_t deadline_ms = 0;
  std::function<void()> on_answer;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;       // the RPC's callback ran
  bool resolved = false;   // `result` is final (answered, failed or late)
  bool delivered = false;  // the caller has seen `result`
  bool abandoned = false;  // the PendingLookup was destroyed
  RemoteLookupResult result;

  // The answer (in `resp` when `s` is OK), over gRPC or the bulk port.
  void OnDone(const absl::Status& s) {
    uint64_t orphan = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      const uint64_t lease = s.ok() ? resp.lease_id() : 0;
      if (!resolved) {
        resolved = true;
        if (s.ok()) {
          result.num_hits = resp.num_hits();
          result.num_hot_hits = resp.num_hot_hits();
          result.lease = LeaseId(lease);
          result.answered_after_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                         std::chrono::steady_clock::now() - started)
                                         .count();
        } else {
          result.status = s;
        }
        if (abandoned) orphan = lease;
      } else {
        orphan = lease;  // answered after the caller counted it as zero hits
      }
      cv.notify_all();
    }
    if (orphan != 0) ReleaseLeaseInBackground(impl, orphan);
    if (s.ok() && on_answer) on_answer();
  }
};

PendingLookup::PendingLookup(std::shared_ptr<State> state) : state_(std::move(state)) {}

// An unfinished RPC is not cancelled: it ends by its deadline, and a lease in
// its answer is released then (OnDone), so none is left behind.
PendingLookup::~PendingLookup() {
  uint64_t orphan = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->abandoned = true;
    if (state_->done && !state_->delivered) orphan = state_->result.lease.value();
  }
  if (orphan != 0) ReleaseLeaseInBackground(state_->impl, orphan);
}

std::optional<RemoteLookupResult> PendingLookup::Poll() {
  bool cancel = false;
  RemoteLookupResult out;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->resolved) {
      if (std::chrono::steady_clock::now() < state_->deadline) return std::nullopt;
      state_->resolved = true;
      state_->result =
          RemoteLookupResult{.status = absl::DeadlineExceededError(absl::StrCat(
                           "KV-store lookup not answered within ", state_->deadline_ms, " ms"))};
      cancel = true;
    }
    state_->delivered = true;
    out = state_->result;
  }
  if (cancel) state_->ctx.TryCancel();
  return out;
}

RemoteLookupResult PendingLookup::Wait() {
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait_until(lock, state_->deadline, [&] { return state_->resolved; });
  }
  for (;;) {
    if (std::optional<RemoteLookupResult> r = Poll()) return *r;
    std::this_thread::sleep_for(std::chrono::microseconds(100));  // clock granularity
  }
}

// ---- KvStoreClient -------------------------------------------------------------

class KvStoreClient::Impl {
 public:
  explicit Impl(const KvStoreClientOptions& options)
      : opts_(options),
        channel_(CreateKvChannel(options.target)),
        stub_(std::make_shared<Stub>(channel_)),
        load_method_("/tandem.v1.KvStore/Load", grpc::internal::RpcMethod::SERVER_STREAMING,
                     channel_),
        bulk_(opts_, [this] { return BulkLoadPort(); }),
        bulk_store_(opts_, &bulk_),
        local_(opts_.rpc_deadline_ms, [this] { return LocalSocket(); }) {
    if (opts_.release_batch_ms > 0) release_flusher_ = std::thread([this] { FlushReleases(); });
    if (opts_.bulk_lookup) {
      bulk_lookup_ =
          std::make_unique<BulkLookupClient>(&bulk_, std::min<int64_t>(opts_.rpc_deadline_ms, 5'000));
    }
  }

  // Sends the releases still batched, waits for callbacks still to come
  // (bounded by the RPC deadlines), then frees their state here rather than
  // on gRPC's callback threads.
  ~Impl() {
    // First: its answer handlers may release leases (ReleaseAsync).
    bulk_lookup_.reset();
    {
      std::lock_guard<std::mutex> lock(release_mu_);
      release_stopping_ = true;  // from here on ReleaseAsync sends at once
    }
    release_cv_.notify_all();
    if (release_flusher_.joinable()) release_flusher_.join();
    std::unique_lock<std::mutex> lock(calls_mu_);
    calls_cv_.wait(lock, [&] { return inflight_.empty(); });
    graveyard_.clear();
  }

  // Callback-API calls: their state (ClientContext, messages) is owned here
  // while in flight and never freed inside a gRPC callback; a finished call's
  // state is freed by the next caller (or the destructor).
  void Track(std::shared_ptr<void> call) {
    std::lock_guard<std::mutex> lock(calls_mu_);
    void* key = call.get();
    inflight_.emplace(key, std::move(call));
  }
  void Retire(void* key) {
    std::lock_guard<std::mutex> lock(calls_mu_);
    auto it = inflight_.find(key);
    if (it == inflight_.end()) return;
    graveyard_.push_back(std::move(it->second));
    inflight_.erase(it);
    calls_cv_.notify_all();
  }
  void Sweep() {
    std::vector<std::shared_ptr<void>> dead;
    std::lock_guard<std::mutex> lock(calls_mu_);
    dead.swap(graveyard_);
    // `dead` is destroyed after the lock is released (declared first).
  }

  std::unique_ptr<PendingLookup> Lookup(std::string_view ns, std::span<const BlockHash> hashes,
                                        const RemoteLookupOptions& options) {
    Sweep();
    auto st = std::make_shared<PendingLookup::State>();
    st->impl = this;
    st->deadline_ms = options.deadline_ms > 0 ? options.deadline_ms : opts_.lookup_deadline_ms;
    st->on_answer = options.on_answer;
    // The RPC's deadline first, so that when Poll() calls the lookup late
    // the server's deadline has passed too (it then releases what it pinned).
    st->ctx.set_deadline(DeadlineIn(st->deadline_ms));
    st->started = std::chrono::steady_clock::now();
    st->deadline = st->started + std::chrono::milliseconds(st->deadline_ms);
    st->req.set_namespace_(std::string(ns));
    rpc::AppendBlockHashes(hashes, st->req.mutable_block_hashes());
    st->req.set_take_lease(options.take_lease);
    st->req.set_lease_ttl_ms(options.lease_ttl_ms);
    st->req.set_stage_to_hot(options.stage_to_hot);
    for (uint64_t id : TakeBatchedReleases()) st->req.add_release_lease_ids(id);
    if (bulk_lookup_ != nullptr &&
        bulk_lookup_->Send(st->req, [st](const absl::Status& s, const v1::LookupResponse& resp) {
          st->resp = resp;
          st->OnDone(s);
        })) {
      return std::make_unique<PendingLookup>(std::move(st));
    }
    Track(st);
    PendingLookup::State* raw = st.get();
    stub_->async()->Lookup(&raw->ctx, &raw->req, &raw->resp, [this, raw](grpc::Status s) {
      raw->OnDone(rpc::FromGrpcStatus(s, "KV-store lookup"));
      Retire(raw);
    });
    return std::make_unique<PendingLookup>(std::move(st));
  }

  void ReleaseAsync(LeaseId lease) {
    if (lease.value() == 0) return;
    {
      std::lock_guard<std::mutex> lock(release_mu_);
      if (opts_.release_batch_ms > 0 && !release_stopping_) {
        if (batched_releases_.empty()) {
          release_due_ = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(opts_.release_batch_ms);
          release_cv_.notify_one();
        }
        batched_releases_.push_back(lease.value());
        return;
      }
    }
    SendReleases({lease.value()});
  }

  // One fire-and-forget Release RPC for `ids` (not empty).
  void SendReleases(const std::vector<uint64_t>& ids) {
    struct Call {
      grpc::ClientContext ctx;
      v1::ReleaseRequest req;
      v1::ReleaseResponse resp;
    };
    auto call = std::make_shared<Call>();
    call->req.set_lease_id(ids[0]);
    for (size_t i = 1; i < ids.size(); ++i) call->req.add_more_lease_ids(ids[i]);
    call->ctx.set_deadline(DeadlineIn(5'000));
    Track(call);
    Call* raw = call.get();
    stub_->async()->Release(&raw->ctx, &raw->req, &raw->resp,
                            [this, raw](grpc::Status) { Retire(raw); });
  }

  std::vector<uint64_t> TakeBatchedReleases() {
    std::vector<uint64_t> ids;
    std::lock_guard<std::mutex> lock(release_mu_);
    ids.swap(batched_releases_);
    return ids;
  }

  // The release flusher thread: batched releases no Lookup carried within
  // release_batch_ms go in one Release RPC; at shutdown, whatever is left.
  void FlushReleases() {
    std::unique_lock<std::mutex> lock(release_mu_);
    while (!release_stopping_) {
      release_cv_.wait(lock, [&] { return release_stopping_ || !batched_releases_.empty(); });
      const bool taken = release_cv_.wait_until(lock, release_due_, [&] {
        return release_stopping_ || batched_releases_.empty();
      });
      if (taken && !release_stopping_) continue;  // a Lookup carried them
      std::vector<uint64_t> ids;
      ids.swap(batched_releases_);
      if (ids.empty()) continue;
      lock.unlock();
      SendReleases(ids);
      lock.lock();
    }
    // Stopping: whatever is left, also when this thread first ran after the
    // destructor had already set release_stopping_ (a busy machine).
    std::vector<uint64_t> ids;
    ids.swap(batched_releases_);
    lock.unlock();
    if (!ids.empty()) SendReleases(ids);
  }

  absl::StatusOr<bool> Release(LeaseId lease) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(opts_.rpc_deadline_ms));
    v1::ReleaseRequest req;
    req.set_lease_id(lease.value());
    v1::ReleaseResponse resp;
    grpc::Status s = stub_->Release(&ctx, req, &resp);
    if (!s.ok()) return rpc::FromGrpcStatus(s, "KV-store release");
    return resp.found();
  }

  absl::StatusOr<std::vector<BlockLoadResult>> Load(std::string_view ns,
                                                    std::span<const BlockHash> hashes,
                                                    std::span<const std::span<uint8_t>> dst,
                                                    LeaseId lease) {
    if (dst.size() != hashes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("Load: ", hashes.size(), " hashes but ",
                                                     dst.size(), " destination buffers"));
    }
    const size_t n = hashes.size();
    std::vector<BlockLoadResult> results(n);
    if (n == 0) return results;
    if (opts_.bulk_load && opts_.local_load) {
      if (auto r = local_.Load(ns, hashes, dst, lease)) return *std::move(r);
    }
    if (opts_.bulk_load) {
      if (auto r = bulk_.Load(ns, hashes, dst, lease)) return *std::move(r);
    }
    v1::LoadRequest req;
    req.set_namespace_(std::string(ns));
    rpc::AppendBlockHashes(hashes, req.mutable_block_hashes());
    req.set_lease_id(lease.value());
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(opts_.rpc_deadline_ms));
    // The response stream is read as raw ByteBuffers and parsed in place
    // (kvstore_client_wire.h): each payload byte is copied once, from gRPC's
    // receive slices into dst, and checksummed during that copy.
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), load_method_,
                                                                      &ctx, req));
    std::vector<uint32_t> crc(n, 0);
    std::vector<uint64_t> received(n, 0);
    std::vector<bool> bad(n, false);
    size_t finished = 0;
    grpc::ByteBuffer buffer;
    std::vector<grpc::Slice> slices;
    std::vector<std::span<const uint8_t>> segments;
    std::vector<wire::LoadChunkView> chunks;
    absl::Status parse_error;
    while (reader->Read(&buffer)) {
      slices.clear();
      segments.clear();
      grpc::Status dumped = buffer.Dump(&slices);  // references, no copy
      if (dumped.ok()) {
        for (const grpc::Slice& sl : slices) segments.emplace_back(sl.begin(), sl.size());
        parse_error = wire::ParseLoadResponse(segments, &chunks);
      } else {
        parse_error = rpc::FromGrpcStatus(dumped, "reading a LoadResponse");
      }
      if (!parse_error.ok()) {
        // As a message the generated parser rejects: the call fails; blocks
        // not completed before it stay kFailed.
        ctx.TryCancel();
        break;
      }
      for (const wire::LoadChunkView& c : chunks) {
        const int32_t i = c.block_index;
        if (i < 0 || static_cast<size_t>(i) >= n) continue;
        if (!c.ok) {
          results[i].miss =
              c.miss_reason == v1::MISS_REASON_CHECKSUM ? LoadMiss::kChecksum : LoadMiss::kNotFound;
          ++finished;
          continue;
        }
        if (c.total_size != dst[i].size() || c.offset != received[i] ||
            received[i] + c.data.size > dst[i].size()) {
          bad[i] = true;
        } else {
          wire::CopyLoadPayload(segments, c.data, dst[i].data() + received[i], &crc[i]);
          received[i] += c.data.size;
        }
        if (c.last) {
          ++finished;
          if (bad[i]) {
            results[i].miss = LoadMiss::kFailed;
          } else if (received[i] != dst[i].size() || crc[i] != c.checksum) {
            results[i].miss = LoadMiss::kChecksum;
          } else {
            results[i].miss = LoadMiss::kNone;
          }
        }
      }
    }
    grpc::Status s = reader->Finish();
    if (!parse_error.ok() && finished == 0) {
      return Annotate(parse_error, "KV-store load");
    }
    if (!s.ok() && finished == 0) return rpc::FromGrpcStatus(s, "KV-store load");
    return results;
  }

  absl::StatusOr<std::vector<BlockStoreResult>> Store(
      std::string_view ns, std::span<const BlockHash> hashes,
      std::span<const std::span<const uint8_t>> src,
      std::optional<kvstore::Durability> durability) {
    if (src.size() != hashes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Store: ", hashes.size(), " hashes but ", src.size(), " source buffers"));
    }
    if (hashes.empty()) return std::vector<BlockStoreResult>();
    if (opts_.bulk_store && opts_.local_store) {
      if (auto r = local_.Store(ns, hashes, src, durability)) return *std::move(r);
    }
    if (opts_.bulk_store) {
      if (auto r = bulk_store_.Store(ns, hashes, src, durability)) return *std::move(r);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(opts_.rpc_deadline_ms));
    v1::StoreResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::StoreRequest>> writer = stub_->Store(&ctx, &resp);
    const size_t limit = static_cast<size_t>(opts_.store_chunk_bytes);
    v1::StoreRequest msg;
    msg.set_namespace_(std::string(ns));
    msg.set_durability(rpc::ToProto(durability));
    size_t msg_bytes = 0;
    bool stream_ok = true;
    auto send = [&] {
      stream_ok = writer->Write(msg);
      msg.Clear();
      msg_bytes = 0;
    };
    for (size_t i = 0; i < hashes.size() && stream_ok; ++i) {
      const std::span<const uint8_t> block = src[i];
      const uint32_t crc = kvstore::Crc32c(block);
      size_t off = 0;
      do {
        const size_t piece = std::min(limit, block.size() - off);
        if (msg_bytes > 0 && msg_bytes + piece > limit) send();
        if (!stream_ok) break;
        v1::StoreChunk* c = msg.add_chunks();
        if (off == 0) {
          c->set_block_hash(hashes[i].ToBytes());
          c->set_total_size(block.size());
        }
        c->set_data(block.data() + off, piece);
        off += piece;
        msg_bytes += piece;
        if (off == block.size()) {
          c->set_last(true);
          c->set_checksum(crc);
        }
      } while (off < block.size());
    }
    if (stream_ok && msg.chunks_size() > 0) send();
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    if (!s.ok()) return rpc::FromGrpcStatus(s, "KV-store store");
    return StoreResults(resp, hashes.size());
  }

  absl::StatusOr<bool> CreateNamespace(const kvstore::NamespaceSpec& spec) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(opts_.rpc_deadline_ms));
    v1::CreateNamespaceRequest req;
    rpc::ToProto(spec, req.mutable_info());
    v1::CreateNamespaceResponse resp;
    grpc::Status s = stub_->CreateNamespace(&ctx, req, &resp);
    if (!s.ok()) return rpc::FromGrpcStatus(s, "KV-store CreateNamespace");
    return resp.created();
  }

  void CreateNamespaceAsync(const kvstore::NamespaceSpec& spec,
                            std::function<void(absl::StatusOr<bool>)> done) {
    Sweep();
    struct Call {
      grpc::ClientContext ctx;
      v1::CreateNamespaceRequest req;
      v1::CreateNamespaceResponse resp;
      std::function<void(absl::StatusOr<bool>)> done;
    };
    auto call = std::make_shared<Call>();
    call->ctx.set_deadline(DeadlineIn(opts_.rpc_deadline_ms));
    rpc::ToProto(spec, call->req.mutable_info());
    call->done = std::move(done);
    Track(call);
    Call* raw = call.get();
    stub_->async()->CreateNamespace(&raw->ctx, &raw->req, &raw->resp, [this, raw](grpc::Status s) {
      if (raw->done) {
        raw->done(s.ok() ? absl::StatusOr<bool>(raw->resp.created())
                         : rpc::FromGrpcStatus(s, "KV-store CreateNamespace"));
      }
      Retire(raw);
    });
  }

  absl::StatusOr<kvstore::KvStoreStats> Stats() {
    TANDEM_ASSIGN_OR_RETURN(v1::StatsResponse resp, StatsRpc(opts_.rpc_deadline_ms));
    return rpc::FromProto(resp);
  }

  [[nodiscard]] uint64_t bulk_loads() const { return bulk_.loads(); }
  [[nodiscard]] uint64_t local_loads() const { return local_.loads(); }
  [[nodiscard]] uint64_t local_stores() const { return local_.stores(); }
  [[nodiscard]] uint64_t bulk_stores() const { return bulk_store_.stores(); }
  [[nodiscard]] uint64_t bulk_lookups() const {
    return bulk_lookup_ ? bulk_lookup_->answered() : 0;
  }
  [[nodiscard]] bool bulk_lookup_connected() const {
    return bulk_lookup_ && bulk_lookup_->connected();
  }

 private:
  absl::StatusOr<v1::StatsResponse> StatsRpc(int64_t deadline_ms) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(deadline_ms));
    v1::StatsResponse resp;
    grpc::Status s = stub_->Stats(&ctx, v1::StatsRequest(), &resp);
    if (!s.ok()) return rpc::FromGrpcStatus(s, "KV-store stats");
    return resp;
  }
  // The store's advertised bulk load port (0: off).
  absl::StatusOr<uint32_t> BulkLoadPort() {
    TANDEM_ASSIGN_OR_RETURN(v1::StatsResponse resp,
                            StatsRpc(std::min<int64_t>(opts_.rpc_deadline_ms, 5'000)));
    return resp.bulk_load_port();
  }
  // The store's advertised local socket and its host id (empty: none).
  absl::StatusOr<std::pair<std::string, std::string>> LocalSocket() {
    TANDEM_ASSIGN_OR_RETURN(v1::StatsResponse resp,
                            StatsRpc(std::min<int64_t>(opts_.rpc_deadline_ms, 5'000)));
    return std::pair{resp.local_socket(), resp.host_id()};
  }

  const KvStoreClientOptions opts_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<Stub> stub_;
  const grpc::internal::RpcMethod load_method_;  // Load, read as raw ByteBuffers
  std::mutex calls_mu_;
  std::condition_variable calls_cv_;
  std::unordered_map<void*, std::shared_ptr<void>> inflight_;
  std::vector<std::shared_ptr<void>> graveyard_;
  BulkLoadClient bulk_;
  BulkStoreClient bulk_store_;  // finds the port through bulk_
  LocalSocketClient local_;
  // ReleaseAsync batching (release_batch_ms).
  std::mutex release_mu_;
  std::condition_variable release_cv_;
  std::vector<uint64_t> batched_releases_;
  std::chrono::steady_clock::time_point release_due_;
  bool release_stopping_ = false;
  std::thread release_flusher_;
  std::unique_ptr<BulkLookupClient> bulk_lookup_;  // null when opts_.bulk_lookup is off
};

void ReleaseLeaseInBackground(KvStoreClient::Impl* impl, uint64_t lease) {
  impl->ReleaseAsync(LeaseId(lease));
}

absl::StatusOr<std::unique_ptr<KvStoreClient>> KvStoreClient::Create(
    const KvStoreClientOptions& options) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<KvStoreClient>(new KvStoreClient(std::make_unique<Impl>(options)));
}

KvStoreClient::KvStoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvStoreClient::~KvStoreClient() = default;

std::unique_ptr<PendingLookup> KvStoreClient::Lookup(std::string_view ns,
                                                     std::span<const BlockHash> hashes,
                                                     const RemoteLookupOptions& options) {
  return impl_->Lookup(ns, hashes, options);
}
void KvStoreClient::ReleaseAsync(LeaseId lease) { impl_->ReleaseAsync(lease); }
absl::StatusOr<bool> KvStoreClient::Release(LeaseId lease) { return impl_->Release(lease); }
absl::StatusOr<std::vector<BlockLoadResult>> KvStoreClient::Load(
    std::string_view ns, std::span<const BlockHash> hashes, std::span<const std::span<uint8_t>> dst,
    LeaseId lease) {
  return impl_->Load(ns, hashes, dst, lease);
}
absl::StatusOr<std::vector<BlockStoreResult>> KvStoreClient::Store(
    std::string_view ns, std::span<const BlockHash> hashes,
    std::span<const std::span<const uint8_t>> src, std::optional<kvstore::Durability> durability) {
  return impl_->Store(ns, hashes, src, durability);
}
absl::StatusOr<bool> KvStoreClient::CreateNamespace(const kvstore::NamespaceSpec& spec) {
  return impl_->CreateNamespace(spec);
}
void KvStoreClient::CreateNamespaceAsync(const kvstore::NamespaceSpec& spec,
                                         std::function<void(absl::StatusOr<bool>)> done) {
  impl_->CreateNamespaceAsync(spec, std::move(done));
}
absl::StatusOr<kvstore::KvStoreStats> KvStoreClient::Stats() { return impl_->Stats(); }
uint64_t KvStoreClient::bulk_loads() const { return impl_->bulk_loads(); }
uint64_t KvStoreClient::local_loads() const { return impl_->local_loads(); }
uint64_t KvStoreClient::local_stores() const { return impl_->local_stores(); }
uint64_t KvStoreClient::bulk_stores() const { return impl_->bulk_stores(); }
uint64_t KvStoreClient::bulk_lookups() const { return impl_->bulk_lookups(); }
bool KvStoreClient::bulk_lookup_connected() const { return impl_->bulk_lookup_connected(); }

}  // namespace tandem::kvconnector
