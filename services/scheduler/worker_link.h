// The scheduler's connection to its worker: a connector thread that waits
// for the worker to report SERVING, asks Describe, and opens the Execute
// stream; and a reader thread per stream that forwards every
// ModelRunnerOutput to the engine. Writes happen on the engine thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::scheduler {

// One live Execute stream. Owned by the engine thread.
class WorkerStream {
 public:
  using OutputFn = std::function<void(uint64_t generation, std::unique_ptr<v1::ModelRunnerOutput>)>;
  using BrokenFn = std::function<void(uint64_t generation, std::string reason)>;

  WorkerStream(std::shared_ptr<grpc::Channel> channel, uint64_t generation,
               v1::DescribeResponse description);
  ~WorkerStream();  // cancels the stream and joins the reader

  // Opens the stream and starts the reader. False when the worker refused.
  bool Start(OutputFn on_output, BrokenFn on_broken, std::string* error);
  // False when the stream is broken (the reader reports it too).
  bool Write(const v1::SchedulerOutput& step);

  uint64_t generation() const { return generation_; }
  const v1::DescribeResponse& description() const { return description_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SchedulerOutput, v1::ModelRunnerOutput>> stream_;
  std::thread reader_;
  const uint64_t generation_;
  const v1::DescribeResponse description_;
};

// Connects (and reconnects) in the background. When a worker is SERVING and
// described, hands a started WorkerStream to `on_connected`; then waits for
// RequestReconnect().
class WorkerConnector {
 public:
  using ConnectedFn = std::function<void(std::unique_ptr<WorkerStream>)>;

  WorkerConnector(std::string address, WorkerStream::OutputFn on_output,
                  WorkerStream::BrokenFn on_broken, ConnectedFn on_connected);
  ~WorkerConnector();

  void Start();
  // Connects again, after `after` (a worker whose configuration the
  // scheduler refused: it would be refused again at once).
  void RequestReconnect(std::chrono::milliseconds after = std::chrono::milliseconds(0));
  void Stop();

 private:
  void Loop();
  std::unique_ptr<WorkerStream> TryConnect(std::string* error);

  const std::string address_;
  WorkerStream::OutputFn on_output_;
  WorkerStream::BrokenFn on_broken_;
  ConnectedFn on_connected_;
  std::shared_ptr<grpc::Channel> channel_;
  uint64_t next_generation_ = 1;

  std::mutex mu_;
  std::condition_variable cv_;
  bool want_connection_ = true;
  std::chrono::steady_clock::time_point not_before_{};  // RequestReconnect's `after`
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem::scheduler
