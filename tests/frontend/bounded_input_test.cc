// Unauthenticated work without bounds (issue 29), through the real frontend
// binary and an in-process fake scheduler (max_model_len 256): a prompt
// longer than any the model can take is refused before the tokenizer sees
// it; /tokenize and /detokenize need the API key when one is set; a long URL
// gets 414 and huge headers 431 (not 413 naming the body limit); a chat
// message with content null gets a 400 naming messages[i].content unless it
// is an assistant turn with tool_calls; connections over --max-connections
// get 503, and an accept loop out of descriptors waits instead of spinning;
// JSON nested too deep is a 400 on every route.
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

const std::string kTokenizer = std::string(TANDEM_SHARED_DIR) + "/models/tokenizer.bin";
constexpr int32_t kMaxModelLen = 256;

struct Result {
  int status = -1;
  Json body;
  std::string message, param;  // the error's
};

Result Post(const std::string& address, const std::string& path, const std::string& body,
            const std::string& key = "") {
  httplib::Client client("http://" + address);
  client.set_read_timeout(20, 0);
  httplib::Headers headers;
  if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
  auto res = client.Post(path, headers, body, "application/json");
  Result out;
  if (!res) return out;
  out.status = res->status;
  out.body = Json::parse(res->body, nullptr, false);
  if (out.body.is_object() && out.body.contains("error")) {
    out.message = out.body["error"].value("message", "");
    if (out.body["error"]["param"].is_string()) out.param = out.body["error"]["param"];
  }
  return out;
}

// Sends `request` over a fresh connection and returns the status of the
// answer (-1 when none came).
int RawStatus(const std::string& address, const std::string& request) {
  const int fd = ConnectTcp(address, [](int fd) {
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  });
  if (fd < 0) return -1;
  // The server may answer and close before it has read everything: send
  // what it takes, then read.
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  char buf[256] = {};
  const ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
  close(fd);
  int status = -1;
  if (n > 12 && std::sscanf(buf, "HTTP/1.1 %d", &status) == 1) return status;
  return -1;
}

class FrontendBoundedInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::LoadTokenizer(kTokenizer);
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (int32_t id = 0; id < (*tok)->vocab_size(); ++id) {
      max_token_bytes_ = std::max<int64_t>(max_token_bytes_, (*tok)->IdToPiece(id)->size());
    }
    dir_ = MakeTempDir("frontend-bounded");
    const std::string tmpl = dir_ + "/template.jinja";
    std::ofstream(tmpl) << "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                           "{% endfor %}";
    scheduler_ = std::make_unique<FakeScheduler>(FakeModelInfo("bounded", 32000, kMaxModelLen));
    frontend_ = StartFrontend(dir_, "frontend", {scheduler_->address()},
                              {"--tokenizer", kTokenizer, "--chat-template", tmpl});
  }

  // max_model_len x the longest vocabulary entry (Frontend::PromptByteLimit).
  int64_t limit() const { return int64_t{kMaxModelLen} * max_token_bytes_; }

  int64_t max_token_bytes_ = 1;
  std::string dir_;
  std::unique_ptr<FakeScheduler> scheduler_;
  Service frontend_;
};

