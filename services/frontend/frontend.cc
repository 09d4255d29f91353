#include "frontend.h"

#include <algorithm>
#include <ctime>
#include <iterator>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "completion_job.h"
#include "nlohmann/json.hpp"
#include "prometheus/text_serializer.h"
#include "tandem/frontend/openai.h"
#include "tandem/frontend/openai_responses.h"

namespace tandem::frontend {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string Dump(const OrderedJson& j) {
  return j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// Seconds; TTFT through the frontend starts near a millisecond.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

// The salt of a request's hash root (DESIGN §3): "tenant:<name>" for a
// tenant, then the body's cache_salt as " salt:<it>" ("salt:<it>" alone
// without a tenant). Tenant names hold no space, so no body salt reaches
// another tenant's blocks, a tenant's own, or the unsalted ones.
std::string CacheSalt(const std::string& tenant, const std::optional<std::string>& client) {
  std::string salt = tenant.empty() ? "" : "tenant:" + tenant;
  if (client) absl::StrAppend(&salt, salt.empty() ? "" : " ", "salt:", *client);
  return salt;
}

}  // namespace

FrontendMetrics::FrontendMetrics(prometheus::Registry* registry)
    : requests(prometheus::BuildCounter()
                   .Name("tandem_frontend_requests_total")
                   .Help("HTTP requests answered, by endpoint and status code (499: the client "
                         "closed the connection first).")
                   .Register(*registry)),
      ttft(prometheus::BuildHistogram()
               .Name("tandem_frontend_time_to_first_token_seconds")
               .Help("From the request's arrival to its first generated token.")
               .Register(*registry)
               .Add({}, LatencyBuckets())),
      duration(prometheus::BuildHistogram()
                   .Name("tandem_frontend_request_duration_seconds")
                   .Help("From a completion request's arrival to its last byte.")
                   .Register(*registry)
                   .Add({}, LatencyBuckets())),
      prompt_tokens(prometheus::BuildCounter()
                        .Name("tandem_frontend_prompt_tokens_total")
                        .Help("Prompt tokens sent to the schedulers (once per choice).")
                        .Register(*registry)
                        .Add({})),
      generation_tokens(prometheus::BuildCounter()
                            .Name("tandem_frontend_generation_tokens_total")
                            .Help("Generated tokens received from the schedulers.")
                            .Register(*registry)
                            .Add({})),
      client_disconnects(prometheus::BuildCounter()
                             .Name("tandem_frontend_client_disconnects_total")
                             .Help("Completion requests whose client closed the connection "
                                   "before the response ended (their generations aborted).")
                             .Register(*registry)
                             .Add({})),
      retries(prometheus::BuildCounter()
                  .Name("tandem_frontend_retries_total")
                  .Help("Choices sent to another replica after one answered UNAVAILABLE before "
                        "the first token.")
                  .Register(*registry)
                  .Add({})),
      in_flight(prometheus::BuildGauge()
                    .Name("tandem_frontend_requests_in_flight")
                    .Help("Completion requests being answered.")
                    .Register(*registry)
                    .Add({})),
      open_connections(prometheus::BuildGauge()
                           .Name("tandem_frontend_open_connections")
                           .Help("HTTP connections open.")
                           .Register(*registry)
                           .Add({})),
      vllm_request_params_n(prometheus::BuildHistogram()
                                .Name("vllm:request_params_n")
                                .Help("Histogram of the n request parameter.")
                                .Register(*registry)) {}

void FrontendMetrics::ObserveRequestParamsN(const std::string& model_name, int32_t n) {
  // vLLM's buckets and labels (vllm/v1/metrics/loggers.py); engine is "0" as
  // on the scheduler's vllm:* series.
  vllm_request_params_n
      .Add({{"model_name", model_name}, {"engine", "0"}},
           prometheus::Histogram::BucketBoundaries{1, 2, 5, 10, 20})
      .Observe(n);
}

Frontend::Frontend(FrontendOptions options, std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
                   std::optional<tokenizer::ChatTemplate> chat_template, Router* router,
                   std::shared_ptr<prometheus::Registry> registry,
                   absl::StatusOr<std::optional<tokenizer::ChatTemplate>> tool_use_template)
    : options_(std::move(options)),
      served_(std::move(tokenizer), std::move(chat_template), std::move(tool_use_template)),
      router_(router),
      registry_(std::move(registry)),
      metrics_(registry_.get()) {
  if (options_.metrics_from) {
    metrics_relay_ = std::make_unique<MetricsRelay>(*options_.metrics_from, *registry_,
                                                    [this] { return RenderMetrics(); });
  }
}

void RespondError(HttpExchange& exchange, const ApiError& error) {
  exchange.Respond(error.http_status, "application/json", error.ToJson());
}

std::optional<std::vector<std::string>> Frontend::ModelNames() const {
  if (!options_.served_model_names.empty()) return options_.served_model_names;
  std::optional<ModelInfo> model = router_->model();
  if (!model) return std::nullopt;
  std::vector<std::string> names = {model->model_name};
  if (!options_.model_path.empty() && options_.model_path != model->model_name) {
    names.push_back(options_.model_path);
  }
  return names;
}

uint64_t Frontend::JobStarted(std::weak_ptr<CompletionJob> job) {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  const uint64_t key = next_job_++;
  jobs_.emplace(key, std::move(job));
  return key;
}

void Frontend::JobFinished(uint64_t key) {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  jobs_.erase(key);
}

int64_t Frontend::in_flight() const {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  return static_cast<int64_t>(jobs_.size());
}

void Frontend::CutOff(const ApiError& error) {
  std::vector<std::shared_ptr<CompletionJob>> open;
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    for (const auto& [key, weak] : jobs_) {
      if (auto job = weak.lock()) open.push_back(std::move(job));
    }
  }
  for (const auto& job : open) job->Cut(error);
}

