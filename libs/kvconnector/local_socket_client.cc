#include "local_socket_client.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bulk_load_client.h"
#include "bulk_store_client.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/kvtypes/checksum.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem::kvconnector {
namespace {

constexpr auto kLookupPathAgainAfter = std::chrono::seconds(10);
constexpr size_t kMaxIdle = 16;
#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;  // Linux 5.14's value; older headers lack it
#endif

}  // namespace

// The store's hot tier, mapped read-only for loads and read-write for
// stores.
//
// A store mapping's pages are mapped in ahead of the writes, by a thread of
// its own: the first write to each 4 KiB page of a slot otherwise takes a
// page fault in this process, and on the 2-core VM those faults made a
// 2 MiB block's copy take 0.82 ms instead of 0.23 (a slot written the second
// time), and local stores of 2 MiB blocks 1.3-1.9 GB/s instead of 2.7. The
// store backs its whole tier when it starts (mlock, or fallocate of the
// memfd), so this maps pages that exist and allocates none. It costs the
// page tables of the mapping (2 MiB per GiB of hot tier) and about a quarter
// of a second of one core per GiB, once per store process.
struct LocalSocketClient::Mapping {
  std::byte* base = nullptr;
  size_t size = 0;
  ino_t inode = 0;  // of the memfd: a new one means the store restarted
  std::atomic<bool> stop{false};
  std::thread populate;

  void Populate() {
    pthread_setname_np(pthread_self(), "kv-local-map");
    constexpr size_t kChunk = 64 << 20;
    for (size_t off = 0; off < size && !stop.load(std::memory_order_relaxed); off += kChunk) {
      // Where the kernel lacks MADV_POPULATE_WRITE (before 5.14) this fails
      // at once and the writes fault the pages in themselves.
      if (madvise(base + off, std::min(kChunk, size - off), kMadvPopulateWrite) != 0) return;
    }
  }
  ~Mapping() {
    stop = true;
    if (populate.joinable()) populate.join();
    if (base != nullptr) munmap(base, size);
  }
};

struct LocalSocketClient::Connection {
  std::unique_ptr<rpc::FramedSocket> sock;
  std::shared_ptr<const Mapping> mapping;
};

LocalSocketClient::LocalSocketClient(int64_t io_timeout_ms, Discover discover)
    : io_timeout_ms_(io_timeout_ms), discover_(std::move(discover)) {}

LocalSocketClient::~LocalSocketClient() = default;

uint64_t LocalSocketClient::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_;
}

uint64_t LocalSocketClient::stores() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stores_;
}

std::optional<std::string> LocalSocketClient::FindPath() {
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
  if (!path) next_lookup_ = std::chrono::steady_clock::now() + kLookupPathAgainAfter;
  return path;
}

void LocalSocketClient::MarkUnusable(const std::string& why) {
  std::vector<std::unique_ptr<Connection>> idle[2];
  std::lock_guard<std::mutex> lock(mu_);
  if (path_) {
    TANDEM_LOG(WARNING) << "KV-store local socket " << *path_ << ": " << why
                        << "; loading and storing over the bulk port";
  }
  path_.reset();
  idle[kLoads].swap(idle_[kLoads]);
  idle[kStores].swap(idle_[kStores]);
  next_lookup_ = std::chrono::steady_clock::now() + kLookupPathAgainAfter;
}

std::unique_ptr<LocalSocketClient::Connection> LocalSocketClient::Take(const std::string& path,
                                                                       Use use, bool* pooled) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_[use].empty()) {
      std::unique_ptr<Connection> conn = std::move(idle_[use].back());
      idle_[use].pop_back();
      *pooled = true;
      return conn;
    }
  }
  *pooled = false;
  return Dial(path, use);
}

void LocalSocketClient::Give(std::unique_ptr<Connection> conn, Use use) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_[use].size() < kMaxIdle) idle_[use].push_back(std::move(conn));
}

void LocalSocketClient::ClearIdle(Use use) {
  std::vector<std::unique_ptr<Connection>> idle;
  std::lock_guard<std::mutex> lock(mu_);
  idle.swap(idle_[use]);
}

