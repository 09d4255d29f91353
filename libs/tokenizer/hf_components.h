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
#include <optional>
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

// Token ids index dense tables (id -> token), so an id must be an integer
// in [0, limit), where callers pass the number of tokens the file defines
// plus kTokenIdSlack: a file may leave gaps in its ids, but one token with id
// 622222222 must not make a table of 622 million entries (the fuzzer's OOM).
inline constexpr int64_t kTokenIdSlack = int64_t{1} << 16;
std::optional<int32_t> ValidTokenId(const Json& id, int64_t limit);

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
