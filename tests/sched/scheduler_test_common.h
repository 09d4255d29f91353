// Helpers the scheduler_*_test.cc files share: the scheduled tokens of one
// request in a step, the check against running a request alone, and the
// sync/async parameterized fixture (instantiated once, in scheduler_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sched_test_util.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched::testing {

inline int32_t NumScheduled(const SchedulerOutput& so, const std::string& id) {
  for (size_t i = 0; i < so.scheduled_new_reqs.size(); ++i) {
    if (so.scheduled_new_reqs[i].request_id == id) return so.num_scheduled_tokens[i];
  }
  for (size_t i = 0; i < so.scheduled_cached_reqs.size(); ++i) {
    if (so.scheduled_cached_reqs[i].request_id == id) {
      return so.num_scheduled_tokens[so.scheduled_new_reqs.size() + i];
    }
  }
  return 0;
}

inline void ExpectMatchesReference(const Harness& h, const std::string& id,
                                   const std::vector<int32_t>& prompt, const SamplingParams& sp) {
  const Reference ref = RunAlone(prompt, sp, h.config);
  auto it = h.outputs.find(id);
  ASSERT_NE(it, h.outputs.end()) << id;
  EXPECT_EQ(it->second, ref.output) << id;
  EXPECT_EQ(h.reasons.at(id), ref.reason) << id;
}

// Runs a test in sync and in async mode (GetParam() is async).
class ModeTest : public ::testing::TestWithParam<bool> {};

}  // namespace tandem::sched::testing
