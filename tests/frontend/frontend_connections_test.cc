// tandem-frontend end to end, its client connections:
//   - a client that disconnects mid-stream aborts its request on the
//     scheduler, which frees its blocks;
//   - a client that reads late still gets the whole stream, in order;
//   - randomized concurrent clients (hang-ups, slow readers, pipelining,
//     bad bodies) get whole answers and leave nothing behind;
//   - calls to a replica spread over --connections-per-replica connections.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "frontend_test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {
namespace {

// Shrinks a socket's receive buffer and segment size (SO_RCVBUF,
// TCP_MAXSEG: on loopback the peer's send buffer grows with the segment
// size), so that a peer's sends fill it soon.
void SmallBuffers(int fd) {
  const int receive_buffer = 2048, segment = 536;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
  setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &segment, sizeof(segment));
}

// An HTTP/1.1 POST of `body` as JSON; `headers` ("Name: value\r\n" lines)
// are added to the head.
std::string PostRequest(const std::string& path, const Json& body,
                        const std::string& headers = "") {
  const std::string text = body.dump();
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         headers + "Content-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
}

// The body of a chunked HTTP response (`response` from its status line
// on); nullopt when the framing is broken or cut short.
std::optional<std::string> Dechunk(const std::string& response) {
  const size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos) return std::nullopt;
  std::string body;
  for (size_t at = head_end + 4; at < response.size();) {
    const size_t eol = response.find("\r\n", at);
    if (eol == std::string::npos) return std::nullopt;
    size_t size = 0;
    try {
      size = std::stoul(response.substr(at, eol - at), nullptr, 16);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (size == 0) return body;
    if (eol + 2 + size + 2 > response.size()) return std::nullopt;
    body += response.substr(eol + 2, size);
    at = eol + 2 + size + 2;
  }
  return std::nullopt;
}

// Reads until the peer closes, the text holds `until` (when not empty) or
// `limit` bytes arrived; `pause` sleeps before each read (a slow client).
std::string ReadFrom(int fd, const std::string& until = "", size_t limit = SIZE_MAX,
                     std::chrono::microseconds pause = {}) {
  std::string received;
  char buf[4096];
  while (received.size() < limit && (until.empty() || received.find(until) == std::string::npos)) {
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    const ssize_t n = recv(fd, buf, pause.count() > 0 ? 512 : sizeof(buf), 0);
    if (n <= 0) break;
    received.append(buf, static_cast<size_t>(n));
  }
  return received;
}

// The worker here sleeps 20 ms before each step, so that the 250 tokens
// take at least 5 s whatever the build's speed (a sanitizer build of the
// frontend took longer to deliver the first event than a plain worker takes
// for all 250): the request is surely running when the client hangs up, and
// a request that was not aborted would run all 250 steps.
TEST_F(FrontendTest, ClientDisconnectMidStreamFreesTheRequestOnTheScheduler) {
  constexpr int kMaxTokens = 250;
  Service worker = StartWorker(dir_, "slow_worker", {"--model", kModels + "/random32k.bin",
                                                     "--debug-step-delay-us", "20000"});
  Service scheduler = StartScheduler(dir_, "slow_scheduler", worker.address(), {});
  Service frontend =
      StartFrontend(dir_, "slow_frontend", {scheduler.address()}, {"--tokenizer", kLlama2Tokenizer});
  auto stub = GenerationStub(scheduler.address());
  const v1::GetStatsResponse before = GetStats(stub.get());
  // A raw socket, so that we can hang up after the first event.
  const int fd = ConnectTcp(frontend.address());
  ASSERT_GE(fd, 0);
  const std::string request = PostRequest("/v1/completions", Json({{"prompt", "Once upon a time"},
                                                                    {"max_tokens", kMaxTokens},
                                                                    {"ignore_eos", true},
                                                                    {"temperature", 0},
                                                                    {"stream", true}}));
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  ASSERT_NE(ReadFrom(fd, "data: ").find("data: "), std::string::npos);
  EXPECT_EQ(GetStats(stub.get()).num_running(), 1);
  close(fd);
  // The scheduler aborts it: nothing running, every block free again, and
  // far fewer steps than the request's 250 tokens would have taken.
  EXPECT_TRUE(WaitFor([&] {
    const v1::GetStatsResponse s = GetStats(stub.get());
    return s.num_running() == 0 && s.num_waiting() == 0 &&
           s.num_free_blocks() == s.num_total_blocks();
  }));
  const v1::GetStatsResponse after = GetStats(stub.get());
  EXPECT_EQ(after.num_requests_finished(), before.num_requests_finished() + 1);
  EXPECT_LT(after.num_steps() - before.num_steps(), static_cast<uint64_t>(kMaxTokens / 2))
      << "the request was not aborted when its client hung up";
  EXPECT_EQ(
      Metric(Get(frontend.address(), "/metrics"), "tandem_frontend_client_disconnects_total"), 1);
}

