// DType: names, block sizes and layout strings, and the CPU backend's
// refusal of bf16 (these run without a GPU).
#include "gtest/gtest.h"
#include "test_util.h"

namespace tandem::model {
namespace {

TEST(DTypeTest, ParsesVllmNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseDType("float32"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("fp32"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  const auto bad = ParseDType("float16");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("float16"), std::string::npos) << bad.status();
  EXPECT_STREQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_STREQ(DTypeName(DType::kFloat32), "float32");
}

// The dtype is part of the block's size and of the layout string that keys
// KV-store blocks, so bf16 blocks are never read as fp32 ones.
TEST(DTypeTest, BlockBytesAndLayoutStringCarryTheDtype) {
  ModelConfig c{.dim = 64, .hidden_dim = 172, .num_layers = 5, .num_heads = 8,
                .num_kv_heads = 4, .vocab_size = 512, .max_seq_len = 512, .head_size = 8};
  EXPECT_EQ(KvBlockBytes(c, 16), 5 * 2 * 16 * 4 * 8 * 4);
  EXPECT_EQ(KvBlockBytes(c, 16, DType::kBFloat16), 5 * 2 * 16 * 4 * 8 * 2);
  EXPECT_EQ(KvLayoutString(c, 16), "block-major/L5/KV2/B16/H4/D8/f32");
  EXPECT_EQ(KvLayoutString(c, 16, DType::kBFloat16), "block-major/L5/KV2/B16/H4/D8/bf16");
}

// --dtype auto (vLLM's default) follows the checkpoint on cuda as far as
// there is a path for its dtype, and never rounds its weights; float16 is
// refused by name.
TEST(DTypeTest, AutoResolvesFromTheCheckpointAndFloat16IsRefused) {
  EXPECT_EQ(*ResolveDType("auto", "bfloat16", /*cuda=*/true), DType::kBFloat16);
  EXPECT_EQ(*ResolveDType("auto", "float32", true), DType::kFloat32);
  EXPECT_EQ(*ResolveDType("auto", "float16", true), DType::kFloat32);  // no float16 path
  EXPECT_EQ(*ResolveDType("auto", "", true), DType::kFloat32);
  EXPECT_EQ(*ResolveDType("auto", "bfloat16", /*cuda=*/false), DType::kFloat32);
  EXPECT_EQ(*ResolveDType("bfloat16", "float32", true), DType::kBFloat16);
  EXPECT_EQ(*ResolveDType("float32", "bfloat16", true), DType::kFloat32);
  for (const char* half : {"float16", "half", "fp16"}) {
    const auto r = ResolveDType(half, "float16", true);
    ASSERT_FALSE(r.ok()) << half;
    EXPECT_NE(r.status().message().find(std::string("dtype '") + half + "' is not supported"),
              std::string::npos)
        << r.status();
  }
  const auto cpu_bf16 = ResolveDType("bfloat16", "bfloat16", false);
  ASSERT_FALSE(cpu_bf16.ok());
  EXPECT_NE(cpu_bf16.status().message().find("needs the cuda backend"), std::string::npos);
}

// The checkpoint's dtype reaches ModelConfig: config.json's torch_dtype, or
// transformers 5's "dtype"; llama2.c files are float32.
TEST(DTypeTest, ModelConfigCarriesTheCheckpointsDtype) {
  const std::string hf = testing::SharedDir() + "/models/hf/";
  for (const auto& [fixture, dtype] : std::vector<std::pair<std::string, std::string>>{
           {"qwen3", "bfloat16"}, {"mistral", "float32"}, {"llama3.2-tf5", "bfloat16"}}) {
    auto model = Model::Load(hf + fixture, {.host_weights = false});
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model.value()->config().torch_dtype, dtype) << fixture;
  }
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->config().torch_dtype, "float32");
}

TEST(DTypeTest, CpuBackendRejectsBf16WithAClearError) {
  auto model = testing::LoadTestModel();
  ASSERT_NE(model, nullptr);
  auto r = ModelRunner::Create(model.get(),
                               {.block_size = 16, .num_blocks = 4, .dtype = DType::kBFloat16});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("cuda"), std::string::npos) << r.status();
}

TEST(DTypeTest, CudaDeviceOrdinalIsValidated) {
  EXPECT_FALSE((ModelRunnerOptions{.cuda_device = -1}).Validate().ok());
  EXPECT_TRUE((ModelRunnerOptions{.cuda_device = 3}).Validate().ok());
}

TEST(DTypeTest, AttentionSplitsPerBlockIsValidated) {
  for (int32_t ok : {-1, 0, 1, 4}) {
    EXPECT_TRUE((ModelRunnerOptions{.attention_splits_per_block = ok}).Validate().ok()) << ok;
  }
  const absl::Status s = ModelRunnerOptions{.attention_splits_per_block = -2}.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("attention_splits_per_block = -2"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem::model
