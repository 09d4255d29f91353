#include "router.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tandem/common/logging.h"
#include "tandem/rpc/convert.h"
#include "tandem/rpc/server.h"
#include "tandem/rpc/service_convert.h"

namespace tandem::frontend {
namespace {

constexpr std::string_view kDnsPrefix = "dns:///";

struct Target {
  bool dns = false;
  std::string host;
  std::string port;
};

absl::Status ParseTarget(const std::string& target, Target* out) {
  std::string_view rest = target;
  out->dns = rest.starts_with(kDnsPrefix);
  if (out->dns) rest.remove_prefix(kDnsPrefix.size());
  const size_t colon = rest.rfind(':');
  int port = 0;
  if (colon == std::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(std::string(rest.substr(colon + 1)), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--scheduler '", target, "' is not host:port or dns:///name:port (port 1-65535)"));
  }
  out->host = std::string(rest.substr(0, colon));
  out->port = std::string(rest.substr(colon + 1));
  return absl::OkStatus();
}

// Every address `host` resolves to, as "ip:port" ("[ip6]:port"); empty when
// it does not resolve.
std::vector<std::string> ResolveAll(const Target& t) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::vector<std::string> out;
  if (getaddrinfo(t.host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) !=
        0) {
      continue;
    }
    std::string name = a->ai_family == AF_INET6 ? absl::StrCat("[", buf, "]:", t.port)
                                                : absl::StrCat(buf, ":", t.port);
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(std::move(name));
  }
  freeaddrinfo(res);
  std::sort(out.begin(), out.end());
  return out;
}

template <typename Request, typename Response, typename Fn>
grpc::Status CallWithDeadline(double seconds, Fn fn, const Request& request, Response* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  return fn(&context, request, response);
}

// Says which sampling defaults of the model the OpenAI requests get, and
// which they cannot.
void LogGenerationDefaults(const GenerationDefaults& d) {
  if (d.empty()) return;
  std::string applied;
  if (d.temperature) absl::StrAppend(&applied, " temperature=", *d.temperature);
  if (d.top_p) absl::StrAppend(&applied, " top_p=", *d.top_p);
  if (d.top_k) absl::StrAppend(&applied, " top_k=", *d.top_k);
  if (d.min_p) absl::StrAppend(&applied, " min_p=", *d.min_p);
  if (d.repetition_penalty)
    absl::StrAppend(&applied, " repetition_penalty=", *d.repetition_penalty);
  if (!applied.empty()) {
    TANDEM_LOG(INFO) << "the model's sampling defaults, for requests that leave them unset:"
                     << applied;
  }
}

}  // namespace

Replica::Replica(std::string name, int32_t connections) : name_(std::move(name)) {
  for (int32_t i = 0; i < connections; ++i) {
    grpc::ChannelArguments args = rpc::DefaultChannelArguments();
    // A subchannel pool of its own: channels with equal arguments would
    // otherwise share one connection.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels_.push_back(rpc::CreateChannel(name_, args));
    stubs_.push_back(v1::Generation::NewStub(channels_.back()));
  }
}

v1::Generation::Stub* Replica::stub() const {
  return stubs_[next_stub_.fetch_add(1, std::memory_order_relaxed) % stubs_.size()].get();
}

Router::Router(RouterOptions options, prometheus::Registry* registry)
    : options_(std::move(options)) {
  if (registry == nullptr) return;
  decisions_ = &prometheus::BuildCounter()
                    .Name("tandem_frontend_route_decisions_total")
                    .Help("Requests routed, by replica and reason (affinity: the prefix's "
                          "rendezvous choice; affinity_spill: the next one, the first being "
                          "loaded or down; least_loaded; round_robin; retry: after a replica "
                          "failed before streaming).")
                    .Register(*registry);
  outstanding_gauge_ = &prometheus::BuildGauge()
                            .Name("tandem_frontend_replica_outstanding_requests")
                            .Help("Requests this frontend has in flight on each replica.")
                            .Register(*registry);
  serving_gauge_ = &prometheus::BuildGauge()
                        .Name("tandem_frontend_replica_serving")
                        .Help("1 while the replica's gRPC health is SERVING (and it serves the "
                              "frontend's model), else 0.")
                        .Register(*registry);
}