TEST_F(FrontendBoundedInputTest, PromptLongerThanAnyValidPromptIsRefusedBeforeTokenizing) {
  const std::string named = "at most " + std::to_string(limit()) + " bytes";
  const std::string at_limit(static_cast<size_t>(limit()), 'a');
  const std::string over_limit = at_limit + "a";
  // At the bound the prompt is tokenized (and is then too long in tokens).
  Result r = Post(frontend_.address(), "/v1/completions", Json{{"prompt", at_limit}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["code"], "context_length_exceeded") << r.message;
  // One byte more: refused by size, naming the bound, on every path.
  r = Post(frontend_.address(), "/v1/completions", Json{{"prompt", over_limit}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.param, "prompt");
  EXPECT_NE(r.message.find(named), std::string::npos) << r.message;
  r = Post(frontend_.address(), "/v1/completions",
           Json{{"prompt", {"Once", over_limit}}}.dump());
  EXPECT_NE(r.message.find(named), std::string::npos) << r.message;
  r = Post(frontend_.address(), "/tokenize", Json{{"prompt", over_limit}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.message.find(named), std::string::npos) << r.message;
  const Json chat = {{"messages", {{{"role", "user"}, {"content", over_limit}}}}};
  r = Post(frontend_.address(), "/v1/chat/completions", chat.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.param, "messages");
  EXPECT_NE(r.message.find(named), std::string::npos) << r.message;
  r = Post(frontend_.address(), "/tokenize", chat.dump());
  EXPECT_NE(r.message.find(named), std::string::npos) << r.message;
  // truncate_prompt_tokens does not lift the bound (DESIGN-NOTES.md).
  r = Post(frontend_.address(), "/v1/completions",
           Json{{"prompt", over_limit}, {"truncate_prompt_tokens", 8}}.dump());
  EXPECT_NE(r.message.find(named), std::string::npos) << r.message;
  EXPECT_TRUE(scheduler_->requests().empty());
  // 16 MiB costs no tokenizer time: llama2.c's BPE would take minutes.
  const auto start = std::chrono::steady_clock::now();
  r = Post(frontend_.address(), "/tokenize",
           Json{{"prompt", std::string(16 << 20, 'a')}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.message.find(named), std::string::npos) << r.message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// The frontend's resident memory (VmRSS) in KiB.
int64_t RssKib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.starts_with("VmRSS:")) return std::stoll(line.substr(6));
  }
  return -1;
}

// Large bodies do not stay resident once answered (the frontend fixes
// glibc's mmap threshold at 1 MiB). Without that four 24 MiB bodies left
// about 150 MiB behind; the bound is 32 MiB over the idle figure.
// A body of 100,000 nested brackets (200 KB) ran the frontend out of stack;
// every JSON route refuses it with a 400 and the server serves on.
TEST_F(FrontendBoundedInputTest, DeeplyNestedBodiesAreRefusedOnEveryRoute) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string chat = R"({"messages":[{"role":"user","content":"hi"}],)";
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/completions", R"({"prompt":"hi","chat_template_kwargs":{"a":)" + deep + "}}"},
           {"/v1/chat/completions", chat + R"("chat_template_kwargs":{"a":)" + deep + "}}"},
           {"/v1/responses", R"({"input":"hi","metadata":{"a":)" + deep + "}}"},
           {"/tokenize", R"({"prompt":"hi","x":)" + deep + "}"},
           {"/detokenize", R"({"tokens":[1],"x":)" + deep + "}"}}) {
    const Result r = Post(frontend_.address(), path, body);
    EXPECT_EQ(r.status, 400) << path;
    EXPECT_NE(r.message.find("more than 1000 deep"), std::string::npos)
        << path << ": " << r.message;
  }
  EXPECT_EQ(Post(frontend_.address(), "/tokenize", Json{{"prompt", "hi"}}.dump()).status, 200);
}

TEST_F(FrontendBoundedInputTest, LargeBodiesGiveTheirMemoryBack) {
  ASSERT_EQ(Post(frontend_.address(), "/tokenize", Json{{"prompt", "hi"}}.dump()).status, 200);
  const int64_t idle = RssKib(frontend_.process.pid());
  ASSERT_GT(idle, 0);
  const std::string body = Json{{"prompt", std::string(24 << 20, 'a')}}.dump();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      EXPECT_EQ(Post(frontend_.address(), i % 2 ? "/tokenize" : "/v1/completions", body).status,
                400);
    });
  }
  for (std::thread& t : threads) t.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t after = RssKib(frontend_.process.pid());
  EXPECT_LT(after - idle, 32 << 10) << "idle " << idle << " KiB, after " << after << " KiB";
}

