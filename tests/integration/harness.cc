#include <algorithm>
#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

extern char** environ;

namespace tandem::testing {

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = other.pid_;
    exit_status_ = other.exit_status_;
    other.pid_ = -1;
  }
  return *this;
}

bool Process::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) exit_status_ = status;
  pid_ = -1;  // exited (or not our child any more)
  return false;
}

Process::~Process() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

Process Process::Spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Children start with default signal handling and no blocked signals.
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Process p;
  int rc = posix_spawn(&p.pid_, argv[0].c_str(), &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << argv[0] << " failed: " << rc;
    p.pid_ = -1;
  }
  return p;
}

void Process::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> Process::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      exit_status_ = status;
      return status;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int RunCommand(const std::vector<std::string>& argv, std::string* output,
               std::chrono::milliseconds timeout) {
  char path[] = "/tmp/tandem-command-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) {
    ADD_FAILURE() << "mkstemp failed";
    return -1;
  }
  ::close(fd);
  Process p = Process::Spawn(argv, path);
  std::optional<int> status = p.Wait(timeout);
  if (!status.has_value()) ADD_FAILURE() << argv[0] << " did not exit within the timeout";
  *output = ReadFile(path);
  std::remove(path);
  if (!status.has_value() || !WIFEXITED(*status)) return -1;
  return WEXITSTATUS(*status);
}

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* dir = mkdtemp(buf.data());
  EXPECT_NE(dir, nullptr);
  return dir == nullptr ? "/tmp" : std::string(dir);
}

std::string BinaryPath(const std::string& relative) {
  return std::string(TANDEM_BINARY_DIR) + "/" + relative;
}

std::string ModelPath() { return std::string(TANDEM_SHARED_DIR) + "/models/stories260K.bin"; }

namespace {

int WaitForPortFile(const std::string& path, Process* process, const std::string& log) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream f(path);
    int port = 0;
    if (f >> port && port > 0) return port;
    if (process->Wait(std::chrono::milliseconds(0)).has_value()) {
      std::ifstream l(log);
      std::stringstream ss;
      ss << l.rdbuf();
      ADD_FAILURE() << "process exited before listening; log:\n" << ss.str();
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "no port file " << path;
  return 0;
}

// Spawns `binary` with `args` plus --listen 127.0.0.1:0 --port-file and
// waits until it listens.
Service SpawnService(const std::string& dir, const std::string& name, const std::string& binary,
                     std::vector<std::string> args, const std::vector<std::string>& extra_args) {
  const std::string port_file = dir + "/" + name + ".port";
  std::remove(port_file.c_str());
  args.insert(args.begin(), BinaryPath(binary));
  args.insert(args.end(), {"--listen", "127.0.0.1:0", "--port-file", port_file});
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  Service s;
  s.log_path = dir + "/" + name + ".log";
  s.process = Process::Spawn(args, s.log_path);
  s.port = WaitForPortFile(port_file, &s.process, s.log_path);
  return s;
}

}  // namespace

Service StartWorker(const std::string& dir, const std::string& name,
                    const std::vector<std::string>& extra_args, bool wait_for_serving) {
  // stories260K unless extra_args names another --model, and the 64 MiB
  // cache the tests were written against unless they size it themselves
  // (the worker's own default is a share of the machine's memory, which
  // long tests with several workers would fill).
  auto has = [&](const char* flag) {
    return std::find(extra_args.begin(), extra_args.end(), flag) != extra_args.end();
  };
  std::vector<std::string> args;
  if (!has("--model")) args = {"--model", ModelPath()};
  if (!has("--kv-cache-bytes") && !has("--num-blocks")) {
    args.insert(args.end(), {"--kv-cache-bytes", std::to_string(64 << 20)});
  }
  Service s = SpawnService(dir, name, "services/worker/tandem-worker", args, extra_args);
  if (wait_for_serving) {
    EXPECT_TRUE(WaitFor([&] { return HealthStatus(s.address()) == 1; }))
        << "worker " << name << " never became SERVING (log " << s.log_path << ")";
  }
  return s;
}

Service StartScheduler(const std::string& dir, const std::string& name,
                       const std::string& worker_address,
                       const std::vector<std::string>& extra_args, bool wait_for_worker) {
  Service s = SpawnService(dir, name, "services/scheduler/tandem-scheduler",
                           {"--worker", worker_address}, extra_args);
  if (wait_for_worker) {
    auto stub = GenerationStub(s.address());
    EXPECT_TRUE(WaitFor([&] { return GetStats(stub.get()).worker_connected(); }))
        << "scheduler " << name << " never connected to its worker (log " << s.log_path << ")";
  }
  return s;
}