Router::~Router() { Stop(); }

absl::Status Router::Start() {
  if (options_.targets.empty()) {
    return absl::InvalidArgumentError("at least one --scheduler is needed");
  }
  for (const std::string& t : options_.targets) {
    Target parsed;
    if (absl::Status s = ParseTarget(t, &parsed); !s.ok()) return s;
  }
  if (options_.affinity_blocks < 1) {
    return absl::InvalidArgumentError("--affinity-blocks must be >= 1");
  }
  if (options_.connections_per_replica < 1 || options_.connections_per_replica > 64) {
    return absl::InvalidArgumentError("--connections-per-replica must be 1 to 64");
  }
  if (!(options_.resolve_interval_s > 0) || !(options_.health_interval_s > 0)) {
    return absl::InvalidArgumentError("--resolve-interval-s must be > 0");
  }
  Resolve();
  CheckHealth();
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Router::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Router::Loop() {
  auto next_resolve = std::chrono::steady_clock::now();
  const auto resolve_every = std::chrono::milliseconds(
      static_cast<int64_t>(options_.resolve_interval_s * 1000));
  const auto health_every = std::chrono::milliseconds(
      static_cast<int64_t>(options_.health_interval_s * 1000));
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, health_every, [this] { return stop_; })) return;
    }
    if (std::chrono::steady_clock::now() >= next_resolve) {
      Resolve();
      next_resolve = std::chrono::steady_clock::now() + resolve_every;
    }
    CheckHealth();
  }
}

