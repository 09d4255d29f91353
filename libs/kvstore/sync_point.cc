#include "tandem/kvstore/sync_point.h"

namespace tandem::kvstore {

std::atomic<bool> SyncPoint::enabled_{false};

SyncPoint* SyncPoint::Get() {
  static SyncPoint* instance = new SyncPoint();
  return instance;
}

void SyncPoint::LoadDependency(const std::vector<std::pair<std::string, std::string>>& deps) {
  std::lock_guard<std::mutex> lock(mu_);
  predecessors_.clear();
  for (const auto& [pred, succ] : deps) predecessors_[succ].push_back(pred);
  cv_.notify_all();
}

void SyncPoint::SetCallBack(const std::string& point, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  callbacks_[point] = std::move(fn);
}

void SyncPoint::ClearAll() {
  std::lock_guard<std::mutex> lock(mu_);
  predecessors_.clear();
  callbacks_.clear();
  passed_.clear();
  cv_.notify_all();
}

void SyncPoint::DisableProcessing() {
  enabled_.store(false, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

void SyncPoint::Process(const char* point) {
  std::function<void()> callback;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const std::string name(point);
    auto it = predecessors_.find(name);
    if (it != predecessors_.end()) {
      cv_.wait(lock, [&] {
        if (!Enabled()) return true;
        for (const auto& pred : it->second) {
          if (!passed_.contains(pred)) return false;
        }
        return true;
      });
    }
    auto cb = callbacks_.find(name);
    if (cb != callbacks_.end()) callback = cb->second;
  }
  if (callback) callback();
  std::lock_guard<std::mutex> lock(mu_);
  passed_.insert(point);
  cv_.notify_all();
}

}  // namespace tandem::kvstore