// The value of the scheduler's vllm:request_success_total for a reason.
double FinishedAs(const std::string& metrics, const std::string& reason) {
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("vllm:request_success_total{", 0) == 0 &&
        line.find("finished_reason=\"" + reason + "\"") != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

// A choice that a stop string ends finishes on the scheduler as "stop", as
// vLLM counts it (the frontend's Abort with stop_string), not as an abort:
// it was cancelled like a client that hung up, and vLLM's dashboards showed
// stop-string chats as aborts. The request still ends at once.
TEST_F(FrontendTest, AStopStringFinishesTheRequestAsStopOnTheScheduler) {
  Service worker =
      StartWorker(dir_, "stop_worker",
                  {"--model", kModels + "/random32k.bin", "--debug-step-delay-us", "20000"});
  Service scheduler =
      StartScheduler(dir_, "stop_scheduler", worker.address(), {"--metrics-listen", "127.0.0.1:0"});
  Service frontend = StartFrontend(dir_, "stop_frontend", {scheduler.address()},
                                   {"--tokenizer", kLlama2Tokenizer});
  const Json body = {
      {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"ignore_eos", true}, {"temperature", 0}};
  const HttpResult whole = Post(frontend.address(), "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const std::string text = whole.body["choices"][0]["text"];
  ASSERT_GE(text.size(), 8u) << text;
  Json stopped_body = body;
  stopped_body["max_tokens"] = 200;
  stopped_body["stop"] = text.substr(4, 3);  // within the first few tokens
  const HttpResult stopped = Post(frontend.address(), "/v1/completions", stopped_body);
  ASSERT_EQ(stopped.status, 200) << stopped.raw;
  EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
  auto stub = GenerationStub(scheduler.address());
  EXPECT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_running() == 0; }));
  std::string metrics;
  EXPECT_TRUE(WaitFor([&] {
    metrics = HttpGetBody(MetricsAddress(scheduler), "/metrics");
    return FinishedAs(metrics, "stop") == 1;
  })) << metrics;
  EXPECT_EQ(FinishedAs(metrics, "length"), 1);
  EXPECT_EQ(FinishedAs(metrics, "abort"), 0);
  EXPECT_LT(GetStats(stub.get()).num_steps(), 100u) << "the stopped request ran on";
}

// A client that does not read fills its socket: the frontend's non-blocking
// sends stop short, the rest goes out asynchronously and later chunks queue
// behind it. Every chunk still arrives, whole and in order.
TEST_F(FrontendTest, AClientThatReadsLateGetsTheWholeStreamInOrder) {
  const Json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 250},
                     {"ignore_eos", true},
                     {"temperature", 0},
                     {"return_token_ids", true}};
  const HttpResult whole = Post(frontend_.address(), "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const std::vector<int32_t> want = whole.body["choices"][0]["token_ids"];
  ASSERT_EQ(want.size(), 250u);

  const int fd = ConnectTcp(frontend_.address(), SmallBuffers);
  ASSERT_GE(fd, 0);
  Json streamed_body = body;
  streamed_body["stream"] = true;
  const std::string request = PostRequest("/v1/completions", streamed_body);
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  // Let the whole stream be generated while nothing is read.
  auto stub = GenerationStub(scheduler_.address());
  EXPECT_TRUE(WaitFor([&] { return GetStats(stub.get()).num_requests_finished() >= 2; }));
  const std::string received = ReadFrom(fd, "0\r\n\r\n");
  close(fd);
  const std::optional<std::string> events = Dechunk(received);
  ASSERT_TRUE(events.has_value()) << received.size() << " bytes: " << received.substr(0, 300);
  const Streamed got = ParseSse(*events);
  EXPECT_TRUE(got.done);
  EXPECT_EQ(got.ids, want);
  EXPECT_EQ(got.text, whole.body["choices"][0]["text"]);
}

