#include "serve.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kUsage[] = R"(Usage: tandem serve MODEL [flags]
Starts tandem-worker, tandem-scheduler and tandem-frontend (and tandem-kvstore
with --kv-store) on this machine and serves MODEL over the OpenAI API until
SIGINT/SIGTERM, like `vllm serve MODEL`.

  MODEL                      a Hugging Face directory or a llama2.c .bin (then
                             give --tokenizer)
  --host H                   the API's address (default 0.0.0.0)
  --port P                   the API's port (default 8000)
  --served-model-name N...   the names the API serves (default: the model's
                             directory name, and MODEL as given, as vLLM names it)
  --kv-store                 also start a KV-store (tandem-kvstore) for the replica
  --kv-store-dir DIR         its data directory (default: a new one under /tmp,
                             removed at exit)
  --kvstore HOST:PORT        use a running KV-store instead
  --metrics-listen H:P       the scheduler's own /metrics port (default: a free
                             loopback port); its tandem_* and vllm:* series are
                             also on the API port's /metrics, after the
                             frontend's, as vllm serve serves them (empty: off)
  vLLM's --max-num-seqs, --max-num-batched-tokens,
  --[no-]enable-prefix-caching, --[no-]enable-chunked-prefill, --block-size,
  --dtype, --disable-sliding-window, --api-key, --chat-template, --tokenizer,
  --disable-log-requests, --generation-config auto go to the part that owns them; any other flag goes
  to each part whose --help lists it (e.g. --backend cuda, --threads 2;
  --max-model-len to the scheduler and the worker).
)";

struct Part {
  std::string name;    // tandem-worker
  std::string binary;  // its path
  std::vector<std::string> args;
  std::map<std::string, bool> flags;  // its --help: name -> takes no value
  pid_t pid = -1;
  int exit_status = 0;
};

class UsageError {
 public:
  explicit UsageError(std::string message) : message(std::move(message)) {}
  std::string message;
};

std::string SelfDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

// The part's binary: $TANDEM_BIN_DIR, beside `tandem`, or the build tree's
// services/<dir>/.
std::string FindBinary(const std::string& name, const std::string& dir) {
  std::vector<fs::path> candidates;
  if (const char* bin = std::getenv("TANDEM_BIN_DIR")) candidates.push_back(fs::path(bin) / name);
  const fs::path self = SelfDir();
  candidates.push_back(self / name);
  candidates.push_back(self / ".." / ".." / "services" / dir / name);
  for (const fs::path& p : candidates) {
    if (access(p.c_str(), X_OK) == 0) return fs::weakly_canonical(p).string();
  }
  throw UsageError("cannot find " + name + " (looked in $TANDEM_BIN_DIR, beside tandem, and " +
                   (self / ".." / ".." / "services" / dir).string() + ")");
}

// The flags a binary's --help lists: "  --name[, --alias] (default: ...)";
// a flag with a --no- form takes no value.
std::map<std::string, bool> FlagsOf(const std::string& binary) {
  std::map<std::string, bool> out;
  FILE* pipe = popen((binary + " --help 2>&1").c_str(), "r");
  if (pipe == nullptr) return out;
  static const std::regex kLine(R"(^  (--[a-z0-9-]+(?:, --[a-z0-9-]+)*) \(default)");
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) {
    std::cmatch m;
    if (!std::regex_search(buf, m, kLine)) continue;
    std::vector<std::string> names;
    bool is_bool = false;
    for (const std::string& n : std::vector<std::string>(absl::StrSplit(m[1].str(), ", "))) {
      names.push_back(n.substr(2));
      if (absl::StartsWith(n, "--no-")) is_bool = true;
    }
    for (const std::string& n : names) out[n] = is_bool;
  }
  pclose(pipe);
  return out;
}

// One parsed command line.
struct ServeConfig {
  std::string model;
  std::string host = "0.0.0.0";
  std::string port = "8000";
  std::vector<std::string> served_model_names;
  bool kv_store = false;
  std::string kv_store_dir;
  std::string kvstore_address;
  std::string tokenizer;
  bool https = false;
};

