// The KV cache's size when the worker is not told it (issue 33): vLLM's
// --gpu-memory-utilization arithmetic on the cuda backend and the cpu
// backend's default, on numbers rather than a device (the CUDA runner feeds
// KvBlocksForMemoryUtilization what cudaMemGetInfo reports).
#include <cstdint>

#include "gtest/gtest.h"
#include "tandem/model/model.h"
#include "tandem/model/model_runner.h"

namespace tandem::model {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// An 80 GiB device with 1 GiB taken by another process before we start:
// 0.9 of it is 72 GiB, the weights take 16 GiB and the reserve 4 GiB, so
// 52 GiB of 2 MiB blocks remain.
TEST(CacheSizingTest, UtilizationBudgetLessWeightsAndReserveIsTheCache) {
  const DeviceMemory m{
      .total = 80 * kGiB, .free_at_start = 79 * kGiB, .free_after_weights = 63 * kGiB};
  auto blocks = KvBlocksForMemoryUtilization(0.9, m, 4 * kGiB, 2 << 20);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  const int64_t budget = static_cast<int64_t>(0.9 * static_cast<double>(80 * kGiB));
  EXPECT_EQ(*blocks, (budget - 16 * kGiB - 4 * kGiB) / (2 << 20));
  // A larger share gives more blocks; the free memory at start (another
  // process's use) does not change the cache while the budget fits.
  auto more = KvBlocksForMemoryUtilization(0.95, m, 4 * kGiB, 2 << 20);
  ASSERT_TRUE(more.ok());
  EXPECT_GT(*more, *blocks);
  const DeviceMemory alone{
      .total = 80 * kGiB, .free_at_start = 80 * kGiB, .free_after_weights = 64 * kGiB};
  EXPECT_EQ(KvBlocksForMemoryUtilization(0.9, alone, 4 * kGiB, 2 << 20).value(), *blocks);
}

// Another process holds more than 1 - utilization of the device: refused at
// start with vLLM's wording and both numbers, as vLLM refuses.
TEST(CacheSizingTest, TooLittleFreeAtStartIsRefusedWithBothNumbers) {
  const DeviceMemory m{
      .total = 80 * kGiB, .free_at_start = 40 * kGiB, .free_after_weights = 30 * kGiB};
  auto blocks = KvBlocksForMemoryUtilization(0.9, m, kGiB, 2 << 20);
  ASSERT_FALSE(blocks.ok());
  EXPECT_EQ(blocks.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(blocks.status().message());
  EXPECT_NE(msg.find("Free memory on device (40.00/80.00 GiB) on startup is less than desired "
                     "GPU memory utilization (0.9, 72.00 GiB)"),
            std::string::npos)
      << msg;
  // The same device at 0.5 (40 GiB requested) fits.
  EXPECT_TRUE(KvBlocksForMemoryUtilization(0.5, m, kGiB, 2 << 20).ok());
}

TEST(CacheSizingTest, NothingLeftForOneBlockIsRefused) {
  const DeviceMemory m{.total = 16 * kGiB,
                       .free_at_start = 16 * kGiB,
                       .free_after_weights = 2 * kGiB};  // 14 GiB of weights
  auto blocks = KvBlocksForMemoryUtilization(0.9, m, kGiB, 2 << 20);
  ASSERT_FALSE(blocks.ok());
  EXPECT_NE(blocks.status().message().find("Try increasing --gpu-memory-utilization"),
            std::string::npos)
      << blocks.status();
  EXPECT_FALSE(KvBlocksForMemoryUtilization(0, m, kGiB, 2 << 20).ok());
  EXPECT_FALSE(KvBlocksForMemoryUtilization(1.5, m, kGiB, 2 << 20).ok());
}

// The reserve grows with the step's rows and covers at least the logits of
// 256 sampled rows; a bigger model reserves more.
TEST(CacheSizingTest, StepReserveCoversTheStepsBuffers) {
  const ModelConfig small{.dim = 64,
                          .hidden_dim = 172,
                          .num_layers = 5,
                          .num_heads = 8,
                          .num_kv_heads = 4,
                          .vocab_size = 512,
                          .max_seq_len = 512,
                          .head_size = 8};
  const ModelConfig llama{.dim = 4096,
                          .hidden_dim = 14336,
                          .num_layers = 32,
                          .num_heads = 32,
                          .num_kv_heads = 8,
                          .vocab_size = 128256,
                          .max_seq_len = 8192,
                          .head_size = 128};
  EXPECT_GT(StepReserveBytes(small, 2048), StepReserveBytes(small, 1024));
  EXPECT_GT(StepReserveBytes(llama, 8192), StepReserveBytes(small, 8192));
  // Residual stream and gate/up output of 8192 rows in fp32, plus logits.
  const int64_t floor = int64_t{8192} * 4 * (4096 + 2 * 14336) + int64_t{256} * 128256 * 4;
  EXPECT_GE(StepReserveBytes(llama, 8192), floor);
  EXPECT_LT(StepReserveBytes(llama, 8192), 8 * kGiB);
}

TEST(CacheSizingTest, CpuDefaultIsFourGiBOrAQuarterOfMemory) {
  EXPECT_EQ(DefaultCpuKvCacheBytes(64 * kGiB), 4 * kGiB);
  EXPECT_EQ(DefaultCpuKvCacheBytes(24 * kGiB), 4 * kGiB);
  EXPECT_EQ(DefaultCpuKvCacheBytes(8 * kGiB), 2 * kGiB);
  EXPECT_EQ(DefaultCpuKvCacheBytes(0), 0);
}

}  // namespace
}  // namespace tandem::model
