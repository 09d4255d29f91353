#include "generation_service.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
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

void ToProto(const ServiceStats& stats, v1::GetStatsResponse* s) {
  const engine::EngineStats& e = stats.engine;
  s->set_worker_connected(e.worker_connected);
  s->set_draining(stats.draining);
  s->set_async_scheduling(e.async_scheduling);
  s->set_num_active_streams(e.num_requests);
  s->set_num_steps_in_flight(e.num_steps_in_flight);
  s->set_num_worker_connects(e.num_worker_connects);
  if (e.has_scheduler) {
    const sched::SchedulerStats& st = e.scheduler;
    s->set_num_running(e.num_running);
    s->set_num_waiting(e.num_waiting);
    s->set_num_free_blocks(e.num_free_blocks);
    s->set_num_total_blocks(e.num_total_blocks);
    s->set_num_preemptions(st.num_preemptions_total);
    s->set_prefix_cache_queries(st.prefix_cache_queries_tokens);
    s->set_prefix_cache_hits(st.prefix_cache_hits_tokens);
    s->set_external_cache_queries(st.external_cache_queries_tokens);
    s->set_external_cache_hits(st.external_cache_hits_tokens);
    s->set_num_steps(st.num_steps);
    s->set_num_requests_finished(st.num_requests_finished);
    s->set_num_waiting_for_lookup(st.num_waiting_for_lookup);
    s->set_num_waiting_for_load(st.num_waiting_for_load);
    s->set_external_loaded_tokens(st.external_loaded_tokens);
  }
  s->set_max_running_plus_loading(e.max_running_plus_loading);
  s->set_max_steps_in_flight(e.max_steps_in_flight);
  s->set_num_steps_sent(e.num_steps_sent);
  s->set_step_scheduled_reqs_sum(e.step_scheduled_reqs_sum);
  s->set_step_message_bytes_sum(stats.step_message_bytes_sum);
  s->set_step_to_proto_seconds_sum(static_cast<double>(stats.step_to_proto_ns_sum) * 1e-9);
  s->set_step_serialize_samples(stats.step_serialize_samples);
  s->set_step_serialize_seconds_sum(static_cast<double>(stats.step_serialize_ns_sum) * 1e-9);
  s->set_external_load_failed_not_found(e.load_failed_not_found);
  s->set_external_load_failed_checksum(e.load_failed_checksum);
  s->set_external_load_failed_rpc(e.load_failed_rpc);
  if (e.has_kv_connector) {
    const sched::KvConnectorSchedulerStats& k = e.kv_connector;
    s->set_external_lookups(k.lookups);
    s->set_external_lookups_with_hits(k.lookups_with_hits);
    s->set_external_lookups_failed(k.lookups_failed);
    s->set_external_lookup_hit_tokens(k.lookup_hit_tokens);
    s->set_external_lookup_latency_seconds_sum(static_cast<double>(k.lookup_latency_ns_sum) * 1e-9);
    s->set_external_lookup_latency_seconds_max(static_cast<double>(k.lookup_latency_ns_max) * 1e-9);
    s->set_external_invalid_blocks(k.invalid_blocks);
    s->set_external_stored_blocks(k.stored_blocks);
    s->set_num_lookups_pending(k.lookups_pending);
    s->set_num_loads_in_flight(k.loads_in_flight);
    s->set_num_stores_in_flight(k.stores_in_flight);
  }
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
    Reject(*call, request->request_id(),
           grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "no worker is connected yet; the scheduler is not serving"));
    return reactor;
  }
  // The frontend (its role proven by a client certificate under mutual TLS)
  // sets the salt from the tenant its API key maps to. The request's content
  // is validated once, by the scheduler (sched::Scheduler::AddRequest).
  if (!request->cache_salt().empty() && !AcceptsCacheSalt(*context)) {
    Reject(*call, request->request_id(),
           grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "cache_salt is set by the server; this server does not accept it in "
                        "requests (--allow-request-cache-salt=false)"));
    return reactor;
  }
  sched::RequestSpec spec{
      .request_id = request->request_id().empty() ? absl::StrCat("req-", next_id_.fetch_add(1))
                                                  : request->request_id(),
      .prompt_token_ids = {request->prompt_token_ids().begin(), request->prompt_token_ids().end()},
      .sampling = rpc::FromProto(request->sampling(), RandomSeed()),
      .priority = request->priority(),
      .cache_salt = request->cache_salt(),
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
  engine_->Abort(request->request_id(), [reactor, response](bool found) {
    response->set_found(found);
    reactor->Finish(grpc::Status::OK);
  });
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
