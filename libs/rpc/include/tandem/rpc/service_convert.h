// Conversion of the services' own messages (GetModelInfo, the worker's
// Describe) to and from the plain structs of libs/common and libs/engine;
// convert.h has the step contract's and the sampling parameters'.
#pragma once

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

// What a worker says about itself (Describe), as the engine core takes it.
[[nodiscard]] engine::WorkerDescription FromProto(const v1::DescribeResponse& in);

}  // namespace tandem::rpc
