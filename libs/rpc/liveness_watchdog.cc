#include "tandem/rpc/liveness_watchdog.h"

#include <chrono>

#include "tandem/common/logging.h"
#include "tandem/rpc/server.h"

namespace tandem::rpc {

LivenessWatchdog::LivenessWatchdog(grpc::Server* server, std::function<double()> stuck_s,
                                   double stall_s, std::string what) {
  thread_ = std::thread([this, server, stuck_s = std::move(stuck_s), stall_s,
                         what = std::move(what)] {
    bool live = true;
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (stall_s <= 0) continue;
      const double stuck = stuck_s();
      const bool now_live = stuck < stall_s;
      if (now_live == live) continue;
      live = now_live;
      if (live) {
        TANDEM_LOG(WARNING) << what << " goes round again: liveness SERVING";
      } else {
        TANDEM_LOG(ERROR) << what << " stuck for " << stuck
                          << " s (--liveness-stall-s): liveness NOT_SERVING";
      }
      SetLive(server, live);
    }
  });
}

LivenessWatchdog::~LivenessWatchdog() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

}  // namespace tandem::rpc
