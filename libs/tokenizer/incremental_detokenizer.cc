#include "tandem/tokenizer/incremental_detokenizer.h"

#include "absl/strings/str_cat.h"

namespace tandem::tokenizer {

absl::StatusOr<std::string> IncrementalDetokenizer::Push(int32_t id) {
  if (finished_) return absl::FailedPreconditionError("Push after Finish");
  std::string delta;
  if (absl::Status s = stream_->Push(id, &delta); !s.ok()) return s;
  ++num_ids_;
  return delta;
}

std::string IncrementalDetokenizer::Finish() {
  std::string rest;
  if (!finished_) stream_->Finish(&rest);
  finished_ = true;
  return rest;
}

}  // namespace tandem::tokenizer