TEST_F(FrontendBoundedInputTest, TokenizeAndDetokenizeNeedTheKeyWhenOneIsSet) {
  const std::string tokenize = Json{{"prompt", "Once upon"}}.dump();
  const std::string detokenize = Json{{"tokens", {1, 9038}}}.dump();
  // No key set: open to all.
  EXPECT_EQ(Post(frontend_.address(), "/tokenize", tokenize).status, 200);
  EXPECT_EQ(Post(frontend_.address(), "/detokenize", detokenize).status, 200);
  const std::string key_file = dir_ + "/key";
  std::ofstream(key_file) << "sk-bounded\n";
  Service keyed = StartFrontend(dir_, "keyed", {scheduler_->address()},
                                {"--tokenizer", kTokenizer, "--api-key-file", key_file});
  for (const auto& [path, body] : {std::pair{"/tokenize", tokenize}, {"/detokenize", detokenize}}) {
    SCOPED_TRACE(path);
    Result r = Post(keyed.address(), path, body);
    EXPECT_EQ(r.status, 401);
    EXPECT_EQ(r.body["error"]["code"], "invalid_api_key");
    EXPECT_EQ(Post(keyed.address(), path, body, "sk-wrong").status, 401);
    EXPECT_EQ(Post(keyed.address(), path, body, "sk-bounded").status, 200);
  }
  EXPECT_EQ(HttpGetStatus(keyed.address(), "/health"), 200) << "probes need no key";
}

TEST_F(FrontendBoundedInputTest, LongUrlGets414AndHugeHeadersGet431) {
  const std::string address = frontend_.address();
  auto get = [](const std::string& target, const std::string& headers) {
    return "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n";
  };
  EXPECT_EQ(RawStatus(address, get("/health", "")), 200);
  // Over --max-url-bytes (default 16 KiB) but inside the header limit.
  EXPECT_EQ(RawStatus(address, get("/health?" + std::string(20 << 10, 'q'), "")), 414);
  // Over the whole header limit (64 KiB) by the URL alone.
  EXPECT_EQ(RawStatus(address, get("/health?" + std::string(100 << 10, 'q'), "")), 414);
  // A short URL and one huge header; many headers.
  EXPECT_EQ(RawStatus(address, get("/health", "X-Big: " + std::string(100 << 10, 'h') + "\r\n")),
            431);
  std::string many;
  for (int i = 0; i < 2000; ++i) many += "X-H" + std::to_string(i) + ": " + std::string(40, 'v') + "\r\n";
  EXPECT_EQ(RawStatus(address, get("/health", many)), 431);
  // A body over the body limit is still 413.
  EXPECT_EQ(RawStatus(address, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: "
                               "application/json\r\nContent-Length: 40000000\r\n\r\n{"),
            413);
}

