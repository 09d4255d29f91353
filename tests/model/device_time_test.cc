// The device's own clock of ForwardSample's steps (model/device_time.h):
// DeviceClock's sums, and each backend's steps timed as the device saw them
// (the CUDA half skips itself without a device; part of
// model_cuda_runner_test, which tools/gpu/bundle.sh takes to a GPU).
#include "tandem/model/device_time.h"

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/common/clock.h"
#include "tandem/model/sampler.h"
#include "test_util.h"

namespace tandem::model {
namespace {

TEST(DeviceTimeTest, TheClockSumsBusyTimeAndTheIdleBetweenSteps) {
  DeviceClock clock;
  clock.Step(10.0, 10.5);  // the first step: nothing before it to be idle after
  clock.Step(10.75, 11.0);
  clock.Step(std::optional<double>(0.125), 0.5);  // measured as intervals
  clock.Step(std::nullopt, 0.25);                 // after a step that was not measured
  EXPECT_DOUBLE_EQ(clock.time().busy_s, 0.5 + 0.25 + 0.5 + 0.25);
  EXPECT_DOUBLE_EQ(clock.time().idle_between_s, 0.25 + 0.125);
  EXPECT_EQ(clock.time().steps, 4);
}

// Runs `steps` greedy decode steps of one sequence with `pause_s` of host
// time between them; returns the wall time from the first step's start to
// the last one's end.
double RunSteps(ModelRunner& runner, int32_t steps, double pause_s) {
  const SamplingParams greedy;
  std::vector<int32_t> table = {0, 1, 2, 3};
  std::vector<int32_t> tokens = {1, 5, 9, 13};
  const double start = MonotonicSeconds();
  for (int32_t s = 0; s < steps; ++s) {
    if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause_s));
    const int32_t pos = s == 0 ? 0 : static_cast<int32_t>(tokens.size()) - 1;
    std::vector<SequenceInput> batch = {
        {.token_ids = std::span(tokens).subspan(static_cast<size_t>(pos)),
         .start_pos = pos,
         .block_table = table}};
    const std::vector<SampleRequest> sample = {{.params = &greedy}};
    std::vector<int32_t> out;
    EXPECT_TRUE(runner.ForwardSample(batch, sample, &out).ok());
    tokens.push_back(out.at(0));
  }
  return MonotonicSeconds() - start;
}

// Each step counted once; the device busy no longer than the steps took and
// idle at least most of the host's pauses between them.
void ExpectStepsTimed(Backend backend, DType dtype) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  auto runner = ModelRunner::Create(model.get(),
                                    {.block_size = 16, .num_blocks = 8, .dtype = dtype}, backend);
  if (absl::IsUnavailable(runner.status())) GTEST_SKIP() << runner.status();
  ASSERT_TRUE(runner.ok()) << runner.status();
  const int32_t steps = 6;
  const double pause_s = 0.02;
  const double wall = RunSteps(**runner, steps, pause_s);
  const DeviceTime& t = (*runner)->device_time();
  EXPECT_EQ(t.steps, steps);
  EXPECT_GT(t.busy_s, 0);
  EXPECT_LE(t.busy_s + t.idle_between_s, wall * 1.001 + 1e-4);
  // Five pauses of 20 ms, less what a timer may lose.
  EXPECT_GE(t.idle_between_s, (steps - 1) * pause_s * 0.9);
}

TEST(DeviceTimeTest, TheCpuBackendTimesEachStep) {
  ExpectStepsTimed(Backend::kCpu, DType::kFloat32);
}

TEST(DeviceTimeTest, TheCudaBackendTimesEachStepOnTheGpusClock) {
  ExpectStepsTimed(Backend::kCuda, DType::kBFloat16);
  ExpectStepsTimed(Backend::kCuda, DType::kFloat32);
}

}  // namespace
}  // namespace tandem::model
