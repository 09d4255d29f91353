// The frontend's drain (SIGTERM), through the real binary and an in-process
// fake scheduler: a request that was answered before the signal, but whose
// Generate call ends only after the listener has closed, is over when its
// call ends; the drain does not wait out --drain-timeout-s for it.
//
// The call's end is posted to the connection's I/O executor. Once the
// listener is closed and no connection has work, nothing else keeps the I/O
// threads running; without a work guard they returned, the post never ran,
// and the request stayed "in flight" until the drain timeout cut it off.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {
namespace {

const std::string kTokenizer = std::string(TANDEM_SHARED_DIR) + "/models/tokenizer.bin";

// POSTs a completion over a connection the client closes after the answer
// (Connection: close); returns the whole answer ("" when none came).
std::string PostAndClose(const std::string& address, const nlohmann::json& json = nlohmann::json{
                                                         {"prompt", "Once"}, {"max_tokens", 2}}) {
  const std::string body = json.dump();
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  const int fd = ConnectTcp(address, [](int fd) {
    timeval tv{.tv_sec = 20, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  });
  if (fd < 0) return "";
  std::string answer;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  }
  close(fd);
  return answer;
}

TEST(FrontendDrainTest, ACallThatEndsAfterTheListenerClosedEndsItsRequest) {
  const std::string dir = MakeTempDir("frontend-drain");
  FakeScheduler scheduler(FakeModelInfo("drain"));
  scheduler.SetOutput({100, 101}, v1::FINISH_REASON_LENGTH);
  scheduler.HoldStreamEnds();
  Service frontend = StartFrontend(dir, "frontend", {scheduler.address()},
                                   {"--tokenizer", kTokenizer, "--drain-timeout-s", "300"});

  // Answered in full (the last message carries the finish reason), while
  // the scheduler still holds the call open.
  const std::string answer = PostAndClose(frontend.address());
  ASSERT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  ASSERT_NE(answer.find("\"finish_reason\":\"length\""), std::string::npos) << answer;
  ASSERT_TRUE(WaitFor([&] { return scheduler.held_ends() == 1; }));

  frontend.process.Signal(SIGTERM);
  // The listener is closed: no connection is open and none is accepted, so
  // the I/O threads have nothing of their own to wait for.
  ASSERT_TRUE(WaitFor([&] {
    const int fd = ConnectTcp(frontend.address());
    if (fd >= 0) close(fd);
    return fd < 0;
  })) << ReadFile(frontend.log_path);

  // The call ends now; its request is over, and so is the drain.
  scheduler.ReleaseStreamEnds();
  const std::optional<int> status = frontend.process.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value()) << "the frontend is still draining a request that is over\n"
                                  << ReadFile(frontend.log_path);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  const std::string log = ReadFile(frontend.log_path);
  EXPECT_EQ(log.find("drain timeout"), std::string::npos) << log;
}

// A stream still open when the drain runs out ends as a failed request: an
// error event, then [DONE], then the connection closes. It was cut mid-stream,
// and a client could not tell a shutdown from an answer that simply ended.
TEST(FrontendDrainTest, AStreamOpenWhenTheDrainRunsOutEndsWithAnErrorEvent) {
  const std::string dir = MakeTempDir("frontend-drain");
  FakeScheduler scheduler(FakeModelInfo("drain"));
  // Tokens, then the stream stays open without a finish reason.
  scheduler.SetOutput({100, 101}, v1::FINISH_REASON_UNSPECIFIED);
  scheduler.HoldStreamEnds();
  Service frontend = StartFrontend(dir, "frontend", {scheduler.address()},
                                   {"--tokenizer", kTokenizer, "--drain-timeout-s", "1"});
  std::string answer;
  std::thread client([&] {
    answer =
        PostAndClose(frontend.address(), {{"prompt", "Once"}, {"max_tokens", 8}, {"stream", true}});
  });
  ASSERT_TRUE(WaitFor([&] { return scheduler.held_ends() == 1; }));
  frontend.process.Signal(SIGTERM);
  client.join();
  scheduler.ReleaseStreamEnds();
  ASSERT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  const size_t error = answer.find("\"error\"");
  ASSERT_NE(error, std::string::npos) << answer;
  EXPECT_NE(answer.find("shutting down", error), std::string::npos) << answer;
  EXPECT_NE(answer.find("data: [DONE]", error), std::string::npos) << answer;
  const std::optional<int> status = frontend.process.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
}

}  // namespace
}  // namespace tandem::testing
