// Batch invariance of the CPU backend (DESIGN §6): a sequence's logits are
// bitwise identical alone, in a batch of 32 mixed prefill and decode
// sequences, chunked, and with prefix KV written by another sequence.
#include <cstring>
#include <numeric>

#include "gtest/gtest.h"
#include "test_util.h"

namespace tandem::model {
namespace {

using testing::LoadTestModel;
using testing::MakePrompt;

constexpr int32_t kBlock = 16;
constexpr int32_t kPrompt = 75;  // 4 full blocks + a partial one
constexpr int32_t kDecode = 4;   // decode steps after the prompt

// Block ids [first, first + n).
std::vector<int32_t> Blocks(int32_t first, int32_t n) {
  std::vector<int32_t> b(static_cast<size_t>(n));
  std::iota(b.begin(), b.end(), first);
  return b;
}

bool BitwiseEqual(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class BatchInvarianceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LoadTestModel();
    ASSERT_NE(model_, nullptr);
    vocab_ = model_->config().vocab_size;
    tokens_ = MakePrompt(kPrompt + kDecode, 11, vocab_);
    auto r = ModelRunner::Create(model_.get(), {.block_size = kBlock, .num_blocks = 256});
    ASSERT_TRUE(r.ok()) << r.status();
    runner_ = std::move(*r);
    // The reference: the prompt in one chunk, then decode steps, alone.
    ref_ = RunChunked(kPrompt, Blocks(0, 6));
  }

  // Logits after the prompt and after each decode step, prefilling in
  // chunks of `chunk` tokens, alone in each step.
  std::vector<std::vector<float>> RunChunked(int32_t chunk, const std::vector<int32_t>& table) {
    std::vector<std::vector<float>> out;
    std::vector<float> logits;
    int32_t pos = 0;
    while (pos < kPrompt) {
      const int32_t n = std::min(chunk, kPrompt - pos);
      SequenceInput in{
          .token_ids = std::span(tokens_).subspan(pos, n), .start_pos = pos, .block_table = table};
      EXPECT_TRUE(runner_->Forward({&in, 1}, &logits).ok());
      pos += n;
    }
    out.push_back(logits);
    for (int32_t d = 0; d < kDecode; ++d, ++pos) {
      SequenceInput in{
          .token_ids = std::span(tokens_).subspan(pos, 1), .start_pos = pos, .block_table = table};
      EXPECT_TRUE(runner_->Forward({&in, 1}, &logits).ok());
      out.push_back(logits);
    }
    return out;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelRunner> runner_;
  int32_t vocab_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<std::vector<float>> ref_;
};

TEST_F(BatchInvarianceTest, ChunkedPrefillGivesBitwiseEqualLogits) {
  for (int32_t chunk : {1, 7, 16, 64}) {
    const auto got = RunChunked(chunk, Blocks(10 + chunk, 6));
    ASSERT_EQ(got.size(), ref_.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(got[i], ref_[i])) << "chunk " << chunk << " step " << i;
    }
  }
}

TEST_F(BatchInvarianceTest, MixedBatchOf32GivesBitwiseEqualLogits) {
  // 31 companions: 15 decoding (after a prefill of their own), 16 prefilling
  // chunks of varied lengths at varied offsets.
  struct Companion {
    std::vector<int32_t> tokens;
    std::vector<int32_t> table;
    int32_t pos = 0;
  };
  std::vector<Companion> comp(31);
  std::vector<float> logits;
  for (int32_t i = 0; i < 31; ++i) {
    Companion& c = comp[static_cast<size_t>(i)];
    c.tokens = MakePrompt(40 + 3 * i + kPrompt, 100 + static_cast<uint32_t>(i), vocab_);
    c.table = Blocks(8 + 7 * i, 7);
    c.pos = i < 15 ? 20 + i : (i % 5) * 3;  // decoders start after a prefill
    if (c.pos > 0) {
      SequenceInput in{.token_ids = std::span(c.tokens).subspan(0, c.pos),
                       .start_pos = 0,
                       .block_table = c.table};
      ASSERT_TRUE(runner_->Forward({&in, 1}, &logits).ok());
    }
  }
  // Our sequence: whole prompt in the first mixed step, then decode steps in
  // mixed steps; it sits at a different index each step.
  const std::vector<int32_t> table = Blocks(0, 6);
  int32_t pos = 0;
  for (int32_t step = 0; step <= kDecode; ++step) {
    std::vector<SequenceInput> batch;
    for (int32_t i = 0; i < 31; ++i) {
      Companion& c = comp[static_cast<size_t>(i)];
      const int32_t n = i < 15 ? 1 : 1 + (i * 5 + step) % 13;
      batch.push_back(SequenceInput{.token_ids = std::span(c.tokens).subspan(c.pos, n),
                                    .start_pos = c.pos,
                                    .block_table = c.table});
      c.pos += n;
    }
    const int32_t n = step == 0 ? kPrompt : 1;
    const size_t where = static_cast<size_t>(step * 7) % 32;
    batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(where),
                 SequenceInput{.token_ids = std::span(tokens_).subspan(pos, n),
                               .start_pos = pos,
                               .block_table = table});
    pos += n;
    ASSERT_EQ(batch.size(), 32u);
    ASSERT_TRUE(runner_->Forward(batch, &logits).ok());
    ASSERT_EQ(logits.size(), 32u * vocab_);
    EXPECT_TRUE(BitwiseEqual(std::span(logits).subspan(where * vocab_, vocab_), ref_[step]))
        << "step " << step;
  }
}

