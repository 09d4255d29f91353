// tandem.v1.Generation on the gRPC callback API: handlers convert, post to the
// Engine and return; no thread blocks per stream. A request's content is
// validated once, by sched::Scheduler::AddRequest (DESIGN §9).
//
// Decisions where DESIGN is silent:
// - Generate sends one message per step that produced tokens; the last one
//   carries finish_reason and usage, and the call ends OK. A request aborted
//   through the Abort RPC ends the same way with FINISH_REASON_ABORT.
// - Client cancel and deadline abort the request in the scheduler (the
//   worker drops it with the next step); the client sees CANCELLED or
//   DEADLINE_EXCEEDED from gRPC, and the request's log line says which.
// - Drain: a call that passed Engine::TryAccept() before SIGTERM finishes;
//   later ones get UNAVAILABLE.
// - A request that sets cache_salt is INVALID_ARGUMENT unless the server runs
//   with --allow-request-cache-salt (the salt isolates tenants, DESIGN §3) or
//   the caller proved the frontend role with its client certificate (mutual
//   TLS, rpc/tls.h): the tenant then comes from the authenticated frontend.
// - An empty request_id gets a server-assigned "req-N"; a duplicate of a live
//   id is ALREADY_EXISTS.
// - Without has_seed the server draws a random seed per request.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::scheduler {

struct GenerationOptions {
  // Honour GenerateRequest.cache_salt. Off: a request that sets it is
  // rejected (the salt isolates tenants and must come from the server).
  bool allow_request_cache_salt = false;
};

class GenerationService final : public v1::Generation::CallbackService {
 public:
  GenerationService(Engine* engine, GenerationOptions options);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;

 private:
  // Whether a Generate from this caller may carry a cache_salt
  // (--allow-request-cache-salt, or the frontend role under mutual TLS).
  bool AcceptsCacheSalt(const grpc::ServerContextBase& context) const;
  Engine* const engine_;
  const GenerationOptions options_;
};

}  // namespace tandem::scheduler
