#include "kvstore_service.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/method_handler.h"
#include "load_scope.h"
#include "load_wire.h"
#include "lookup_answer.h"
#include "store_answer.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/rpc/server.h"
#include "tandem/rpc/status.h"
#include "tandem/rpc/tls.h"

namespace tandem::kvstore_service {
namespace {

std::string HashForMessage(const std::string& raw) {
  if (raw.size() == 32) {
    BlockHash h;
    std::memcpy(h.bytes.data(), raw.data(), 32);
    return h.ToHex().substr(0, 16);
  }
  return absl::StrCat("<", raw.size(), "-byte hash>");
}

// Roles (DESIGN §5 as issue 16 amends it) are checked before any handler
// runs, by the server's role table (rpc/method_roles.h): workers Load and
// Store, schedulers Lookup and Release, both CreateNamespace and Stats.

}  // namespace

absl::Status KvStoreServiceOptions::Validate() const {
  if (load_chunk_bytes <= 0 || load_chunk_bytes > (3 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("load_chunk_bytes ", load_chunk_bytes,
                                                   " must be in (0, 3 MiB] to stay under 4 MiB"));
  }
  if (max_block_bytes <= 0) return absl::InvalidArgumentError("max_block_bytes must be > 0");
  if (debug_lookup_delay_ms < 0 || debug_load_delay_ms < 0 || debug_corrupt_hot_every < 0 ||
      debug_corrupt_cold_every < 0) {
    return absl::InvalidArgumentError("the --debug-* fault-injection settings must be >= 0");
  }
  return absl::OkStatus();
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder) {
  // Also for the servers built without rpc::BuildAndStart (KvStoreServer's
  // Listen, the benches'): the KV client's channels ping every 10 s.
  rpc::AcceptClientPings(builder);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20);
  builder->SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
}

KvStoreServiceImpl::KvStoreServiceImpl(kvstore::KvStoreEngine* store, KvStoreServiceOptions options)
    : store_(store), options_(options) {
  // Load (method 2 of tandem.v1.KvStore, as the generated
  // WithSplitStreamingMethod_Load uses) answers with raw ByteBuffers. A split
  // server stream is still a sync handler on gRPC's thread pool and, on the
  // wire, the same server-streaming call.
  MarkMethodStreamed(
      2, new grpc::internal::SplitServerStreamingHandler<v1::LoadRequest, grpc::ByteBuffer>(
             [this](grpc::ServerContext* ctx,
                    grpc::ServerSplitStreamer<v1::LoadRequest, grpc::ByteBuffer>* stream) {
               return LoadRaw(ctx, stream);
             }));
}

grpc::Status KvStoreServiceImpl::CreateNamespace(grpc::ServerContext* ctx,
                                                 const v1::CreateNamespaceRequest* req,
                                                 v1::CreateNamespaceResponse* resp) {
  if (options_.debug_before_create_namespace) options_.debug_before_create_namespace();
  absl::StatusOr<bool> created = store_->CreateNamespace(rpc::FromProto(req->info()));
  if (!created.ok()) return rpc::ToGrpcStatus(created.status());
  resp->set_created(*created);
  return grpc::Status::OK;
}

grpc::Status KvStoreServiceImpl::Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                                        v1::LookupResponse* resp) {
  // A caller past its deadline has given up and drops the answer: nobody
  // would release a lease granted now. (The deadline, not IsCancelled(): on
  // the sync API that polls the completion queue, tens of microseconds, and
  // the client never cancels a lookup before its deadline.)
  return rpc::ToGrpcStatus(AnswerLookup(
      store_, *req, {.debug_delay_ms = options_.debug_lookup_delay_ms, .deadline = ctx->deadline()},
      resp));
}

