// The bulk load server's local socket (bulk_load_server.h, "Local socket"):
// loads that a client on this host reads in place from the hot tier's
// shared memory, and stores it writes in place (bulk_store.cc).
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "bulk_load_server.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"

namespace tandem::kvstore_service {

absl::StatusOr<int> ListenLocal(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat("local socket path ", path, " is too long (",
                                                   path.size(), " bytes, at most ",
                                                   sizeof addr.sun_path - 1, ")"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  // A socket file left by a store that died is replaced; a live store's
  // answers a connect, and is not.
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live =
        probe >= 0 && connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      close(fd);
      return absl::AlreadyExistsError(
          absl::StrCat("local socket ", path, ": another process is serving it"));
    }
    unlink(path.c_str());
  }
  // Owner only: the socket's permissions are its access control.
  const mode_t old_mask = umask(0077);
  const bool bound = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  const int bind_errno = errno;
  umask(old_mask);
  if (!bound || listen(fd, 128) != 0) {
    const std::string error = std::strerror(bound ? errno : bind_errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("local socket: cannot listen on ", path, ": ", error));
  }
  return fd;
}

void BulkLoadServer::ServeLocal(rpc::FramedSocket* sock) {
  uint8_t preface[rpc::kKvLocalLoadPreface.size()];
  if (!sock->ReadRaw(preface).ok()) return;
  const bool stores =
      std::memcmp(preface, rpc::kKvLocalStorePreface.data(), sizeof preface) == 0;
  if (!stores && std::memcmp(preface, rpc::kKvLocalLoadPreface.data(), sizeof preface) != 0) {
    ++bad_prefaces_;
    TANDEM_LOG(WARNING) << "local socket: a connection did not start with the local load or "
                           "store preface; closed";
    return;
  }
  const kvstore::KvStoreEngine::HotTierMemory memory = store_->hot_tier_memory();
  uint8_t size[8];
  for (int i = 0; i < 8; ++i) size[i] = static_cast<uint8_t>(memory.bytes.size() >> (8 * i));
  if (!sock->SendWithFd(size, memory.fd).ok()) return;
  if (stores) {
    ServeStores(sock, absl::OkStatus(), /*in_place=*/true);
    return;
  }
  // The pins of the last load, held until the client's next frame.
  LeaseId pinned{0};
  struct Unpin {
    kvstore::KvStoreEngine* store;
    LeaseId* lease;
    void operator()() const {
      if (lease->value() != 0) store->Release(*lease);
      *lease = LeaseId(0);
    }
    ~Unpin() { (*this)(); }
  } unpin{store_, &pinned};
  for (;;) {
    v1::LoadRequest request;
    absl::Status s = sock->Read(&request, rpc::kKvBulkLoadMaxRequestBytes);
    unpin();  // the client has copied the last load's blocks (or is gone)
    if (s.code() == absl::StatusCode::kInvalidArgument) {
      SendDone(sock, Annotate(s, "local load"));
      return;
    }
    if (!s.ok()) return;  // closed, reset, or idle past the timeout
    if (request.block_hashes_size() == 0 && request.corrupt_block_hashes_size() == 0) {
      if (!SendDone(sock, absl::OkStatus())) return;  // only the unpin
      continue;
    }
    if (!ServeLoad(sock, request, &pinned)) return;
  }
}

}  // namespace tandem::kvstore_service
