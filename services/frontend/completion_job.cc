#include "completion_job.h"

#include <atomic>
#include <chrono>

#include "frontend.h"
#include "grpcpp/grpcpp.h"
#include "tandem/frontend/completion_job.h"
#include "tandem/rpc/service_convert.h"
#include "tandem/rpc/status.h"

namespace tandem::frontend {
namespace {

using Clock = std::chrono::steady_clock;

class GrpcCall final : public GenerateCall {
 public:
  GrpcCall(std::shared_ptr<grpc::ClientContext> context, std::shared_ptr<Replica> replica,
           std::string request_id)
      : context_(std::move(context)),
        replica_(std::move(replica)),
        request_id_(std::move(request_id)) {}
  void Cancel() override { context_->TryCancel(); }
  // The scheduler's Abort with stop_string: the request finishes as "stop"
  // and the stream ends by itself. Where the Abort fails or finds nothing
  // (the request ended meanwhile), the call is cancelled as before.
  void StopAtString() override {
    if (stopping_.exchange(true)) return;
    struct Pending {
      grpc::ClientContext context;
      v1::AbortRequest request;
      v1::AbortResponse response;
    };
    auto pending = std::make_shared<Pending>();
    pending->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pending->request.set_request_id(request_id_);
    pending->request.set_stop_string(true);
    std::weak_ptr<grpc::ClientContext> call = context_;
    replica_->control_stub()->async()->Abort(&pending->context, &pending->request,
                                             &pending->response,
                                             [pending, call](const grpc::Status& status) {
                                               if (status.ok() && pending->response.found()) return;
                                               if (auto context = call.lock()) context->TryCancel();
                                             });
  }

 private:
  std::shared_ptr<grpc::ClientContext> context_;
  std::shared_ptr<Replica> replica_;
  const std::string request_id_;
  std::atomic<bool> stopping_{false};
};

// One Generate call. Its callbacks run on gRPC's threads: a message goes
// straight to the job (under its lock, and from there to the client's
// socket); the call's end is posted to the connection's strand, after every
// message. Deletes itself after OnDone.
class CallReactor final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  CallReactor(std::shared_ptr<CompletionJob> job, std::shared_ptr<HttpExchange> exchange,
              Router* router, CallId id, std::shared_ptr<Replica> replica,
              std::shared_ptr<grpc::ClientContext> context, const GenerateRequest& request)
      : job_(std::move(job)),
        exchange_(std::move(exchange)),
        router_(router),
        id_(id),
        replica_(std::move(replica)),
        context_(std::move(context)) {
    rpc::ToProto(request, &request_);
  }

  void Start() {
    replica_->stub()->async()->Generate(context_.get(), &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    job_->OnCallMessage(id_, rpc::FromProto(response_));
    response_.Clear();
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    router_->Release(replica_.get());
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      router_->MarkUnavailable(replica_.get());
    }
    exchange_->Post([job = job_, id = id_, name = replica_->name(),
                     status = rpc::FromGrpcStatus(status)] { job->OnCallDone(id, name, status); });
    delete this;
  }

 private:
  std::shared_ptr<CompletionJob> job_;
  std::shared_ptr<HttpExchange> exchange_;
  Router* router_;
  CallId id_;
  std::shared_ptr<Replica> replica_;
  std::shared_ptr<grpc::ClientContext> context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
};

class GrpcTransport final : public GenerateTransport {
 public:
  GrpcTransport(Router* router, std::shared_ptr<HttpExchange> exchange)
      : router_(router), exchange_(std::move(exchange)) {}

  std::optional<Started> StartCall(std::shared_ptr<CompletionJob> job, CallId id,
                                   const GenerateRequest& request,
                                   const std::vector<std::string>& exclude) override {
    std::shared_ptr<Replica> replica = router_->Pick(request.prompt_token_ids, exclude);
    if (replica == nullptr) return std::nullopt;
    Started started{.replica = replica->name()};
    auto context = std::make_shared<grpc::ClientContext>();
    started.call = std::make_shared<GrpcCall>(context, replica, request.request_id);
    (new CallReactor(std::move(job), exchange_, router_, id, std::move(replica), std::move(context),
                     request))
        ->Start();
    return started;
  }

 private:
  Router* router_;
  std::shared_ptr<HttpExchange> exchange_;
};

class ExchangeSink final : public CompletionSink {
 public:
  explicit ExchangeSink(std::shared_ptr<HttpExchange> exchange) : exchange_(std::move(exchange)) {}

  void Respond(const std::string& json) override {
    exchange_->Respond(200, "application/json", json);
  }
  void RespondError(const ApiError& error) override { frontend::RespondError(*exchange_, error); }
  void StartStream() override { exchange_->StartStream(200, "text/event-stream; charset=utf-8"); }
  void Write(const std::string& event) override { exchange_->Write(event); }
  void End() override { exchange_->End(); }
  void WatchClientGone(std::function<void()> gone) override {
    exchange_->SetOnClientGone(std::move(gone));
  }

 private:
  std::shared_ptr<HttpExchange> exchange_;
};

// FrontendMetrics for one request; in flight from construction to
// destruction (the job's life).
class JobMetrics final : public CompletionJobMetrics {
 public:
  JobMetrics(Frontend* frontend, std::string endpoint)
      : frontend_(frontend), endpoint_(std::move(endpoint)), start_(Clock::now()) {}
  // From Start: the job, held weakly by the frontend while it lives.
  void Track(std::weak_ptr<CompletionJob> job) { key_ = frontend_->JobStarted(std::move(job)); }
  ~JobMetrics() override {
    frontend_->JobFinished(key_);
    metrics().duration.Observe(Seconds());
    // Every prompt whose choices were sent, finished or not (vLLM counts
    // aborted requests among the finished).
    for (size_t p = 0; p < num_prompts_sent_; ++p) metrics().ObserveRequestParamsN(model_, n_);
  }

  void OnResponse(int http_status) override { frontend_->CountResponse(endpoint_, http_status); }
  void OnSent(const std::string& model, size_t num_prompts, int32_t n) override {
    model_ = model;
    num_prompts_sent_ = num_prompts;
    n_ = n;
  }
  void OnPromptTokens(int64_t n) override {
    metrics().prompt_tokens.Increment(static_cast<double>(n));
  }
  void OnFirstToken() override { metrics().ttft.Observe(Seconds()); }
  void OnGeneratedTokens(int64_t n) override {
    metrics().generation_tokens.Increment(static_cast<double>(n));
  }
  void OnRetry() override { metrics().retries.Increment(); }
  void OnClientGone() override { metrics().client_disconnects.Increment(); }

 private:
  FrontendMetrics& metrics() { return frontend_->metrics(); }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  Frontend* frontend_;
  std::string endpoint_;
  Clock::time_point start_;
  uint64_t key_ = 0;
  std::string model_;
  size_t num_prompts_sent_ = 0;
  int32_t n_ = 0;
};

}  // namespace

void StartCompletionJob(Frontend* frontend, std::shared_ptr<HttpExchange> exchange,
                        CompletionRequest request, std::string endpoint) {
  auto metrics = std::make_unique<JobMetrics>(frontend, std::move(endpoint));
  JobMetrics* tracked = metrics.get();
  auto job = std::make_shared<CompletionJob>(
      frontend->served_tokenizer(), std::make_unique<GrpcTransport>(&frontend->router(), exchange),
      std::make_unique<ExchangeSink>(exchange), std::move(metrics), std::move(request));
  tracked->Track(job);
  job->Start(frontend->router().model(), frontend->ModelNames());
}

}  // namespace tandem::frontend
