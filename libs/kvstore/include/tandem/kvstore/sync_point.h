// Named sync points, after RocksDB's TEST_SYNC_POINT: tests order threads
// deterministically by declaring "point A happens before point B", and can run
// a callback when a thread passes a point.
//
// Always compiled in, in a cheap form: while processing is disabled (the
// default, and always outside tests) a point costs one relaxed atomic load.
//
//   auto* sp = SyncPoint::Get();
//   sp->LoadDependency({{"KvStoreEngine::Lookup:AfterPin", "KvStoreEngine::EvictCold:BeforeSelect"}});
//   sp->EnableProcessing();
//   ... threads run; a thread reaching EvictCold:BeforeSelect waits until some
//   thread has passed Lookup:AfterPin ...
//   sp->DisableProcessing(); sp->ClearAll();
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace tandem::kvstore {

class SyncPoint {
 public:
  static SyncPoint* Get();

  // Each pair is (predecessor, successor): a thread reaching `successor`
  // blocks until a thread has passed `predecessor`. Replaces earlier ones.
  void LoadDependency(const std::vector<std::pair<std::string, std::string>>& deps);
  // Runs `fn` (outside the sync point's lock) whenever a thread passes `point`.
  void SetCallBack(const std::string& point, std::function<void()> fn);
  // Forgets dependencies, callbacks and which points were passed.
  void ClearAll();
  void EnableProcessing() { enabled_.store(true, std::memory_order_release); }
  void DisableProcessing();

  [[nodiscard]] static bool Enabled() { return enabled_.load(std::memory_order_relaxed); }
  void Process(const char* point);

 private:
  static std::atomic<bool> enabled_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::vector<std::string>> predecessors_;
  std::unordered_map<std::string, std::function<void()>> callbacks_;
  std::unordered_set<std::string> passed_;
};

}  // namespace tandem::kvstore

#define TANDEM_SYNC_POINT(name)                                  \
  do {                                                           \
    if (::tandem::kvstore::SyncPoint::Enabled()) {               \
      ::tandem::kvstore::SyncPoint::Get()->Process(name);        \
    }                                                            \
  } while (0)