void Frontend::CountResponse(const std::string& endpoint, int http_status) {
  // A route's own name, or "other": a label value per path a client makes
  // up (a 401 or 405 for /v1/<anything>) would grow the registry without
  // bound.
  static constexpr std::string_view kRoutes[] = {
      "/health",    "/metrics",      "/v1/completions",   "/v1/chat/completions",
      "/v1/models", "/tokenize",     "/detokenize",       "/ping",
      "/version",   "/v1/responses", "/v1/responses/{id}"};
  const bool known =
      std::find(std::begin(kRoutes), std::end(kRoutes), endpoint) != std::end(kRoutes);
  metrics_.requests
      .Add({{"endpoint", known ? endpoint : "other"}, {"code", std::to_string(http_status)}})
      .Increment();
}

std::optional<std::string> Frontend::TenantOf(const HttpExchange& exchange) const {
  if (options_.api_key.empty() && options_.tenants.empty()) return std::string();
  const std::string header = exchange.request().Header("authorization");
  if (header.rfind("Bearer ", 0) != 0) return std::nullopt;
  const std::string key = header.substr(7);
  if (!options_.api_key.empty() && key == options_.api_key) return std::string();
  auto it = options_.tenants.find(key);
  if (it == options_.tenants.end()) return std::nullopt;
  return it->second;
}

