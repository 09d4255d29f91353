// Bad model inputs give a Status naming the file and the problem; nothing is
// half-loaded, nothing crashes. Bad batches give INVALID_ARGUMENT naming the
// sequence and leave the cache untouched.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace tandem::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
std::string Message(const absl::Status& s) { return std::string(s.message()); }

// A small random checkpoint written as a .bin and as an HF directory.
class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ckpt = MakeRandomCheckpoint(RandomModelOptions{.num_layers = 2, .seed = 5});
    ASSERT_TRUE(ckpt.ok());
    ckpt_ = std::move(*ckpt);
    bin_ = dir_.File("model.bin");
    hf_ = dir_.File("hf");
    ASSERT_TRUE(WriteLlama2cCheckpoint(ckpt_.config, ckpt_.weights, bin_).ok());
    ASSERT_TRUE(WriteHfCheckpoint(ckpt_.config, ckpt_.weights, hf_).ok());
    ASSERT_TRUE(Model::Load(bin_).ok());
    ASSERT_TRUE(Model::Load(hf_).ok());
  }
  // Replaces `from` with `to` (same length) in the safetensors header.
  void EditSafetensors(const std::string& from, const std::string& to) {
    ASSERT_EQ(from.size(), to.size());
    std::string bytes = Slurp(hf_ + "/model.safetensors");
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    bytes.replace(at, from.size(), to);
    Spit(hf_ + "/model.safetensors", bytes);
  }
  void EditConfig(const std::string& from, const std::string& to) {
    std::string text = Slurp(hf_ + "/config.json");
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    Spit(hf_ + "/config.json", text);
  }

  TempDir dir_;
  LoadedCheckpoint ckpt_;
  std::string bin_, hf_;
};

TEST_F(BadInputTest, MissingFileIsNotFoundNamingThePath) {
  auto m = Model::Load(dir_.File("nope.bin"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("nope.bin"), HasSubstr("cannot open")));
  std::filesystem::remove(hf_ + "/model.safetensors");
  m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), HasSubstr("model.safetensors: cannot open"));
}

TEST_F(BadInputTest, TruncatedBinNamesFileAndSizes) {
  const std::string bytes = Slurp(bin_);
  for (size_t keep : {size_t{0}, size_t{10}, bytes.size() / 2, bytes.size() - 4}) {
    Spit(bin_, bytes.substr(0, keep));
    auto m = Model::Load(bin_);
    ASSERT_FALSE(m.ok()) << keep;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.bin"), HasSubstr("truncated"))) << keep;
  }
}

TEST_F(BadInputTest, WrongHeaderIsRejected) {
  std::string bytes = Slurp(bin_);
  int32_t bad_heads = 7;  // dim 64 is not a multiple of 7
  std::memcpy(bytes.data() + 3 * 4, &bad_heads, 4);
  Spit(bin_, bytes);
  auto m = Model::Load(bin_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.bin"), HasSubstr("bad llama2.c header"),
                                         HasSubstr("n_heads=7")));
  // A plausible header for a different size: the file size gives it away.
  bytes = Slurp(bin_);
  int32_t hidden = 100;
  int32_t heads = 8;
  std::memcpy(bytes.data() + 3 * 4, &heads, 4);
  std::memcpy(bytes.data() + 1 * 4, &hidden, 4);
  Spit(bin_, bytes);
  m = Model::Load(bin_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.bin"), HasSubstr("size mismatch")));
}

TEST_F(BadInputTest, TensorOfWrongDtypeIsRejected) {
  EditSafetensors("\"model.norm.weight\":{\"dtype\":\"F32\"",
                  "\"model.norm.weight\":{\"dtype\":\"I32\"");
  auto m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()),
              AllOf(HasSubstr("model.safetensors"), HasSubstr("model.norm.weight"),
                    HasSubstr("unsupported dtype I32")));
}

TEST_F(BadInputTest, NonNumericDataOffsetsAreRejected) {
  // The last tensor's offsets [b,e] become ["xx..",0] (same length): a
  // string where a number belongs is refused, not read as 0 or thrown.
  std::string bytes = Slurp(hf_ + "/model.safetensors");
  const size_t at = bytes.rfind("\"data_offsets\":[");
  ASSERT_NE(at, std::string::npos);
  const size_t begin = at + std::string("\"data_offsets\":[").size();
  const size_t len = bytes.find(']', begin) - begin;
  ASSERT_GE(len, 4u);
  bytes.replace(begin, len, "\"" + std::string(len - 4, 'x') + "\",0");
  Spit(hf_ + "/model.safetensors", bytes);
  auto m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.safetensors"),
                                         HasSubstr("lacks dtype, shape or data_offsets")));
}

TEST_F(BadInputTest, TensorOfWrongShapeIsRejected) {
  // 64 x 172 stored as 172 x 64: same bytes, wrong shape.
  EditSafetensors("\"model.layers.0.mlp.down_proj.weight\":{\"dtype\":\"F32\",\"shape\":[64,172]",
                  "\"model.layers.0.mlp.down_proj.weight\":{\"dtype\":\"F32\",\"shape\":[172,64]");
  auto m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()),
              AllOf(HasSubstr("model.safetensors"), HasSubstr("down_proj"),
                    HasSubstr("shape [172, 64]"), HasSubstr("implies [64, 172]")));
}

