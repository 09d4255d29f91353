// Scheduler stop conditions (issue 3, "What must hold" 4): EOS, extra EOS
// ids, stop token ids, min_tokens, max_tokens and max_model_len, in sync and
// async mode.
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler_test_common.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched {
namespace {

using testing::kEos;
using testing::kEos2;
using testing::kEos3;
using testing::ModeTest;
using testing::TestConfig;
using testing::Tokens;

struct StopCase {
  const char* name;
  SamplingParams sp;
  std::vector<int32_t> script;  // tokens the worker samples, in order
  std::vector<int32_t> output;  // what the client must see
  RequestState reason;
};

// A worker that samples scripted tokens; handles sync and async.
void RunScripted(bool async, const StopCase& sc, int32_t max_model_len = 256,
                 int32_t prompt_len = 5) {
  SchedulerConfig c = TestConfig(64, async);
  c.max_model_len = max_model_len;
  c.extra_eos_token_ids = {kEos2, kEos3};  // as Llama 3's three
  Scheduler sched(c, nullptr);
  ASSERT_TRUE(
      sched
          .AddRequest(
              {.request_id = "x", .prompt_token_ids = Tokens(prompt_len, 1), .sampling = sc.sp}, 0)
          .ok());
  std::deque<std::pair<SchedulerOutput, ModelRunnerOutput>> inflight;
  size_t next = 0;
  std::vector<int32_t> got;
  std::optional<RequestState> reason;
  bool stopped_on_token = false;
  auto update = [&] {
    for (const RequestOutput& o :
         sched.UpdateFromOutput(inflight.front().first, inflight.front().second)) {
      got.insert(got.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) reason = o.finished;
      stopped_on_token |= o.stopped_on_token;
    }
    inflight.pop_front();
    ASSERT_TRUE(sched.CheckInvariants().ok()) << sched.CheckInvariants();
  };
  for (int step = 0; step < 100 && (sched.HasUnfinishedRequests() || !inflight.empty()); ++step) {
    if (sched.HasUnfinishedRequests()) {
      SchedulerOutput so = sched.Schedule();
      ModelRunnerOutput mro{.step_id = so.step_id};
      if (so.total_num_scheduled_tokens > 0) {
        mro.sampled.push_back({"x", {next < sc.script.size() ? sc.script[next] : 50}});
        ++next;
      }
      inflight.push_back({std::move(so), std::move(mro)});
      if (!async || inflight.size() == 2) update();
    } else {
      update();
    }
  }
  EXPECT_EQ(got, sc.output) << sc.name << (async ? " async" : " sync");
  EXPECT_EQ(reason, sc.reason) << sc.name << (async ? " async" : " sync");
  // Every stop here is a token's: the last one streamed.
  EXPECT_EQ(stopped_on_token, sc.reason == RequestState::kFinishedStopped) << sc.name;
  EXPECT_EQ(sched.num_free_blocks(), sched.num_total_blocks());
}

TEST_P(ModeTest, EveryStopConditionEndsTheRequestAsSpecified) {
  auto sp = [](int32_t max_tokens, bool ignore_eos, int32_t min_tokens, std::vector<int32_t> stop) {
    SamplingParams p;
    p.max_tokens = max_tokens;
    p.ignore_eos = ignore_eos;
    p.min_tokens = min_tokens;
    p.stop_token_ids = std::move(stop);
    return p;
  };
  using S = RequestState;
  const std::vector<StopCase> cases = {
      {"eos stops and is emitted, as vLLM appends it",
       sp(10, false, 0, {}),
       {5, 6, kEos, 7},
       {5, 6, kEos},
       S::kFinishedStopped},
      {"eos first: eos alone", sp(10, false, 0, {}), {kEos, 7}, {kEos}, S::kFinishedStopped},
      {"ignore_eos keeps eos as a token",
       sp(3, true, 0, {}),
       {5, kEos, 6, 7},
       {5, kEos, 6},
       S::kFinishedLength},
      {"a second eos id stops and is emitted",
       sp(10, false, 0, {}),
       {5, kEos2, 7},
       {5, kEos2},
       S::kFinishedStopped},
      {"a third eos id stops and is emitted",
       sp(10, false, 0, {}),
       {5, 6, kEos3, 7},
       {5, 6, kEos3},
       S::kFinishedStopped},
      {"ignore_eos keeps every eos id as a token",
       sp(4, true, 0, {}),
       {kEos3, kEos2, kEos, 6, 7},
       {kEos3, kEos2, kEos, 6},
       S::kFinishedLength},
      {"stop token is emitted", sp(10, false, 0, {9}), {5, 9, 6}, {5, 9}, S::kFinishedStopped},
      {"min_tokens holds back eos",
       sp(10, false, 2, {}),
       {kEos, 5, kEos, 6},
       {kEos, 5, kEos},
       S::kFinishedStopped},
      {"min_tokens holds back every eos id",
       sp(10, false, 3, {}),
       {kEos2, kEos3, kEos, 5, kEos3, 6},
       {kEos2, kEos3, kEos, 5, kEos3},
       S::kFinishedStopped},
      {"min_tokens holds back stop tokens",
       sp(10, false, 2, {9}),
       {9, 9, 9, 9},
       {9, 9, 9},
       S::kFinishedStopped},
      {"max_tokens", sp(3, false, 0, {}), {5, 6, 7, 8}, {5, 6, 7}, S::kFinishedLength},
      {"eos on the last allowed token stops",
       sp(2, false, 0, {}),
       {5, kEos},
       {5, kEos},
       S::kFinishedStopped},
      {"stop token on the last allowed token",
       sp(2, false, 0, {9}),
       {5, 9},
       {5, 9},
       S::kFinishedStopped},
  };
  for (const StopCase& sc : cases) RunScripted(GetParam(), sc);
  // max_model_len: prompt 8 + 4 output tokens reach a max_model_len of 12.
  RunScripted(
      GetParam(),
      {"max_model_len", sp(4, false, 0, {}), {5, 6, 7, 8, 9}, {5, 6, 7, 8}, S::kFinishedLength},
      /*max_model_len=*/12, /*prompt_len=*/8);
}

// An engine reuses its outputs from step to step (UpdateOldestStepInto):
// the mark of a request that stopped on a token is not left in the slot for
// the request that takes it next.
TEST(SchedulerTest, TheStopMarkDoesNotOutliveItsOutputWhenOutputsAreReused) {
  Scheduler sched(TestConfig(64), nullptr);
  SamplingParams stops = testing::Greedy(8);
  stops.stop_token_ids = {40};
  ASSERT_TRUE(
      sched.AddRequest({.request_id = "a", .prompt_token_ids = Tokens(5, 1), .sampling = stops}, 0)
          .ok());
  ASSERT_TRUE(
      sched
          .AddRequest(
              {.request_id = "b", .prompt_token_ids = Tokens(5, 2), .sampling = testing::Greedy(8)},
              1)
          .ok());
  std::vector<RequestOutput> outputs;
  SchedulerOutput so = sched.Schedule();
  sched.UpdateOldestStepInto({.step_id = so.step_id, .sampled = {{"a", {40}}, {"b", {7}}}},
                             &outputs);
  ASSERT_EQ(outputs.size(), 2u);
  ASSERT_EQ(outputs[0].request_id, "a");
  EXPECT_TRUE(outputs[0].stopped_on_token);
  EXPECT_FALSE(outputs[1].stopped_on_token);
  so = sched.Schedule();
  sched.UpdateOldestStepInto({.step_id = so.step_id, .sampled = {{"b", {9}}}}, &outputs);
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].request_id, "b");
  EXPECT_EQ(outputs[0].new_token_ids, std::vector<int32_t>{9});
  EXPECT_FALSE(outputs[0].stopped_on_token);
}

