// Turns a service's tandem.liveness health NOT_SERVING while the thread it
// watches is stuck, and SERVING again when it moves: what a Kubernetes
// liveness probe restarts a container on. The scheduler watches its engine
// loop (--liveness-stall-s), the worker its step loop (a hung kernel).
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace grpc {
class Server;
}

namespace tandem::rpc {

class LivenessWatchdog {
 public:
  // Every 100 ms asks `stuck_s` for how long the watched thread has been
  // stuck (0: it is not), and sets `server`'s liveness to stuck_s <
  // stall_s. stall_s 0: never NOT_SERVING. `what` names the thread in logs.
  LivenessWatchdog(grpc::Server* server, std::function<double()> stuck_s, double stall_s,
                   std::string what);
  ~LivenessWatchdog();  // stops the thread
  LivenessWatchdog(const LivenessWatchdog&) = delete;
  LivenessWatchdog& operator=(const LivenessWatchdog&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tandem::rpc
