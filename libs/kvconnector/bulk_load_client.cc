#include "bulk_load_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvconnector {
namespace {

constexpr auto kLookupPortAgainAfter = std::chrono::seconds(10);
constexpr uint32_t kMaxFrameBytes = 1 << 20;  // answer frames carry no payload

}  // namespace

BulkLoadClient::BulkLoadClient(const KvStoreClientOptions& options,
                               std::function<absl::StatusOr<uint32_t>()> discover_port)
    : opts_(options),
      discover_port_(std::move(discover_port)),
      tls_(rpc::ClientSocketTls()),
      pool_(this, rpc::kKvBulkLoadPreface, options.rpc_deadline_ms) {}

std::unique_ptr<rpc::FramedSocket> BulkConnectionPool::Take(
    const std::pair<std::string, std::string>& addr, bool* pooled) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<rpc::FramedSocket> sock = std::move(idle_.back());
      idle_.pop_back();
      *pooled = true;
      return sock;
    }
  }
  *pooled = false;
  std::unique_ptr<rpc::FramedSocket> sock =
      dialer_->Dial(addr, preface_, std::min<int64_t>(io_timeout_ms_, 5'000));
  if (sock != nullptr) sock->SetTimeouts(io_timeout_ms_, io_timeout_ms_);
  return sock;
}

void BulkConnectionPool::Give(std::unique_ptr<rpc::FramedSocket> sock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(sock));
}

void BulkConnectionPool::Clear() {
  std::vector<std::unique_ptr<rpc::FramedSocket>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle.swap(idle_);
  }
}

absl::Status Stalled(const absl::Status& io, std::string_view what) {
  return absl::DeadlineExceededError(
      absl::StrCat(std::string(what), ": the KV-store took the request and did not answer (",
                   io.message(), "); not tried again on another connection or path"));
}

LoadAnswer ReadLoadAnswer(rpc::FramedSocket* sock, const v1::LoadRequest& req,
                          std::span<const std::span<uint8_t>> dst,
                          std::span<const std::byte> shared) {
  const size_t n = dst.size();
  LoadAnswer a;
  a.results.resize(n);  // kFailed until answered
  v1::LoadRequest report;  // blocks that failed our checksum
  std::vector<bool> answered(n, false);
  absl::Status& io = a.io;
  io = sock->Write(req);
  v1::BulkLoadFrame frame;
  while (io.ok() && !a.done) {
    io = sock->Read(&frame, kMaxFrameBytes);
    if (!io.ok()) break;
    if (frame.done()) {
      a.done = true;
      a.done_status = absl::Status(static_cast<absl::StatusCode>(frame.status_code()),
                                   frame.status_message());
      break;
    }
    const v1::LoadChunk& c = frame.chunk();
    const int64_t i = c.block_index();
    const bool valid = i >= 0 && static_cast<size_t>(i) < n && !answered[i];
    if (valid) {
      answered[i] = true;
      ++a.finished;
    }
    if (!c.ok()) {
      if (valid) {
        a.results[i].miss = c.miss_reason() == v1::MISS_REASON_CHECKSUM ? LoadMiss::kChecksum
                                                                         : LoadMiss::kNotFound;
      }
      continue;
    }
    uint32_t crc = 0;
    if (c.in_shared_memory()) {
      // Bytes in the store's shared memory, pinned until our next request:
      // copied out (and checksummed) here.
      if (!valid || c.total_size() != dst[i].size() || c.shared_offset() > shared.size() ||
          c.total_size() > shared.size() - c.shared_offset()) {
        continue;  // kFailed
      }
      // Copied and checksummed in one pass, as ReadRaw's pieces below.
      const auto* src = reinterpret_cast<const uint8_t*>(shared.data() + c.shared_offset());
      crc = kvstore::Crc32cCopy(0, dst[i].data(), src, dst[i].size());
    } else {
      if (!valid || c.total_size() != dst[i].size()) {
        io = sock->Skip(c.total_size());  // kFailed; the framing survives
        continue;
      }
      // Checksummed piece by piece as it arrives, while in cache.
      io = sock->ReadRaw(dst[i], [&](std::span<const uint8_t> piece) {
        crc = kvstore::Crc32cExtend(crc, piece.data(), piece.size());
      });
      if (!io.ok()) break;
    }
    if (crc == c.checksum()) {
      a.results[i].miss = LoadMiss::kNone;
    } else {
      // The store sent the bytes unverified: they are not handed out, and
      // the store is told, so it checks the block and drops it.
      a.results[i].miss = LoadMiss::kChecksum;
      std::memset(dst[i].data(), 0, dst[i].size());
      *report.add_corrupt_block_hashes() = req.block_hashes(static_cast<int>(i));
    }
  }
  if (a.done && report.corrupt_block_hashes_size() > 0) {
    TANDEM_LOG(WARNING) << "KV-store load: " << report.corrupt_block_hashes_size()
                        << " block(s) failed their checksum; reported to the store";
    report.set_namespace_(req.namespace_());
    absl::Status r = sock->Write(report);
    while (r.ok() && (r = sock->Read(&frame, kMaxFrameBytes)).ok() && !frame.done()) {
    }
    if (!r.ok()) {
      TANDEM_LOG(WARNING) << "KV-store load: reporting corrupt blocks failed: " << r;
      a.reported_broke = true;
    } else if (frame.status_code() != 0) {
      TANDEM_LOG(WARNING) << "KV-store load: the store refused the corrupt-block report: "
                          << frame.status_message();
    }
  }
  return a;
}