void Frontend::Handle(std::shared_ptr<HttpExchange> exchange) {
  const HttpRequest& req = exchange->request();
  const std::string& path = req.path;
  // HEAD is a GET whose body the server leaves out (RFC 9110 9.3.2); a 405
  // names what the route takes in Allow (RFC 9110 15.5.6).
  auto method_is = [&](const char* method) {
    if (req.method == method || (req.method == "HEAD" && std::string_view(method) == "GET")) {
      return true;
    }
    ApiError e{.http_status = 405,
               .message = absl::StrCat(path, " takes ", method, ", not ", req.method)};
    exchange->Respond(e.http_status, "application/json", e.ToJson(),
                      {{"Allow", std::string_view(method) == "GET" ? "GET, HEAD" : method}});
    CountResponse(path, 405);
    return false;
  };
  if (path == "/health") {
    if (!method_is("GET")) return;
    const bool live_only = absl::StrContains(req.query, "live=1");
    const bool ok = live_only || (!draining_.load() && router_->any_serving());
    exchange->Respond(ok ? 200 : 503, "application/json",
                      ok ? "{}"
                         : (draining_.load() ? R"({"status":"draining"})"
                                             : R"({"status":"no scheduler replica is serving"})"));
    return;
  }
  if (path == "/metrics") {
    if (method_is("GET")) Metrics(exchange);
    return;
  }
  // vLLM's liveness route (GET or POST) and version.
  if (path == "/ping") {
    if (req.method == "POST" || method_is("GET")) {
      exchange->Respond(200, "application/json", "{}");
      CountResponse(path, 200);
    }
    return;
  }
  if (path == "/version") {
    if (method_is("GET")) {
      exchange->Respond(200, "application/json", Dump(OrderedJson{{"version", TANDEM_VERSION}}));
      CountResponse(path, 200);
    }
    return;
  }
  // With a key set, every route but /health and /metrics needs it:
  // /tokenize and /detokenize spend CPU too (issue 29).
  const bool needs_key =
      absl::StartsWith(path, "/v1/") || path == "/tokenize" || path == "/detokenize";
  const std::optional<std::string> tenant = TenantOf(*exchange);
  if (needs_key && !tenant) {
    ApiError e{.http_status = 401,
               .message = "a valid API key is needed: send 'Authorization: Bearer <key>'",
               .type = "authentication_error",
               .code = "invalid_api_key"};
    RespondError(*exchange, e);
    CountResponse(path, 401);
    return;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/responses") {
    if (!method_is("POST")) return;
    const Endpoint endpoint = path == "/v1/completions"        ? Endpoint::kCompletions
                              : path == "/v1/chat/completions" ? Endpoint::kChat
                                                               : Endpoint::kResponses;
    CompletionRequest request;
    if (auto e = endpoint == Endpoint::kResponses
                     ? ParseResponsesRequest(req.body, &request)
                     : ParseCompletionRequest(req.body, endpoint, &request)) {
      RespondError(*exchange, *e);
      CountResponse(path, e->http_status);
      return;
    }
    request.cache_salt = CacheSalt(*tenant, request.client_cache_salt);
    // vLLM's _base_request_id: the X-Request-Id header (gateways such as
    // Envoy set one on every request) before the body's request_id.
    if (auto id = req.headers.find("x-request-id");
        id != req.headers.end() && endpoint != Endpoint::kResponses) {
      request.request_id = id->second;
    }
    if (auto e = ApplyServerOptions(&request)) {
      RespondError(*exchange, *e);
      CountResponse(path, e->http_status);
      return;
    }
    StartCompletionJob(this, std::move(exchange), std::move(request), path);
    return;
  }
  if (path == "/v1/models") {
    if (method_is("GET")) Models(*exchange);
    return;
  }
  if (path == "/tokenize") {
    if (method_is("POST")) Tokenize(*exchange);
    return;
  }
  if (path == "/detokenize") {
    if (method_is("POST")) Detokenize(*exchange);
    return;
  }
  // A stored response's routes (OpenAI's retrieve, delete, cancel and
  // input_items): no response is stored here, so every id is not found, as
  // vLLM answers them without its store.
  if (constexpr std::string_view kStored = "/v1/responses/"; path.rfind(kStored, 0) == 0) {
    std::string_view id = std::string_view(path).substr(kStored.size());
    id = id.substr(0, id.find('/'));
    ApiError e{.http_status = 404,
               .message = absl::StrCat("Response with id '", std::string(id),
                                       "' not found: this server stores no responses"),
               .code = "not_found"};
    RespondError(*exchange, e);
    CountResponse("/v1/responses/{id}", 404);
    return;
  }
  ApiError e{.http_status = 404, .message = absl::StrCat("no route for ", req.method, " ", path)};
  RespondError(*exchange, e);
  CountResponse("other", 404);
}