// vLLM's flags, each for the one part that takes it (--metrics-listen,
// which every part takes, for the scheduler: its series are vLLM's). Whether
// one takes a value is read from that part's --help.
const std::map<std::string, std::string>& OwnerOf() {
  static const auto* owners = new std::map<std::string, std::string>{
      {"max-num-seqs", "tandem-scheduler"},
      {"max-num-batched-tokens", "tandem-scheduler"},
      {"max-logprobs", "tandem-scheduler"},
      {"metrics-listen", "tandem-scheduler"},
      {"enable-prefix-caching", "tandem-scheduler"},
      {"no-enable-prefix-caching", "tandem-scheduler"},
      {"enable-chunked-prefill", "tandem-scheduler"},
      {"no-enable-chunked-prefill", "tandem-scheduler"},
      {"disable-log-requests", "tandem-scheduler"},
      {"block-size", "tandem-worker"},
      {"gpu-memory-utilization", "tandem-worker"},
      {"dtype", "tandem-worker"},
      {"disable-sliding-window", "tandem-worker"},
      {"api-key", "tandem-frontend"},
      {"chat-template", "tandem-frontend"},
  };
  return *owners;
}
// vLLM flags we cannot honour yet: refused with the reason.
const std::map<std::string, std::string>& Refused() {
  static const auto* refused = new std::map<std::string, std::string>{
      {"seed", "not supported: there is no engine-wide seed; give each request its own \"seed\""},
  };
  return *refused;
}
// Flags tandem serve sets itself.
const std::set<std::string>& Reserved() {
  static const auto* reserved =
      new std::set<std::string>{"listen", "port-file", "worker", "scheduler", "model", "data-dir"};
  return *reserved;
}

Part* FindPart(std::vector<Part>& parts, const std::string& name) {
  for (Part& p : parts) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// Parses argv[2..] into `config` and the parts' args.
void ParseArgs(int argc, char** argv, ServeConfig* config, std::vector<Part>& parts) {
  std::vector<std::string> args(argv + 2, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!absl::StartsWith(arg, "--")) {
      if (!config->model.empty()) {
        throw UsageError("unexpected argument '" + arg + "' (tandem serve takes one MODEL)");
      }
      config->model = arg;
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto take_value = [&]() -> std::string {
      if (value) return *value;
      if (i + 1 >= args.size()) throw UsageError("--" + name + " needs a value");
      return args[++i];
    };
    auto no_value = [&] {
      if (value) throw UsageError("--" + name + " takes no value");
    };
    if (name == "help") throw UsageError("");
    if (Reserved().count(name) != 0) {
      throw UsageError("--" + name +
                       ": tandem serve sets it for each part; give MODEL, --host "
                       "and --port instead");
    }
    if (auto it = Refused().find(name); it != Refused().end()) {
      throw UsageError("--" + name + ": " + it->second);
    }
    if (name == "host") {
      config->host = take_value();
    } else if (name == "port") {
      config->port = take_value();
    } else if (name == "served-model-name") {
      if (value) {
        config->served_model_names.push_back(*value);
      } else {
        while (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
          config->served_model_names.push_back(args[++i]);
        }
        if (config->served_model_names.empty()) throw UsageError("--" + name + " needs a value");
      }
    } else if (name == "kv-store") {
      no_value();
      config->kv_store = true;
    } else if (name == "kv-store-dir") {
      config->kv_store_dir = take_value();
    } else if (name == "kvstore") {
      config->kvstore_address = take_value();
    } else if (name == "tokenizer") {
      config->tokenizer = take_value();
    } else if (name == "generation-config") {
      const std::string v = take_value();
      if (v != "auto") {
        throw UsageError("--generation-config " + v +
                         ": only 'auto' (the model's generation_config.json, which the worker "
                         "always reads) is supported");
      }
    } else {
      // Its owner, or every part whose --help lists it.
      std::vector<Part*> owners;
      if (auto it = OwnerOf().find(name); it != OwnerOf().end()) {
        owners.push_back(FindPart(parts, it->second));
      } else {
        for (Part& p : parts) {
          if (p.flags.count(name) != 0) owners.push_back(&p);
        }
      }
      if (owners.empty()) {
        std::vector<std::string> names = {"tandem serve"};
        for (const Part& p : parts) names.push_back(p.name);
        throw UsageError("unknown flag --" + name + " (not a flag of " +
                         absl::StrJoin(names, ", ") + ")");
      }
      const auto known = owners.front()->flags.find(name);
      if (known == owners.front()->flags.end()) {
        throw UsageError("--" + name + ": " + owners.front()->name + " does not take it");
      }
      std::string forwarded = "--" + name;
      if (!known->second) {
        forwarded += "=" + take_value();
      } else if (value) {
        forwarded += "=" + *value;
      }
      if (name == "https-cert") config->https = true;
      for (Part* p : owners) p->args.push_back(forwarded);
    }
  }
  if (config->model.empty()) throw UsageError("MODEL is missing");
}

// The value a forwarded "--name=value" flag of `part` has, or nullopt.
std::optional<std::string> ForwardedValue(const Part& part, const std::string& name) {
  std::optional<std::string> out;
  const std::string prefix = "--" + name + "=";
  for (const std::string& a : part.args) {
    if (absl::StartsWith(a, prefix)) out = a.substr(prefix.size());
  }
  return out;
}

// The host to reach a server listening on `listen` (host:port) from this
// machine: loopback for an any-address.
std::string LocalHostOf(const std::string& listen) {
  const std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") return "127.0.0.1";
  return host;
}

// GET /health on the frontend: true on 200.
bool HealthOk(const std::string& host, const std::string& port) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  try {
    boost::asio::io_context io;
    boost::asio::ip::tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(2));
    stream.connect(resolver.resolve(host, port));
    http::request<http::empty_body> req{http::verb::get, "/health", 11};
    req.set(http::field::host, host);
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    return res.result_int() == 200;
  } catch (const std::exception&) {
    return false;
  }
}

