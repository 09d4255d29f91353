// Private: a tiny fork-join pool for the CPU runner. ParallelFor(n, fn) runs
// fn(0..n-1) on the workers and the calling thread and returns when all are
// done. Which thread runs a task never changes its arithmetic.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::model::internal {

class ThreadPool {
 public:
  explicit ThreadPool(int32_t num_threads) {
    for (int32_t i = 1; i < num_threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t num_threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
    if (workers_.empty() || n <= 1) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      next_ = 0;
      pending_ = n;
      ++generation_;
    }
    wake_.notify_all();
    RunTasks();
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void RunTasks() {
    while (true) {
      int64_t i;
      const std::function<void(int64_t)>* fn;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (fn_ == nullptr || next_ >= n_) return;
        i = next_++;
        fn = fn_;
      }
      (*fn)(i);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_all();
    }
  }
  void Work() {
    uint64_t seen = 0;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      RunTasks();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, next_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace tandem::model::internal
