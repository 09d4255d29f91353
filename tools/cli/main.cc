// tandem: command-line client of tandem-scheduler.
//
//   tandem generate --server 127.0.0.1:50051 --prompt 1,2,3 [--n K] [--max-tokens M] ...
//   tandem bench --server ADDR (--concurrency C | --rate R) --num-requests N ...
//   tandem bench --http http://FRONTEND:8000 --server ADDR ...   (the same load over OpenAI HTTP)
//   tandem info|stats --server ADDR
//   tandem health --server ADDR [--service NAME]
//   tandem serve MODEL [flags]   (worker, scheduler and frontend: like `vllm serve`; serve.h)
//
// Output goes to stdout, errors to stderr as "CODE: message" (gRPC status
// names). Exit codes: 0 success, 1 the server (or the connection) failed a
// call, 2 bad usage (flags, malformed ids).
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/text_format.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "http_stream_client.h"
#include "serve.h"
#include "tandem/common/flags.h"
#include "tandem/rpc/server.h"
#include "tandem/rpc/status.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "Usage: tandem <command> [flags]\n"
    "Commands:\n"
    "  generate  send token ids, stream the generated ids\n"
    "  bench     load generator: throughput, TTFT and inter-token latency\n"
    "  info      print the served model (GetModelInfo)\n"
    "  stats     print the scheduler's stats (GetStats)\n"
    "  health    check any Tandem server's grpc.health.v1 status (exit 0: SERVING)\n"
    "  serve     serve a model over the OpenAI API on this machine, like `vllm serve`\n"
    "Run 'tandem <command> --help' for its flags.\n"
    "Under mutual TLS, generate, bench, info and stats need a certificate with the client\n"
    "(or frontend) role: URI SAN spiffe://<trust domain>/tandem/client; health takes any.\n";

struct SamplingFlags {
  int32_t max_tokens = 16;
  double temperature = 0.0;
  int32_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  int64_t seed = -1;
  bool ignore_eos = false;
  std::string stop_token_ids;

  void Register(tandem::FlagSet* flags) {
    flags->Add("max-tokens", &max_tokens, "output tokens at most");
    flags->Add("temperature", &temperature, "0 = greedy");
    flags->Add("top-k", &top_k, "0 = off");
    flags->Add("top-p", &top_p, "1 = off");
    flags->Add("min-p", &min_p, "drop tokens below min-p x the top probability; 0 = off");
    flags->Add("seed", &seed, "sampling seed; -1 = the server picks one");
    flags->Add("ignore-eos", &ignore_eos, "keep generating after the EOS token");
    flags->Add("stop-token-ids", &stop_token_ids, "comma-separated token ids that stop generation");
  }
  bool Fill(tandem::v1::SamplingParams* p) const {
    p->set_max_tokens(max_tokens);
    p->set_temperature(static_cast<float>(temperature));
    p->set_top_k(top_k);
    p->set_top_p(static_cast<float>(top_p));
    p->set_min_p(static_cast<float>(min_p));
    if (seed >= 0) {
      p->set_seed(static_cast<uint64_t>(seed));
      p->set_has_seed(true);
    }
    p->set_ignore_eos(ignore_eos);
    for (absl::string_view part : absl::StrSplit(stop_token_ids, ',', absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) return false;
      p->add_stop_token_ids(id);
    }
    return true;
  }
};

bool ParseIds(const std::string& text, std::vector<int32_t>* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) return false;
    out->push_back(id);
  }
  return true;
}

const char* ReasonName(tandem::v1::FinishReason r) {
  switch (r) {
    case tandem::v1::FINISH_REASON_STOP:
      return "stop";
    case tandem::v1::FINISH_REASON_LENGTH:
      return "length";
    case tandem::v1::FINISH_REASON_ABORT:
      return "abort";
    case tandem::v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "none";
  }
}

