#include "generation_service.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/rpc/convert.h"
#include "tandem/rpc/status.h"
#include "tandem/rpc/tls.h"

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
      : engine_(engine), context_(context), call_(std::make_shared<GenerateCall>(this)) {}

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
  TANDEM_LOG(INFO) << "request " << (request_id.empty() ? "(no id)" : request_id)
                   << " rejected: status=" << rpc::StatusCodeName(status) << " "
                   << status.error_message();
  call.Finish(std::move(status));
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace

absl::Status ValidateGenerateRequest(const v1::GenerateRequest& request,
                                     const v1::GetModelInfoResponse& model,
                                     const GenerationOptions& options) {
  const int32_t vocab = model.vocab_size();
  if (request.prompt_token_ids_size() == 0) {
    return absl::InvalidArgumentError(
        "prompt_token_ids is empty; a prompt needs at least one token");
  }
  for (int i = 0; i < request.prompt_token_ids_size(); ++i) {
    const int32_t id = request.prompt_token_ids(i);
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt_token_ids[", i, "] = ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  SamplingParams sampling = rpc::FromProto(request.sampling());
  if (absl::Status s = sampling.Validate(vocab); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", s.message()));
  }
  const int64_t total = static_cast<int64_t>(request.prompt_token_ids_size()) + sampling.max_tokens;
  if (total > model.max_model_len()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", request.prompt_token_ids_size(), " tokens) + max_tokens (", sampling.max_tokens,
        ") = ", total, " exceeds max_model_len ", model.max_model_len()));
  }
  if (!request.cache_salt().empty() && !options.allow_request_cache_salt) {
    return absl::InvalidArgumentError(
        "cache_salt is set by the server; this server does not accept it in requests "
        "(--allow-request-cache-salt=false)");
  }
  return absl::OkStatus();
}

GenerationService::GenerationService(Engine* engine, GenerationOptions options)
    : engine_(engine), options_(options) {}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(engine_, context);
  const std::shared_ptr<GenerateCall>& call = reactor->call();
  call->start_ns = MonotonicNanos();
  call->num_prompt_tokens = request->prompt_token_ids_size();
  const grpc::Status draining(grpc::StatusCode::UNAVAILABLE,
                              "the scheduler is draining (shutting down); retry elsewhere");
  if (engine_->draining()) {
    Reject(*call, request->request_id(), draining);
    return reactor;
  }
  ModelInfo model = engine_->model_info();
  if (!model.ready) {
    Reject(*call, request->request_id(),
           grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "no worker is connected yet; the scheduler is not serving"));
    return reactor;
  }
  GenerationOptions options = options_;
  // The frontend (its role proven by a client certificate under mutual TLS)
  // sets the salt from the tenant its API key maps to.
  if (rpc::RoleOf(*context) == rpc::CallerRole::kFrontend) options.allow_request_cache_salt = true;
  if (absl::Status s = ValidateGenerateRequest(*request, model.info, options); !s.ok()) {
    Reject(*call, request->request_id(), rpc::ToGrpcStatus(s));
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
  ModelInfo model = engine_->model_info();
  if (!model.ready) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no worker is connected yet"));
    return reactor;
  }
  *response = model.info;
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetStats(grpc::CallbackServerContext* context,
                                                      const v1::GetStatsRequest*,
                                                      v1::GetStatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  *response = engine_->stats();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::scheduler
