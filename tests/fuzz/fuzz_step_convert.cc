// The step contract's proto-to-struct converters (libs/rpc/convert.h) on
// arbitrary bytes parsed as a SchedulerOutput or a ModelRunnerOutput (byte 0
// says which): an INVALID_ARGUMENT or a struct, never a crash; and a struct
// that converted converts back and again to the same struct.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "tandem/rpc/convert.h"

namespace {

template <typename Proto, typename Struct>
void RoundTrip(const uint8_t* data, size_t size) {
  Proto in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return;
  Struct once;
  if (!tandem::rpc::FromProto(in, &once).ok()) return;
  Proto back;
  tandem::rpc::ToProto(once, &back);
  Struct twice;
  if (!tandem::rpc::FromProto(back, &twice).ok()) std::abort();  // ToProto wrote what FromProto refuses
  Proto again;
  tandem::rpc::ToProto(twice, &again);
  if (back.SerializeAsString() != again.SerializeAsString()) std::abort();  // not a fixed point
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) {
    RoundTrip<tandem::v1::SchedulerOutput, tandem::sched::SchedulerOutput>(data + 1, size - 1);
  } else {
    RoundTrip<tandem::v1::ModelRunnerOutput, tandem::sched::ModelRunnerOutput>(data + 1, size - 1);
  }
  return 0;
}
