// A blocking TCP connection that carries length-prefixed protobuf frames,
// each optionally followed by raw payload bytes: the transport of the
// KV-store's bulk load port (services/kvstore/bulk_load_server.h), where a
// block's bytes go from the store's memory to the socket and from the socket
// into the caller's buffer with no copy in between.
//
// A frame on the wire: a 4-byte little-endian length N, then N bytes of a
// serialized message. Payload bytes that follow a frame are not framed; the
// frame says how many there are.
//
// Reads go through a small lookahead buffer, so a frame header costs no
// syscall of its own: ReadPayload() receives straight into the destination
// and lets the same readv() pick up the next frame into the buffer.
//
// Errors: UNAVAILABLE when the peer closed or reset the connection (see
// closed_cleanly()), DEADLINE_EXCEEDED when a send or receive made no
// progress within the socket's timeout, INVALID_ARGUMENT for a frame longer
// than the caller's limit or one that does not parse. After any error the
// connection is not usable (the framing is lost); close it.
//
// TLS (StartTls): after the handshake every byte goes through one OpenSSL
// session, kernel TLS where the kernel and OpenSSL offer it. The socket is
// then non-blocking and the session is guarded by a mutex that no wait
// holds, so one thread may read while another writes (the lookup
// connection's pattern), as with plain TCP; the timeouts are kept by poll().
//
// Not thread-safe otherwise: one reader and one writer at a time.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX
struct iovec;

namespace tandem::rpc {

// The KV-store's bulk load port (services/kvstore/bulk_load_server.h has
// the protocol): the prefaces a client sends first on each connection (one
// for loads, one for lookups, one for stores), and the largest request frame the server
// accepts.
inline constexpr std::string_view kKvBulkLoadPreface = "TKVBULK1";
inline constexpr std::string_view kKvBulkLookupPreface = "TKVLOOK1";
inline constexpr std::string_view kKvBulkStorePreface = "TKVSTOR1";
// Loads read in place from the hot tier's shared memory, on the store's
// local (Unix-domain) socket only.
inline constexpr std::string_view kKvLocalLoadPreface = "TKVSHM01";
// Stores written in place into hot-tier slots the store reserves, on the
// local socket only.
inline constexpr std::string_view kKvLocalStorePreface = "TKVSHS01";
// A local store's checksums follow its blocks in frames: one after block i
// when the blocks since the last frame hold at least this many payload bytes,
// or block i is the batch's last. Both ends compute these points from the
// request's sizes. A frame per block cost the store one wake-up per block
// (64 KiB blocks); one per batch left the two ends taking turns.
inline constexpr uint64_t kKvLocalStoreChecksumBytes = 512 << 10;
[[nodiscard]] inline bool KvLocalStoreChecksumsDue(uint64_t bytes_since_frame, bool last_block) {
  return last_block || bytes_since_frame >= kKvLocalStoreChecksumBytes;
}
// The most payload bytes one store batch on the bulk port may carry (the
// server receives a whole batch before it stores any of it).
inline constexpr uint64_t kKvBulkStoreMaxBatchBytes = uint64_t{256} << 20;
inline constexpr uint32_t kKvBulkLoadMaxRequestBytes = 16 << 20;

// Splits a gRPC-style address into host and port: "host:port",
// "[v6addr]:port", and the target forms "dns:///host:port", "ipv4:h:p",
// "ipv6:[h]:p". INVALID_ARGUMENT for anything else (unix sockets, a missing
// port).
[[nodiscard]] absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(
    std::string_view address);

// This machine's identity for the KV-store's local socket: the kernel's
// boot id (/proc/sys/kernel/random/boot_id), which processes in one kernel
// share; empty when it cannot be read.
[[nodiscard]] std::string LocalHostId();

// OpenSSL's queued errors on this thread, oldest first, in one line ("no
// reason given" when there are none); the queue is left empty.
[[nodiscard]] std::string TakeOpenSslErrors();

class FramedSocket {
 public:
  // Takes ownership of a connected stream socket; sets TCP_NODELAY.
  explicit FramedSocket(int fd);
  ~FramedSocket();  // closes the socket
  FramedSocket(const FramedSocket&) = delete;
  FramedSocket& operator=(const FramedSocket&) = delete;

  // Connects to host:port (numeric or a name getaddrinfo resolves), waiting
  // at most `timeout_ms`, and sets that as the send and receive timeout.
  static absl::StatusOr<std::unique_ptr<FramedSocket>> Connect(const std::string& host,
                                                               const std::string& port,
                                                               int64_t timeout_ms);

  // Connects to the Unix-domain stream socket at `path`, as Connect does.
  static absl::StatusOr<std::unique_ptr<FramedSocket>> ConnectUnix(const std::string& path,
                                                                   int64_t timeout_ms);

  // On a plain Unix-domain connection, before any framed I/O: sends
  // `bytes` with the descriptor `fd` (SCM_RIGHTS; none when fd < 0), and
  // receives exactly `bytes.size()` bytes and the descriptor sent with them
  // (*fd = -1 when none came; the caller owns it).
  absl::Status SendWithFd(std::span<const uint8_t> bytes, int fd);
  absl::Status ReceiveWithFd(std::span<uint8_t> bytes, int* fd);

  // Send and receive timeouts (SO_SNDTIMEO / SO_RCVTIMEO): how long one
  // send or receive may make no progress. 0 = wait forever.
  void SetTimeouts(int64_t send_ms, int64_t receive_ms);