// Randomized: rounds of concurrent clients over raw sockets, each one of:
// reads its stream to the end; hangs up after a random number of bytes;
// reads slowly through small buffers; pipelines a stream and a plain
// request; sends a body that is not JSON. Prompts, lengths and n are
// random. Every stream that is read to the end is whole (n * max_tokens
// ids, [DONE], the chunked end), every pipelined pair is answered in order,
// and afterwards nothing is left: no request running or waiting on the
// scheduler, every KV block free, none in flight in the frontend.
TEST_F(FrontendTest, ConcurrentClientsThatHangUpReadSlowlyOrPipelineLeaveNothingBehind) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  enum Mode { kFull, kHangUp, kSlow, kPipeline, kGarbage };
  std::mutex mu;
  std::map<std::string, int> outcomes;
  std::vector<std::string> failures;
  auto note = [&](const std::string& outcome, const std::string& failure = "") {
    std::lock_guard<std::mutex> lock(mu);
    ++outcomes[outcome];
    if (!failure.empty()) failures.push_back(outcome + ": " + failure);
  };
  auto client = [&](uint32_t client_seed) {
    std::mt19937 rng(client_seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const Mode mode = static_cast<Mode>(pick(0, 4));
    Json prompt = Json::array({1});
    for (int i = pick(1, 30); i > 0; --i) prompt.push_back(pick(2, 31999));
    // A slow reader's stream is long enough to fill its small socket.
    const int max_tokens = mode == kSlow ? pick(150, 200) : pick(1, 60);
    const int n = pick(1, 3) == 3 ? 2 : 1;
    const Json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true},
                 {"temperature", 0},  {"n", n},                  {"stream", true},
                 {"return_token_ids", true}};
    const int fd = ConnectTcp(frontend_.address(), mode == kSlow ? SmallBuffers : nullptr);
    if (fd < 0) return note("connect", "failed");
    std::string request;
    if (mode == kGarbage) {
      request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                "Content-Length: 5\r\n\r\n{bad}";
    } else if (mode == kPipeline) {
      // The first request keeps the connection; the second closes it.
      Json plain_body = body;
      plain_body["stream"] = false;
      request = PostRequest("/v1/completions", body) +
                PostRequest("/v1/completions", plain_body, "Connection: close\r\n");
    } else {
      // A client that hangs up keeps the connection alive.
      request = PostRequest("/v1/completions", body,
                            mode == kHangUp ? "" : "Connection: close\r\n");
    }
    send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string received;
    if (mode == kHangUp) {
      // (Or at the stream's end: the connection is kept alive.)
      received = ReadFrom(fd, "0\r\n\r\n", static_cast<size_t>(pick(1, 4000)));
    } else {
      if (mode == kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(pick(0, 300)));
      received = ReadFrom(fd, "", SIZE_MAX,
                          mode == kSlow ? std::chrono::microseconds(2000) : std::chrono::microseconds{});
    }
    close(fd);
    const size_t want_ids = static_cast<size_t>(max_tokens) * n;
    switch (mode) {
      case kHangUp:
        return note("hang up");
      case kGarbage:
        return note("garbage", received.rfind("HTTP/1.1 400 ", 0) == 0 ? "" : received.substr(0, 80));
      case kFull:
      case kSlow: {
        const std::optional<std::string> events = Dechunk(received);
        const Streamed got = events ? ParseSse(*events) : Streamed{};
        const bool ok = events && got.done && got.ids.size() == want_ids;
        return note(mode == kFull ? "full" : "slow",
                    ok ? "" : absl::StrCat(received.size(), " bytes, ", got.ids.size(), " of ",
                                           want_ids, " ids"));
      }
      case kPipeline: {
        const size_t second = received.find("HTTP/1.1 200", 1);
        const std::optional<std::string> events =
            Dechunk(received.substr(0, second == std::string::npos ? received.size() : second));
        const Streamed got = events ? ParseSse(*events) : Streamed{};
        const size_t json_at =
            second == std::string::npos ? std::string::npos : received.find("\r\n\r\n", second);
        const Json plain = json_at == std::string::npos
                               ? Json()
                               : Json::parse(received.substr(json_at + 4), nullptr, false);
        const bool ok = got.done && got.ids.size() == want_ids && plain.is_object() &&
                        plain["usage"]["completion_tokens"] == static_cast<int>(want_ids);
        return note("pipeline", ok ? "" : received.substr(0, 200));
      }
    }
  };
