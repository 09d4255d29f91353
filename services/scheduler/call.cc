#include "call.h"

#include <iterator>

namespace tandem::scheduler {

StreamWriter::StreamWriter() : thread_([this] { Run(); }) {}
StreamWriter::~StreamWriter() { Stop(); }

void StreamWriter::Submit(std::vector<std::shared_ptr<GenerateCall>>& calls) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.insert(queue_.end(), std::make_move_iterator(calls.begin()),
                  std::make_move_iterator(calls.end()));
  }
  calls.clear();  // keeps its capacity for the engine's next turn
  cv_.notify_one();
}

void StreamWriter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void StreamWriter::Run() {
  std::vector<std::shared_ptr<GenerateCall>> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything flushed
      batch.swap(queue_);
    }
    for (const std::shared_ptr<GenerateCall>& call : batch) call->Flush();
    batch.clear();
  }
}

}  // namespace tandem::scheduler