class Supervisor {
 public:
  Supervisor(std::vector<Part>& parts, sigset_t signals) : parts_(parts), signals_(signals) {}

  // Starts `part`; its stdout and stderr are ours.
  void Start(Part& part, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {part.binary};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), part.args.begin(), part.args.end());
    std::cerr << "tandem serve: starting " << absl::StrJoin(argv, " ") << "\n";
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      std::vector<char*> c;
      for (std::string& a : argv) c.push_back(a.data());
      c.push_back(nullptr);
      execv(c[0], c.data());
      std::perror(("exec " + argv[0]).c_str());
      _exit(127);
    }
    part.pid = pid;
  }

  // Waits for `path` to hold a port while every part runs. Returns the
  // port, or nullopt when a part exited or a stop signal came.
  std::optional<std::string> WaitForPort(const std::string& path) {
    while (true) {
      std::ifstream f(path);
      std::string port;
      if (f >> port && !port.empty()) return port;
      if (!Poll(std::chrono::milliseconds(50))) return std::nullopt;
    }
  }

  // Sleeps up to `d` for a signal. False when a stop signal came or a part
  // exited (stop_reason_ says which).
  bool Poll(std::chrono::milliseconds d) {
    timespec ts{.tv_sec = d.count() / 1000, .tv_nsec = (d.count() % 1000) * 1000000};
    const int sig = sigtimedwait(&signals_, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) {
      stop_reason_ = sig == SIGINT ? "SIGINT" : "SIGTERM";
      stopped_by_signal_ = true;
      return false;
    }
    for (Part& p : parts_) {
      if (p.pid <= 0) continue;
      int status = 0;
      if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.pid = -1;
        p.exit_status = status;
        stop_reason_ = p.name + " exited (" + Describe(status) + ")";
        return false;
      }
    }
    return true;
  }

  // Waits until a stop signal or a part's exit.
  void Run() {
    while (Poll(std::chrono::milliseconds(500))) {
    }
  }

  // SIGTERM to each running part, front to back, each given `grace` to
  // drain (SIGKILL after it, or at once on a second signal).
  void StopAll(std::chrono::seconds grace) {
    std::cerr << "tandem serve: " << stop_reason_ << "; stopping\n";
    for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) {
      Part& p = *it;
      if (p.pid <= 0) continue;
      kill(p.pid, SIGTERM);
      const auto deadline = std::chrono::steady_clock::now() + grace;
      int status = 0;
      while (waitpid(p.pid, &status, WNOHANG) != p.pid) {
        timespec ts{.tv_sec = 0, .tv_nsec = 50'000'000};
        const int sig = sigtimedwait(&signals_, nullptr, &ts);
        if (sig == SIGINT || sig == SIGTERM || std::chrono::steady_clock::now() > deadline) {
          std::cerr << "tandem serve: killing " << p.name << "\n";
          kill(p.pid, SIGKILL);
          waitpid(p.pid, &status, 0);
          break;
        }
      }
      p.exit_status = status;
      std::cerr << "tandem serve: " << p.name << " stopped (" << Describe(status) << ")\n";
      p.pid = -1;
    }
  }

  [[nodiscard]] bool stopped_by_signal() const { return stopped_by_signal_; }

 private:
  static std::string Describe(int status) {
    if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
    return "status " + std::to_string(status);
  }

  std::vector<Part>& parts_;
  sigset_t signals_;
  std::string stop_reason_;
  bool stopped_by_signal_ = false;
};

}  // namespace

