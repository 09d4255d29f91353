// Helpers shared by the tokenizer tests.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tandem/tokenizer/incremental_detokenizer.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::tokenizer::testing {

inline std::string SharedModel(const std::string& name) {
  return std::string(TANDEM_SHARED_DIR) + "/models/" + name;
}
inline std::string TestData(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/tokenizer/data/" + name;
}
// Where tests/tokenizer/npm_references.py lays out the npm tokenizer files.
inline std::string NpmModel(const std::string& name) {
  return std::string(TANDEM_BINARY_DIR) + "/tokenizer_npm/models/" + name;
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

inline std::vector<std::string> CorpusTexts() {
  return ReadJson(TestData("corpus.json"))["texts"].get<std::vector<std::string>>();
}

// `s` as a JSON string literal (ill-formed bytes shown as U+FFFD).
inline std::string Quote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Whether `s` is well-formed UTF-8 (written here, not taken from the library).
inline bool IsUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3
             : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      unsigned char lo = 0x80, hi = 0xBF;
      if (k == 1 && b == 0xE0) lo = 0xA0;
      if (k == 1 && b == 0xED) hi = 0x9F;
      if (k == 1 && b == 0xF0) lo = 0x90;
      if (k == 1 && b == 0xF4) hi = 0x8F;
      if (c < lo || c > hi) return false;
    }
    i += n;
  }
  return true;
}

// Streams `ids` through an IncrementalDetokenizer and checks the two
// properties it promises: every delta is well-formed UTF-8, and the deltas
// add up to Decode(ids). Returns false (with a failure) otherwise.
inline bool StreamMatchesDecode(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                const DecodeOptions& options, const std::string& what) {
  const auto whole = tok.Decode(ids, options);
  if (!whole.ok()) {
    ADD_FAILURE() << what << ": Decode failed: " << whole.status();
    return false;
  }
  IncrementalDetokenizer detok(tok, options);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto delta = detok.Push(ids[i]);
    if (!delta.ok()) {
      ADD_FAILURE() << what << ": Push(" << ids[i] << ") failed: " << delta.status();
      return false;
    }
    if (!IsUtf8(*delta)) {
      ADD_FAILURE() << what << ": delta " << i << " is not UTF-8: " << Quote(*delta);
      return false;
    }
    streamed += *delta;
  }
  const std::string rest = detok.Finish();
  if (!IsUtf8(rest)) {
    ADD_FAILURE() << what << ": Finish() is not UTF-8";
    return false;
  }
  streamed += rest;
  if (streamed != *whole) {
    ADD_FAILURE() << what << ": streamed " << Quote(streamed) << " but Decode gives "
                  << Quote(*whole);
    return false;
  }
  return true;
}

}  // namespace tandem::tokenizer::testing
