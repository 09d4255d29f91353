// Helpers shared by the tokenizer tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

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
    size_t n = b < 0x80                 ? 1
               : b >= 0xC2 && b <= 0xDF ? 2
               : b >= 0xE0 && b <= 0xEF ? 3
               : b >= 0xF0 && b <= 0xF4 ? 4
                                        : 0;
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

// Pushes `ids` into `detok` and finishes it: the text, or nullopt (with a
// failure) when a push fails or a delta is not well-formed UTF-8.
inline std::optional<std::string> StreamAll(IncrementalDetokenizer& detok,
                                            const std::vector<int32_t>& ids,
                                            const std::string& what) {
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto delta = detok.Push(ids[i]);
    if (!delta.ok()) {
      ADD_FAILURE() << what << ": Push(" << ids[i] << ") failed: " << delta.status();
      return std::nullopt;
    }
    if (!IsUtf8(*delta)) {
      ADD_FAILURE() << what << ": delta " << i << " is not UTF-8: " << Quote(*delta);
      return std::nullopt;
    }
    streamed += *delta;
  }
  const std::string rest = detok.Finish();
  if (!IsUtf8(rest)) {
    ADD_FAILURE() << what << ": Finish() is not UTF-8";
    return std::nullopt;
  }
  return streamed + rest;
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
  const std::optional<std::string> streamed = StreamAll(detok, ids, what);
  if (!streamed) return false;
  if (*streamed != *whole) {
    ADD_FAILURE() << what << ": streamed " << Quote(*streamed) << " but Decode gives "
                  << Quote(*whole);
    return false;
  }
  return true;
}

// Streams `output` through an IncrementalDetokenizer primed with `prompt`
// and checks that every delta is well-formed UTF-8 and that the deltas add
// up to Decode(prompt + output) minus Decode(prompt). Cases where
// Decode(prompt) is not a prefix of Decode(prompt + output) (the output
// completes a character the prompt began, or clean-up rewrites the
// prompt's end) are counted in *skipped and not checked. Returns false
// (with a failure) otherwise.
inline bool PrimedStreamMatchesDecode(const Tokenizer& tok, const std::vector<int32_t>& prompt,
                                      const std::vector<int32_t>& output,
                                      const DecodeOptions& options, const std::string& what,
                                      int* skipped) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  const auto whole = tok.Decode(all, options);
  const auto head = tok.Decode(prompt, options);
  if (!whole.ok() || !head.ok()) {
    ADD_FAILURE() << what << ": Decode failed";
    return false;
  }
  if (whole->compare(0, head->size(), *head) != 0) {
    ++*skipped;
    return true;
  }
  const std::string expected = whole->substr(head->size());
  IncrementalDetokenizer detok(tok, options, prompt);
  const std::optional<std::string> streamed = StreamAll(detok, output, what);
  if (!streamed) return false;
  if (*streamed != expected) {
    ADD_FAILURE() << what << ": prompt " << nlohmann::json(prompt).dump() << " output "
                  << nlohmann::json(output).dump() << ": streamed " << Quote(*streamed)
                  << " but Decode(prompt + output) minus Decode(prompt) is " << Quote(expected);
    return false;
  }
  return true;
}

// Every way to split the ids of each case into a prompt and an output (at
// most `max_splits` per case, spread evenly), checked with
// PrimedStreamMatchesDecode. Returns the number of failures (reported up to
// `max_reported`); *checked counts the splits checked, *skipped those that
// could not be.
inline int CheckPrimedSplits(const Tokenizer& tok, const std::vector<std::vector<int32_t>>& cases,
                             const DecodeOptions& options, size_t max_splits, int max_reported,
                             int* checked, int* skipped) {
  int failures = 0;
  for (size_t c = 0; c < cases.size() && failures < max_reported; ++c) {
    const std::vector<int32_t>& ids = cases[c];
    if (ids.size() < 2) continue;
    const size_t step = std::max<size_t>(1, (ids.size() - 1) / max_splits);
    for (size_t k = 1; k < ids.size(); k += step) {
      const std::vector<int32_t> prompt(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k));
      const std::vector<int32_t> output(ids.begin() + static_cast<ptrdiff_t>(k), ids.end());
      ++*checked;
      if (!PrimedStreamMatchesDecode(tok, prompt, output, options,
                                     "case " + std::to_string(c) + " split " + std::to_string(k),
                                     skipped)) {
        ++failures;
        break;
      }
    }
  }
  return failures;
}

}  // namespace tandem::tokenizer::testing
