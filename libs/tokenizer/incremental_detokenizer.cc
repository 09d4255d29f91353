#include "tandem/tokenizer/incremental_detokenizer.h"

#include "absl/strings/str_cat.h"
#include "utf8.h"

namespace tandem::tokenizer {
namespace {

// Whether a decode of ids starting here begins at a character of text: not
// empty, and not U+FFFD (the repaired tail of a character that began before
// it, or nothing but skipped tokens).
bool StartsAtText(std::string_view text) {
  const std::optional<internal::DecodedChar> c = internal::DecodeChar(text);
  return c.has_value() && c->cp != 0xFFFD;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               const DecodeOptions& options,
                                               absl::Span<const int32_t> prompt)
    : stream_(tokenizer.NewDecodeStream(options)) {
  size_t start = prompt.size() > kMinPromptContext ? prompt.size() - kMinPromptContext : 0;
  absl::StatusOr<std::string> decoded = tokenizer.Decode(prompt.subspan(start), options);
  while (start > 0 && prompt.size() - start < kMaxPromptContext &&
         !(decoded.ok() && StartsAtText(*decoded))) {
    --start;
    decoded = tokenizer.Decode(prompt.subspan(start), options);
  }
  std::string emitted;
  for (const int32_t id : prompt.subspan(start)) {
    // An id outside the vocabulary leaves the stream as it was, as in Push.
    (void)stream_->Push(id, &emitted);
  }
  // Decode() is the stream plus Finish(): what it has beyond `emitted` is the
  // prompt's text the stream still holds.
  if (decoded.ok() && decoded->size() > emitted.size() &&
      decoded->compare(0, emitted.size(), emitted) == 0) {
    prompt_held_ = decoded->substr(emitted.size());
  }
}

std::string IncrementalDetokenizer::SkipPromptText(std::string delta) {
  size_t skip = 0;
  while (!prompt_held_.empty() && skip < delta.size()) {
    const std::optional<internal::DecodedChar> c =
        internal::DecodeChar(std::string_view(delta).substr(skip));
    const size_t len = c ? c->len : 1;
    if (prompt_held_.compare(0, len, delta, skip, len) != 0) {
      prompt_held_.clear();  // the output changed the prompt's tail: keep the rest
      break;
    }
    prompt_held_.erase(0, len);
    skip += len;
  }
  delta.erase(0, skip);
  return delta;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Push(int32_t id) {
  if (finished_) return absl::FailedPreconditionError("Push after Finish");
  std::string delta;
  if (absl::Status s = stream_->Push(id, &delta); !s.ok()) return s;
  ++num_ids_;
  return SkipPromptText(std::move(delta));
}

std::string IncrementalDetokenizer::Finish() {
  std::string rest;
  if (!finished_) stream_->Finish(&rest);
  finished_ = true;
  return SkipPromptText(std::move(rest));
}

}  // namespace tandem::tokenizer
