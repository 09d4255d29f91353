// Helpers of the frontend's tool tests (tools_test.cc,
// tool_calls_e2e_test.cc): the npm fixtures' models, SSE events, the npm
// openai SDK's case scripts and the prompt the fake scheduler was sent.
#pragma once

#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {

using Json = nlohmann::ordered_json;

inline const std::string kNpm = std::string(TANDEM_BINARY_DIR) + "/tokenizer_npm/models/";
inline const std::string kData = std::string(TANDEM_SOURCE_DIR) + "/tests/tokenizer/data/";

inline Json ReadJson(const std::string& path) { return Json::parse(std::ifstream(path)); }

// The data of each event of an SSE body ("data: {...}" lines).
inline void AppendEvents(const std::string& body, std::vector<Json>* events) {
  for (size_t at = body.find("data: {"); at != std::string::npos;
       at = body.find("data: {", at + 1)) {
    events->push_back(Json::parse(body.substr(at + 6, body.find('\n', at) - at - 6)));
  }
}

// Runs node/`script` (copied to the build by npm_install.sh) with the npm
// openai SDK against the frontend at `address`; what it wrote, or nullopt
// (a failure recorded) when it failed.
inline std::optional<Json> RunSdkCases(const std::string& script, const std::string& address,
                                const std::string& out) {
  const std::string npm = std::string(TANDEM_BINARY_DIR) + "/frontend_npm";
  std::string log;
  const int rc = RunCommand({"/usr/bin/env", "NODE_PATH=" + npm + "/node_modules", "node",
                             npm + "/" + script, "http://" + address + "/v1", out},
                            &log, std::chrono::seconds(120));
  EXPECT_EQ(rc, 0) << log;
  if (rc != 0) return std::nullopt;
  return Json::parse(std::ifstream(out));
}

// The prompt `scheduler` was last sent, as text.
inline std::string LastPromptOf(FakeScheduler& scheduler, const tokenizer::Tokenizer& tok) {
  const v1::GenerateRequest got = scheduler.requests().back();
  auto text =
      tok.Decode(std::vector<int32_t>(got.prompt_token_ids().begin(), got.prompt_token_ids().end()),
                 {.skip_special_tokens = false});
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

}  // namespace tandem::testing