int Serve(int argc, char** argv) {
  // Blocked before any child exists, so none is lost; children unblock.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  sigprocmask(SIG_BLOCK, &signals, nullptr);

  ServeConfig config;
  std::vector<Part> parts;
  try {
    parts.push_back({.name = "tandem-kvstore", .binary = ""});
    parts.push_back({.name = "tandem-worker", .binary = FindBinary("tandem-worker", "worker")});
    parts.push_back(
        {.name = "tandem-scheduler", .binary = FindBinary("tandem-scheduler", "scheduler")});
    parts.push_back(
        {.name = "tandem-frontend", .binary = FindBinary("tandem-frontend", "frontend")});
    for (Part& p : parts) {
      if (!p.binary.empty()) p.flags = FlagsOf(p.binary);
    }
    ParseArgs(argc, argv, &config, parts);
    // The parts may run elsewhere than here: absolute paths.
    config.model = fs::absolute(config.model).string();
    if (!config.tokenizer.empty()) config.tokenizer = fs::absolute(config.tokenizer).string();
    if (config.kv_store && !config.kvstore_address.empty()) {
      throw UsageError("--kv-store starts a KV-store and --kvstore names a running one: give one");
    }
    if (config.kv_store) {
      parts[0].binary = FindBinary("tandem-kvstore", "kvstore");
    } else {
      if (!config.kv_store_dir.empty()) throw UsageError("--kv-store-dir needs --kv-store");
      parts.erase(parts.begin());
    }
    const bool model_is_dir = fs::is_directory(config.model);
    if (!fs::exists(config.model)) throw UsageError("MODEL " + config.model + " does not exist");
    if (!model_is_dir && config.tokenizer.empty()) {
      throw UsageError("MODEL " + config.model +
                       " is a llama2.c file: give its tokenizer with --tokenizer "
                       "(tokenizer.model, tokenizer.bin or tokenizer.json)");
    }
  } catch (const UsageError& e) {
    if (e.message.empty()) {
      std::cout << kUsage;
      return 0;
    }
    std::cerr << "tandem serve: " << e.message << "\n";
    return 2;
  }

  char tmpl[] = "/tmp/tandem-serve-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("tandem serve: mkdtemp");
    return 1;
  }
  const std::string run_dir = tmpl;
  Supervisor supervisor(parts, signals);
  // Stops what runs; 0 after SIGINT/SIGTERM, 1 when a part exited.
  auto fail = [&] {
    supervisor.StopAll(std::chrono::seconds(60));
    std::error_code ec;
    fs::remove_all(run_dir, ec);
    return supervisor.stopped_by_signal() ? 0 : 1;
  };

  std::string kvstore = config.kvstore_address;
  size_t next = 0;
  if (config.kv_store) {
    Part& kv = parts[next++];
    const std::string dir =
        config.kv_store_dir.empty() ? run_dir + "/kvstore" : config.kv_store_dir;
    // The worker, on this host, reads loaded blocks in place from the
    // store's shared memory (bulk_load_server.h, "Local socket").
    supervisor.Start(kv, {"--data-dir=" + dir, "--listen=127.0.0.1:0",
                          "--port-file=" + run_dir + "/kvstore.port",
                          "--local-socket=" + run_dir + "/kvstore.sock"});
    const std::optional<std::string> port = supervisor.WaitForPort(run_dir + "/kvstore.port");
    if (!port) return fail();
    kvstore = "127.0.0.1:" + *port;
  }
  Part& worker = parts[next++];
  std::vector<std::string> worker_args = {"--model=" + config.model, "--listen=127.0.0.1:0",
                                          "--port-file=" + run_dir + "/worker.port"};
  if (!kvstore.empty()) worker_args.push_back("--kvstore=" + kvstore);
  // The worker reads the vocabulary's bytes for structured outputs.
  if (!config.tokenizer.empty()) worker_args.push_back("--tokenizer=" + config.tokenizer);
  supervisor.Start(worker, worker_args);
  const std::optional<std::string> worker_port = supervisor.WaitForPort(run_dir + "/worker.port");
  if (!worker_port) return fail();

  Part& scheduler = parts[next++];
  std::vector<std::string> scheduler_args = {"--worker=127.0.0.1:" + *worker_port,
                                             "--listen=127.0.0.1:0",
                                             "--port-file=" + run_dir + "/scheduler.port"};
  if (!kvstore.empty()) scheduler_args.push_back("--kvstore=" + kvstore);
  if (!config.served_model_names.empty()) {
    scheduler_args.push_back("--served-model-name=" + config.served_model_names.front());
  }
  // The scheduler's /metrics, relayed by the frontend on the API port.
  const std::optional<std::string> metrics_listen = ForwardedValue(scheduler, "metrics-listen");
  const bool relay_metrics = metrics_listen != "" && !ForwardedValue(parts.back(), "metrics-from");
  if (relay_metrics) {
    scheduler_args.push_back("--metrics-port-file=" + run_dir + "/scheduler-metrics.port");
  }
  supervisor.Start(scheduler, scheduler_args);
  const std::optional<std::string> scheduler_port =
      supervisor.WaitForPort(run_dir + "/scheduler.port");
  if (!scheduler_port) return fail();
  std::optional<std::string> metrics_url;
  if (relay_metrics) {
    // Written before the gRPC port file: there now.
    const std::optional<std::string> port =
        supervisor.WaitForPort(run_dir + "/scheduler-metrics.port");
    if (!port) return fail();
    metrics_url =
        "http://" + LocalHostOf(metrics_listen.value_or("127.0.0.1:0")) + ":" + *port + "/metrics";
  }

  Part& frontend = parts[next++];
  const std::string listen_host =
      config.host.find(':') != std::string::npos ? "[" + config.host + "]" : config.host;
  std::vector<std::string> frontend_args = {"--scheduler=127.0.0.1:" + *scheduler_port,
                                            "--listen=" + listen_host + ":" + config.port,
                                            "--port-file=" + run_dir + "/frontend.port"};
  if (fs::is_directory(config.model)) frontend_args.push_back("--model=" + config.model);
  if (!config.tokenizer.empty()) frontend_args.push_back("--tokenizer=" + config.tokenizer);
  for (const std::string& n : config.served_model_names) {
    frontend_args.push_back("--served-model-name=" + n);
  }
  if (metrics_url) frontend_args.push_back("--metrics-from=" + *metrics_url);
  supervisor.Start(frontend, frontend_args);
  const std::optional<std::string> api_port = supervisor.WaitForPort(run_dir + "/frontend.port");
  if (!api_port) return fail();

  const bool any_host = config.host == "0.0.0.0" || config.host == "::" || config.host.empty();
  const std::string probe_host = any_host ? "127.0.0.1" : config.host;
  const std::string url =
      std::string(config.https ? "https" : "http") + "://" + listen_host + ":" + *api_port + "/v1";
  if (!config.https) {
    while (!HealthOk(probe_host, *api_port)) {
      if (!supervisor.Poll(std::chrono::milliseconds(200))) return fail();
    }
  }
  std::cerr << "tandem serve: the OpenAI API is up on " << url << " (run files in " << run_dir
            << "); SIGINT or SIGTERM stops it\n";
  std::cout << "serving " << url << std::endl;
  supervisor.Run();
  return fail();
}

}  // namespace tandem::cli
