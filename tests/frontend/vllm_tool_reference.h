// Holds our tool-call parsers to vLLM's steps run by Python
// (vllm_tool_parsers.py on /usr/bin/python3, which tools/install-deps.sh
// installs): every answer's calls (names and arguments) and content.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tandem/frontend/tool_calls.h"

namespace tandem::frontend::testing {

// What the answer generators share: a seeded generator's draws, and a
// mutation at a character's start (never inside a UTF-8 sequence).
class RandomText {
 public:
  explicit RandomText(uint32_t seed) : rng_(seed) {}

 protected:
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int Int(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }
  std::string Pick(std::initializer_list<const char*> options) {
    return *(options.begin() + Int(static_cast<int>(options.size())));
  }
  // Deletes a character, or inserts one of `insertions`.
  void Mutate(std::string* s, std::initializer_list<const char*> insertions) {
    auto continuation = [&](size_t i) {
      return i < s->size() && (static_cast<unsigned char>((*s)[i]) & 0xC0) == 0x80;
    };
    size_t at = rng_() % (s->size() + 1);
    while (continuation(at)) ++at;
    if (Chance(0.5) && at < s->size()) {
      size_t end = at + 1;
      while (continuation(end)) ++end;
      s->erase(at, end - at);
    } else {
      s->insert(at, Pick(insertions));
    }
  }

  std::mt19937 rng_;
};

// The generators' seed: `fixed`, or TANDEM_TOOL_CALLS_SEED to explore others.
inline uint32_t GeneratorSeed(uint32_t fixed) {
  const char* env = std::getenv("TANDEM_TOOL_CALLS_SEED");
  return env == nullptr ? fixed : static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
}

struct ReferenceCase {
  ToolParser parser;
  std::string text;
};

struct ReferenceTally {
  int with_calls = 0;  // answers vLLM found calls in
  int mismatches = 0;
};

inline const char* ParserName(ToolParser parser) {
  switch (parser) {
    case ToolParser::kHermes:
      return "hermes";
    case ToolParser::kLlama3Json:
      return "llama3_json";
    case ToolParser::kPythonic:
      return "pythonic";
    case ToolParser::kLlama4Pythonic:
      return "llama4_pythonic";
    case ToolParser::kMistral:
      return "mistral";
  }
  return "";
}

// Runs the reference over `cases` and compares; the first ten mismatches
// are failures with both answers.
inline ReferenceTally ExpectVllmsCalls(const std::vector<ReferenceCase>& cases) {
  using Json = nlohmann::json;
  ReferenceTally tally;
  const std::string python = "/usr/bin/python3";
  if (access(python.c_str(), X_OK) != 0) {
    ADD_FAILURE() << python << " is missing (tools/install-deps.sh installs it)";
    return tally;
  }
  Json input = Json::array();
  for (const ReferenceCase& c : cases) {
    input.push_back({{"text", c.text}, {"parser", ParserName(c.parser)}});
  }
  char dir[] = "/tmp/tool-reference-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    ADD_FAILURE() << "mkdtemp";
    return tally;
  }
  const std::string in_path = std::string(dir) + "/in.json";
  std::ofstream(in_path) << input.dump();
  const std::string script = std::string(TANDEM_TEST_SOURCE_DIR) + "/vllm_tool_parsers.py";
  FILE* pipe = popen((python + " " + script + " " + in_path).c_str(), "r");
  std::string output;
  char buf[65536];
  for (size_t n; pipe != nullptr && (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) {
    output.append(buf, n);
  }
  if (pipe == nullptr || pclose(pipe) != 0) {
    ADD_FAILURE() << "the reference failed: " << output.substr(0, 2000);
    return tally;
  }
  std::remove(in_path.c_str());
  std::remove(dir);
  const Json want = Json::parse(output);
  EXPECT_EQ(want.size(), cases.size());
  for (size_t k = 0; k < cases.size() && k < want.size(); ++k) {
    const ExtractedToolCalls got = ExtractToolCalls(cases[k].parser, cases[k].text);
    std::vector<std::pair<std::string, std::string>> got_calls, want_calls;
    for (const ToolCall& c : got.calls) got_calls.emplace_back(c.name, c.arguments);
    if (!want[k]["calls"].is_null()) {
      for (const Json& c : want[k]["calls"]) want_calls.emplace_back(c[0], c[1]);
      ++tally.with_calls;
    }
    const std::optional<std::string> want_content =
        want[k]["content"].is_null() ? std::nullopt
                                     : std::optional<std::string>(want[k]["content"]);
    if (got_calls == want_calls && got.content == want_content) continue;
    if (++tally.mismatches <= 10) {
      ADD_FAILURE() << ParserName(cases[k].parser) << " answer " << k << ":\n"
                    << cases[k].text << "\nPython: " << want[k].dump() << "\nours: "
                    << got_calls.size() << " calls"
                    << (got.calls.empty() ? "" : ", first " + got.calls[0].arguments)
                    << "; content " << got.content.value_or("(null)");
    }
  }
  return tally;
}

}  // namespace tandem::frontend::testing