std::optional<ApiError> Frontend::ApplyServerOptions(CompletionRequest* request) const {
  if (!request->return_tokens_as_token_ids) {
    request->return_tokens_as_token_ids = options_.return_tokens_as_token_ids;
  }
  if (request->endpoint != Endpoint::kCompletions) {
    request->reasoning_parser = options_.reasoning_parser;
  }
  if (request->chat_template && !options_.trust_request_chat_template) {
    return BadRequest(
        "Chat template is passed with request, but --trust-request-chat-template is not set. "
        "Refused request with untrusted chat template.",
        "chat_template");
  }
  if (!request->include_reasoning && !request->reasoning_parser) {
    return BadRequest(
        "'include_reasoning' false needs --reasoning-parser: without it the thinking is part "
        "of the content",
        "include_reasoning");
  }
  if (request->tool_choice == "auto") {
    if (!options_.auto_tool_parser) {
      return BadRequest(
          "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser "
          "to be set",
          "tool_choice");
    }
    request->tool_parser = options_.auto_tool_parser;
    // vLLM's hermes and mistral adjust_request: some models mark
    // <tool_call> special, Mistral's tokenizer [TOOL_CALLS], and a skipped
    // tag would hide the call.
    if (*request->tool_parser == ToolParser::kHermes ||
        *request->tool_parser == ToolParser::kMistral) {
      request->skip_special_tokens = false;
    }
  }
  return std::nullopt;
}

void Frontend::Models(HttpExchange& exchange) {
  std::optional<std::vector<std::string>> names = ModelNames();
  std::optional<ModelInfo> model = router_->model();
  if (!names || !model) {
    RespondError(exchange, FromStatus(14, "no scheduler replica has described its model yet"));
    CountResponse("/v1/models", 503);
    return;
  }
  OrderedJson data = OrderedJson::array();
  for (const std::string& name : *names) {
    OrderedJson card;
    card["id"] = name;
    card["object"] = "model";
    card["created"] = static_cast<int64_t>(std::time(nullptr));
    card["owned_by"] = "tandem";
    card["root"] = model->model_name;
    card["max_model_len"] = model->max_model_len;
    data.push_back(std::move(card));
  }
  OrderedJson body;
  body["object"] = "list";
  body["data"] = std::move(data);
  exchange.Respond(200, "application/json", Dump(body));
  CountResponse("/v1/models", 200);
}