TEST_F(BatchInvarianceTest, PrefixFromBlocksAnotherSequenceWroteGivesBitwiseEqualLogits) {
  // Sequence A writes the first 3 full blocks (48 tokens) of the shared
  // prefix into blocks 100..102, then continues differently.
  std::vector<int32_t> a_tokens(tokens_.begin(), tokens_.begin() + 48);
  const std::vector<int32_t> a_tail = MakePrompt(20, 5, vocab_);
  a_tokens.insert(a_tokens.end(), a_tail.begin(), a_tail.end());
  std::vector<int32_t> a_table = Blocks(100, 5);
  std::vector<float> logits;
  SequenceInput a{.token_ids = a_tokens, .start_pos = 0, .block_table = a_table};
  ASSERT_TRUE(runner_->Forward({&a, 1}, &logits).ok());

  // Our sequence reuses A's first 3 blocks and computes only the rest.
  std::vector<int32_t> table = {100, 101, 102, 50, 51, 52};
  std::vector<std::vector<float>> got;
  int32_t pos = 48;
  SequenceInput in{.token_ids = std::span(tokens_).subspan(48, kPrompt - 48),
                   .start_pos = 48,
                   .block_table = table};
  ASSERT_TRUE(runner_->Forward({&in, 1}, &logits).ok());
  EXPECT_TRUE(BitwiseEqual(logits, ref_[0]));
  pos = kPrompt;
  for (int32_t d = 0; d < kDecode; ++d, ++pos) {
    SequenceInput dec{
        .token_ids = std::span(tokens_).subspan(pos, 1), .start_pos = pos, .block_table = table};
    ASSERT_TRUE(runner_->Forward({&dec, 1}, &logits).ok());
    EXPECT_TRUE(BitwiseEqual(logits, ref_[d + 1])) << "decode " << d;
  }
}

TEST_F(BatchInvarianceTest, SequenceReadsPrefixAnotherSequenceWritesInTheSameStep) {
  // Two new requests share an uncached 48-token prefix: the first computes
  // it, the second (after it in the batch) starts at 48 and reads those
  // blocks in the same step. K/V are written before any attention reads.
  std::vector<int32_t> a_table = {120, 121, 122, 123};
  std::vector<int32_t> b_table = {120, 121, 122, 60, 61, 62};
  std::vector<int32_t> a_tokens(tokens_.begin(), tokens_.begin() + 50);
  std::vector<float> logits;
  for (bool b_first : {false, true}) {
    std::vector<SequenceInput> batch = {
        SequenceInput{.token_ids = a_tokens, .start_pos = 0, .block_table = a_table},
        SequenceInput{.token_ids = std::span(tokens_).subspan(48, kPrompt - 48),
                      .start_pos = 48,
                      .block_table = b_table}};
    if (b_first) std::swap(batch[0], batch[1]);
    ASSERT_TRUE(runner_->Forward(batch, &logits).ok());
    EXPECT_TRUE(BitwiseEqual(std::span(logits).subspan(b_first ? 0 : vocab_, vocab_), ref_[0]))
        << "b_first " << b_first;
  }
}

TEST_F(BatchInvarianceTest, WorkerThreadsGiveBitwiseEqualLogits) {
  auto threaded = ModelRunner::Create(model_.get(), {.block_size = kBlock, .num_blocks = 256},
                                      Backend::kCpu, {.num_threads = 3});
  ASSERT_TRUE(threaded.ok()) << threaded.status();
  // 12 sequences: prefills of varied lengths, then two decode steps.
  std::vector<std::vector<int32_t>> prompts, tables;
  for (int32_t i = 0; i < 12; ++i) {
    prompts.push_back(MakePrompt(3 + 9 * i, 300 + static_cast<uint32_t>(i), vocab_));
    tables.push_back(Blocks(10 * i, 10));
  }
  std::vector<int32_t> pos(12, 0);
  for (int32_t step = 0; step < 3; ++step) {
    std::vector<SequenceInput> batch;
    for (int32_t i = 0; i < 12; ++i) {
      const int32_t n = step == 0 ? static_cast<int32_t>(prompts[i].size()) - 2 : 1;
      batch.push_back({.token_ids = std::span(prompts[i]).subspan(pos[i], n),
                       .start_pos = pos[i],
                       .block_table = tables[i]});
      pos[i] += n;
    }
    std::vector<float> one, three;
    ASSERT_TRUE(runner_->Forward(batch, &one).ok());
    ASSERT_TRUE((*threaded)->Forward(batch, &three).ok());
    EXPECT_TRUE(BitwiseEqual(one, three)) << "step " << step;
  }
}

}  // namespace
}  // namespace tandem::model