// --tls-cert, --tls-key and --tls-ca of a subcommand that dials the
// scheduler; false (after printing why) when they are unusable.
struct ClientTlsFlags {
  tandem::rpc::TlsOptions tls;
  void Register(tandem::FlagSet* flags) { tandem::rpc::AddTlsFlags(flags, &tls); }
  bool Apply(const char* command) {
    if (absl::Status s = tls.Validate(/*server=*/false); !s.ok()) {
      std::cerr << command << ": " << s.message() << "\n";
      return false;
    }
    tandem::rpc::SetClientTls(tls);
    return true;
  }
};

int Generate(int argc, char** argv) {
  std::string server = "127.0.0.1:50051";
  std::string prompt;
  int32_t n = 1;
  double timeout_s = 60;
  SamplingFlags sampling;
  tandem::FlagSet flags("tandem generate", "Streams generated token ids for a prompt.");
  flags.Add("server", &server, "tandem-scheduler host:port");
  flags.Add("prompt", &prompt, "comma-separated prompt token ids, e.g. 1,403,407");
  flags.Add("n", &n, "concurrent copies of the request");
  flags.Add("timeout-s", &timeout_s, "deadline of each call in seconds");
  sampling.Register(&flags);
  ClientTlsFlags tls;
  tls.Register(&flags);
  flags.ParseOrExit(argc, argv, 2);
  if (!tls.Apply("tandem generate")) return 2;
  tandem::v1::GenerateRequest request;
  std::vector<int32_t> ids;
  if (!ParseIds(prompt, &ids) || ids.empty()) {
    std::cerr << "tandem generate: --prompt must be comma-separated token ids\n";
    return 2;
  }
  request.mutable_prompt_token_ids()->Assign(ids.begin(), ids.end());
  if (!sampling.Fill(request.mutable_sampling())) {
    std::cerr << "tandem generate: --stop-token-ids must be comma-separated token ids\n";
    return 2;
  }
  auto channel = tandem::rpc::CreateChannel(server);
  auto stub = tandem::v1::Generation::NewStub(channel);
  std::mutex out_mu;
  std::atomic<int> failures{0};
  auto run = [&](int index) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    auto reader = stub->Generate(&context, request);
    tandem::v1::GenerateResponse msg;
    std::vector<int32_t> tokens;
    std::string id;
    tandem::v1::GenerateResponse last;
    while (reader->Read(&msg)) {
      id = msg.request_id();
      tokens.insert(tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
      if (n == 1) {
        std::lock_guard<std::mutex> lock(out_mu);
        for (int32_t t : msg.token_ids()) std::cout << t << " " << std::flush;
      }
      if (msg.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) last = msg;
    }
    grpc::Status status = reader->Finish();
    std::lock_guard<std::mutex> lock(out_mu);
    if (n > 1) {
      std::cout << "[" << index << "] ";
      for (int32_t t : tokens) std::cout << t << " ";
    }
    if (!status.ok()) {
      ++failures;
      std::cout << "\n" << std::flush;
      std::cerr << "tandem generate: " << (n > 1 ? "[" + std::to_string(index) + "] " : "")
                << tandem::rpc::StatusCodeName(status) << ": " << status.error_message() << "\n";
      return;
    }
    const auto& u = last.usage();
    std::cout << "\n  (" << id << ": finish=" << ReasonName(last.finish_reason())
              << " prompt_tokens=" << u.prompt_tokens() << " output_tokens=" << u.output_tokens()
              << " cached_local=" << u.cached_tokens_local()
              << " cached_external=" << u.cached_tokens_external() << ")\n";
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(run, i);
  for (auto& t : threads) t.join();
  return failures.load() == 0 ? 0 : 1;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

int Bench(int argc, char** argv) {
  std::string server = "127.0.0.1:50051";
  int32_t concurrency = 32;
  double rate = 0;
  int32_t num_requests = 256;
  int32_t prompt_len = 64;
  int32_t output_len = 64;
  int32_t shared_prefix_len = 0;
  int64_t seed = 0;
  double temperature = 0;
  std::string label;
  std::string json_path;
  std::string http_url;
  std::string api_key;
  int32_t vocab_size = 0;
  tandem::FlagSet flags(
      "tandem bench",
      "Sends synthetic requests and reports output tokens/s, requests/s, and the mean, p50, p90 "
      "and p99 of time to first token (TTFT), inter-token latency (ITL), time per output token "
      "(TPOT: per request, (E2E - TTFT) / (output tokens - 1)) and end-to-end latency (E2E).");
  flags.Add("server", &server, "tandem-scheduler host:port");
  flags.Add("concurrency", &concurrency, "requests in flight at once (closed loop)");
  flags.Add("rate", &rate, "open loop: Poisson arrivals per second (0 = use --concurrency)");
  flags.Add("num-requests", &num_requests, "requests to send");
  flags.Add("prompt-len", &prompt_len, "prompt tokens per request (including BOS)");
  flags.Add("output-len", &output_len, "output tokens per request (EOS ignored)");
  flags.Add("shared-prefix-len", &shared_prefix_len,
            "leading prompt tokens every request shares (prefix-cache workload)");
  flags.Add("seed", &seed, "seed of the synthetic prompts");
  flags.Add("temperature", &temperature, "sampling temperature (0 = greedy)");
  flags.Add("label", &label, "printed in the result line");
  flags.Add("json", &json_path, "also write the results to this file as JSON (empty: don't)");
  flags.Add("http", &http_url,
            "send the requests to this tandem-frontend (or any OpenAI server) instead, as streamed "
            "POST /v1/completions with token-id prompts: http://host:port[/base] (empty: gRPC to "
            "--server)");
  flags.Add("api-key", &api_key, "with --http: sent as 'Authorization: Bearer KEY'");
  flags.Add("vocab-size", &vocab_size,
            "vocabulary the random prompt ids are drawn from (0: ask --server's GetModelInfo)");
  ClientTlsFlags tls;
  tls.Register(&flags);
  flags.ParseOrExit(argc, argv, 2);
  if (!tls.Apply("tandem bench")) return 2;
  if (prompt_len < 1 || output_len < 1 || num_requests < 1 || concurrency < 1 ||
      shared_prefix_len > prompt_len) {
    std::cerr << "tandem bench: need prompt-len, output-len, num-requests, concurrency >= 1 and "
                 "shared-prefix-len <= prompt-len\n";
    return 2;
  }
  std::optional<tandem::cli::HttpTarget> http_target;
  if (!http_url.empty()) {
    auto target = tandem::cli::ParseHttpUrl(http_url);
    if (!target.ok()) {
      std::cerr << "tandem bench: " << target.status().message() << "\n";
      return 2;
    }
    target->api_key = api_key;
    http_target = *std::move(target);
  }
  auto channel = tandem::rpc::CreateChannel(server);
  auto stub = tandem::v1::Generation::NewStub(channel);
  int32_t vocab = vocab_size;
  if (vocab <= 0) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    tandem::v1::GetModelInfoResponse info;
    grpc::Status s = stub->GetModelInfo(&context, {}, &info);
    if (!s.ok()) {
      std::cerr << "tandem bench: GetModelInfo: " << tandem::rpc::StatusCodeName(s) << ": "
                << s.error_message() << "\n";
      return 1;
    }
    vocab = info.vocab_size();
  }
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  std::uniform_int_distribution<int32_t> token(2, vocab - 1);
  std::vector<int32_t> prefix{1};
  while (static_cast<int32_t>(prefix.size()) < std::max(shared_prefix_len, 1)) {
    prefix.push_back(token(rng));
  }
  std::vector<tandem::v1::GenerateRequest> requests(num_requests);
  for (int i = 0; i < num_requests; ++i) {
    std::vector<int32_t> p = prefix;
    p.resize(std::max(shared_prefix_len, 1));
    while (static_cast<int32_t>(p.size()) < prompt_len) p.push_back(token(rng));
    requests[i].mutable_prompt_token_ids()->Assign(p.begin(), p.end());
    auto* s = requests[i].mutable_sampling();
    s->set_max_tokens(output_len);
    s->set_ignore_eos(true);
    s->set_temperature(static_cast<float>(temperature));
    s->set_seed(static_cast<uint64_t>(i));
    s->set_has_seed(true);
  }
  // The same requests as OpenAI completions bodies (token-id prompts; the
  // ids come back in each chunk's token_ids, which the counts read).
  std::vector<std::string> http_bodies;
  if (http_target) {
    for (const tandem::v1::GenerateRequest& r : requests) {
      std::string prompt;
      for (int32_t id : r.prompt_token_ids()) {
        absl::StrAppend(&prompt, prompt.empty() ? "" : ",", id);
      }
      http_bodies.push_back(
          absl::StrCat(R"({"prompt":[)", prompt, R"(],"max_tokens":)", output_len,
                       R"(,"temperature":)", temperature, R"(,"seed":)", r.sampling().seed(),
                       R"(,"ignore_eos":true,"stream":true,"return_token_ids":true})"));
    }
  }

  std::mutex mu;
  std::vector<double> ttft_ms, itl_ms, tpot_ms, e2e_ms;
  std::atomic<int64_t> output_tokens{0};
  std::atomic<int> done{0}, failed{0};
  std::string first_error;
  // One request over gRPC: what its stream gave.
  auto run_grpc = [&](int i, Clock::time_point start) {
    tandem::cli::StreamResult r(start);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    auto reader = stub->Generate(&context, requests[i]);
    tandem::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.token_ids_size() > 0) r.AddTokens(msg.token_ids_size(), Clock::now());
    }
    grpc::Status s = reader->Finish();
    if (!s.ok()) r.error = tandem::rpc::StatusCodeName(s) + ": " + s.error_message();
    return r;
  };
  std::atomic<int> wrong_token_count{0};
  // `http` is the calling thread's connection (null: gRPC).
  auto run_one = [&](int i, tandem::cli::HttpStreamClient* http) {
    const auto start = Clock::now();
    const tandem::cli::StreamResult r =
        http != nullptr ? http->Complete(http_bodies[i], start) : run_grpc(i, start);
    const double e2e = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    output_tokens += r.tokens;
    std::lock_guard<std::mutex> lock(mu);
    if (!r.error.empty()) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
    } else {
      if (r.tokens != output_len) ++wrong_token_count;
      if (r.ttft_ms >= 0) ttft_ms.push_back(r.ttft_ms);
      if (r.ttft_ms >= 0 && r.tokens > 1)
        tpot_ms.push_back((e2e - r.ttft_ms) / static_cast<double>(r.tokens - 1));
      e2e_ms.push_back(e2e);
      itl_ms.insert(itl_ms.end(), r.itl_ms.begin(), r.itl_ms.end());
    }
    ++done;
  };
  // A thread's own HTTP connection, kept alive across its requests.
  auto make_client = [&]() -> std::unique_ptr<tandem::cli::HttpStreamClient> {
    return http_target ? std::make_unique<tandem::cli::HttpStreamClient>(*http_target) : nullptr;
  };

  // Closed loop: every thread has its connection open (on the gRPC side, the
  // channel) before the clock starts, so that neither path counts a
  // connection set-up in its first requests' TTFT: 256 connects at once took
  // ~80 ms of the first wave's TTFT on the HTTP side, where the gRPC side
  // connects one channel. A Poisson run's thread connects per request.
  std::vector<std::unique_ptr<tandem::cli::HttpStreamClient>> clients;
  if (rate <= 0) {
    if (!http_target &&
        !channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      std::cerr << "tandem bench: cannot connect to " << server << "\n";
      return 1;
    }
    for (int c = 0; c < std::min(concurrency, num_requests); ++c) {
      clients.push_back(make_client());
      if (clients.back() == nullptr) continue;
      if (std::string error = clients.back()->Connect(); !error.empty()) {
        std::cerr << "tandem bench: cannot connect to " << http_url << ": " << error << "\n";
        return 1;
      }
    }
  }

  const auto bench_start = Clock::now();
  std::atomic<bool> finished{false};
  std::thread progress([&] {
    for (int tick = 1; !finished.load(); ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (tick % 10 != 0 || finished.load()) continue;
      const double t = std::chrono::duration<double>(Clock::now() - bench_start).count();
      std::fprintf(stderr, "\r[%6.1fs] %d/%d done, %d failed, %.0f output tok/s   ", t, done.load(),
                   num_requests, failed.load(), output_tokens.load() / std::max(t, 1e-9));
    }
    std::fprintf(stderr, "\n");
  });
  std::vector<std::thread> threads;
  if (rate > 0) {
    std::exponential_distribution<double> gap(rate);
    auto next = Clock::now();
    for (int i = 0; i < num_requests; ++i) {
      std::this_thread::sleep_until(next);
      threads.emplace_back([&, i] { run_one(i, make_client().get()); });
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    }
  } else {
    std::atomic<int> next{0};
    for (auto& client : clients) {
      threads.emplace_back([&] {
        for (int i; (i = next.fetch_add(1)) < num_requests;) run_one(i, client.get());
      });
    }
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - bench_start).count();
  finished.store(true);
  progress.join();

  char rate_text[64];
  std::snprintf(rate_text, sizeof(rate_text), "rate=%.1f/s", rate);
  const std::string load = rate > 0 ? rate_text : "concurrency=" + std::to_string(concurrency);
  std::printf(
      "%s%s%s %s requests=%d failed=%d prompt_len=%d output_len=%d shared_prefix=%d "
      "wrong_token_count=%d via=%s\n"
      "  duration %.2f s | output %.1f tok/s | %.2f req/s\n"
      "  %-8s %10s %10s %10s %10s\n",
      label.empty() ? "" : "[", label.c_str(), label.empty() ? "" : "]", load.c_str(), num_requests,
      failed.load(), prompt_len, output_len, shared_prefix_len, wrong_token_count.load(),
      http_target ? "http" : "grpc", elapsed, output_tokens.load() / elapsed,
      (num_requests - failed.load()) / elapsed, "", "mean", "p50", "p90", "p99");
  struct Series {
    const char* name;
    const std::vector<double>* values;
  };
  const Series series[] = {
      {"ttft", &ttft_ms}, {"itl", &itl_ms}, {"tpot", &tpot_ms}, {"e2e", &e2e_ms}};
  // A JSON string's contents: quotes and backslashes escaped, control bytes dropped.
  auto escape = [](const std::string& text) {
    std::string out;
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out;
  };
  std::ostringstream json;
  json << "{\"label\": \"" << escape(label) << "\", \"via\": \"" << (http_target ? "http" : "grpc")
       << "\", \"load\": \"" << load << "\", \"num_requests\": " << num_requests
       << ", \"failed\": " << failed.load() << ", \"prompt_len\": " << prompt_len
       << ", \"output_len\": " << output_len << ", \"shared_prefix_len\": " << shared_prefix_len
       << ", \"duration_s\": " << elapsed
       << ", \"output_tokens_per_s\": " << output_tokens.load() / elapsed
       << ", \"requests_per_s\": " << (num_requests - failed.load()) / elapsed
       << ", \"output_tokens\": " << output_tokens.load()
       << ", \"wrong_token_count\": " << wrong_token_count.load() << ", \"first_error\": \""
       << escape(first_error) << "\"";
  for (const Series& x : series) {
    const std::vector<double>& v = *x.values;
    const double mean =
        v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    std::string upper = x.name;
    for (char& c : upper) c = static_cast<char>(std::toupper(c));
    std::printf("  %-5s ms %10.2f %10.2f %10.2f %10.2f\n", upper.c_str(), mean, Percentile(v, 50),
                Percentile(v, 90), Percentile(v, 99));
    for (const char* stat : {"mean", "p50", "p90", "p99"}) {
      const double value = std::string(stat) == "mean"  ? mean
                           : std::string(stat) == "p50" ? Percentile(v, 50)
                           : std::string(stat) == "p90" ? Percentile(v, 90)
                                                        : Percentile(v, 99);
      json << ", \"" << stat << "_" << x.name << "_ms\": " << value;
    }
  }
  json << "}\n";
  if (!first_error.empty()) std::printf("  first error: %s\n", first_error.c_str());
  if (!json_path.empty()) {
    std::FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr || std::fputs(json.str().c_str(), f) < 0 || std::fclose(f) != 0) {
      std::cerr << "tandem bench: cannot write " << json_path << "\n";
      return 1;
    }
  }
  return failed.load() == 0 ? 0 : 1;
}

