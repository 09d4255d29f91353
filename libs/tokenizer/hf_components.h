// tokenizer.json's normalizers and pre-tokenizers (private).
//
// Supported (anything else is an error naming its type and where it sits):
//   normalizer:    NFC, NFD, NFKC, NFKD (ICU), Replace (String or Regex
//                  pattern), Prepend, Strip, Sequence.
//   pre_tokenizer: ByteLevel (with or without GPT-2's regex), Split (Regex or
//                  String pattern, behavior Isolated or Removed, invert
//                  false), Metaspace, Sequence.
// Semantics follow the Rust `tokenizers` crate; where tokenizers.js differs
// the class comment says so.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace tandem::tokenizer::internal {

using Json = nlohmann::json;

// Reads a member of a JSON object; `where` names the object in errors
// ("tokenizer.json: normalizer.normalizers[1]").
absl::StatusOr<std::string> JsonString(const Json& object, const char* key,
                                       const std::string& where);
// A missing or null member gives `fallback`.
absl::StatusOr<bool> JsonBool(const Json& object, const char* key, bool fallback,
                              const std::string& where);

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void Normalize(std::string* text) const = 0;
};

// nullptr for a JSON null.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& json,
                                                            const std::string& where);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits each of `pieces` further (or rewrites it). `section_index` is the
  // index of the text section between added tokens that the pieces come from
  // (Metaspace's prepend_scheme "first" prepends only in section 0).
  virtual void PreTokenize(std::vector<std::string>* pieces, int section_index) const = 0;
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                                const std::string& where);

}  // namespace tandem::tokenizer::internal