TEST_F(BadInputTest, ConfigDisagreeingWithTensorsIsRejected) {
  EditConfig("\"intermediate_size\": 172", "\"intermediate_size\": 256");
  auto m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.safetensors"), HasSubstr("gate_proj"),
                                         HasSubstr("config.json implies [256, 64]")));
}

TEST_F(BadInputTest, ConfigWithFewerLayersThanTheTensorsIsRejected) {
  // The checkpoint has 2 layers; a config declaring 1 would run another model.
  EditConfig("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
  auto m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.safetensors"), HasSubstr("of layer 1"),
                                         HasSubstr("num_hidden_layers = 1")));
}

TEST_F(BadInputTest, HugeHeaderValuesAreRejectedWithoutOverflow) {
  std::string bytes = Slurp(bin_);
  const int32_t huge = 1 << 30;  // dim: size arithmetic would overflow int64
  std::memcpy(bytes.data(), &huge, 4);
  Spit(bin_, bytes);
  auto m = Model::Load(bin_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.bin"), HasSubstr("dim = 1073741824"),
                                         HasSubstr("exceeds the limit")));
  EditSafetensors("\"model.layers.0.mlp.down_proj.weight\":{\"dtype\":\"F32\",\"shape\":[64,172]",
                  "\"model.layers.0.mlp.down_proj.weight\":{\"dtype\":\"F32\",\"shape\":[9e99,1]");
  m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.safetensors"), HasSubstr("down_proj"),
                                         HasSubstr("bad shape")));
}

TEST_F(BadInputTest, ShardedIndexThatDisagreesWithItsShardsIsRejected) {
  const std::string dir = dir_.File("sharded");
  ASSERT_TRUE(
      WriteHfCheckpoint(ckpt_.config, ckpt_.weights, dir, HfWriteOptions{.num_shards = 2}).ok());
  ASSERT_TRUE(Model::Load(dir).ok());
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string index = Slurp(index_path);
  // model.norm.weight is written last, so it sits in the second shard.
  const std::string entry = "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"";
  ASSERT_NE(index.find(entry), std::string::npos) << index;
  std::string moved = index;
  moved.replace(moved.find(entry), entry.size(),
                "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"");
  Spit(index_path, moved);
  auto m = Model::Load(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("model.norm.weight"),
                    HasSubstr("but it is in"), HasSubstr("model-00002-of-00002")));
  // A missing shard names its path.
  Spit(index_path, index);
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  m = Model::Load(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(BadInputTest, MissingTensorIsRejected) {
  EditSafetensors("\"model.norm.weight\"", "\"model.norx.weight\"");
  auto m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.safetensors"),
                                         HasSubstr("missing tensor 'model.norm.weight'")));
}

TEST_F(BadInputTest, TruncatedSafetensorsIsRejected) {
  const std::string bytes = Slurp(hf_ + "/model.safetensors");
  for (size_t keep : {size_t{3}, size_t{100}, bytes.size() - 1}) {
    Spit(hf_ + "/model.safetensors", bytes.substr(0, keep));
    auto m = Model::Load(hf_);
    ASSERT_FALSE(m.ok()) << keep;
    EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("model.safetensors"), HasSubstr("truncated")))
        << keep << ": " << m.status();
  }
}

TEST_F(BadInputTest, BadConfigJsonIsRejected) {
  EditConfig("\"hidden_size\": 64,", "\"hidden_size\": 64");
  auto m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("config.json"), HasSubstr("JSON parse error")));
  // A misspelt key is refused by name (it might change the math) ...
  EditConfig("\"hidden_size\": 64", "\"hidden_sizeX\": 64,");
  m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()),
              AllOf(HasSubstr("config.json"), HasSubstr("\"hidden_sizeX\" is not supported")));
  // ... and a missing one named.
  EditConfig("\"hidden_sizeX\": 64,", "\"pad_token_id\": 0,");
  m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()),
              AllOf(HasSubstr("config.json"), HasSubstr("missing \"hidden_size\"")));
}

TEST_F(BadInputTest, UnsupportedArchitectureFeaturesAreRejected) {
  EditConfig("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
  auto m = Model::Load(hf_);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(m.status()), AllOf(HasSubstr("config.json"), HasSubstr("gelu")));
}

