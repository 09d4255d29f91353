// FastDivmod and KvLayerRows, the CUDA attention kernels' hoisted cache
// addressing, against `/` and KvCacheShape::Offset.
#include "tandem/kernels/kv_layout.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

TEST(FastDivmodTest, DividesLikeTheDivisionOperator) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any(0, INT32_MAX);
  std::vector<int32_t> divisors;
  for (int32_t d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (int s = 11; s < 31; ++s) {
    divisors.push_back((1 << s) - 1);
    divisors.push_back(1 << s);
    divisors.push_back((1 << s) + 1);
  }
  divisors.push_back(INT32_MAX);
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + any(rng) % INT32_MAX);
  for (const int32_t d : divisors) {
    const FastDivmod f(d);
    // Around multiples of d (where a wrong rounding shows), the ends, and at random.
    std::vector<int32_t> ns = {0, 1, d - 1, d, INT32_MAX, INT32_MAX - 1, INT32_MAX - d + 1};
    for (int64_t k = 1; k <= 64; ++k) {
      for (int64_t n = k * d - 1; n <= k * d + 1; ++n) {
        if (n >= 0 && n <= INT32_MAX) ns.push_back(static_cast<int32_t>(n));
      }
    }
    for (int i = 0; i < 300; ++i) ns.push_back(any(rng));
    for (const int32_t n : ns) {
      if (n < 0) continue;
      ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
    }
  }
}

TEST(FastDivmodTest, EveryDividendBelowAFewThousandForBlockSizes) {
  for (const int32_t d : {1, 2, 3, 5, 7, 8, 16, 24, 32, 48, 64, 128, 256, 1000}) {
    const FastDivmod f(d);
    for (int32_t n = 0; n < 1 << 17; ++n) ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
  }
}

TEST(KvLayerRowsTest, RowsAreTheShapesOffsets) {
  for (const int32_t block_size : {1, 3, 16, 32}) {
    const KvCacheShape sh{.num_blocks = 40,
                          .num_layers = 3,
                          .block_size = block_size,
                          .num_kv_heads = 5,
                          .head_size = 24};
    std::vector<int32_t> table(sh.num_blocks);
    for (int32_t i = 0; i < sh.num_blocks; ++i) table[i] = (i * 17 + 3) % sh.num_blocks;
    for (int32_t layer = 0; layer < sh.num_layers; ++layer) {
      const KvLayerRows rows(sh, layer);
      for (int32_t kvh = 0; kvh < sh.num_kv_heads; ++kvh) {
        for (int32_t t = 0; t < sh.num_blocks * block_size; ++t) {
          const int32_t blk = table[t / block_size], slot = t % block_size;
          const int64_t k = rows.K(table.data(), t, kvh);
          ASSERT_EQ(k, sh.Offset(blk, layer, 0, slot, kvh));
          ASSERT_EQ(k + rows.v_after_k, sh.Offset(blk, layer, 1, slot, kvh));
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