Service StartFrontend(const std::string& dir, const std::string& name,
                      const std::vector<std::string>& scheduler_targets,
                      const std::vector<std::string>& extra_args, bool wait_for_serving) {
  std::vector<std::string> args;
  for (const std::string& t : scheduler_targets) args.insert(args.end(), {"--scheduler", t});
  Service s = SpawnService(dir, name, "services/frontend/tandem-frontend", args, extra_args);
  if (wait_for_serving) {
    EXPECT_TRUE(WaitFor([&] { return HttpGetStatus(s.address(), "/health") == 200; }))
        << "frontend " << name << " never served (log " << s.log_path << ")";
  }
  return s;
}

int ConnectTcp(const std::string& address, const std::function<void(int fd)>& before_connect) {
  const size_t colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (before_connect) before_connect(fd);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

namespace {
// A plain HTTP/1.1 GET over a socket (the harness needs no HTTP library):
// the whole response, "" when none came.
std::string HttpGet(const std::string& address, const std::string& path) {
  const int fd = ConnectTcp(address, [](int fd) {
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  });
  if (fd < 0) return "";
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::string response;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) >= 0) {
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
  }
  close(fd);
  return response;
}
}  // namespace

int HttpGetStatus(const std::string& address, const std::string& path) {
  const std::string response = HttpGet(address, path);
  int status = -1;
  if (response.size() > 12 && std::sscanf(response.c_str(), "HTTP/1.1 %d", &status) == 1) {
    return status;
  }
  return -1;
}

std::string HttpGetBody(const std::string& address, const std::string& path) {
  const std::string response = HttpGet(address, path);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

std::string MetricsAddress(const Service& service) {
  const std::string log = ReadFile(service.log_path);
  const std::string mark = "metrics on http://";
  const size_t at = log.find(mark);
  if (at == std::string::npos) return "";
  const size_t start = at + mark.size();
  const size_t slash = log.find('/', start);
  if (slash == std::string::npos) return "";
  return log.substr(start, slash - start);
}

double ScrapeMetric(const Service& service, const std::string& series) {
  const std::string address = MetricsAddress(service);
  if (address.empty()) return -1;
  const std::string page = HttpGetBody(address, "/metrics");
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

std::vector<GenerateResult> RunConcurrently(v1::Generation::Stub* stub,
                                            const std::vector<v1::GenerateRequest>& requests,
                                            const std::function<void()>& meanwhile,
                                            std::chrono::milliseconds timeout) {
  std::vector<GenerateResult> results(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = RunGenerate(stub, requests[i], timeout); });
  }
  if (meanwhile) meanwhile();
  for (auto& t : threads) t.join();
  return results;
}

int HealthStatus(const std::string& address, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, request, &response).ok()) return -1;
  return static_cast<int>(response.status());
}

GenerateResult RunGenerate(v1::Generation::Stub* stub, const v1::GenerateRequest& request,
                           std::chrono::milliseconds timeout) {
  GenerateResult result;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    result.tokens.insert(result.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
    if (!msg.has_usage()) ++result.messages_without_usage;
    result.usage_so_far.emplace_back(msg.usage(), static_cast<int32_t>(result.tokens.size()));
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      result.finish_reason = msg.finish_reason();
      result.usage = msg.usage();
    }
    // Any message's, so that a flag out of place (not the last) shows.
    result.last_token_stops |= msg.last_token_stops();
  }
  result.status = reader->Finish();
  return result;
}

v1::GenerateRequest MakeRequest(std::vector<int32_t> prompt, int32_t max_tokens, float temperature,
                                std::optional<uint64_t> seed, bool ignore_eos) {
  v1::GenerateRequest r;
  r.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_max_tokens(max_tokens);
  s->set_temperature(temperature);
  if (seed.has_value()) {
    s->set_seed(*seed);
    s->set_has_seed(true);
  }
  s->set_ignore_eos(ignore_eos);
  return r;
}

std::unique_ptr<v1::Generation::Stub> GenerationStub(const std::string& address) {
  grpc::ChannelArguments args;
  // Many concurrent streams from one test: don't queue behind the default
  // per-connection stream limit of the server.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::Generation::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

std::unique_ptr<v1::Worker::Stub> WorkerStub(const std::string& address) {
  return v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

v1::GetStatsResponse GetStats(v1::Generation::Stub* stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::GetStatsResponse r;
  stub->GetStats(&context, {}, &r).ok();
  return r;
}

v1::DescribeResponse Describe(v1::Worker::Stub* stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::DescribeResponse r;
  stub->Describe(&context, {}, &r).ok();
  return r;
}

}  // namespace tandem::testing