std::unique_ptr<LocalSocketClient::Connection> LocalSocketClient::Dial(const std::string& path,
                                                                       Use use) {
  absl::StatusOr<std::unique_ptr<rpc::FramedSocket>> sock =
      rpc::FramedSocket::ConnectUnix(path, std::min<int64_t>(io_timeout_ms_, 5'000));
  if (!sock.ok()) return nullptr;
  const std::string_view preface_text =
      use == kStores ? rpc::kKvLocalStorePreface : rpc::kKvLocalLoadPreface;
  const auto* preface = reinterpret_cast<const uint8_t*>(preface_text.data());
  if (!(*sock)->WriteRaw(std::span(preface, preface_text.size())).ok()) return nullptr;
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
    if (mapping_[use] != nullptr && mapping_[use]->inode == st.st_ino &&
        mapping_[use]->size == size) {
      conn->mapping = mapping_[use];
      close(fd);
      return conn;
    }
  }
  void* base =
      mmap(nullptr, size, use == kStores ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  auto mapping = std::make_shared<Mapping>();
  mapping->base = static_cast<std::byte*>(base);
  mapping->size = size;
  mapping->inode = st.st_ino;
  if (use == kStores) mapping->populate = std::thread([m = mapping.get()] { m->Populate(); });
  conn->mapping = mapping;
  std::lock_guard<std::mutex> lock(mu_);
  mapping_[use] = std::move(mapping);
  return conn;
}

std::optional<absl::StatusOr<std::vector<BlockLoadResult>>> LocalSocketClient::Load(
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
    bool pooled = false;
    std::unique_ptr<Connection> conn = Take(*path, kLoads, &pooled);
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
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++loads_;
      }
      if (reusable) Give(std::move(conn), kLoads);
      if (!a.done_status.ok() && a.finished == 0) return Annotate(a.done_status, "KV-store load");
      return a.results;
    }
    if (conn->sock->bytes_received() == received_before) {
      if (TimedOut(a.io)) return Stalled(a.io, "KV-store load (local socket)");
      // No answer: a pooled connection the store closed (idle timeout,
      // restart) makes every pooled one suspect; a new one: not serving.
      if (pooled) {
        ClearIdle(kLoads);
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

std::optional<absl::StatusOr<std::vector<BlockStoreResult>>> LocalSocketClient::Store(
    std::string_view ns, std::span<const BlockHash> hashes,
    std::span<const std::span<const uint8_t>> src, std::optional<kvstore::Durability> durability) {
  std::optional<std::string> path = FindPath();
  if (!path) return std::nullopt;
  std::optional<v1::BulkStoreRequest> req = MakeBulkStoreRequest(ns, hashes, src, durability);
  if (!req) return std::nullopt;
  const size_t n = hashes.size();
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool pooled = false;
    std::unique_ptr<Connection> conn = Take(*path, kStores, &pooled);
    if (conn == nullptr) {
      MarkUnusable("cannot connect");
      return std::nullopt;
    }
    rpc::FramedSocket* sock = conn->sock.get();
    const uint64_t received_before = sock->bytes_received();
    v1::BulkStoreSlots slots;
    absl::Status io = sock->Write(*req);
    if (io.ok()) io = sock->Read(&slots, rpc::kKvBulkLoadMaxRequestBytes);
    if (!io.ok() && sock->bytes_received() == received_before) {
      if (TimedOut(io)) return Stalled(io, "KV-store store (local socket)");
      // No answer: a pooled connection the store closed (idle timeout,
      // restart) makes every pooled one suspect; a new one: not serving.
      if (pooled) {
        ClearIdle(kStores);
        continue;
      }
      MarkUnusable("no answer to a store");
      return std::nullopt;
    }
    if (!io.ok()) {
      return absl::Status(io.code(), absl::StrCat("KV-store store (local socket): ", io.message()));
    }
    if (slots.status_code() != 0) {  // refused before any payload; the store closes
      return absl::Status(static_cast<absl::StatusCode>(slots.status_code()),
                          absl::StrCat("KV-store store: ", slots.status_message()));
    }
    if (slots.shared_offsets_size() != static_cast<int>(n)) {
      return absl::InternalError(absl::StrCat("KV-store store (local socket): ",
                                              slots.shared_offsets_size(), " slots for ", n,
                                              " blocks"));
    }
    // Block by block: a block with a slot is copied into it, the others go
    // inline, as on the bulk port. The blocks' checksums follow them in
    // frames where rpc::KvLocalStoreChecksumsDue says, so the store checks
    // those slots while this writes the next blocks.
    const Mapping& m = *conn->mapping;
    v1::BulkStoreChecksums frame;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n && io.ok(); ++i) {
      const int64_t offset = slots.shared_offsets(static_cast<int>(i));
      if (offset < 0) {
        frame.add_checksums(kvstore::Crc32c(src[i]));
        io = sock->WriteRaw(src[i]);
      } else if (static_cast<uint64_t>(offset) > m.size || src[i].size() > m.size - offset) {
        return absl::InternalError(absl::StrCat("KV-store store (local socket): slot at ", offset,
                                                " for a ", src[i].size(),
                                                "-byte block lies outside the ", m.size,
                                                "-byte shared memory"));
      } else {
        // Copied into its slot and checksummed in one pass.
        frame.add_checksums(kvstore::Crc32cCopy(0, reinterpret_cast<uint8_t*>(m.base + offset),
                                                src[i].data(), src[i].size()));
      }
      bytes += src[i].size();
      if (io.ok() && rpc::KvLocalStoreChecksumsDue(bytes, i + 1 == n)) {
        io = sock->Write(frame);
        frame.clear_checksums();
        bytes = 0;
      }
    }
    v1::BulkStoreAnswer answer;
    if (io.ok()) io = sock->Read(&answer, rpc::kKvBulkLoadMaxRequestBytes);
    if (!io.ok()) {
      return absl::Status(io.code(), absl::StrCat("KV-store store (local socket): ", io.message()));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stores_;
    }
    if (answer.status_code() == 0) Give(std::move(conn), kStores);  // else the store closes
    return BulkStoreResults(answer, n);
  }
  return std::nullopt;
}

}  // namespace tandem::kvconnector