grpc::Status KvStoreServiceImpl::LoadRaw(
    grpc::ServerContext* ctx,
    grpc::ServerSplitStreamer<v1::LoadRequest, grpc::ByteBuffer>* stream) {
  v1::LoadRequest request;
  if (!stream->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Load: no LoadRequest received");
  }
  if (options_.debug_load_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.debug_load_delay_ms));
  }
  if (options_.debug_before_load) options_.debug_before_load();
  LoadScope scope(store_, request);  // releases the lease however the load ends
  if (!scope.status().ok()) return rpc::ToGrpcStatus(scope.status());
  const std::vector<BlockHash>& hashes = scope.hashes();
  const size_t chunk_bytes = static_cast<size_t>(options_.load_chunk_bytes);
  LoadResponseEncoder resp;
  bool stream_ok = true;
  auto flush = [&] {
    if (resp.num_chunks() == 0 || !stream_ok) return;
    stream_ok = stream->Write(resp.Finish());
  };
  // A broken or cancelled stream shows as a failed Write (stream_ok); no
  // per-block IsCancelled(), which polls the completion queue.
  for (size_t i = 0; i < hashes.size() && stream_ok; ++i) {
    // The engine verified the block's checksum before calling the sink; the
    // sink's copy into the message is the one copy of the payload here.
    absl::StatusOr<kvstore::ReadResult> r =
        store_->Read(request.namespace_(), hashes[i], [&](std::span<const uint8_t> data, uint32_t) {
          for (size_t off = 0; off < data.size() && stream_ok;) {
            const size_t n = std::min(chunk_bytes, data.size() - off);
            if (resp.payload_bytes() > 0 && resp.payload_bytes() + n > chunk_bytes) flush();
            resp.AddPiece(static_cast<int32_t>(i), off, data.size(), data.subspan(off, n),
                          off + n == data.size());
            off += n;
          }
        });
    if (!r.ok()) {
      return rpc::ToGrpcStatus(Annotate(r.status(), absl::StrCat("loading block ", i)));
    }
    if (r->ok()) {
      // The block's last piece is still in `resp` (flushes happen before a
      // piece is added): stamp the verified checksum on it.
      resp.SetLastPieceChecksum(r->checksum);
    } else {
      resp.AddMiss(static_cast<int32_t>(i), static_cast<int32_t>(rpc::ToProto(r->miss)));
    }
  }
  flush();
  if (!stream_ok) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "load stream cancelled or broken");
  }
  return grpc::Status::OK;
}

