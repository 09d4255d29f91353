// tandem-frontend's HTTP routes: the OpenAI API (libs/frontend/openai.h)
// over the schedulers' tandem.v1.Generation gRPC API.
//
//   POST /v1/completions, /v1/chat/completions   (JSON or SSE)
//   GET  /v1/models
//   POST /tokenize, /detokenize                  (as vLLM has them)
//   GET  /health        200 while a replica serves and we are not draining,
//                       else 503; /health?live=1: 200 while the process runs
//   GET  /metrics       Prometheus text
//
// One request = one CompletionJob (tandem/frontend/completion_job.h, wired
// up by completion_job.h here): it tokenizes, routes
// each choice to a replica, streams tokens back as text, and aborts the
// generation on the scheduler when the client goes away.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "http_server.h"
#include "metrics_relay.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "router.h"
#include "tandem/frontend/completion_job.h"
#include "tandem/frontend/openai.h"
#include "tandem/frontend/prompts.h"
#include "tandem/tokenizer/chat_template.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::frontend {

struct FrontendOptions {
  // The model's names (vLLM's --served-model-name NAME [NAME ...]): each is
  // listed in /v1/models and accepted in a request's "model", and a response
  // names the one its request named (the first when it named none); a
  // request naming another gets 404. Empty: the name the schedulers describe.
  std::vector<std::string> served_model_names;
  // --model as given. vLLM names the model by it when no
  // --served-model-name is set, so without served_model_names it is
  // accepted too and listed after the name the schedulers describe: a client
  // set up for `vllm serve PATH` (`vllm bench serve --model PATH`) finds the
  // model, and one that names the schedulers' name still does.
  std::string model_path;
  // With a key, /v1/*, /tokenize and /detokenize demand
  // "Authorization: Bearer <key>" (401 otherwise); /health and /metrics
  // never do.
  std::string api_key;
  // API key -> tenant (--api-keys-file); those routes then take these keys
  // too. A tenant's requests carry cache_salt "tenant:<name>", so tenants never
  // share a prefix-cache block, locally or in the KV-store, and one tenant's
  // TTFT cannot tell whether another's prompt is cached. The schedulers must
  // take the salt: --allow-request-cache-salt, or mutual TLS with this
  // frontend's certificate in the frontend role (rpc/tls.h).
  std::map<std::string, std::string> tenants;
  // --metrics-from: another process's /metrics (the scheduler's, under
  // tandem serve) served after the frontend's own series (metrics_relay.h).
  std::optional<MetricsUrl> metrics_from;
  // vLLM's --enable-auto-tool-choice with --tool-call-parser (tool_calls.h):
  // a chat request with tools and tool_choice "auto" (the default with
  // tools) gets the calls its answer writes as tool_calls. Without it such a
  // request is refused, as vLLM refuses it.
  std::optional<ToolParser> auto_tool_parser;
  // vLLM's --reasoning-parser (reasoning.h): chat and /v1/responses answers
  // carry the model's thinking apart from its content.
  std::optional<ReasoningParser> reasoning_parser;
  // vLLM's --return-tokens-as-token-ids: logprobs name tokens "token_id:<id>"
  // unless a request says otherwise.
  bool return_tokens_as_token_ids = false;
  // vLLM's --trust-request-chat-template: a chat request's own template
  // (chat_template, or chat_template_kwargs.chat_template) renders its
  // prompt; without it such a request is refused, as vLLM refuses it.
  bool trust_request_chat_template = false;
};

struct FrontendMetrics {
  explicit FrontendMetrics(prometheus::Registry* registry);
  prometheus::Family<prometheus::Counter>& requests;  // {endpoint, code}
  prometheus::Histogram& ttft;
  prometheus::Histogram& duration;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Counter& client_disconnects;
  prometheus::Counter& retries;
  prometheus::Gauge& in_flight;
  prometheus::Gauge& open_connections;
  // vLLM's vllm:request_params_n {model_name, engine}: the frontend fans a
  // request's n out into n scheduler requests, so only it knows n. Observed
  // once per prompt when its request ends (ObserveRequestParamsN).
  prometheus::Family<prometheus::Histogram>& vllm_request_params_n;
  void ObserveRequestParamsN(const std::string& model_name, int32_t n);
};

class Frontend {
 public:
  // `tool_use_template`: ServedTokenizer's.
  Frontend(FrontendOptions options, std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
           std::optional<tokenizer::ChatTemplate> chat_template, Router* router,
           std::shared_ptr<prometheus::Registry> registry,
           absl::StatusOr<std::optional<tokenizer::ChatTemplate>> tool_use_template = std::nullopt);

  // The HttpServer's handler.
  void Handle(std::shared_ptr<HttpExchange> exchange);

  // /health answers 503 from now on (Kubernetes stops sending traffic);
  // requests already accepted go on.
  void SetDraining() { draining_.store(true); }
  // Requests open: the jobs alive.
  int64_t in_flight() const;
  // Set once the server runs (its I/O threads may already serve /metrics).
  void set_server(const HttpServer* server) { server_.store(server); }

  // What a CompletionJob needs.
  const FrontendOptions& options() const { return options_; }
  const ServedTokenizer& served_tokenizer() const { return served_; }
  Router& router() { return *router_; }
  FrontendMetrics& metrics() { return metrics_; }
  // The served name, or nullopt while no replica has described the model.
  // The served names (see FrontendOptions::served_model_names); nullopt
  // until a scheduler has described its model when none were given.
  std::optional<std::vector<std::string>> ModelNames() const;
  void CountResponse(const std::string& endpoint, int http_status);
  // A job's life (JobMetrics): counted in in_flight(), and held (weakly)
  // for CutOff (one map for both). JobStarted returns the key JobFinished takes.
  uint64_t JobStarted(std::weak_ptr<CompletionJob> job);
  void JobFinished(uint64_t key);
  // Ends every job still open with `error` (a stream: an error event and
  // [DONE]): the drain timed out, and the connections close next.
  void CutOff(const ApiError& error);

 private:
  // The caller's tenant ("" for --api-key or no key at all), or nullopt when
  // a key is needed and the request has no valid one.
  std::optional<std::string> TenantOf(const HttpExchange& exchange) const;
  // What a parsed chat, completions or Responses request takes from the
  // server's flags (the reasoning and tool-call parsers), or the error
  // when those flags cannot honour it.
  [[nodiscard]] std::optional<ApiError> ApplyServerOptions(CompletionRequest* request) const;
  void Models(HttpExchange& exchange);
  void Tokenize(HttpExchange& exchange);
  void Detokenize(HttpExchange& exchange);
  void Metrics(std::shared_ptr<HttpExchange> exchange);
  // The registry's exposition (the relay's own part, when there is one).
  std::string RenderMetrics() const;

  FrontendOptions options_;
  ServedTokenizer served_;
  Router* router_;
  std::shared_ptr<prometheus::Registry> registry_;
  FrontendMetrics metrics_;
  std::atomic<const HttpServer*> server_{nullptr};
  std::atomic<bool> draining_{false};
  mutable std::mutex jobs_mu_;
  uint64_t next_job_ = 0;
  std::unordered_map<uint64_t, std::weak_ptr<CompletionJob>> jobs_;
  std::unique_ptr<MetricsRelay> metrics_relay_;  // last: it renders the registry
};

// Sends an OpenAI error object with its status.
void RespondError(HttpExchange& exchange, const ApiError& error);

}  // namespace tandem::frontend