// vLLM's /tokenize: {"prompt": text} or {"messages": [...]}, plus
// add_special_tokens and return_token_strs; answers {"count",
// "max_model_len", "tokens", "token_strs"}. As vLLM's, it does not check the
// prompt against the context ("count, then truncate" clients need the count
// of a prompt too long to serve), and a model it does not serve is a 404.
void Frontend::Tokenize(HttpExchange& exchange) {
  auto fail = [&](const ApiError& e) {
    RespondError(exchange, e);
    CountResponse("/tokenize", e.http_status);
  };
  if (JsonNestedDeeperThan(exchange.request().body))
    return fail(TooDeeplyNested("the request body"));
  const nlohmann::json body = nlohmann::json::parse(exchange.request().body, nullptr, false);
  if (!body.is_object()) return fail(BadRequest("the request body must be a JSON object"));
  const bool chat = body.contains("messages");
  if (!chat && !(body.contains("prompt") && body["prompt"].is_string())) {
    return fail(BadRequest("'prompt' (a string) or 'messages' is required", "prompt"));
  }
  const auto strs = body.find("return_token_strs");
  if (strs != body.end() && !strs->is_boolean() && !strs->is_null()) {
    return fail(BadRequest("'return_token_strs' must be a boolean", "return_token_strs"));
  }
  const bool token_strs = strs != body.end() && strs->is_boolean() && strs->get<bool>();
  // The parser takes the rest; return_token_strs is /tokenize's own.
  nlohmann::json rest = body;
  rest.erase("return_token_strs");
  CompletionRequest request;
  if (auto e = ParseCompletionRequest(rest.dump(), chat ? Endpoint::kChat : Endpoint::kCompletions,
                                      &request)) {
    return fail(*e);
  }
  std::optional<std::vector<std::string>> names = ModelNames();
  if (!request.model.empty() && names &&
      std::find(names->begin(), names->end(), request.model) == names->end()) {
    return fail({.http_status = 404,
                 .message = absl::StrCat("The model '", request.model,
                                         "' does not exist; this server serves '",
                                         absl::StrJoin(*names, "', '"), "'"),
                 .param = "model",
                 .code = "model_not_found"});
  }
  std::optional<ModelInfo> model = router_->model();
  ModelInfo limits = model.value_or(
      ModelInfo{.vocab_size = served_.tokenizer().vocab_size(), .max_model_len = INT32_MAX});
  PreparedPrompts prompts;
  if (auto e = PreparePrompts(served_, request, limits, &prompts, /*check_context=*/false)) {
    return fail(*e);
  }
  OrderedJson out;
  out["count"] = prompts.ids[0].size();
  out["max_model_len"] = model ? OrderedJson(model->max_model_len) : OrderedJson();
  out["tokens"] = prompts.ids[0];
  OrderedJson pieces;  // null unless asked, as vLLM's
  if (token_strs) {
    pieces = OrderedJson::array();
    for (int32_t id : prompts.ids[0]) {
      absl::StatusOr<std::string> piece = served_.tokenizer().IdToPiece(id);
      pieces.push_back(piece.ok() ? *piece : std::string());
    }
  }
  out["token_strs"] = std::move(pieces);
  exchange.Respond(200, "application/json", Dump(out));
  CountResponse("/tokenize", 200);
}

// vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}.
void Frontend::Detokenize(HttpExchange& exchange) {
  auto fail = [&](const ApiError& e) {
    RespondError(exchange, e);
    CountResponse("/detokenize", e.http_status);
  };
  if (JsonNestedDeeperThan(exchange.request().body))
    return fail(TooDeeplyNested("the request body"));
  const nlohmann::json body = nlohmann::json::parse(exchange.request().body, nullptr, false);
  auto tokens = body.is_object() ? body.find("tokens") : body.end();
  if (!body.is_object() || tokens == body.end() || !tokens->is_array()) {
    return fail(BadRequest("'tokens' (a list of token ids) is required", "tokens"));
  }
  std::vector<int32_t> ids;
  for (const auto& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      return fail(BadRequest("'tokens' must be a list of token ids", "tokens"));
    }
    ids.push_back(t.get<int32_t>());
  }
  absl::StatusOr<std::string> text = served_.tokenizer().Decode(ids);
  if (!text.ok()) return fail(BadRequest(std::string(text.status().message()), "tokens"));
  OrderedJson out;
  out["prompt"] = *text;
  exchange.Respond(200, "application/json", Dump(out));
  CountResponse("/detokenize", 200);
}

void Frontend::Metrics(std::shared_ptr<HttpExchange> exchange) {
  router_->UpdateMetrics();
  metrics_.in_flight.Set(static_cast<double>(in_flight()));
  if (const HttpServer* server = server_.load(); server != nullptr) {
    metrics_.open_connections.Set(static_cast<double>(server->open_connections()));
  }
  if (metrics_relay_ != nullptr) {
    metrics_relay_->Serve(std::move(exchange));
    return;
  }
  exchange->Respond(200, "text/plain; version=0.0.4; charset=utf-8", RenderMetrics());
}

std::string Frontend::RenderMetrics() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace tandem::frontend
