// Runner options that change where or when kernels run but must not change
// a bit of the result (issue 31): the pipelined decode attention and decode
// GEMVs launched as programmatic dependents, against the defaults, eagerly
// and through decode graphs; and the tensor-core decode attention against
// itself. Skipped without a device.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace tandem::model {
namespace {

using testing::MakePrompt;

// Runners that must give the same bits as want_opts (eagerly, the logits of
// every prefill and decode row; through decode graphs, the greedy tokens at a
// bucket's size), teacher-forced with the same tokens, on Llama 3.2's (head
// size 32) and Qwen3's (64, q/k norms) test checkpoints. Prompts of 100 to
// 100 + 85 (batch - 1) tokens: contexts of 1 to 6 attention splits.
void ExpectSameBits(int32_t batch, const ModelRunnerOptions& want_opts,
                    std::initializer_list<ModelRunnerOptions> same_opts) {
  for (const char* name : {"llama3.2", "qwen3"}) {
    SCOPED_TRACE(std::string(name) + " batch " + std::to_string(batch));
    const std::string dir = testing::SharedDir() + "/models/hf/" + name;
    if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is missing";
    auto model = Model::Load(dir);
    ASSERT_TRUE(model.ok()) << model.status();
    TANDEM_REQUIRE_CUDA(model->get());
    const int32_t vocab = (*model)->config().vocab_size, bs = 16, steps = 6;
    const int32_t per_seq = (100 + 85 * (batch - 1) + steps) / bs + 1;
    const KvCacheOptions kv{.block_size = bs, .num_blocks = batch * per_seq,
                            .dtype = DType::kBFloat16};
    std::vector<ModelRunnerOptions> opts = {want_opts};
    opts.insert(opts.end(), same_opts.begin(), same_opts.end());
    std::vector<std::unique_ptr<ModelRunner>> runners;
    for (const ModelRunnerOptions& o : opts) {
      auto r = ModelRunner::Create(model->get(), kv, Backend::kCuda, o);
      ASSERT_TRUE(r.ok()) << r.status();
      runners.push_back(std::move(*r));
    }
    std::vector<std::vector<int32_t>> prompts, tables(batch);
    std::vector<SequenceInput> prefill;
    for (int32_t i = 0; i < batch; ++i) {
      prompts.push_back(MakePrompt(100 + i * 85, 7 + i, vocab));
      for (int32_t j = 0; j < per_seq; ++j) tables[i].push_back(i * per_seq + j);
      prefill.push_back({.token_ids = prompts[i], .start_pos = 0, .block_table = tables[i]});
    }
    SamplingParams greedy;
    const std::vector<SampleRequest> sample(batch, SampleRequest{.params = &greedy});
    // One step on every runner: the others' logits against the first's, or
    // (graph runners) their greedy tokens against the first's argmax.
    auto step = [&](const std::vector<SequenceInput>& in, const std::string& what) {
      std::vector<float> want, got;
      ASSERT_TRUE(runners[0]->Forward(in, &want).ok());
      std::vector<int32_t> want_tokens(batch);
      for (int32_t i = 0; i < batch; ++i) {
        const auto row = want.begin() + int64_t{i} * vocab;
        want_tokens[i] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      }
      for (size_t k = 1; k < runners.size(); ++k) {
        SCOPED_TRACE(what + ", runner " + std::to_string(k));
        if (opts[k].cuda_graphs) {
          std::vector<int32_t> tokens;
          ASSERT_TRUE(runners[k]->ForwardSample(in, sample, &tokens).ok());
          EXPECT_EQ(tokens, want_tokens);
          continue;
        }
        ASSERT_TRUE(runners[k]->Forward(in, &got).ok());
        ASSERT_EQ(got.size(), want.size());
        int64_t differ = 0;
        for (size_t j = 0; j < got.size(); ++j) {
          differ += std::memcmp(&got[j], &want[j], sizeof(float)) != 0;
        }
        EXPECT_EQ(differ, 0) << "of " << got.size() << " logits";
      }
    };
    step(prefill, "prefill");
    std::vector<std::vector<int32_t>> fed(batch);
    for (int32_t t = 0; t < steps; ++t) {
      std::vector<SequenceInput> decode;
      for (int32_t i = 0; i < batch; ++i) {
        fed[i] = {(t * 31 + i * 7 + 5) % vocab};
        decode.push_back({.token_ids = fed[i],
                          .start_pos = static_cast<int32_t>(prompts[i].size()) + t,
                          .block_table = tables[i]});
      }
      step(decode, "decode step " + std::to_string(t));
    }
    for (size_t k = 1; k < runners.size(); ++k) {
      if (opts[k].cuda_graphs) {
        EXPECT_EQ(runners[k]->graph_replays(), steps) << "runner " << k;
      }
    }
  }
}

// The pipelined decode attention (several or all of a row's attention
// splits in one block; kernels/cuda_decode_attention.cu) against a block per
// split, through the whole runner; the graph is captured after the eager
// prefill made the kernel's shared-memory opt-in.
TEST(CudaRunnerTest, PipelinedDecodeAttentionGivesTheSameLogits) {
  ExpectSameBits(8, {.attention_splits_per_block = 1, .cuda_graphs = false},
                 {{.attention_splits_per_block = 0, .cuda_graphs = false},
                  {.attention_splits_per_block = 2, .cuda_graphs = false},
                  {.attention_splits_per_block = 0, .cuda_graphs = true}});
}

// The tensor-core decode attention gives other bits than the split-K
// kernel, but its own in a decode graph as eagerly: greedy tokens through
// graphs against its eager logits' argmax.
TEST(CudaRunnerTest, TensorCoreDecodeAttentionGraphsReplayItsEagerSteps) {
  for (int32_t batch : {1, 8}) {
    ExpectSameBits(batch, {.decode_attention_tensor_cores = true, .cuda_graphs = false},
                   {{.decode_attention_tensor_cores = true, .cuda_graphs = true}});
  }
}

// Decode GEMVs launched as programmatic dependents (compute capability 9.0;
// elsewhere the option changes nothing) against plain launches: batches of
// 1 and 3 rows take the GEMV, eagerly and through graphs.
TEST(CudaRunnerTest, DependentLaunchGivesTheSameLogits) {
  for (int32_t batch : {1, 3}) {
    ExpectSameBits(batch, {.cuda_graphs = false},
                   {{.dependent_launch = true, .cuda_graphs = false},
                    {.dependent_launch = true, .cuda_graphs = true}});
  }
}

}  // namespace
}  // namespace tandem::model