// SampledTokens::error (the worker cannot go on with one request): that
// request ends with kFinishedError and the worker's message, its token of the
// step unread; the other request in the step goes on, sync and async.
TEST_P(ModeTest, AWorkersErrorForOneRequestEndsItAlone) {
  const bool async = GetParam();
  Scheduler sched(TestConfig(64, async), nullptr);
  for (const char* id : {"a", "b"}) {
    ASSERT_TRUE(sched
                    .AddRequest({.request_id = id,
                                 .prompt_token_ids = Tokens(5, id[0]),
                                 .sampling = testing::Greedy(6)},
                                0)
                    .ok());
  }
  std::deque<std::pair<SchedulerOutput, ModelRunnerOutput>> inflight;
  std::map<std::string, std::vector<int32_t>> got;
  std::map<std::string, RequestOutput> ended;
  int step = 0;
  auto update = [&] {
    for (const RequestOutput& o :
         sched.UpdateFromOutput(inflight.front().first, inflight.front().second)) {
      auto& tokens = got[o.request_id];
      tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) ended[o.request_id] = o;
    }
    inflight.pop_front();
    ASSERT_TRUE(sched.CheckInvariants().ok()) << sched.CheckInvariants();
  };
  while ((sched.HasUnfinishedRequests() || !inflight.empty()) && step < 50) {
    if (sched.HasUnfinishedRequests()) {
      SchedulerOutput so = sched.Schedule();
      ModelRunnerOutput mro{.step_id = so.step_id};
      ++step;
      for (const std::string id : {"a", "b"}) {
        if (sched.FindRequest(id) == nullptr) continue;
        SampledTokens& t = mro.sampled.emplace_back(SampledTokens{id, {10 + step}});
        if (id == "a" && step == 2) t.error = "no token can go on";
      }
      inflight.push_back({std::move(so), std::move(mro)});
      if (!async || inflight.size() == 2) update();
    } else {
      update();
    }
  }
  ASSERT_EQ(ended.count("a"), 1u);
  EXPECT_EQ(ended["a"].finished, RequestState::kFinishedError);
  EXPECT_EQ(ended["a"].error, "no token can go on");
  EXPECT_EQ(got["a"], std::vector<int32_t>{11});  // step 2's token unread
  ASSERT_EQ(ended.count("b"), 1u);
  EXPECT_EQ(ended["b"].finished, RequestState::kFinishedLength);
  EXPECT_EQ(got["b"].size(), 6u);
  EXPECT_EQ(sched.num_free_blocks(), sched.num_total_blocks());
}

TEST(SchedulerTest, ConfigRefusesAnExtraEosIdOutsideTheVocabulary) {
  SchedulerConfig c = TestConfig(64);
  c.extra_eos_token_ids = {kEos2, 64};
  EXPECT_EQ(c.Validate().message(),
            "SchedulerConfig.extra_eos_token_ids holds 64, outside the vocabulary [0, 64)");
  c.extra_eos_token_ids = {-1};
  EXPECT_EQ(c.Validate().message(), "SchedulerConfig.extra_eos_token_ids holds -1, a negative id");
  c.vocab_size = 0;  // unknown: only negative ids are refused
  EXPECT_FALSE(c.Validate().ok());
  c.extra_eos_token_ids = {1000};
  EXPECT_TRUE(c.Validate().ok());
  c.vocab_size = 64;
  c.extra_eos_token_ids = {kEos2, kEos3};
  EXPECT_TRUE(c.Validate().ok());
}
}  // namespace
}  // namespace tandem::sched