// Broken framing, and an HTTP version other than 1.0 and 1.1, are answered
// with a 400, not closed without a word; the server goes on serving.
TEST_F(FrontendBoundedInputTest, MalformedFramingAndUnknownVersionsGet400) {
  const std::string address = frontend_.address();
  const std::string head =
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  const std::string body = R"({"prompt":"hi"})";
  const std::string length = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  // Two different Content-Lengths; Content-Length with chunked; a chunk
  // size that is not hex; a header line without a colon.
  EXPECT_EQ(RawStatus(address, head + length + "Content-Length: 3\r\n\r\n" + body), 400);
  EXPECT_EQ(RawStatus(address, head + length + "Transfer-Encoding: chunked\r\n\r\n" + body), 400);
  EXPECT_EQ(RawStatus(address,
                      head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + "\r\n0\r\n\r\n"),
            400);
  EXPECT_EQ(RawStatus(address, head + "no colon here\r\n" + length + "\r\n" + body), 400);
  EXPECT_EQ(RawStatus(address, "GET /health HTTP/9.9\r\nHost: x\r\n\r\n"), 400);
  EXPECT_EQ(RawStatus(address, "GET /health HTTP/2.0\r\nHost: x\r\n\r\n"), 400);
  EXPECT_EQ(RawStatus(address, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
  EXPECT_EQ(RawStatus(address, "GET /health HTTP/1.0\r\n\r\n"), 200);
}

TEST_F(FrontendBoundedInputTest, NullContentIsRefusedUnlessAnAssistantCalledTools) {
  Result r = Post(frontend_.address(), "/v1/chat/completions",
                  R"({"messages":[{"role":"system","content":"be brief"},
                                  {"role":"user","content":null}]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.param, "messages[1].content");
  EXPECT_NE(r.message.find("messages[1].content is null"), std::string::npos) << r.message;
  r = Post(frontend_.address(), "/v1/chat/completions",
           R"({"messages":[{"role":"assistant","content":null}]})");
  EXPECT_EQ(r.param, "messages[0].content") << "no tool_calls";
  r = Post(frontend_.address(), "/tokenize", R"({"messages":[{"role":"user","content":null}]})");
  EXPECT_EQ(r.param, "messages[0].content");
  // An assistant turn that only called tools has no content.
  r = Post(frontend_.address(), "/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"What time is it?"},
                           {"role":"assistant","content":null,"tool_calls":[{"id":"c1",
                            "type":"function","function":{"name":"now","arguments":"{}"}}]},
                           {"role":"tool","tool_call_id":"c1","content":"noon"}]})");
  EXPECT_EQ(r.status, 200) << r.body.dump();
}

TEST_F(FrontendBoundedInputTest, ConnectionsOverTheCapGet503) {
  Service capped = StartFrontend(dir_, "capped", {scheduler_->address()},
                                 {"--tokenizer", kTokenizer, "--max-connections", "3"});
  // StartFrontend's /health probes are closed, but their sessions end
  // asynchronously: wait until a fresh connection is taken again.
  ASSERT_TRUE(WaitFor([&] { return HttpGetStatus(capped.address(), "/health") == 200; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(ConnectTcp(capped.address()));
    ASSERT_GE(held.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted
  EXPECT_EQ(RawStatus(capped.address(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"), 503);
  // A held connection is served; once the held ones close, a new one is
  // taken.
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(held[0], get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  char buf[64] = {};
  ASSERT_GT(recv(held[0], buf, sizeof(buf) - 1, 0), 12);
  EXPECT_EQ(std::string(buf, 12), "HTTP/1.1 200");
  for (int fd : held) close(fd);
  EXPECT_TRUE(WaitFor([&] { return HttpGetStatus(capped.address(), "/health") == 200; }));
}

// utime + stime of `pid`, in clock ticks.
int64_t CpuTicks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string skip;
  for (int i = 0; i < 11; ++i) fields >> skip;  // state .. cmajflt
  int64_t utime = 0, stime = 0;
  fields >> utime >> stime;
  return utime + stime;
}

TEST_F(FrontendBoundedInputTest, AcceptOutOfDescriptorsWaitsInsteadOfSpinning) {
  // The frontend inherits a small open-file limit, and a cap above it.
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 128;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  Service frontend = StartFrontend(dir_, "few-files", {scheduler_->address()},
                                   {"--tokenizer", kTokenizer, "--max-connections", "1000"});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  std::vector<int> held;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectTcp(frontend.address());
    if (fd >= 0) held.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t before = CpuTicks(frontend.process.pid());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t ticks = CpuTicks(frontend.process.pid()) - before;
  EXPECT_LT(ticks, 20) << "the accept loop spun for " << ticks << " ticks of one second";
  for (int fd : held) close(fd);
  EXPECT_TRUE(WaitFor([&] { return HttpGetStatus(frontend.address(), "/health") == 200; }))
      << "accepting again once descriptors free";
  EXPECT_NE(ReadFile(frontend.log_path).find("retrying every"), std::string::npos);
}

}  // namespace
}  // namespace tandem::testing