#ifdef TANDEM_SANITIZER_BUILD
  const int rounds = 3, clients = 24;  // ThreadSanitizer: 33 s for 2 x 24
#else
  const int rounds = 3, clients = 48;
#endif
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back(client, seed + static_cast<uint32_t>(round * 1000 + i));
    }
    for (std::thread& t : threads) t.join();
  }
  for (const std::string& f : failures) ADD_FAILURE() << f;
  for (const auto& [outcome, count] : outcomes) std::cout << outcome << ": " << count << "\n";
  auto stub = GenerationStub(scheduler_.address());
  EXPECT_TRUE(WaitFor([&] {
    const v1::GetStatsResponse stats = GetStats(stub.get());
    return stats.num_running() == 0 && stats.num_waiting() == 0 &&
           stats.num_free_blocks() == stats.num_total_blocks();
  })) << GetStats(stub.get()).DebugString();
  EXPECT_TRUE(WaitFor([&] {
    return Metric(Get(frontend_.address(), "/metrics"), "tandem_frontend_requests_in_flight") == 0;
  }));
  EXPECT_TRUE(frontend_.process.running());
}

// The established TCP connections of process `pid` to local port
// `remote_port`: its sockets' inodes, looked up in /proc/net/tcp and tcp6
// (gRPC dials IPv4 through an IPv6 socket where it can).
int ConnectionsTo(pid_t pid, int remote_port) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(fd_dir)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream tcp(table);
    std::string line;
    std::getline(tcp, line);  // the header
    while (std::getline(tcp, line)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      const int port = std::stoi(remote.substr(remote.find(':') + 1), nullptr, 16);
      if (state == "01" && port == remote_port && inodes.count(inode) > 0) ++count;
    }
  }
  return count;
}

TEST_F(FrontendTest, CallsSpreadOverTheConfiguredConnectionsToAReplica) {
  Service pooled =
      StartFrontend(dir_, "pooled", {scheduler_.address()},
                    {"--tokenizer", kLlama2Tokenizer, "--connections-per-replica", "3"});
  Service single =
      StartFrontend(dir_, "single", {scheduler_.address()},
                    {"--tokenizer", kLlama2Tokenizer, "--connections-per-replica", "1"});
  const Json body = {{"prompt", "Once"}, {"max_tokens", 2}, {"temperature", 0}};
  for (int i = 0; i < 6; ++i) {
    for (const Service* f : {&pooled, &single}) {
      const HttpResult r = Post(f->address(), "/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.raw;
    }
  }
  // Calls take the connections in turn; health checks use the first.
  EXPECT_EQ(ConnectionsTo(pooled.process.pid(), scheduler_.port), 3);
  EXPECT_EQ(ConnectionsTo(single.process.pid(), scheduler_.port), 1);

  std::string out;
  EXPECT_NE(RunCommand({BinaryPath("services/frontend/tandem-frontend"), "--scheduler",
                        scheduler_.address(), "--tokenizer", kLlama2Tokenizer,
                        "--listen", "127.0.0.1:0", "--connections-per-replica", "0"},
                       &out),
            0);
  EXPECT_NE(out.find("--connections-per-replica must be 1 to 64"), std::string::npos) << out;
}

}  // namespace
}  // namespace tandem::testing
