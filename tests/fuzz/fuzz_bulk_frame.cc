// The bulk load port's framing (libs/rpc/framed_socket.h) on arbitrary
// bytes arriving over a real socket, read the three ways it is read: the
// server's (preface, then LoadRequest frames), the load client's
// (BulkLoadFrame frames, each followed by its block's payload bytes) and the
// lookup client's (BulkLookupAnswer frames). An error or frames, never a
// crash, a hang or an allocation the bytes did not pay for.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/rpc/framed_socket.h"
#include "tandem/v1/kvstore.pb.h"

namespace {

constexpr uint32_t kMaxFrame = 1 << 20;
constexpr uint64_t kMaxPayload = 1 << 20;  // the client's block buffer

void AsServer(tandem::rpc::FramedSocket& sock) {
  std::vector<uint8_t> preface(tandem::rpc::kKvBulkLoadPreface.size());
  if (!sock.ReadRaw(preface).ok()) return;
  tandem::v1::LoadRequest request;
  while (sock.Read(&request, tandem::rpc::kKvBulkLoadMaxRequestBytes).ok()) {
  }
}

void AsLoadClient(tandem::rpc::FramedSocket& sock) {
  tandem::v1::BulkLoadFrame frame;
  std::vector<uint8_t> block;
  while (sock.Read(&frame, kMaxFrame).ok() && !frame.done()) {
    if (!frame.chunk().ok()) continue;
    const uint64_t n = frame.chunk().total_size();
    absl::Status s;
    if (n <= kMaxPayload) {
      block.resize(n);
      s = sock.ReadRaw(block);
    } else {
      s = sock.Skip(n);
    }
    if (!s.ok()) return;
  }
}

void AsLookupClient(tandem::rpc::FramedSocket& sock) {
  tandem::v1::BulkLookupAnswer answer;
  while (sock.Read(&answer, kMaxFrame).ok()) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  // libFuzzer's inputs (4 KiB by default) fit the socket buffer: write all,
  // then close, so every read ends in data or end of stream.
  const uint8_t mode = data[0] % 3;
  size_t off = 1;
  while (off < size) {
    const ssize_t n = write(fds[1], data + off, size - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  close(fds[1]);
  tandem::rpc::FramedSocket sock(fds[0]);  // owns and closes fds[0]
  sock.SetTimeouts(1000, 1000);
  if (mode == 0) AsServer(sock);
  if (mode == 1) AsLoadClient(sock);
  if (mode == 2) AsLookupClient(sock);
  return 0;
}