TEST_F(BadInputTest, BadBatchIsInvalidArgumentNamingTheSequenceAndLeavesCacheUntouched) {
  auto model = Model::Load(bin_);
  ASSERT_TRUE(model.ok());
  auto runner = ModelRunner::Create(model->get(), {.block_size = 4, .num_blocks = 8});
  ASSERT_TRUE(runner.ok());
  const std::vector<std::byte> before((*runner)->BlockBytes(0).begin(),
                                      (*runner)->BlockBytes(0).end());
  std::vector<int32_t> ok_tokens = {1, 2, 3}, table = {0, 1};
  std::vector<int32_t> bad_token = {1, 9999}, bad_table = {0, 8}, short_table = {0};
  std::vector<int32_t> empty;
  struct Case {
    SequenceInput bad;
    const char* want;
  } cases[] = {
      {{.token_ids = bad_token, .start_pos = 0, .block_table = table}, "token id 9999"},
      {{.token_ids = ok_tokens, .start_pos = 2, .block_table = bad_table}, "block id 8"},
      {{.token_ids = ok_tokens, .start_pos = 2, .block_table = short_table}, "need 5"},
      {{.token_ids = ok_tokens, .start_pos = 511, .block_table = table}, "max_seq_len"},
      {{.token_ids = empty, .start_pos = 0, .block_table = table}, "no tokens"},
      {{.token_ids = ok_tokens, .start_pos = -1, .block_table = table}, "negative start_pos"},
  };
  std::vector<float> logits;
  for (const Case& c : cases) {
    const SequenceInput good{.token_ids = ok_tokens, .start_pos = 0, .block_table = table};
    const SequenceInput batch[] = {good, c.bad};
    const absl::Status s = (*runner)->Forward(batch, &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(Message(s), AllOf(HasSubstr("sequence 1"), HasSubstr(c.want)));
    EXPECT_TRUE(std::equal(before.begin(), before.end(), (*runner)->BlockBytes(0).begin()))
        << "the good sequence must not have been run: " << c.want;
  }
  EXPECT_TRUE((*runner)->BlockBytes(8).empty()) << "out-of-range block id";
  EXPECT_TRUE((*runner)->BlockBytes(-1).empty());
  std::vector<std::byte> wrong_size(3);
  EXPECT_EQ((*runner)->CopyBlockToHost(0, wrong_size).code(), absl::StatusCode::kInvalidArgument);
  // A batch of copies with one bad entry copies nothing.
  std::vector<std::byte> b0(static_cast<size_t>((*runner)->block_bytes()), std::byte{7}), b1 = b0;
  const std::span<std::byte> outs[] = {b0, b1};
  for (const std::vector<int32_t>& ids : {std::vector<int32_t>{0, 8}, std::vector<int32_t>{0}}) {
    auto wait = (*runner)->CopyBlocksToHostAsync(ids, outs);
    EXPECT_EQ(wait.status().code(), absl::StatusCode::kInvalidArgument) << ids.size();
  }
  const std::span<std::byte> short_out[] = {b0, wrong_size};
  const int32_t two[] = {0, 1};
  EXPECT_EQ((*runner)->CopyBlocksToHostAsync(two, short_out).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b0, std::vector<std::byte>(b0.size(), std::byte{7}));
  // A good one copies the blocks at once on the CPU backend.
  auto copied = (*runner)->CopyBlocksToHostAsync(two, outs);
  ASSERT_TRUE(copied.ok()) << copied.status();
  ASSERT_TRUE((*copied)().ok());
  EXPECT_TRUE(std::equal(b0.begin(), b0.end(), (*runner)->BlockBytes(0).begin()));
  EXPECT_TRUE(std::equal(b1.begin(), b1.end(), (*runner)->BlockBytes(1).begin()));
  // Loads: a batch with one bad entry writes no block; a good one writes all.
  const std::vector<std::byte> before0(b0), before1(b1);
  std::vector<std::byte> in0(b0.size(), std::byte{3}), in1(b0.size(), std::byte{4});
  const std::span<const std::byte> ins[] = {in0, in1};
  const int32_t bad_second[] = {1, 8};
  EXPECT_EQ((*runner)->CopyBlocksFromHost(bad_second, ins).code(),
            absl::StatusCode::kInvalidArgument);
  const std::span<const std::byte> short_in[] = {in0, wrong_size};
  EXPECT_EQ((*runner)->CopyBlocksFromHost(two, short_in).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*runner)->CopyBlocksFromHost(std::span(two).first(1), ins).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::equal(before0.begin(), before0.end(), (*runner)->BlockBytes(0).begin()));
  EXPECT_TRUE(std::equal(before1.begin(), before1.end(), (*runner)->BlockBytes(1).begin()));
  ASSERT_TRUE((*runner)->CopyBlocksFromHost(two, ins).ok());
  EXPECT_TRUE(std::equal(in0.begin(), in0.end(), (*runner)->BlockBytes(0).begin()));
  EXPECT_TRUE(std::equal(in1.begin(), in1.end(), (*runner)->BlockBytes(1).begin()));
  EXPECT_EQ(ModelRunner::Create(model->get(), {.block_size = 4, .num_blocks = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, CudaBackendIsUnavailableWithoutADevice) {
  auto model = Model::Load(bin_);
  ASSERT_TRUE(model.ok());
  auto runner =
      ModelRunner::Create(model->get(), {.block_size = 16, .num_blocks = 4}, Backend::kCuda);
#if defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA
  if (runner.ok()) GTEST_SKIP() << "a CUDA device is present";
#endif
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnavailable) << runner.status();
}

}  // namespace
}  // namespace tandem::model
