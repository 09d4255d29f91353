// Request ids (issue 29): bounded and plain before anything logs them or
// keys a map with them; a refused id changes nothing.
#include "tandem/sched/request_id.h"

#include <string>

#include "gtest/gtest.h"
#include "sched_test_util.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched {
namespace {

TEST(RequestIdTest, OnlyShortPrintableIdsWithoutSpacesAreAccepted) {
  EXPECT_TRUE(ValidateRequestId("cmpl-0a1b2c-0").ok());
  EXPECT_TRUE(ValidateRequestId(std::string(kMaxRequestIdBytes, 'x')).ok());
  for (const std::string& bad :
       {std::string(), std::string(kMaxRequestIdBytes + 1, 'x'), std::string("a\nforged line"),
        std::string("with space"), std::string("tab\there"), std::string("nul\0x", 5),
        std::string("caf\xc3\xa9")}) {
    const absl::Status s = ValidateRequestId(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << LoggableRequestId(bad);
    if (bad.size() > 16) {
      EXPECT_EQ(s.message().find(bad), std::string::npos) << "the message echoes the id";
    }
  }
}

TEST(RequestIdTest, LoggableIdsAreEscapedAndShort) {
  EXPECT_EQ(LoggableRequestId("a\nb"), "a\\nb");
  const std::string shown = LoggableRequestId(std::string(1 << 20, 'y'));
  EXPECT_LT(shown.size(), 100u);
  EXPECT_NE(shown.find("1048576 bytes"), std::string::npos) << shown;
}

TEST(RequestIdTest, TheSchedulerRefusesABadIdAndChangesNothing) {
  Scheduler s(testing::TestConfig(64, /*async=*/false), nullptr);
  const absl::Status bad = s.AddRequest(
      {.request_id = "x\ny", .prompt_token_ids = {1, 2}, .sampling = testing::Greedy(2)}, 0);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("request_id byte 1 is 0x0a"), std::string::npos) << bad;
  EXPECT_FALSE(s.HasUnfinishedRequests());
  EXPECT_TRUE(
      s.AddRequest({.request_id = "x", .prompt_token_ids = {1, 2}, .sampling = testing::Greedy(2)},
                   0)
          .ok());
}

}  // namespace
}  // namespace tandem::sched
