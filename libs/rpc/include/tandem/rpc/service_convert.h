// Conversion of the services' own messages (GetModelInfo, the worker's
// Describe) to and from the plain structs of libs/common and libs/engine;
// convert.h has the step contract's and the sampling parameters'.
#pragma once

#include "tandem/common/generate.h"
#include "tandem/common/model_info.h"
#include "tandem/engine/engine_core.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::rpc {

// The served model (GetModelInfo). accepts_cache_salt depends on the caller:
// the service sets it. FromProto's `ready` is true (a scheduler answers only
// once a worker served).
void ToProto(const ModelInfo& in, v1::GetModelInfoResponse* out);
[[nodiscard]] ModelInfo FromProto(const v1::GetModelInfoResponse& in);

// A Generate call, from the client's side (the sampling parameters as
// convert.h's ToProto: has_seed exactly with a seed). FromProto
// cuts a position's top lists to the shorter of the two (a malformed
// message loses alternatives, never the token) and reads a finish reason
// this build does not know as kNone.
void ToProto(const GenerateRequest& in, v1::GenerateRequest* out);
[[nodiscard]] GenerateResponse FromProto(const v1::GenerateResponse& in);

// The same call from the scheduler's side. FromProto fills `default_seed`
// when the request has none (convert.h); it does not validate (the
// scheduler does, sched::Scheduler::AddRequest). Every field converts both
// ways (usage only when present).
[[nodiscard]] GenerateRequest FromProto(const v1::GenerateRequest& in, uint64_t default_seed);
void ToProto(const GenerateResponse& in, v1::GenerateResponse* out);

// The engine's counters in GetStats (the service adds its own: draining and
// the cost of putting steps on the wire).
void ToProto(const engine::EngineStats& in, v1::GetStatsResponse* out);

// What a worker says about itself (Describe), as the engine core takes it.
[[nodiscard]] engine::WorkerDescription FromProto(const v1::DescribeResponse& in);

}  // namespace tandem::rpc
