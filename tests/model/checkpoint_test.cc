// The loaders' JSON helpers, the random-model generator and the llama2.c writer.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/model/json.h"
#include "test_util.h"

namespace tandem::model {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

TEST(JsonTest, ParsesNestedValuesAndEscapes) {
  auto v =
      ParseJson(R"( {"a": [1, -2.5e1, true, null], "b": {"c": "x\"y\\z\n\u00e9"}, "d": false} )");
  ASSERT_TRUE(v.ok()) << v.status();
  const nlohmann::json* a = JsonMember(*v, "a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->size(), 4u);
  EXPECT_EQ((*a)[0].get<double>(), 1);
  EXPECT_EQ((*a)[1].get<double>(), -25);
  EXPECT_TRUE((*a)[2].get<bool>());
  EXPECT_TRUE((*a)[3].is_null());
  EXPECT_EQ(JsonMember(*JsonMember(*v, "b"), "c")->get<std::string>(), "x\"y\\z\n\xc3\xa9");
  EXPECT_FALSE(JsonMember(*v, "d")->get<bool>());
  EXPECT_EQ(JsonMember(*v, "missing"), nullptr);
  EXPECT_EQ(JsonMember(*a, "a"), nullptr);  // not an object
}

TEST(JsonTest, RejectsMalformedInputWithPosition) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "{\"a\":1} x", "\"open", "tru"}) {
    auto v = ParseJson(bad);
    EXPECT_FALSE(v.ok()) << bad;
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("JSON parse error at byte")) << bad;
  }
  // nlohmann throws out_of_range, not parse_error, for a number past a
  // double's range (found by fuzz_json).
  for (const char* overflow : {"1e999", "[3333333e3133332]"}) {
    auto v = ParseJson(overflow);
    EXPECT_FALSE(v.ok()) << overflow;
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("JSON parse error")) << overflow;
  }
}

TEST(JsonTest, RefusesNestingDeeperThanTheLimit) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJson(ok).ok());
  const std::string deep =
      std::string(kMaxJsonDepth + 2, '[') + std::string(kMaxJsonDepth + 2, ']');
  auto v = ParseJson(deep);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("nested deeper than 64"));
}

TEST(RandomModelTest, IsAPureFunctionOfSizesAndSeed) {
  const RandomModelOptions opts{.dim = 32,
                                .hidden_dim = 48,
                                .num_layers = 2,
                                .num_heads = 4,
                                .num_kv_heads = 2,
                                .vocab_size = 100,
                                .max_seq_len = 64};
  auto a = MakeRandomCheckpoint(opts), b = MakeRandomCheckpoint(opts);
  RandomModelOptions other = opts;
  other.seed = 2;
  auto c = MakeRandomCheckpoint(other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto ma = Model::FromWeights(a->config, a->weights, "a");
  auto mb = Model::FromWeights(b->config, b->weights, "b");
  auto mc = Model::FromWeights(c->config, c->weights, "c");
  ASSERT_TRUE(ma.ok() && mb.ok() && mc.ok());
  EXPECT_EQ((*ma)->fingerprint(), (*mb)->fingerprint());
  EXPECT_NE((*ma)->fingerprint(), (*mc)->fingerprint());
  EXPECT_EQ((*ma)->fingerprint().size(), 64u);
  EXPECT_FALSE(MakeRandomCheckpoint(RandomModelOptions{.dim = 30, .num_heads = 4}).ok());
}

TEST(RandomModelTest, Llama2cWriterRoundTripsWithAndWithoutSharedClassifier) {
  for (bool shared : {true, false}) {
    auto ckpt = MakeRandomCheckpoint(
        RandomModelOptions{.num_layers = 2, .shared_classifier = shared, .seed = shared ? 1u : 2u});
    ASSERT_TRUE(ckpt.ok());
    TempDir dir;
    ASSERT_TRUE(WriteLlama2cCheckpoint(ckpt->config, ckpt->weights, dir.File("m.bin")).ok());
    auto m = Model::Load(dir.File("m.bin"));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->name(), "m.bin");
    EXPECT_EQ((*m)->weights().wcls, ckpt->weights.wcls);
    EXPECT_EQ((*m)->weights().token_embedding, ckpt->weights.token_embedding);
    EXPECT_EQ((*m)->weights().layers[1].w3, ckpt->weights.layers[1].w3);
    EXPECT_EQ((*m)->config().vocab_size, 512);
  }
}

TEST(RandomModelTest, KvLayoutStringAndBlockBytesDescribeTheCache) {
  TANDEM_REQUIRE_STORIES();
  auto m = Model::Load(testing::StoriesPath());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(KvLayoutString((*m)->config(), 16), "block-major/L5/KV2/B16/H4/D8/f32");
  EXPECT_EQ(KvBlockBytes((*m)->config(), 16), 5 * 2 * 16 * 4 * 8 * 4);
  EXPECT_EQ((*m)->name(), "stories260K.bin");
}

}  // namespace
}  // namespace tandem::model
