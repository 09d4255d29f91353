// The cases of ../shared/models/stories260K.reference.json: llama2.c's own
// greedy outputs for stories260K (see ../shared/models/README.md).
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "harness.h"
#include "tandem/model/json.h"

namespace tandem::testing {

struct ReferenceCase {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  std::vector<int32_t> expected;
  size_t decisive_prefix_len = 0;
  bool stopped_on_token_1 = false;  // stories260K's cases only

  // What the scheduler streams: the reference's tokens, then the EOS (id 1)
  // run.c stopped on, an output token as in vLLM.
  std::vector<int32_t> Streamed() const {
    std::vector<int32_t> out = expected;
    if (stopped_on_token_1) out.push_back(1);
    return out;
  }
};

// One greedy request per case, as the reference ran it.
inline std::vector<v1::GenerateRequest> ReferenceRequests(const std::vector<ReferenceCase>& cases) {
  std::vector<v1::GenerateRequest> requests;
  for (const ReferenceCase& c : cases) requests.push_back(MakeRequest(c.prompt, c.max_tokens));
  return requests;
}

// stories260K.reference.json by default; also reads the Hugging Face
// fixtures' reference.json (an object whose "cases" hold the same fields).
inline std::vector<ReferenceCase> LoadReferenceCases(
    const std::string& path = std::string(TANDEM_SHARED_DIR) +
                              "/models/stories260K.reference.json") {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto json = model::ParseJson(ss.str());
  EXPECT_TRUE(json.ok()) << json.status();
  std::vector<ReferenceCase> cases;
  if (!json.ok()) return cases;
  const nlohmann::json& list = json->is_object() ? json->at("cases") : *json;
  for (const nlohmann::json& c : list) {
    cases.push_back({.prompt = c.at("prompt_token_ids").get<std::vector<int32_t>>(),
                     .max_tokens = c.at("max_tokens").get<int32_t>(),
                     .expected = c.at("expected_output_token_ids").get<std::vector<int32_t>>(),
                     .decisive_prefix_len = c.at("decisive_prefix_len").get<size_t>(),
                     .stopped_on_token_1 = c.value("stopped_on_token_1", false)});
  }
  return cases;
}

}  // namespace tandem::testing