  // Runs the TLS handshake (within the send and receive timeouts) with a
  // context from rpc::SocketTlsContext; from then on every Read and Write is
  // encrypted. A client verifies the server's certificate for `peer_host`
  // (a DNS name or an IP address, as gRPC does for its target). Call it
  // before any other I/O. UNAVAILABLE naming OpenSSL's reason when the
  // handshake fails (an unknown CA, no client certificate, a peer that does
  // not speak TLS); DEADLINE_EXCEEDED when it stalls.
  absl::Status StartTls(ssl_ctx_st* context, bool server, const std::string& peer_host = "");
  // How TLS records reach the socket: OpenSSL writes each 16 KiB record to
  // the socket itself, handing the record layer to the kernel where it has
  // the `tls` module (kSocket); or OpenSSL encrypts a whole write into
  // memory and one send() takes it (kBuffered: a 2 MiB block is one system
  // call instead of 128). kAuto (the default) is kSocket where
  // /sys/module/tls exists, kBuffered elsewhere.
  enum class TlsWrites { kAuto, kSocket, kBuffered };
  // Tests only: what kAuto means in this process (kAuto: the rule above).
  static void TEST_SetTlsWrites(TlsWrites writes);
  // Whether StartTls succeeded, and whether the kernel does the record
  // layer (kernel TLS) for sends.
  [[nodiscard]] bool tls() const { return tls_ != nullptr; }
  [[nodiscard]] bool kernel_tls_send() const;
  // Whether this connection's TLS writes are buffered (TlsWrites).
  [[nodiscard]] bool tls_writes_buffered() const;
  // The URI SANs of the peer's verified certificate (its role, tls.h's
  // RoleFromUris); empty without TLS or without a client certificate.
  [[nodiscard]] std::vector<std::string> PeerUris() const;

  // Sends the frame, then `payload`, in as few syscalls as the kernel takes.
  absl::Status Write(const google::protobuf::MessageLite& frame,
                     std::span<const uint8_t> payload = {});
  // Sends bytes as they are (a connection preface).
  absl::Status WriteRaw(std::span<const uint8_t> bytes);

  // Reads the next frame into `frame` (a frame longer than
  // `max_frame_bytes` is an error).
  absl::Status Read(google::protobuf::MessageLite* frame, uint32_t max_frame_bytes);
  // Reads exactly dst.size() bytes (payload, or a preface) into `dst`.
  // `on_piece`, when given, sees each piece of dst as it arrives, in order,
  // while it is still in cache (e.g. to checksum it).
  absl::Status ReadRaw(std::span<uint8_t> dst,
                       absl::FunctionRef<void(std::span<const uint8_t>)> on_piece =
                           [](std::span<const uint8_t>) {});
  // ReadRaw into each of `dsts` in turn, as if they were one buffer: one
  // readv(2) fills several of them (a batch of blocks landing in the places
  // they are kept). `on_piece` gets the index of the dst each piece is of.
  absl::Status ReadRawScatter(
      std::span<const std::span<uint8_t>> dsts,
      absl::FunctionRef<void(size_t, std::span<const uint8_t>)> on_piece);
  // Receives `n` bytes and drops them (a payload nobody has room for).
  absl::Status Skip(uint64_t n);

  // After an UNAVAILABLE from Read(): true when the peer closed the
  // connection between frames (an orderly end), not in the middle of one.
  [[nodiscard]] bool closed_cleanly() const { return closed_cleanly_; }
  // Bytes received so far (frames and payload): whether the peer answered
  // anything at all.
  [[nodiscard]] uint64_t bytes_received() const { return bytes_received_; }
  [[nodiscard]] int fd() const { return fd_; }

 private:
  // Receives into buf_ until it holds at least `n` unread bytes.
  absl::Status Fill(size_t n);
  absl::Status RecvError(ssize_t r, const char* what, bool between_frames);
  // Sends every byte of iov[0..count) (advancing it).
  absl::Status SendAll(::iovec* iov, int count, const char* what);
  // Receives up to `n` bytes into `dst` (one recv, or one TLS read); the
  // number received, or the error (a closed connection included).
  absl::StatusOr<size_t> ReceiveSome(uint8_t* dst, size_t n, const char* what, bool between_frames);

  struct Tls;  // the OpenSSL session (framed_socket.cc)
  enum class TlsOp { kHandshake, kRead, kWrite };
  // One OpenSSL call under the session's lock, repeated after waiting
  // (outside the lock, within the timeouts) for what OpenSSL wants: the
  // bytes moved, or the error.
  absl::StatusOr<size_t> TlsCall(TlsOp op, void* data, size_t n, const char* what,
                                 bool between_frames);
  // Buffered writes: sends what OpenSSL left in its output buffer. Requires
  // the session's lock.
  absl::Status FlushTlsLocked(const char* what);

  int fd_;
  std::unique_ptr<Tls> tls_;
  int64_t send_timeout_ms_ = 0;
  int64_t receive_timeout_ms_ = 0;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;  // next unread byte of buf_
  size_t len_ = 0;  // bytes of buf_ filled
  bool closed_cleanly_ = false;
  uint64_t bytes_received_ = 0;
  std::string scratch_;  // serialized outgoing frame
};

}  // namespace tandem::rpc
