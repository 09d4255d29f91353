// Conversion between the plain structs of libs/sched and common and the
// tandem.v1 step and sampling protos. With service_convert.h (the services'
// own messages), the only place where both worlds meet (DESIGN §1). This
// half needs only common.proto and worker.proto (the fuzz build compiles it
// alone).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "tandem/common/finish_reason.h"
#include "tandem/common/logprobs.h"
#include "tandem/common/sampling_params.h"
#include "tandem/sched/scheduler_output.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::rpc {

// Sampling parameters. ToProto sets has_seed exactly when `in.seed` has a
// value. FromProto reads top_p == 0 as 1 (proto3 default) and uses
// `default_seed` when has_seed is false (so its seed always has a value);
// it does not validate (call SamplingParams::Validate).
void ToProto(const SamplingParams& in, v1::SamplingParams* out);
[[nodiscard]] SamplingParams FromProto(const v1::SamplingParams& in, uint64_t default_seed = 0);

// A model's sampling defaults: a field unset in one is unset in the other.
// FromProto does not validate (call GenerationDefaults::Validate).
void ToProto(const GenerationDefaults& in, v1::GenerationDefaults* out);
[[nodiscard]] GenerationDefaults FromProto(const v1::GenerationDefaults& in);

// Log-probabilities at one position. FromProto checks that the top lists
// are parallel.
void ToProto(const TokenLogprobs& in, v1::TokenLogprobs* out);
[[nodiscard]] absl::Status FromProto(const v1::TokenLogprobs& in, TokenLogprobs* out);
void ToProto(const std::vector<TokenLogprobs>& in,
             google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* out);
[[nodiscard]] absl::Status FromProto(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& in,
    std::vector<TokenLogprobs>* out);

// How a request ended. FINISH_REASON_UNSPECIFIED (and a value this build
// does not know) is kNone.
[[nodiscard]] v1::FinishReason ToProto(FinishReason in);
[[nodiscard]] FinishReason FromProto(v1::FinishReason in);

// Scheduler -> worker, one per step.
void ToProto(const sched::SchedulerOutput& in, v1::SchedulerOutput* out);
// INVALID_ARGUMENT when a block hash is not 32 bytes or the per-request
// token counts do not match the request lists.
[[nodiscard]] absl::Status FromProto(const v1::SchedulerOutput& in, sched::SchedulerOutput* out);

// Worker -> scheduler, one per step. (The proto's `error` field is not part
// of the struct; callers check it.)
void ToProto(const sched::ModelRunnerOutput& in, v1::ModelRunnerOutput* out);
[[nodiscard]] absl::Status FromProto(const v1::ModelRunnerOutput& in,
                                     sched::ModelRunnerOutput* out);
// The connector report alone (also of a step the worker failed).
[[nodiscard]] sched::KvConnectorReport FromProto(const v1::KvConnectorReport& in);

}  // namespace tandem::rpc
