#include "tandem/sched/request.h"

namespace tandem::sched {

bool IsFinished(RequestState state) {
  switch (state) {
    case RequestState::kWaiting:
    case RequestState::kWaitingForRemoteKv:
    case RequestState::kRunning:
    case RequestState::kPreempted:
      return false;
    case RequestState::kFinishedStopped:
    case RequestState::kFinishedLength:
    case RequestState::kFinishedAborted:
    case RequestState::kFinishedError:
      return true;
  }
  return true;
}

const char* RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kWaiting:
      return "waiting";
    case RequestState::kWaitingForRemoteKv:
      return "waiting_for_remote_kv";
    case RequestState::kRunning:
      return "running";
    case RequestState::kPreempted:
      return "preempted";
    case RequestState::kFinishedStopped:
      return "finished_stopped";
    case RequestState::kFinishedLength:
      return "finished_length";
    case RequestState::kFinishedAborted:
      return "finished_aborted";
    case RequestState::kFinishedError:
      return "finished_error";
  }
  return "?";
}

}  // namespace tandem::sched
