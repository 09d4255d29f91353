#include "generation_service.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/rpc/convert.h"
#include "tandem/rpc/service_convert.h"
#include "tandem/rpc/status.h"
#include "tandem/rpc/tls.h"
#include "tandem/sched/request_id.h"

namespace tandem::scheduler {
namespace {

// gRPC reports a client cancel and a passed deadline the same way (OnCancel,
// IsCancelled); the deadline tells them apart. The server's deadline is the
// client's timeout counted from when the call arrived, so it falls a little
// after the client's own; a client whose deadline passes first cancels the
// call (RST_STREAM) just before the server's deadline. A cancel within
// kDeadlineSlack of the deadline is therefore the deadline's.
constexpr auto kDeadlineSlack = std::chrono::milliseconds(100);
Engine::CancelCause CauseOf(const grpc::CallbackServerContext& context) {
  return context.deadline() <= std::chrono::system_clock::now() + kDeadlineSlack
             ? Engine::CancelCause::kDeadline
             : Engine::CancelCause::kClient;
}

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(Engine* engine, const grpc::CallbackServerContext* context)
      : engine_(engine), context_(context), call_(std::make_shared<GenerateCall>(this, engine)) {}

  const std::shared_ptr<GenerateCall>& call() const { return call_; }
  void set_submitted() { submitted_.store(true); }

  void OnWriteDone(bool ok) override { call_->OnWriteDone(ok); }
  void OnCancel() override {
    if (submitted_.load()) engine_->Cancel(call_, CauseOf(*context_));
  }
  void OnDone() override { delete this; }

 private:
  Engine* const engine_;
  const grpc::CallbackServerContext* const context_;
  std::shared_ptr<GenerateCall> call_;
  std::atomic<bool> submitted_{false};
};

// The one log line of a request that never reached the engine.
void Reject(GenerateCall& call, const std::string& request_id, grpc::Status status) {
  TANDEM_LOG(INFO) << "request "
                   << (request_id.empty() ? "(no id)" : sched::LoggableRequestId(request_id))
                   << " rejected: status=" << rpc::StatusCodeName(status) << " "
                   << status.error_message();
  call.Finish(std::move(status));
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// The engine's counters (libs/rpc), then the service's own.
void ToProto(const ServiceStats& stats, v1::GetStatsResponse* s) {
  rpc::ToProto(stats.engine, s);
  s->set_draining(stats.draining);
  s->set_step_message_bytes_sum(stats.step_message_bytes_sum);
  s->set_step_to_proto_seconds_sum(static_cast<double>(stats.step_to_proto_ns_sum) * 1e-9);
  s->set_step_serialize_samples(stats.step_serialize_samples);
  s->set_step_serialize_seconds_sum(static_cast<double>(stats.step_serialize_ns_sum) * 1e-9);
}

}  // namespace

GenerationService::GenerationService(Engine* engine, GenerationOptions options)
    : engine_(engine), options_(options) {}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(engine_, context);
  const std::shared_ptr<GenerateCall>& call = reactor->call();
  call->times.arrival_ns = MonotonicNanos();
  call->times.max_tokens = request->sampling().max_tokens();
  call->num_prompt_tokens = request->prompt_token_ids_size();
  const grpc::Status draining(grpc::StatusCode::UNAVAILABLE,
                              "the scheduler is draining (shutting down); retry elsewhere");
  if (engine_->draining()) {
    Reject(*call, request->request_id(), draining);
    return reactor;
  }
  // Before anything logs it or keys a map with it (empty: the server names it).
  if (!request->request_id().empty()) {
    if (absl::Status s = sched::ValidateRequestId(request->request_id()); !s.ok()) {
      Reject(*call, request->request_id(),
             grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message())));
      return reactor;
    }
  }
  if (!engine_->model_info().ready) {
    const std::string refused = engine_->refused_worker();
    Reject(*call, request->request_id(),
           grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        refused.empty()
                            ? "no worker is connected yet; the scheduler is not serving"
                            : absl::StrCat("the scheduler is not serving: ", refused)));
    return reactor;
  }
  // The frontend (its role proven by a client certificate under mutual TLS)
  // sets the salt from the tenant its API key maps to. The request's content
  // is validated once, by the scheduler (sched::Scheduler::AddRequest).
  if (!request->cache_salt().empty() && !AcceptsCacheSalt(*context)) {
    Reject(*call, request->request_id(),
           grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "cache_salt is not accepted here: this scheduler takes it only from a "
                        "frontend proven by its certificate (mutual TLS) or with "
                        "--allow-request-cache-salt"));
    return reactor;
  }
  GenerateRequest r = rpc::FromProto(*request, RandomSeed());
  sched::RequestSpec spec{
      // Random, as vLLM's: no client's own id takes it, and no one guesses
      // it to abort the request.
      .request_id = r.request_id.empty()
                        ? absl::StrFormat("req-%016x%016x", RandomSeed(), RandomSeed())
                        : std::move(r.request_id),
      .prompt_token_ids = std::move(r.prompt_token_ids),
      .sampling = std::move(r.sampling),
      .priority = r.priority,
      .cache_salt = std::move(r.cache_salt),
  };
  // The drain gate: from here on the call is the engine's and finishes there.
  if (!engine_->TryAccept()) {
    Reject(*call, request->request_id(), draining);
    return reactor;
  }
  call->request_id = spec.request_id;
  reactor->set_submitted();
  engine_->Submit(call, std::move(spec));
  // A cancel that raced with set_submitted() is not lost (a second one is
  // ignored by the engine).
  if (context->IsCancelled()) engine_->Cancel(call, CauseOf(*context));
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* context,
                                                   const v1::AbortRequest* request,
                                                   v1::AbortResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!sched::ValidateRequestId(request->request_id()).ok()) {  // no request has such an id
    response->set_found(false);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  engine_->Abort(
      request->request_id(),
      [reactor, response](bool found) {
        response->set_found(found);
        reactor->Finish(grpc::Status::OK);
      },
      request->stop_string());
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::GetModelInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const ModelInfo model = engine_->model_info();
  if (!model.ready) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no worker is connected yet"));
    return reactor;
  }
  rpc::ToProto(model, response);
  response->set_accepts_cache_salt(AcceptsCacheSalt(*context));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

bool GenerationService::AcceptsCacheSalt(const grpc::ServerContextBase& context) const {
  return options_.allow_request_cache_salt || rpc::RoleOf(context) == rpc::CallerRole::kFrontend;
}

grpc::ServerUnaryReactor* GenerationService::GetStats(grpc::CallbackServerContext* context,
                                                      const v1::GetStatsRequest*,
                                                      v1::GetStatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ToProto(engine_->stats(), response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::scheduler
