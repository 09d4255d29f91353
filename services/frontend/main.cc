// tandem-frontend: the OpenAI-compatible HTTP front door. Owns the tokenizer
// and routes requests across scheduler replicas (tandem.v1.Generation).
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cors.h"
#include "frontend.h"
#include "http_server.h"
#include "router.h"
#include "tandem/common/flags.h"
#include "tandem/common/logging.h"
#include "tandem/frontend/tool_calls.h"
#include "tandem/rpc/server.h"
#include "tandem/rpc/tls_reload.h"

namespace {

int Fail(const std::string& message, int code = 2) {
  std::cerr << "tandem-frontend: " << message << "\n";
  return code;
}

// --api-keys-file: one "<key> <tenant>" a line; blank lines and lines that
// start with # are skipped.
absl::Status ReadTenantKeys(const std::string& path, std::map<std::string, std::string>* out) {
  std::ifstream f(path);
  if (!f) return absl::InvalidArgumentError("cannot read --api-keys-file " + path);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    const std::string text(absl::StripAsciiWhitespace(line));
    if (text.empty() || text.front() == '#') continue;
    std::vector<std::string> fields = absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat("--api-keys-file ", path, " line ", n);
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(where + ": want '<key> <tenant>'");
    }
    const bool name_ok = std::all_of(fields[1].begin(), fields[1].end(), [](char c) {
      return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
    if (!name_ok) {
      return absl::InvalidArgumentError(where + ": a tenant is letters, digits, '-', '_' or '.'");
    }
    if (!out->emplace(fields[0], fields[1]).second) {
      return absl::InvalidArgumentError(where + ": the key appears twice");
    }
  }
  if (out->empty()) return absl::InvalidArgumentError("--api-keys-file " + path + " has no keys");
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  tandem::rpc::BlockShutdownSignals();
  tandem::SetLogTag("frontend");
  // Buffers of 1 MiB and more (request bodies, their prompts) are mapped
  // and unmapped, so they leave nothing resident once freed. A fixed value
  // also stops glibc from raising the threshold to the largest buffer freed
  // so far, after which every big body would stay in the heap
  // (bounded_input_test's LargeBodiesGiveTheirMemoryBack).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // A quarter of the cores, 2 to 8: on a 16-core H100 host 4 I/O threads
  // served 112k tokens/s to 256 streams at 37 us of frontend CPU per token
  // where 16 took 59-68 us (idle threads woken per token) and added more to
  // the p50 TTFT (tools/bench_frontend/run.sh; DESIGN-NOTES.md).
  tandem::frontend::HttpServerOptions http{
      .listen_address = "127.0.0.1:8000",
      .threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 2, 8)};
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  tandem::frontend::RouterOptions router_options;
  // A quarter of the cores, 1 to 8 (router.h says why more than one). On the
  // 2-core VM 1 gave the best throughput (HTTP/gRPC 0.92-0.93 at 256 streams,
  // against 0.90-0.91 with 2 and 0.88-0.89 with 4: the reads' wake-ups cost
  // CPU the worker and client need there), while the scheduler-to-frontend
  // part of the TTFT already fell by ~0.35 ms with 4.
  router_options.connections_per_replica = std::clamp(cores / 4, 1, 8);
  tandem::frontend::FrontendOptions options;
  std::string port_file, model_dir, tokenizer_path, chat_template, api_key_file,
      routing = "affinity";
  int32_t threads = http.threads, drain_timeout_s = 30;

