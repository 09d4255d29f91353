#include "tandem/common/sampling_params.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

void ExpectInvalid(const SamplingParams& p, absl::string_view needle) {
  absl::Status s = p.Validate(512);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
  EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s.message();
}

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams{}.Validate(512).ok()); }

TEST(SamplingParamsTest, EachBadFieldIsNamed) {
  ExpectInvalid({.temperature = -1.0f}, "temperature");
  ExpectInvalid({.top_k = 513}, "top_k");
  ExpectInvalid({.top_p = 0.0f}, "top_p");
  ExpectInvalid({.top_p = 1.5f}, "top_p");
  ExpectInvalid({.max_tokens = 0}, "max_tokens");
  ExpectInvalid({.max_tokens = 4, .min_tokens = 5}, "min_tokens");
  ExpectInvalid({.stop_token_ids = {512}}, "stop token id 512");
  ExpectInvalid({.stop_token_ids = {-1}}, "stop token id -1");
}

}  // namespace
}  // namespace tandem
