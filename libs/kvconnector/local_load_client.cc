#include "local_load_client.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "bulk_load_client.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvconnector {
namespace {

constexpr auto kLookupAgainAfter = std::chrono::seconds(10);
constexpr size_t kMaxIdle = 16;

}  // namespace

// The store's hot tier, mapped read-only.
struct LocalLoadClient::Mapping {
  const std::byte* base = nullptr;
  size_t size = 0;
  ino_t inode = 0;  // of the memfd: a new one means the store restarted
  ~Mapping() {
    if (base != nullptr) munmap(const_cast<std::byte*>(base), size);
  }
};

struct LocalLoadClient::Connection {
  std::unique_ptr<rpc::FramedSocket> sock;
  std::shared_ptr<const Mapping> mapping;
};

LocalLoadClient::LocalLoadClient(int64_t io_timeout_ms, Discover discover)
    : io_timeout_ms_(io_timeout_ms), discover_(std::move(discover)) {}

LocalLoadClient::~LocalLoadClient() = default;

uint64_t LocalLoadClient::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_;
}

std::optional<std::string> LocalLoadClient::FindPath() {
  std::lock_guard<std::mutex> lookup(lookup_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (path_ || std::chrono::steady_clock::now() < next_lookup_) return path_;
  }
  std::optional<std::string> path;
  if (absl::StatusOr<std::pair<std::string, std::string>> found = discover_(); found.ok()) {
    const auto& [socket, host] = *found;
    if (!socket.empty() && !host.empty() && host == rpc::LocalHostId()) path = socket;
  }
  std::lock_guard<std::mutex> lock(mu_);
  path_ = path;
  if (!path) next_lookup_ = std::chrono::steady_clock::now() + kLookupAgainAfter;
  return path;
}

void LocalLoadClient::MarkUnusable(const std::string& why) {
  std::vector<std::unique_ptr<Connection>> idle;
  std::lock_guard<std::mutex> lock(mu_);
  if (path_) {
    TANDEM_LOG(WARNING) << "KV-store local socket " << *path_ << ": " << why
                        << "; loading over the bulk port";
  }
  path_.reset();
  idle.swap(idle_);
  next_lookup_ = std::chrono::steady_clock::now() + kLookupAgainAfter;
}

std::unique_ptr<LocalLoadClient::Connection> LocalLoadClient::Dial(const std::string& path) {
  absl::StatusOr<std::unique_ptr<rpc::FramedSocket>> sock =
      rpc::FramedSocket::ConnectUnix(path, std::min<int64_t>(io_timeout_ms_, 5'000));
  if (!sock.ok()) return nullptr;
  const auto* preface = reinterpret_cast<const uint8_t*>(rpc::kKvLocalLoadPreface.data());
  if (!(*sock)->WriteRaw(std::span(preface, rpc::kKvLocalLoadPreface.size())).ok()) return nullptr;
  uint8_t size_le[8];
  int fd = -1;
  if (!(*sock)->ReceiveWithFd(size_le, &fd).ok() || fd < 0) return nullptr;
  size_t size = 0;
  for (int i = 0; i < 8; ++i) size |= size_t{size_le[i]} << (8 * i);
  struct stat st{};
  auto conn = std::make_unique<Connection>();
  conn->sock = std::move(*sock);
  conn->sock->SetTimeouts(io_timeout_ms_, io_timeout_ms_);
  if (fstat(fd, &st) != 0 || size == 0 || static_cast<uint64_t>(st.st_size) < size) {
    close(fd);
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (mapping_ != nullptr && mapping_->inode == st.st_ino && mapping_->size == size) {
      conn->mapping = mapping_;
      close(fd);
      return conn;
    }
  }
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  auto mapping = std::make_shared<Mapping>();
  mapping->base = static_cast<const std::byte*>(base);
  mapping->size = size;
  mapping->inode = st.st_ino;
  conn->mapping = mapping;
  std::lock_guard<std::mutex> lock(mu_);
  mapping_ = std::move(mapping);
  return conn;
}

std::optional<absl::StatusOr<std::vector<BlockLoadResult>>> LocalLoadClient::Load(
    std::string_view ns, std::span<const BlockHash> hashes,
    std::span<const std::span<uint8_t>> dst, LeaseId lease) {
  std::optional<std::string> path = FindPath();
  if (!path) return std::nullopt;
  v1::LoadRequest req;
  req.set_namespace_(std::string(ns));
  rpc::AppendBlockHashes(hashes, req.mutable_block_hashes());
  req.set_lease_id(lease.value());
  if (req.ByteSizeLong() > rpc::kKvBulkLoadMaxRequestBytes) return std::nullopt;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<Connection> conn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        conn = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    const bool pooled = conn != nullptr;
    if (conn == nullptr) conn = Dial(*path);
    if (conn == nullptr) {
      MarkUnusable("cannot connect");
      return std::nullopt;
    }
    const uint64_t received_before = conn->sock->bytes_received();
    const Mapping& m = *conn->mapping;
    LoadAnswer a = ReadLoadAnswer(conn->sock.get(), req, dst, {m.base, m.size});
    if (a.reported_broke) return a.results;
    if (a.done) {
      // The blocks are copied: an empty request lets the store unpin them.
      v1::LoadRequest unpin;
      unpin.set_namespace_(std::string(ns));
      v1::BulkLoadFrame frame;
      const bool reusable = conn->sock->Write(unpin).ok() &&
                            conn->sock->Read(&frame, 1 << 10).ok() && frame.done();
      std::lock_guard<std::mutex> lock(mu_);
      ++loads_;
      if (reusable && idle_.size() < kMaxIdle) idle_.push_back(std::move(conn));
      if (!a.done_status.ok() && a.finished == 0) return Annotate(a.done_status, "KV-store load");
      return a.results;
    }
    if (conn->sock->bytes_received() == received_before) {
      // No answer: a pooled connection the store closed (idle timeout,
      // restart) makes every pooled one suspect; a new one: not serving.
      if (pooled) {
        std::lock_guard<std::mutex> lock(mu_);
        idle_.clear();
        continue;
      }
      MarkUnusable("no answer");
      return std::nullopt;
    }
    if (a.finished == 0) {
      return absl::Status(a.io.code(),
                          absl::StrCat("KV-store load (local socket): ", a.io.message()));
    }
    return a.results;
  }
  return std::nullopt;
}

}  // namespace tandem::kvconnector
