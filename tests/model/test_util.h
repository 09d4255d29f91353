// Helpers shared by the model tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/model/checkpoint.h"
#include "tandem/model/json.h"
#include "tandem/model/model.h"
#include "tandem/model/model_runner.h"
#include "tandem/model/sampler.h"

namespace tandem::model::testing {

// The shared/ directory: $TANDEM_SHARED_DIR when set (a test binary run on
// another machine, e.g. the GPU box), else the one configured at build time.
inline std::string SharedDir() {
  const char* env = std::getenv("TANDEM_SHARED_DIR");
  return env != nullptr && *env != '\0' ? env : TANDEM_SHARED_DIR;
}
inline std::string StoriesPath() { return SharedDir() + "/models/stories260K.bin"; }
inline std::string ReferencePath() { return SharedDir() + "/models/stories260K.reference.json"; }
inline bool HaveStories() { return std::filesystem::exists(StoriesPath()); }

// Skips a test that needs stories260K when the checkpoint is absent, except in
// CI (CI=true), which always has ../shared beside the checkout: there a
// missing model is a failure, not a silent skip.
#define TANDEM_REQUIRE_STORIES()                                              \
  do {                                                                        \
    if (!::tandem::model::testing::HaveStories()) {                           \
      if (std::getenv("CI") != nullptr) {                                     \
        FAIL() << "CI is set but " << ::tandem::model::testing::StoriesPath() \
               << " is missing (TANDEM_SHARED_DIR=" TANDEM_SHARED_DIR ")";    \
      }                                                                       \
      GTEST_SKIP() << "no " << ::tandem::model::testing::StoriesPath();       \
    }                                                                         \
  } while (0)

// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem_model_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Greedy steps with the top-2 logit margin of each. Free-running (stops at
// EOS, not included) when `forced` is null; else teacher-forced: step t
// predicts after the prompt and forced[0 .. t), whatever it picked.
struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<float> margins;
};
inline GreedyRun Greedy(const Model& model, const std::vector<int32_t>& prompt, int32_t max_tokens,
                        Backend backend, DType dtype, const std::vector<int32_t>* forced = nullptr,
                        bool stop_on_eos = true, const ModelRunnerOptions& runner_opts = {}) {
  if (forced != nullptr) max_tokens = static_cast<int32_t>(forced->size());
  const int32_t bs = 16, need = static_cast<int32_t>(prompt.size()) + max_tokens + 1;
  auto runner =
      ModelRunner::Create(&model, {.block_size = bs, .num_blocks = need / bs + 2, .dtype = dtype},
                          backend, runner_opts);
  EXPECT_TRUE(runner.ok()) << runner.status();
  std::vector<int32_t> table(need / bs + 1), chunk = prompt;
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  GreedyRun run;
  std::vector<float> logits;
  int32_t pos = 0;
  while (static_cast<int32_t>(run.tokens.size()) < max_tokens) {
    const SequenceInput in{.token_ids = chunk, .start_pos = pos, .block_table = table};
    EXPECT_TRUE((*runner)->Forward({&in, 1}, &logits).ok());
    pos += static_cast<int32_t>(chunk.size());
    const int32_t next = SampleToken(logits, SamplingParams{}, 0);
    float second = -INFINITY;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (static_cast<int32_t>(i) != next) second = std::max(second, logits[i]);
    }
    if (forced == nullptr && stop_on_eos && next == model.config().eos_token_id) break;
    run.margins.push_back(logits[next] - second);
    run.tokens.push_back(next);
    chunk = {forced != nullptr ? (*forced)[run.tokens.size() - 1] : next};
  }
  return run;
}

// Greedy generation for one prompt on a fresh runner: prefill in one chunk,
// then decode; stops on EOS (not included) or after max_tokens.
inline std::vector<int32_t> GenerateGreedy(const Model& model, const std::vector<int32_t>& prompt,
                                           int32_t max_tokens, Backend backend = Backend::kCpu,
                                           DType dtype = DType::kFloat32) {
  return Greedy(model, prompt, max_tokens, backend, dtype).tokens;
}

}  // namespace tandem::model::testing

namespace tandem::model::testing {

// stories260K when present, else a deterministic random model of the same
// shape (so the tests that do not need trained weights always run).
inline std::unique_ptr<Model> LoadTestModel() {
  if (HaveStories()) {
    auto m = Model::Load(StoriesPath());
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }
  auto ckpt = MakeRandomCheckpoint(RandomModelOptions{.num_layers = 3, .seed = 7});
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  auto m = Model::FromWeights(ckpt->config, std::move(ckpt->weights), "random");
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// Deterministic pseudo-random prompt of `n` tokens starting with BOS.
inline std::vector<int32_t> MakePrompt(int32_t n, uint32_t salt, int32_t vocab) {
  std::vector<int32_t> p = {1};
  uint32_t s = 2654435761u * (salt + 1);
  while (static_cast<int32_t>(p.size()) < n) {
    s = s * 1664525u + 1013904223u;
    p.push_back(2 + static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(vocab - 2)));
  }
  return p;
}

struct ReferenceCase {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  std::vector<int32_t> expected;
  int32_t decisive_prefix_len = 0;
  bool stopped_on_token_1 = false;

  // What a scheduler streams for the case: the reference's tokens, then the
  // EOS (id 1) run.c stopped on, an output token as in vLLM.
  std::vector<int32_t> Streamed() const {
    std::vector<int32_t> out = expected;
    if (stopped_on_token_1) out.push_back(1);
    return out;
  }
};

inline std::vector<int32_t> Ints(const nlohmann::json& v) { return v.get<std::vector<int32_t>>(); }

// The cases of stories260K.reference.json (llama2.c run.c's greedy outputs).
inline std::vector<ReferenceCase> LoadCases() {
  std::ifstream in(ReferencePath());
  std::stringstream ss;
  ss << in.rdbuf();
  auto doc = ParseJson(ss.str());
  EXPECT_TRUE(doc.ok()) << doc.status();
  std::vector<ReferenceCase> cases;
  if (!doc.ok()) return cases;
  for (const nlohmann::json& c : *doc) {
    cases.push_back(ReferenceCase{.prompt = Ints(c.at("prompt_token_ids")),
                                  .max_tokens = c.at("max_tokens").get<int32_t>(),
                                  .expected = Ints(c.at("expected_output_token_ids")),
                                  .decisive_prefix_len = c.at("decisive_prefix_len").get<int32_t>(),
                                  .stopped_on_token_1 = c.at("stopped_on_token_1").get<bool>()});
  }
  return cases;
}

}  // namespace tandem::model::testing

// Skips the test when the build or the machine has no CUDA device.
#define TANDEM_REQUIRE_CUDA(model)                                                      \
  do {                                                                                  \
    auto _probe =                                                                       \
        ModelRunner::Create((model), {.block_size = 16, .num_blocks = 4}, Backend::kCuda); \
    if (absl::IsUnavailable(_probe.status())) GTEST_SKIP() << _probe.status();          \
  } while (0)

