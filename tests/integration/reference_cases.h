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
  auto json = model::JsonValue::Parse(ss.str());
  EXPECT_TRUE(json.ok()) << json.status();
  std::vector<ReferenceCase> cases;
  if (!json.ok()) return cases;
  auto ids = [](const model::JsonValue* v) {
    std::vector<int32_t> out;
    for (const auto& x : v->array()) out.push_back(static_cast<int32_t>(x.number()));
    return out;
  };
  const model::JsonValue& list = json->is_object() ? *json->Find("cases") : *json;
  for (const model::JsonValue& c : list.array()) {
    cases.push_back(
        {.prompt = ids(c.Find("prompt_token_ids")),
         .max_tokens = static_cast<int32_t>(c.Find("max_tokens")->number()),
         .expected = ids(c.Find("expected_output_token_ids")),
         .decisive_prefix_len = static_cast<size_t>(c.Find("decisive_prefix_len")->number())});
  }
  return cases;
}

}  // namespace tandem::testing
