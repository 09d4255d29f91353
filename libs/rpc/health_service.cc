#include "health_service.h"

#include <optional>
#include <utility>

namespace tandem::rpc {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch call. Writes one status at a time; a status that changes while a
// write is in flight is coalesced (only the latest is sent, and only if it
// differs from the last one sent).
class HealthService::Watcher final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, std::string name) : service_(service), name_(std::move(name)) {}

  const std::string& name() const { return name_; }

  void Send(ServingStatus status) {
    std::unique_lock<std::mutex> lock(mu_);
    pending_ = status;
    MaybeStart(lock);
  }
  // Ends the call once the queued status is written.
  void End(grpc::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
    if (end_requested_) return;
    end_requested_ = true;
    end_status_ = std::move(status);
    MaybeStart(lock);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok && !end_requested_) {
      pending_.reset();
      end_requested_ = true;
      end_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "health watch write failed");
    }
    MaybeStart(lock);
  }
  void OnCancel() override {
    std::unique_lock<std::mutex> lock(mu_);
    pending_.reset();
    if (!end_requested_) {
      end_requested_ = true;
      end_status_ = grpc::Status::CANCELLED;
    }
    MaybeStart(lock);
  }
  void OnDone() override {
    service_->RemoveWatcher(this);
    delete this;
  }

 private:
  // Starts the next write or the Finish; releases `lock` before calling gRPC.
  void MaybeStart(std::unique_lock<std::mutex>& lock) {
    if (writing_ || finish_issued_) return;
    if (pending_.has_value() && pending_ != last_sent_) {
      writing_ = true;
      last_sent_ = pending_;
      response_.set_status(*pending_);
      pending_.reset();
      lock.unlock();
      StartWrite(&response_);
      return;
    }
    pending_.reset();
    if (end_requested_) {
      finish_issued_ = true;
      grpc::Status status = end_status_;
      lock.unlock();
      Finish(status);
    }
  }

  HealthService* const service_;
  const std::string name_;
  std::mutex mu_;
  std::optional<ServingStatus> pending_;
  std::optional<ServingStatus> last_sent_;
  HealthCheckResponse response_;
  bool writing_ = false;
  bool end_requested_ = false;
  bool finish_issued_ = false;
  grpc::Status end_status_;
};

HealthService::HealthService() { statuses_[""] = HealthCheckResponse::NOT_SERVING; }

HealthService::~HealthService() = default;

void HealthService::Set(const std::string& service_name, ServingStatus status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  statuses_[service_name] = status;
  for (Watcher* w : watchers_) {
    if (w->name() == service_name) w->Send(status);
  }
}

void HealthService::SetServingStatus(const std::string& service_name, bool serving) {
  Set(service_name, serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
}

void HealthService::SetServingStatus(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  const ServingStatus status =
      serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  for (auto& [name, s] : statuses_) s = status;
  for (Watcher* w : watchers_) {
    if (statuses_.contains(w->name())) w->Send(status);
  }
}

void HealthService::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [name, s] : statuses_) s = HealthCheckResponse::NOT_SERVING;
  for (Watcher* w : watchers_) {
    if (statuses_.contains(w->name())) w->Send(HealthCheckResponse::NOT_SERVING);
    w->End(grpc::Status::OK);
  }
}

void HealthService::RemoveWatcher(Watcher* watcher) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = statuses_.find(request->service());
    if (it == statuses_.end()) {
      status =
          grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service '" + request->service() + "'");
    } else {
      response->set_status(it->second);
    }
  }
  reactor->Finish(status);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext*, const HealthCheckRequest* request) {
  auto* watcher = new Watcher(this, request->service());
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.insert(watcher);
  auto it = statuses_.find(request->service());
  watcher->Send(it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second);
  if (shut_down_) watcher->End(grpc::Status::OK);
  return watcher;
}

}  // namespace tandem::rpc