  tandem::FlagSet flags(
      "tandem-frontend",
      "Serves the OpenAI HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
      "/tokenize, /detokenize, /health, /metrics) and routes each request to a tandem-scheduler "
      "replica over gRPC.");
  flags.Add("listen", &http.listen_address, "host:port of the HTTP server (port 0: any free port)");
  flags.Add("port-file", &port_file, "write the bound port to this file once listening");
  std::string allowed_origins = R"(["*"])";
  flags.Add("allowed-origins", &allowed_origins,
            "[vLLM] CORS: the origins whose browsers may call the API, a JSON list (vLLM's "
            "form) or comma-separated; [\"*\"] (the default, vLLM's): any; []: no CORS headers");
  flags.Add("enable-request-id-headers", &http.request_id_headers,
            "[vLLM] every answer carries an X-Request-Id header: the request's own, else a "
            "random one");
  flags.Add("scheduler", &router_options.targets,
            "a scheduler replica: host:port, or dns:///name:port for every address the name "
            "resolves to (a headless Service); repeatable");
  tandem::rpc::TlsOptions tls;
  tandem::rpc::AddTlsFlags(&flags, &tls);
  flags.Add("https-cert", &http.tls_cert_file,
            "PEM certificate chain of the HTTP port: it then speaks HTTPS only (the --tls-* "
            "flags are the frontend's identity towards the schedulers, this is the one clients "
            "see); reread when the file changes, every --tls-reload-interval-s");
  flags.Add("https-key", &http.tls_key_file, "PEM private key of --https-cert");
  flags.Add("https-ca", &http.tls_ca_file,
            "PEM CA bundle: HTTPS clients must present a certificate it signed");
  flags.Add("resolve-interval-s", &router_options.resolve_interval_s,
            "how often dns:/// targets are resolved again");
  flags.Add("health-interval-s", &router_options.health_interval_s,
            "how often each replica's gRPC health is checked (a call that fails UNAVAILABLE "
            "takes its replica out at once, whatever this says)");
  flags.Add("model", &model_dir,
            "the model directory the workers serve: its tokenizer and chat template are the "
            "defaults (a Hugging Face directory: tokenizer.json or tokenizer.model, "
            "tokenizer_config.json, chat_template.jinja)");
  flags.Add("tokenizer", &tokenizer_path,
            "tokenizer.model, tokenizer.bin, tokenizer.json or a directory holding one "
            "(with tokenizer_config.json and chat_template.jinja); empty: --model's");
  flags.Add("chat-template", &chat_template,
            "for /v1/chat/completions: a built-in template (llama-2, llama-3, chatml) or a Jinja "
            "file; empty: the tokenizer's own (chat_template.jinja, else tokenizer_config.json's "
            "chat_template)");
  flags.Add("served-model-name", &options.served_model_names,
            "the model's name in the API; repeatable: each name is served, responses carry "
            "the one the request named (none: the name the schedulers describe, and --model as "
            "given, vLLM's name for it)");
  flags.Add("api-key", &options.api_key,
            "demand 'Authorization: Bearer <key>' on /v1/*, /tokenize and /detokenize (prefer "
            "--api-key-file: argv is visible to other processes)");
  flags.Add("api-key-file", &api_key_file, "read the API key from this file (trimmed)");
  std::string api_keys_file;
  flags.Add("api-keys-file", &api_keys_file,
            "tenants: a file of '<key> <tenant>' lines. /v1/*, /tokenize and /detokenize take "
            "these keys, and each tenant's prefix cache is its own (cache_salt; the schedulers "
            "must accept it: --allow-request-cache-salt, or mutual TLS with the frontend role)");
  flags.Add("routing", &routing,
            "affinity (same prompt prefix, same replica, unless overloaded), least-loaded or "
            "round-robin");
  flags.Add("affinity-blocks", &router_options.affinity_blocks,
            "KV blocks of the prompt's start that choose the replica under --routing affinity");
  flags.Add("connections-per-replica", &router_options.connections_per_replica,
            "HTTP/2 connections to each scheduler replica, calls spread over them in turn "
            "(one connection's messages are read by one thread at a time; default: a "
            "quarter of the cores, 1 to 8)");
  flags.Add("threads", &threads, "HTTP I/O threads (default: a quarter of the cores, 2 to 8)");
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    http.max_connections = std::clamp<int64_t>(static_cast<int64_t>(files.rlim_cur) - 256, 16,
                                               http.max_connections);
  }
  int64_t max_url_bytes = static_cast<int64_t>(http.max_target_bytes);
  int64_t max_header_bytes = static_cast<int64_t>(http.max_header_bytes);
  flags.Add("max-url-bytes", &max_url_bytes,
            "longest request URL (path and query) taken; longer gets 414 URI Too Long");
  flags.Add("max-connections", &http.max_connections,
            "open HTTP connections at most (an SSE stream holds one); one more is answered 503 "
            "and closed. Default: the open-file limit (ulimit -n) less 256 for gRPC and files, "
            "at most 10000; a larger value lets accept() run out of descriptors, which it then "
            "retries every 100 ms");
  flags.Add("max-header-bytes", &max_header_bytes,
            "most bytes of request line and headers taken; more gets 431 Request Header Fields "
            "Too Large (414 when the URL is what is too long)");
  flags.Add("drain-timeout-s", &drain_timeout_s,
            "on SIGTERM/SIGINT, how long accepted requests may take to finish");
  std::string metrics_from;
  flags.Add("metrics-from", &metrics_from,
            "http://HOST:PORT/metrics of a scheduler whose series /metrics serves after the "
            "frontend's own, as vllm serve serves its engine's on the API port (tandem serve "
            "sets it; empty: the frontend's series only)");
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;
  flags.Add("enable-auto-tool-choice", &enable_auto_tool_choice,
            "[vLLM] chat requests with tools and tool_choice \"auto\" (the default with tools) "
            "get the tool calls their answer writes as message.tool_calls (needs "
            "--tool-call-parser); without it they are refused");
  flags.Add("tool-call-parser", &tool_call_parser,
            "[vLLM] how answers write tool calls: hermes (<tool_call>{\"name\": ..., "
            "\"arguments\": ...}</tool_call>: Qwen2.5, Qwen3, Hermes), llama3_json or "
            "llama4_json ({\"name\": ..., \"parameters\": ...}: Llama 3.1-3.3 with vLLM's JSON "
            "tool template), pythonic or llama4_pythonic ([f(a=1), g()]: Llama 3.2, Llama 4, "
            "ToolACE), mistral ([TOOL_CALLS] [{\"name\": ..., \"arguments\": ...}]: Mistral 7B "
            "Instruct v0.3); other parsers are refused");
  std::string reasoning_parser;
  flags.Add("reasoning-parser", &reasoning_parser,
            "[vLLM] chat and /v1/responses answers give the model's thinking "
            "(<think>...</think>) apart from the content: as message.reasoning and "
            "reasoning_content, and as a reasoning item: deepseek_r1 (DeepSeek-R1 and its "
            "distills) or qwen3; other parsers are refused");
  flags.Add("trust-request-chat-template", &options.trust_request_chat_template,
            "[vLLM] a chat request's own chat_template (or chat_template_kwargs.chat_template) "
            "renders its prompt instead of the server's; its work and memory are bounded (see "
            "ChatTemplateInputs::max_steps), but it runs a client's code: trust the clients");
  flags.Add("return-tokens-as-token-ids", &options.return_tokens_as_token_ids,
            "[vLLM] logprobs name each token \"token_id:<id>\" instead of its text (a "
            "request's return_tokens_as_token_ids overrides it)");
  flags.MirrorsVllm({"model", "served-model-name", "api-key", "chat-template", "tokenizer",
                     "enable-auto-tool-choice", "tool-call-parser", "allowed-origins",
                     "reasoning-parser", "return-tokens-as-token-ids", "enable-request-id-headers",
                     "trust-request-chat-template"});
  flags.ParseOrExit(argc, argv);
  if (drain_timeout_s < 0) {
    return Fail("--drain-timeout-s must be >= 0, got " + std::to_string(drain_timeout_s));
  }
  const std::optional<tandem::frontend::ToolParser> parser =
      tandem::frontend::ToolParserNamed(tool_call_parser);
  if (!tool_call_parser.empty() && !parser) {
    return Fail("--tool-call-parser '" + tool_call_parser + "' is not implemented (implemented: " +
                std::string(tandem::frontend::kToolParserNames) + ")");
  }
  if (enable_auto_tool_choice && !parser) {
    return Fail("--enable-auto-tool-choice requires --tool-call-parser");
  }
  if (enable_auto_tool_choice) options.auto_tool_parser = parser;
  options.reasoning_parser = tandem::frontend::ReasoningParserNamed(reasoning_parser);
  if (!reasoning_parser.empty() && !options.reasoning_parser) {
    return Fail("--reasoning-parser '" + reasoning_parser + "' is not implemented (implemented: " +
                std::string(tandem::frontend::kReasoningParserNames) + ")");
  }
  if (!metrics_from.empty()) {
    absl::StatusOr<tandem::frontend::MetricsUrl> url =
        tandem::frontend::ParseMetricsUrl(metrics_from);
    if (!url.ok()) return Fail(std::string(url.status().message()));
    options.metrics_from = *std::move(url);
  }
  if (absl::Status s = tls.Validate(/*server=*/false); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  tandem::rpc::SetClientTls(tls);  // to the schedulers (the HTTP port: --https-*)
  http.tls_reload_interval_s = tls.reload_interval_s;

  auto policy = tandem::frontend::ParseRoutingPolicy(routing);
  if (!policy) return Fail("--routing must be affinity, least-loaded or round-robin, got '" + routing + "'");
  router_options.policy = *policy;
  if (absl::StatusOr<std::vector<std::string>> origins =
          tandem::frontend::ParseAllowedOrigins(allowed_origins);
      origins.ok()) {
    http.allowed_origins = *std::move(origins);
  } else {
    return Fail(std::string(origins.status().message()));
  }
  if (threads < 1) return Fail("--threads must be >= 1");
  http.threads = threads;
  if (max_url_bytes < 1 || max_header_bytes < 1024 || max_url_bytes >= max_header_bytes ||
      max_header_bytes > (int64_t{1} << 30)) {
    return Fail("--max-url-bytes must be >= 1 and below --max-header-bytes, which must be in "
                "[1024, 2^30]");
  }
  if (http.max_connections < 1) return Fail("--max-connections must be >= 1");
  http.max_target_bytes = static_cast<size_t>(max_url_bytes);
  http.max_header_bytes = static_cast<size_t>(max_header_bytes);
  // As `vllm serve MODEL`: the model directory's tokenizer unless --tokenizer
  // names another. --model must be a directory whenever it is given.
  if (std::error_code ec; !model_dir.empty() && !std::filesystem::is_directory(model_dir, ec)) {
    return Fail("--model " + model_dir + " is not a directory (a Hugging Face model "
                "directory; for other models give --tokenizer)");
  }
  options.model_path = model_dir;
  const bool tokenizer_from_model = tokenizer_path.empty() && !model_dir.empty();
  if (tokenizer_from_model) tokenizer_path = model_dir;
  if (tokenizer_path.empty()) {
    return Fail("--model (a Hugging Face model directory) or --tokenizer is required");
  }
  if (!api_key_file.empty()) {
    std::ifstream f(api_key_file);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!f) return Fail("cannot read --api-key-file " + api_key_file);
    options.api_key = std::string(absl::StripAsciiWhitespace(ss.str()));
    if (options.api_key.empty()) return Fail("--api-key-file " + api_key_file + " is empty");
  }

  if (!api_keys_file.empty()) {
    if (absl::Status s = ReadTenantKeys(api_keys_file, &options.tenants); !s.ok()) {
      return Fail(std::string(s.message()));
    }
    if (options.tenants.count(options.api_key) > 0) {
      return Fail("the --api-key is also in --api-keys-file");
    }
    TANDEM_LOG(INFO) << options.tenants.size() << " tenant API keys; each tenant's requests carry "
                     << "its own cache_salt";
    router_options.sends_cache_salt = true;
  }

  auto tokenizer = tandem::tokenizer::LoadTokenizer(tokenizer_path);
  if (!tokenizer.ok()) {
    // The message names the path ("DIR: holds no tokenizer.json, ...").
    return Fail(absl::StrCat(tokenizer_from_model ? "--model: " : "--tokenizer: ",
                             tokenizer.status().message()));
  }
  std::shared_ptr<const tandem::tokenizer::Tokenizer> tok = *std::move(tokenizer);
  std::optional<tandem::tokenizer::ChatTemplate> chat;
  if (auto t = tandem::tokenizer::ChatTemplate::Select(chat_template, *tok); t.ok()) {
    chat = *std::move(t);
  } else if (!chat_template.empty() || tok->chat_template()) {
    return Fail(std::string(t.status().message()));
  } else {
    TANDEM_LOG(WARNING) << "the tokenizer has no chat template and --chat-template is empty: "
                           "/v1/chat/completions answers 400";
  }

  // Requests with tools render the tokenizer's "tool_use" template when it
  // names one; one that cannot be rendered refuses only those requests.
  absl::StatusOr<std::optional<tandem::tokenizer::ChatTemplate>> tool_use_chat =
      tandem::tokenizer::ChatTemplate::SelectToolUse(chat_template, *tok);
  if (!tool_use_chat.ok()) {
    TANDEM_LOG(WARNING) << tool_use_chat.status().message() << "; requests with tools answer 400";
  }

  auto registry = std::make_shared<prometheus::Registry>();
  tandem::rpc::RegisterTlsMetrics(registry);  // the --tls-* reloads
  tandem::frontend::Router router(router_options, registry.get());
  if (absl::Status s = router.Start(); !s.ok()) return Fail(std::string(s.message()));
  tandem::frontend::Frontend frontend(options, tok, std::move(chat), &router, registry,
                                      std::move(tool_use_chat));
  auto server = tandem::frontend::HttpServer::Start(
      http, [&frontend](std::shared_ptr<tandem::frontend::HttpExchange> exchange) {
        frontend.Handle(std::move(exchange));
      });
  if (!server.ok()) return Fail(std::string(server.status().message()), 1);
  frontend.set_server(server->get());
  if (!port_file.empty()) {
    if (absl::Status s = tandem::rpc::WritePortFile(port_file, (*server)->port()); !s.ok()) {
      return Fail(std::string(s.message()), 1);
    }
  }
  if (!tandem::rpc::IsLoopbackAddress(http.listen_address) && options.api_key.empty() &&
      options.tenants.empty()) {
    TANDEM_LOG(WARNING) << "serving " << http.listen_address
                        << " beyond loopback without an API key: anyone who reaches the port "
                           "can generate (set --api-key-file)";
  }
  if (!tandem::rpc::IsLoopbackAddress(http.listen_address) && !(*server)->tls()) {
    TANDEM_LOG(WARNING) << "serving " << http.listen_address
                        << " beyond loopback in plain HTTP: prompts, completions and API keys "
                           "cross the network readable by anyone on the path (set --https-cert "
                           "and --https-key, or terminate TLS in front of the frontend)";
  }
  TANDEM_LOG(INFO) << "listening on port " << (*server)->port() << " ("
                   << ((*server)->tls() ? "HTTPS" : "HTTP") << ", " << http.threads
                   << " threads); " << router_options.targets.size() << " scheduler target(s), "
                   << router_options.connections_per_replica << " connection(s) each, routing "
                   << routing;

  const int sig = tandem::rpc::WaitForShutdownSignal();
  TANDEM_LOG(INFO) << "signal " << sig << ": draining (/health answers 503)";
  frontend.SetDraining();
  (*server)->StopAccepting();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(drain_timeout_s);
  while (frontend.in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (frontend.in_flight() > 0) {
    TANDEM_LOG(WARNING) << "drain timeout: " << frontend.in_flight()
                        << " requests still open are cut off";
    // Each ends as a request that failed (a stream: an error event and
    // [DONE]), not as a connection cut mid-stream; their last bytes get a
    // moment to go out.
    frontend.CutOff(tandem::frontend::FromStatus(
        14, absl::StrCat("the frontend is shutting down: its drain (--drain-timeout-s ",
                         drain_timeout_s, ") ran out")));
    const auto flushed = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (frontend.in_flight() > 0 && std::chrono::steady_clock::now() < flushed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  (*server)->Stop();
  router.Stop();
  TANDEM_LOG(INFO) << "stopped";
  // Calls cut off by the drain timeout may still hold the server's
  // connections; leave without running their destructors.
  std::quick_exit(0);
}
