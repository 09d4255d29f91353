// The HTTP side of `tandem bench --http`: one streamed OpenAI completion per
// call (POST /v1/completions, "stream": true) over a connection kept alive
// between calls, read as Server-Sent Events while they arrive. Blocking, one
// client per thread, like the gRPC side's synchronous stubs, so that the two
// paths are measured with the same client shape; the Node load generator in
// tools/bench_frontend costs several times the CPU per token on its one
// thread, which on a small machine is taken from the frontend it measures.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

struct HttpTarget {
  std::string host;
  std::string port;
  std::string path;     // of the completions endpoint, e.g. "/v1/completions"
  std::string api_key;  // sent as a Bearer token when set
};
// "http://host:port[/base]" -> the target of base + "/v1/completions".
// INVALID_ARGUMENT for anything else (https is not spoken here).
[[nodiscard]] absl::StatusOr<HttpTarget> ParseHttpUrl(std::string_view url);

// What one stream gave (the gRPC and the HTTP side of the bench alike).
struct StreamResult {
  explicit StreamResult(std::chrono::steady_clock::time_point start) : start(start), last(start) {}

  // `k` > 0 tokens arrived at `now`: the first sets TTFT, and each token
  // after it gets an equal share of the gap since the last arrival as ITL.
  void AddTokens(int64_t k, std::chrono::steady_clock::time_point now);

  std::string error;  // empty: the stream ended normally
  double ttft_ms = -1;
  std::vector<double> itl_ms;  // one per token after the first
  int64_t tokens = 0;
  std::chrono::steady_clock::time_point start;  // when the request was sent
  std::chrono::steady_clock::time_point last;   // the last arrival
};

class HttpStreamClient {
 public:
  explicit HttpStreamClient(HttpTarget target);
  ~HttpStreamClient();
  HttpStreamClient(const HttpStreamClient&) = delete;
  HttpStreamClient& operator=(const HttpStreamClient&) = delete;

  // Sends `body` (a JSON completions request with "stream": true) and reads
  // the stream to its end; `start` is when the caller began the request.
  // Token counts come from each chunk's token_ids (the request asks for
  // return_token_ids), times from when its event was read.
  // Connects (again) when there is no open connection.
  StreamResult Complete(const std::string& body, std::chrono::steady_clock::time_point start);
  // Opens the connection now (the bench does before its clock starts, as a
  // client with a warm pool would); "" or what failed. Complete connects
  // by itself when this was not called or the connection closed.
  std::string Connect();

 private:
  struct Connection;
  // Connects, or throws what failed (conn_ stays as it was).
  void Open();
  HttpTarget target_;
  std::unique_ptr<Connection> conn_;
};

}  // namespace tandem::cli
