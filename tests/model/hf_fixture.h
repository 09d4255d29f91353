// Helpers of the tests that read shared/models/hf: the fixtures, their
// transformers references, and copies with an edited config.json.
#pragma once

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace tandem::model::testing {

inline std::string FixtureDir(const std::string& name) { return SharedDir() + "/models/hf/" + name; }

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void Spit(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// Skips when shared/models/hf is absent, except in CI, where it must be there.
#define TANDEM_REQUIRE_HF()                                                             \
  do {                                                                                  \
    if (!std::filesystem::exists(FixtureDir("llama2-bf16"))) {                          \
      if (std::getenv("CI") != nullptr) FAIL() << "CI is set but " << FixtureDir("") << \
                                            " is missing";                              \
      GTEST_SKIP() << "no " << FixtureDir("");                                          \
    }                                                                                   \
  } while (0)

struct HfCase {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  std::vector<int32_t> expected;
  std::vector<double> margins;
  int32_t decisive = 0;
};

// The cases of a reference.json (the fixtures' layout).
inline std::vector<HfCase> LoadHfCasesFrom(const std::string& file) {
  auto doc = ParseJson(Slurp(file));
  EXPECT_TRUE(doc.ok()) << doc.status();
  std::vector<HfCase> cases;
  if (!doc.ok()) return cases;
  for (const nlohmann::json& c : doc->at("cases")) {
    HfCase h{.prompt = Ints(c.at("prompt_token_ids")),
             .max_tokens = c.at("max_tokens").get<int32_t>(),
             .expected = Ints(c.at("expected_output_token_ids")),
             .margins = c.at("top2_margins").get<std::vector<double>>(),
             .decisive = c.at("decisive_prefix_len").get<int32_t>()};
    cases.push_back(std::move(h));
  }
  return cases;
}
inline std::vector<HfCase> LoadHfCases(const std::string& fixture) {
  return LoadHfCasesFrom(FixtureDir(fixture) + "/reference.json");
}

// Greedy for several prompts at once, every step one batch (prefills, then
// decodes), EOS ignored as in the reference.
inline std::vector<std::vector<int32_t>> GreedyBatched(const Model& model,
                                                const std::vector<HfCase>& cases, Backend backend,
                                                DType dtype) {
  const int32_t bs = 16;
  std::vector<std::vector<int32_t>> tables, chunks(cases.size()), out(cases.size());
  std::vector<int32_t> pos(cases.size(), 0);
  int32_t next_block = 0, total_blocks = 0;
  for (const HfCase& c : cases) {
    total_blocks += (static_cast<int32_t>(c.prompt.size()) + c.max_tokens) / bs + 1;
  }
  auto runner =
      ModelRunner::Create(&model, {.block_size = bs, .num_blocks = total_blocks, .dtype = dtype},
                          backend);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return out;
  for (size_t i = 0; i < cases.size(); ++i) {
    const int32_t need = (static_cast<int32_t>(cases[i].prompt.size()) + cases[i].max_tokens) / bs + 1;
    std::vector<int32_t> table;
    for (int32_t b = 0; b < need; ++b) table.push_back(next_block++);
    tables.push_back(table);
    chunks[i] = cases[i].prompt;
  }
  std::vector<float> logits;
  for (;;) {
    std::vector<SequenceInput> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (static_cast<int32_t>(out[i].size()) >= cases[i].max_tokens) continue;
      batch.push_back({.token_ids = chunks[i], .start_pos = pos[i], .block_table = tables[i]});
      who.push_back(i);
    }
    if (batch.empty()) break;
    const absl::Status s = (*runner)->Forward(batch, &logits);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    const int32_t vocab = model.config().vocab_size;
    for (size_t b = 0; b < who.size(); ++b) {
      const size_t i = who[b];
      pos[i] += static_cast<int32_t>(chunks[i].size());
      const std::vector<float> row(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
      const int32_t next = SampleToken(row, SamplingParams{}, 0);
      out[i].push_back(next);
      chunks[i] = {next};
    }
  }
  return out;
}

inline void ExpectDecisivePrefix(const std::vector<int32_t>& got, const HfCase& c,
                          const std::string& what) {
  ASSERT_GE(got.size(), static_cast<size_t>(c.decisive)) << what;
  for (int32_t t = 0; t < c.decisive; ++t) {
    ASSERT_EQ(got[t], c.expected[t]) << what << " token " << t << " (decisive prefix "
                                     << c.decisive << ")";
  }
}

// bfloat16 rounds weights, K/V and GEMM inputs (8-bit mantissa: a relative
// error of up to 2^-9 per rounding), so a token is held to transformers' only
// while every step so far had a top-2 margin of at least kBf16Margin (the
// fp32 reference's logits). Why 0.25: the fixtures' logits are O(1-10) and
// pass 3 layers of hidden size 128, so a few hundred roundings of 0.2% each,
// partly cancelling, move a logit by a few hundredths; 0.25 leaves a factor
// of about 5. On an H200 (2026-11-30) every shared fixture held it.
constexpr double kBf16Margin = 0.25;

// Both CUDA modes' greedy tokens against transformers': float32 over the
// decisive prefix, bfloat16 while the margins stay above kBf16Margin.
inline void ExpectCudaMatchesTransformers(const Model& model, const std::vector<HfCase>& cases,
                                          const std::string& what) {
  for (size_t i = 0; i < cases.size(); ++i) {
    const HfCase& c = cases[i];
    const std::string label = what + " case " + std::to_string(i);
    const std::vector<int32_t> f32 =
        Greedy(model, c.prompt, c.max_tokens, Backend::kCuda, DType::kFloat32, nullptr, false)
            .tokens;
    ExpectDecisivePrefix(f32, c, label + " cuda float32");
    // bfloat16 with either decode attention (the split-K kernel, the
    // runner's default, and the tensor-core one), and for Gemma's head size
    // 256 or a softcap, its prefill chunks on the tensor-core kernel too.
    std::vector<std::pair<ModelRunnerOptions, std::string>> modes = {
        {{}, ""}, {{.decode_attention_tensor_cores = true}, " (tensor-core decode attention)"}};
    const ModelConfig& mc = model.config();
    if (mc.head_size == 256 || mc.attn_logit_softcap > 0) {
      modes.push_back({{.tensor_core_prefill_gemma = true}, " (Gemma's tensor-core prefill)"});
    }
    for (const auto& [opts, mode] : modes) {
      const std::vector<int32_t> bf16 = Greedy(model, c.prompt, c.max_tokens, Backend::kCuda,
                                               DType::kBFloat16, nullptr, false, opts)
                                            .tokens;
      for (int32_t t = 0; t < c.max_tokens && c.margins[t] >= kBf16Margin; ++t) {
        ASSERT_EQ(bf16[t], c.expected[t]) << label << " cuda bfloat16" << mode << " token " << t;
      }
    }
  }
}

inline bool CudaAvailable(const Model& model) {
  return ModelRunner::Create(&model, {.block_size = 16, .num_blocks = 1}, Backend::kCuda).ok();
}

// A copy of a fixture whose config.json has `from` replaced by `to`, or
// the keys of `overrides` set (Python's dict.update).
class EditedFixture {
 public:
  EditedFixture(const std::string& fixture, const std::string& from, const std::string& to) {
    Copy(fixture);
    std::string cfg = Slurp(dir_.File("config.json"));
    const size_t at = cfg.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) cfg.replace(at, from.size(), to);
    Spit(dir_.File("config.json"), cfg);
  }
  EditedFixture(const std::string& fixture, const nlohmann::json& overrides) {
    Copy(fixture);
    auto cfg = ParseJson(Slurp(dir_.File("config.json")));
    EXPECT_TRUE(cfg.ok()) << cfg.status();
    if (!cfg.ok()) return;
    cfg->update(overrides);
    Spit(dir_.File("config.json"), cfg->dump(1));
  }
  const std::string& path() const { return dir_.path(); }
  std::string File(const std::string& name) const { return dir_.File(name); }

 private:
  // `fixture`: a shared fixture's name, or a directory's path.
  void Copy(const std::string& fixture) {
    const std::string src = fixture.find('/') != std::string::npos ? fixture : FixtureDir(fixture);
    for (const auto& e : std::filesystem::directory_iterator(src)) {
      const std::string dst = dir_.File(e.path().filename().string());
      std::filesystem::copy_file(e.path(), dst);
      std::filesystem::permissions(dst, std::filesystem::perms::owner_write,
                                   std::filesystem::perm_options::add);
    }
  }
  TempDir dir_;
};

inline void ExpectRefused(const EditedFixture& f, absl::StatusCode code, const std::string& needle) {
  auto m = Model::Load(f.path());
  ASSERT_FALSE(m.ok()) << "loaded; wanted a refusal naming " << needle;
  EXPECT_EQ(m.status().code(), code) << m.status();
  EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status();
}

// Edits config.json's text in place: every (from, to) pair, each must be found.
// ExpectRefused on a copy of `fixture` with `from` replaced by `to`.
inline void ExpectEditRefused(const std::string& fixture, const std::string& from,
                              const std::string& to, absl::StatusCode code,
                              const std::string& needle) {
  EditedFixture f(fixture, from, to);
  ExpectRefused(f, code, needle);
}

inline void EditConfig(const EditedFixture& f,
                const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string cfg = Slurp(f.File("config.json"));
  for (const auto& [from, to] : edits) {
    const size_t at = cfg.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    cfg.replace(at, from.size(), to);
  }
  Spit(f.File("config.json"), cfg);
}

// The last position's logits of one prefill of `tokens` in chunks of `chunk`.
inline std::vector<float> LastLogits(const Model& model, const std::vector<int32_t>& tokens, int32_t chunk,
                              Backend backend = Backend::kCpu, DType dtype = DType::kFloat32) {
  const int32_t bs = 16, n = static_cast<int32_t>(tokens.size());
  auto runner = ModelRunner::Create(
      &model, {.block_size = bs, .num_blocks = n / bs + 1, .dtype = dtype}, backend);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return {};
  std::vector<int32_t> table(static_cast<size_t>(n / bs + 1));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  std::vector<float> logits;
  for (int32_t pos = 0; pos < n; pos += chunk) {
    const std::vector<int32_t> part(tokens.begin() + pos,
                                    tokens.begin() + std::min(n, pos + chunk));
    const SequenceInput in{.token_ids = part, .start_pos = pos, .block_table = table};
    const absl::Status s = (*runner)->Forward({&in, 1}, &logits);
    EXPECT_TRUE(s.ok()) << s;
  }
  return logits;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The CPU backend, and both CUDA modes when a GPU is at hand.
inline std::vector<std::pair<Backend, DType>> RunnerModes(const Model& model) {
  std::vector<std::pair<Backend, DType>> modes = {{Backend::kCpu, DType::kFloat32}};
  if (CudaAvailable(model)) {
    modes.push_back({Backend::kCuda, DType::kFloat32});
    modes.push_back({Backend::kCuda, DType::kBFloat16});
  }
  return modes;
}
inline const char* ModeName(Backend backend, DType dtype) {
  return backend == Backend::kCpu ? "cpu" : dtype == DType::kFloat32 ? "cuda f32" : "cuda bf16";
}

}  // namespace tandem::model::testing