// "name: value" for every field, in declaration order, zeros and empty
// strings included (DebugString leaves them out).
std::string EveryField(const google::protobuf::Message& m) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  std::string out;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        std::string v;
        google::protobuf::TextFormat::PrintFieldValueToString(m, f, j, &v);
        out += f->name() + ": " + v + "\n";
      }
    } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      std::string v;
      google::protobuf::TextFormat::PrintToString(r->GetMessage(m, f), &v);
      out += f->name() + " {\n" + v + "}\n";
    } else {
      std::string v;
      google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &v);
      out += f->name() + ": " + v + "\n";
    }
  }
  return out;
}

int InfoOrStats(int argc, char** argv, bool stats) {
  std::string server = "127.0.0.1:50051";
  tandem::FlagSet flags(stats ? "tandem stats" : "tandem info",
                        stats ? "Prints GetStats." : "Prints GetModelInfo.");
  flags.Add("server", &server, "tandem-scheduler host:port");
  ClientTlsFlags tls;
  tls.Register(&flags);
  flags.ParseOrExit(argc, argv, 2);
  if (!tls.Apply(stats ? "tandem stats" : "tandem info")) return 2;
  auto stub = tandem::v1::Generation::NewStub(tandem::rpc::CreateChannel(server));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status s;
  std::string text;
  if (stats) {
    tandem::v1::GetStatsResponse r;
    s = stub->GetStats(&context, {}, &r);
    text = EveryField(r);
  } else {
    tandem::v1::GetModelInfoResponse r;
    s = stub->GetModelInfo(&context, {}, &r);
    text = EveryField(r);
  }
  if (!s.ok()) {
    std::cerr << (stats ? "tandem stats: " : "tandem info: ") << tandem::rpc::StatusCodeName(s)
              << ": " << s.error_message() << "\n";
    return 1;
  }
  std::cout << text;
  return 0;
}