grpc::Status KvStoreServiceImpl::Store(grpc::ServerContext* ctx,
                                       grpc::ServerReader<v1::StoreRequest>* reader,
                                       v1::StoreResponse* resp) {
  if (options_.debug_before_store) options_.debug_before_store();
  v1::StoreRequest msg;
  bool first = true;
  std::string ns;
  std::optional<kvstore::Durability> durability;
  uint64_t block_bytes = 0;
  // The block being received.
  bool active = false;
  int32_t index = -1;
  std::string raw_hash;
  uint64_t total = 0;
  std::string data;
  absl::Status error;
  // The blocks of one message that arrived whole and passed the checks,
  // stored together after it (one StoreBatch, one RocksDB write), and the
  // response entries they answer (stable: the response owns its elements).
  std::vector<std::string> batch_data;
  std::vector<kvstore::StoreBlock> batch;
  std::vector<v1::BlockStatus*> batch_statuses;
  const StoreAnswerOptions answer_options{
      .debug_corrupt_hot_every = options_.debug_corrupt_hot_every,
      .debug_corrupt_cold_every = options_.debug_corrupt_cold_every,
      .debug_new_blocks = &debug_new_blocks_};
  while (reader->Read(&msg)) {
    if (first) {
      first = false;
      ns = msg.namespace_();
      absl::StatusOr<kvstore::NamespaceSpec> spec = store_->GetNamespace(ns);
      if (!spec.ok()) return rpc::ToGrpcStatus(spec.status());
      block_bytes = spec->block_bytes;
      absl::Status d = rpc::FromProto(msg.durability(), &durability);
      if (!d.ok()) return rpc::ToGrpcStatus(d);
    }
    for (v1::StoreChunk& chunk : *msg.mutable_chunks()) {
      bool consumed = false;  // the piece was moved in whole
      if (!active) {
        active = true;
        ++index;
        raw_hash = chunk.block_hash();
        total = chunk.total_size();
        data.clear();
        error = absl::OkStatus();
        if (raw_hash.size() != 32) {
          error = absl::InvalidArgumentError(absl::StrCat("block ", index, ": block_hash has ",
                                                          raw_hash.size(),
                                                          " bytes; a block hash has 32"));
        } else if (total != block_bytes) {
          error = absl::InvalidArgumentError(
              absl::StrCat("block ", index, " (", HashForMessage(raw_hash), "): total_size ", total,
                           " but blocks of namespace '", ns, "' have ", block_bytes, " bytes"));
        } else if (static_cast<int64_t>(total) > options_.max_block_bytes) {
          error = absl::InvalidArgumentError(
              absl::StrCat("block ", index, ": total_size ", total, " over the server's limit"));
        } else if (chunk.data().size() == total && chunk.last()) {
          data = std::move(*chunk.mutable_data());  // whole block in one piece
          consumed = true;
        } else {
          data.reserve(total);
        }
      }
      if (error.ok() && !consumed) {
        if (data.size() + chunk.data().size() > total) {
          error = absl::InvalidArgumentError(
              absl::StrCat("block ", index, " (", HashForMessage(raw_hash),
                           "): more than total_size ", total, " bytes sent"));
        } else {
          data.append(chunk.data());
        }
      }
      if (!chunk.last()) continue;
      active = false;
      if (error.ok() && data.size() != total) {
        error = absl::InvalidArgumentError(absl::StrCat("block ", index, " (",
                                                        HashForMessage(raw_hash), "): ended after ",
                                                        data.size(), " of ", total, " bytes"));
      }
      v1::BlockStatus* st = resp->add_blocks();
      st->set_block_hash(raw_hash);
      if (error.ok()) {
        kvstore::StoreBlock& block = batch.emplace_back();
        std::memcpy(block.hash.bytes.data(), raw_hash.data(), 32);
        block.checksum = chunk.checksum();
        batch_data.push_back(std::move(data));
        data = std::string();
        batch_statuses.push_back(st);
        continue;
      }
      st->set_ok(false);
      st->set_code(static_cast<int32_t>(error.code()));
      st->set_error(std::string(error.message()));
    }
    for (size_t k = 0; k < batch.size(); ++k) {
      batch[k].payload = std::span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(batch_data[k].data()), batch_data[k].size());
    }
    (void)AnswerStoreBatch(store_, ns, durability, batch, batch_statuses, answer_options);
    batch.clear();
    batch_data.clear();
    batch_statuses.clear();
  }
  if (active) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("Store stream ended in the middle of block ", index, " (",
                                     HashForMessage(raw_hash), ") after ", data.size(), " of ",
                                     total, " bytes; that block was not stored"));
  }
  return grpc::Status::OK;
}

grpc::Status KvStoreServiceImpl::Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                                         v1::ReleaseResponse* resp) {
  resp->set_found(store_->Release(LeaseId(req->lease_id())));
  for (uint64_t id : req->more_lease_ids()) store_->Release(LeaseId(id));
  return grpc::Status::OK;
}

grpc::Status KvStoreServiceImpl::Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                                       v1::StatsResponse* resp) {
  rpc::ToProto(store_->GetStats(), resp);
  if (options_.bulk_load != nullptr) {
    resp->set_bulk_load_port(static_cast<uint32_t>(options_.bulk_load->port()));
    const BulkLoadServerStats b = options_.bulk_load->GetStats();
    resp->set_bulk_loads(b.loads);
    resp->set_bulk_lookups(b.lookups);
    resp->set_bulk_connections_open(b.connections_open);
    resp->set_bulk_stores(b.stores);
    if (!options_.bulk_load->local_socket().empty()) {
      resp->set_local_socket(options_.bulk_load->local_socket());
      resp->set_host_id(options_.debug_host_id.empty() ? rpc::LocalHostId()
                                                       : options_.debug_host_id);
      resp->set_local_loads(b.local_loads);
    }
  }
  return grpc::Status::OK;
}

}  // namespace tandem::kvstore_service