uint64_t BulkLoadClient::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_;
}

std::optional<BulkLoadClient::Address> BulkLoadClient::FindAddress() {
  // One lookup at a time; loads arriving meanwhile wait for its answer.
  std::lock_guard<std::mutex> lookup(lookup_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (address_ || std::chrono::steady_clock::now() < next_lookup_) return address_;
  }
  std::optional<Address> addr;
  if (!opts_.bulk_load_target.empty()) {
    absl::StatusOr<Address> a = rpc::SplitHostPort(opts_.bulk_load_target);
    if (a.ok()) addr = *a;  // Validate() rejects a bad one before
  } else if (absl::StatusOr<uint32_t> port = discover_port_(); port.ok() && *port != 0) {
    // The target's host (a unix: target has none: gRPC only).
    if (absl::StatusOr<Address> target = rpc::SplitHostPort(opts_.target); target.ok()) {
      addr = Address{target->first, std::to_string(*port)};
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  address_ = addr;
  if (!addr) next_lookup_ = std::chrono::steady_clock::now() + kLookupPortAgainAfter;
  return addr;
}

void BulkLoadClient::ForgetAddress() {
  std::lock_guard<std::mutex> lock(mu_);
  address_.reset();
  next_lookup_ = {};
}

void BulkLoadClient::MarkUnreachable() {
  std::lock_guard<std::mutex> lock(mu_);
  if (address_) {
    TANDEM_LOG(WARNING) << "KV-store bulk load port " << address_->first << ":"
                        << address_->second << " unreachable; loading over gRPC";
  }
  address_.reset();
  pool_.Clear();
  next_lookup_ = std::chrono::steady_clock::now() + kLookupPortAgainAfter;
}

std::unique_ptr<rpc::FramedSocket> BulkLoadClient::Dial(const Address& addr,
                                                        std::string_view preface,
                                                        int64_t timeout_ms) const {
  absl::StatusOr<std::unique_ptr<rpc::FramedSocket>> sock =
      rpc::FramedSocket::Connect(addr.first, addr.second, timeout_ms);
  if (!sock.ok()) return nullptr;
  // Under the process's client TLS (rpc::SetClientTls) the port speaks TLS
  // too, with the store's gRPC certificate and roles (socket_tls.h).
  if (tls_ != nullptr) {
    absl::StatusOr<std::shared_ptr<ssl_ctx_st>> context = tls_->Current();
    absl::Status s = context.ok() ? (*sock)->StartTls(context->get(), /*server=*/false, addr.first)
                                  : context.status();
    if (!s.ok()) {
      TANDEM_LOG(WARNING) << "KV-store bulk port " << addr.first << ":" << addr.second
                          << ": TLS handshake failed (" << s << "); using gRPC";
      return nullptr;
    }
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(preface.data());
  if (!(*sock)->WriteRaw(std::span(bytes, preface.size())).ok()) return nullptr;
  return std::move(*sock);
}

std::optional<absl::StatusOr<std::vector<BlockLoadResult>>> BulkLoadClient::Load(
    std::string_view ns, std::span<const BlockHash> hashes,
    std::span<const std::span<uint8_t>> dst, LeaseId lease) {
  std::optional<Address> addr = FindAddress();
  if (!addr) return std::nullopt;
  v1::LoadRequest req;
  req.set_namespace_(std::string(ns));
  rpc::AppendBlockHashes(hashes, req.mutable_block_hashes());
  req.set_lease_id(lease.value());
  if (req.ByteSizeLong() > rpc::kKvBulkLoadMaxRequestBytes) return std::nullopt;

  bool asked_again = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool pooled = false;
    std::unique_ptr<rpc::FramedSocket> sock = pool_.Take(*addr, &pooled);
    if (sock == nullptr) {
      // The port refused: the store may have restarted on another one. Ask
      // it once; a new port gets this load's attempt.
      if (!asked_again && opts_.bulk_load_target.empty()) {
        asked_again = true;
        ForgetAddress();
        std::optional<Address> now = FindAddress();
        if (now && *now != *addr) {
          addr = now;
          --attempt;
          continue;
        }
      }
      MarkUnreachable();
      return std::nullopt;
    }
    const uint64_t received_before = sock->bytes_received();
    LoadAnswer a = ReadLoadAnswer(sock.get(), req, dst);
    if (a.reported_broke) return a.results;  // the connection is not reused
    if (a.done) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++loads_;
      }
      pool_.Give(std::move(sock));
      if (!a.done_status.ok() && a.finished == 0) return Annotate(a.done_status, "KV-store load");
      return a.results;
    }
    if (sock->bytes_received() == received_before) {
      if (TimedOut(a.io)) return Stalled(a.io, "KV-store load (bulk load port)");
      // No answer at all. A pooled connection the store closed meanwhile:
      // every pooled one is suspect, try a new one. A new one: the port is
      // not serving (refused over its connection limit, shutting down).
      if (pooled) {
        pool_.Clear();
        continue;
      }
      MarkUnreachable();
      return std::nullopt;
    }
    if (a.finished == 0) {
      return absl::Status(a.io.code(),
                          absl::StrCat("KV-store load (bulk load port): ", a.io.message()));
    }
    return a.results;  // blocks not completed stay kFailed
  }
  return std::nullopt;
}

}  // namespace tandem::kvconnector