// grpc.health.v1 Check of any Tandem server, with the --tls-* flags: the
// Helm chart's probes under TLS, which the kubelet's gRPC probe cannot
// speak. Prints the status; exit 0 only for SERVING.
int Health(int argc, char** argv) {
  std::string server = "127.0.0.1:50051";
  std::string service;
  double timeout_s = 5;
  tandem::FlagSet flags("tandem health",
                        "Checks a server's grpc.health.v1 status; exit 0 when SERVING, 1 "
                        "otherwise (NOT_SERVING, unknown service, unreachable).");
  flags.Add("server", &server, "host:port of any Tandem gRPC server");
  flags.Add("service", &service,
            "health name: '' (overall), tandem.liveness, or the service's own (e.g. "
            "tandem.v1.Generation)");
  flags.Add("timeout-s", &timeout_s, "deadline of the check in seconds");
  ClientTlsFlags tls;
  tls.Register(&flags);
  flags.ParseOrExit(argc, argv, 2);
  if (!tls.Apply("tandem health")) return 2;
  auto stub = grpc::health::v1::Health::NewStub(tandem::rpc::CreateChannel(server));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status s = stub->Check(&context, request, &response);
  if (!s.ok()) {
    std::cerr << "tandem health: " << tandem::rpc::StatusCodeName(s) << ": " << s.error_message()
              << "\n";
    return 1;
  }
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()) << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "generate") return Generate(argc, argv);
  if (command == "bench") return Bench(argc, argv);
  if (command == "info") return InfoOrStats(argc, argv, false);
  if (command == "stats") return InfoOrStats(argc, argv, true);
  if (command == "health") return Health(argc, argv);
  if (command == "serve") return tandem::cli::Serve(argc, argv);
  std::cerr << "tandem: unknown command '" << command << "'\n" << kUsage;
  return 2;
}