void Router::Resolve() {
  std::vector<std::pair<std::string, std::string>> wanted;  // name, target
  std::vector<std::string> unresolved;                       // dns targets that failed
  for (const std::string& t : options_.targets) {
    Target parsed;
    if (!ParseTarget(t, &parsed).ok()) continue;
    if (!parsed.dns) {
      wanted.emplace_back(t, t);
      continue;
    }
    std::vector<std::string> names = ResolveAll(parsed);
    if (names.empty()) {
      unresolved.push_back(t);
      continue;
    }
    for (std::string& n : names) wanted.emplace_back(std::move(n), t);
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Replica>> next;
  for (const auto& [name_binding, target] : wanted) {
    const std::string& name = name_binding;  // lambdas cannot capture a binding (clang 14)
    auto it = std::find_if(replicas_.begin(), replicas_.end(),
                           [&](const auto& r) { return r->name() == name; });
    if (it != replicas_.end()) {
      if (std::none_of(next.begin(), next.end(), [&](const auto& r) { return r->name() == name; })) {
        next.push_back(*it);
      }
      continue;
    }
    auto replica = std::make_shared<Replica>(name, options_.connections_per_replica);
    replica->from_target_ = target;
    TANDEM_LOG(INFO) << "replica " << name << " added (from " << target << ")";
    next.push_back(std::move(replica));
  }
  for (const auto& r : replicas_) {
    const bool kept =
        std::any_of(next.begin(), next.end(), [&](const auto& n) { return n == r; }) ||
        // A dns:/// target that did not resolve this time keeps its replicas.
        std::find(unresolved.begin(), unresolved.end(), r->from_target_) != unresolved.end();
    if (kept) {
      if (std::none_of(next.begin(), next.end(), [&](const auto& n) { return n == r; })) {
        next.push_back(r);
      }
      continue;
    }
    TANDEM_LOG(INFO) << "replica " << r->name() << " removed (no longer resolved)";
    if (outstanding_gauge_ != nullptr) {
      outstanding_gauge_->Remove(&outstanding_gauge_->Add({{"replica", r->name()}}));
      serving_gauge_->Remove(&serving_gauge_->Add({{"replica", r->name()}}));
    }
  }
  for (const std::string& t : unresolved) {
    TANDEM_LOG(WARNING) << "--scheduler " << t << " does not resolve now; keeping its replicas";
  }
  replicas_ = std::move(next);
}

void Router::CheckHealth() {
  for (const std::shared_ptr<Replica>& r : Snapshot()) {
    auto health = grpc::health::v1::Health::NewStub(r->channel());
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("tandem.v1.Generation");
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = CallWithDeadline(
        1.0,
        [&](grpc::ClientContext* c, const auto& q, auto* a) { return health->Check(c, q, a); },
        request, &response);
    const bool serving =
        status.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    if (serving != r->serving_.load()) {
      TANDEM_LOG(INFO) << "replica " << r->name() << (serving ? " SERVING" : " not serving: ")
                       << (serving ? "" : status.ok() ? "NOT_SERVING" : status.error_message());
    }
    if (serving && !r->described_.load()) {
      v1::GetModelInfoResponse info;
      const grpc::Status s = CallWithDeadline(
          2.0,
          [&](grpc::ClientContext* c, const auto& q, auto* a) {
            return r->control_stub()->GetModelInfo(c, q, a);
          },
          v1::GetModelInfoRequest(), &info);
      if (!s.ok()) {
        r->serving_.store(false);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (!model_) {
        model_ = rpc::FromProto(info);
        TANDEM_LOG(INFO) << "model " << model_->model_name << " (vocab " << model_->vocab_size
                         << ", max_model_len " << model_->max_model_len << ", block_size "
                         << model_->block_size << ") described by " << r->name();
        LogGenerationDefaults(model_->generation);
      } else if (info.model_fingerprint() != model_->model_fingerprint ||
                 info.block_size() != model_->block_size) {
        TANDEM_LOG(ERROR) << "replica " << r->name() << " serves model " << info.model_name()
                          << " (" << info.model_fingerprint() << "), not " << model_->model_name
                          << " (" << model_->model_fingerprint << "): it gets no requests";
        r->wrong_model_.store(true);
      }
      if (options_.sends_cache_salt && !info.accepts_cache_salt()) {
        TANDEM_LOG(ERROR) << "replica " << r->name()
                          << " does not accept cache_salt from this frontend, and every tenant "
                             "request carries one: it gets no requests. Give the frontend a "
                             "certificate with the frontend role (mutual TLS), or start the "
                             "scheduler with --allow-request-cache-salt";
        r->refuses_salt_.store(true);
      }
      r->described_.store(true);
    }
    r->serving_.store(serving);
  }
}

std::vector<std::shared_ptr<Replica>> Router::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return replicas_;
}

std::shared_ptr<Replica> Router::Pick(std::span<const int32_t> prompt,
                                      std::span<const std::string> exclude) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ReplicaState> states;
  std::vector<int> excluded;
  states.reserve(replicas_.size());
  for (int i = 0; i < static_cast<int>(replicas_.size()); ++i) {
    const Replica& r = *replicas_[i];
    states.push_back({.name = r.name(), .serving = r.serving(), .outstanding = r.outstanding()});
    if (std::find(exclude.begin(), exclude.end(), r.name()) != exclude.end()) {
      excluded.push_back(i);
    }
  }
  std::optional<uint64_t> key;
  if (model_) key = AffinityKey(prompt, model_->block_size, options_.affinity_blocks);
  const RouteChoice choice = PickReplica(states, options_.policy, key, turn_++, excluded);
  if (choice.index < 0) return nullptr;
  const std::shared_ptr<Replica>& r = replicas_[choice.index];
  r->outstanding_.fetch_add(1);
  if (decisions_ != nullptr) {
    decisions_
        ->Add({{"replica", r->name()},
               {"reason", exclude.empty() ? RouteReasonName(choice.reason) : "retry"}})
        .Increment();
  }
  return r;
}

void Router::Release(Replica* replica) { replica->outstanding_.fetch_sub(1); }

void Router::MarkUnavailable(Replica* replica) {
  if (replica->serving_.exchange(false)) {
    TANDEM_LOG(WARNING) << "replica " << replica->name()
                        << " answered UNAVAILABLE: no new requests until its health says SERVING";
  }
}

std::optional<ModelInfo> Router::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_;
}

bool Router::any_serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(replicas_.begin(), replicas_.end(),
                     [](const auto& r) { return r->serving(); });
}

void Router::UpdateMetrics() {
  if (outstanding_gauge_ == nullptr) return;
  for (const auto& r : Snapshot()) {
    outstanding_gauge_->Add({{"replica", r->name()}}).Set(static_cast<double>(r->outstanding()));
    serving_gauge_->Add({{"replica", r->name()}}).Set(r->serving() ? 1 : 0);
  }
}

}  // namespace tandem::frontend
