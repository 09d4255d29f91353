// Fixtures derived from shared/models/hf by editing config.json only (the
// same weights): RoPE scaling yarn and longrope, Phi3's partial RoPE and
// sliding windows, which no shared fixture exercises; and small random
// checkpoints of architectures no shared fixture has
// (tests/model/hf_generated: Gemma 3). tests/model/hf_derived/
// derived.json lists them; <name>.reference.json holds transformers' greedy
// tokens for each, made where transformers is installed (the GPU machines)
// by tools/gpu/hf_derived_references.py, in the shared fixtures' layout.
// Every derived config must load; each one with a reference must give its
// decisive prefix on the CPU backend, and both CUDA modes' tokens where a
// GPU is at hand (as the shared fixtures' are held). An entry may load with options
// ("load": {"max_model_len": N}) and compare only the cases whose prompt has
// at least "min_prompt_len" tokens (longrope's long factors, which
// transformers takes only for a sequence past the original context). An
// entry with "wrap" is transformers' multimodal class around the same
// weights (Gemma3ForConditionalGeneration); Tandem's side loads the causal
// LM, which multimodal_test.cc holds to the wrapped checkpoint bit for bit.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "hf_fixture.h"

namespace tandem::model {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

// $TANDEM_HF_DERIVED_DIR (a GPU bundle's copy) or the source tree's.
std::string DerivedDir() {
  const char* env = std::getenv("TANDEM_HF_DERIVED_DIR");
  return env != nullptr && *env != '\0' ? env
                                         : std::string(TANDEM_SOURCE_DIR) + "/tests/model/hf_derived";
}

TEST(HfDerivedTest, DerivedConfigsLoadAndMatchTransformersWhereAReferenceExists) {
  TANDEM_REQUIRE_HF();
  auto manifest = ParseJson(Slurp(DerivedDir() + "/derived.json"));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_FALSE(manifest->empty());
  int compared = 0;
  std::vector<std::string> missing;
  for (const auto& [name, d] : manifest->items()) {
    SCOPED_TRACE(name);
    // A shared fixture, or one of tests/model/hf_generated (beside this
    // folder).
    EditedFixture f(d.contains("generated")
                        ? DerivedDir() + "/../hf_generated/" + d.at("generated").get<std::string>()
                        : d.at("fixture").get<std::string>(),
                    d.at("config"));
    LoadOptions options;
    if (d.contains("load")) options.max_model_len = d.at("load").value("max_model_len", 0);
    auto m = Model::Load(f.path(), options);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::string ref = DerivedDir() + "/" + name + ".reference.json";
    if (!std::filesystem::exists(ref)) {
      missing.push_back(name);
      continue;
    }
    std::vector<HfCase> cases = LoadHfCasesFrom(ref);
    const size_t min_prompt = d.value("min_prompt_len", 0);
    std::erase_if(cases, [&](const HfCase& c) { return c.prompt.size() < min_prompt; });
    ASSERT_FALSE(cases.empty());
    const auto got = GreedyBatched(**m, cases, Backend::kCpu, DType::kFloat32);
    for (size_t i = 0; i < cases.size(); ++i) {
      ExpectDecisivePrefix(got[i], cases[i], absl::StrCat(name, " case ", i));
    }
    if (CudaAvailable(**m)) ExpectCudaMatchesTransformers(**m, cases, name);
    ++compared;
  }
  if (!missing.empty()) {
    std::cout << "no transformers reference yet for " << absl::StrJoin(missing, ", ")
              << " (tools/gpu/hf_derived_references.py makes them)\n";
  }
  if (compared == 0) GTEST_SKIP() << "every derived config loads; no reference to compare yet";
}

}  // namespace
}  // namespace tandem::model
