#include "worker_link.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tandem/common/logging.h"
#include "tandem/rpc/server.h"

namespace tandem::scheduler {
namespace {

// The worker's readiness (grpc.health.v1, service tandem.v1.Worker).
bool IsServing(const std::shared_ptr<grpc::Channel>& channel, std::string* error) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("tandem.v1.Worker");
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    *error = absl::StrCat("health check: ", status.error_message());
    return false;
  }
  if (response.status() == grpc::health::v1::HealthCheckResponse::SERVING) return true;
  *error = "worker is not SERVING yet";
  return false;
}

}  // namespace

WorkerStream::WorkerStream(std::shared_ptr<grpc::Channel> channel, uint64_t generation,
                           v1::DescribeResponse description)
    : channel_(std::move(channel)),
      stub_(v1::Worker::NewStub(channel_)),
      generation_(generation),
      description_(std::move(description)) {}

WorkerStream::~WorkerStream() {
  context_.TryCancel();
  if (reader_.joinable()) reader_.join();
  if (stream_ != nullptr) stream_->Finish().ok();
}

bool WorkerStream::Start(OutputFn on_output, BrokenFn on_broken, std::string* error) {
  stream_ = stub_->Execute(&context_);
  if (stream_ == nullptr) {
    *error = "cannot open the Execute stream";
    return false;
  }
  reader_ = std::thread([this, on_output = std::move(on_output), on_broken = std::move(on_broken)] {
    for (;;) {
      auto out = std::make_unique<v1::ModelRunnerOutput>();
      if (!stream_->Read(out.get())) break;
      on_output(generation_, std::move(out));
    }
    on_broken(generation_, "the worker's Execute stream ended");
  });
  return true;
}

bool WorkerStream::Write(const v1::SchedulerOutput& step) { return stream_->Write(step); }

WorkerConnector::WorkerConnector(std::string address, WorkerStream::OutputFn on_output,
                                 WorkerStream::BrokenFn on_broken, ConnectedFn on_connected)
    : address_(std::move(address)),
      on_output_(std::move(on_output)),
      on_broken_(std::move(on_broken)),
      on_connected_(std::move(on_connected)),
      channel_(rpc::CreateChannel(address_)) {}

WorkerConnector::~WorkerConnector() { Stop(); }

void WorkerConnector::Start() { thread_ = std::thread([this] { Loop(); }); }

void WorkerConnector::RequestReconnect(std::chrono::milliseconds after) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    want_connection_ = true;
    not_before_ = std::chrono::steady_clock::now() + after;
  }
  cv_.notify_all();
}

void WorkerConnector::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<WorkerStream> WorkerConnector::TryConnect(std::string* error) {
  if (!IsServing(channel_, error)) return nullptr;
  auto stub = v1::Worker::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::DescribeResponse description;
  grpc::Status s = stub->Describe(&context, v1::DescribeRequest(), &description);
  if (!s.ok()) {
    *error = absl::StrCat("Describe: ", s.error_message());
    return nullptr;
  }
  auto stream = std::make_unique<WorkerStream>(channel_, next_generation_++, description);
  if (!stream->Start(on_output_, on_broken_, error)) return nullptr;
  return stream;
}

void WorkerConnector::Loop() {
  std::string last_error;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || want_connection_; });
      cv_.wait_until(lock, not_before_, [&] { return stopping_; });
      if (stopping_) return;
    }
    std::string error;
    std::unique_ptr<WorkerStream> stream = TryConnect(&error);
    if (stream != nullptr) {
      TANDEM_LOG(INFO) << "connected to worker " << address_ << " ("
                       << stream->description().model_name() << ", "
                       << stream->description().num_kv_blocks() << " KV blocks of "
                       << stream->description().block_size() << " tokens, backend "
                       << stream->description().backend() << ")";
      last_error.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        want_connection_ = false;
      }
      on_connected_(std::move(stream));
      continue;
    }
    if (error != last_error) {
      TANDEM_LOG(WARNING) << "worker " << address_ << " not ready: " << error;
      last_error = error;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping_; });
    if (stopping_) return;
  }
}

}  // namespace tandem::scheduler
