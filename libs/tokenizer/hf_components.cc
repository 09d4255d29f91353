#include "hf_components.h"

#include <re2/re2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "byte_level.h"
#include "split_regex.h"
#include "tandem/common/status.h"
#include "utf8.h"

namespace tandem::tokenizer::internal {
namespace {

constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

absl::Status Unsupported(const std::string& kind, const std::string& type, const std::string& where) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": ", kind, " type '", type, "' is not supported"));
}

// Unicode White_Space (Rust's char::is_whitespace).
bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// A JSON `pattern` object: {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  bool is_regex = false;
  std::string text;
};
absl::StatusOr<Pattern> ParsePattern(const Json& json, const std::string& where) {
  const auto it = json.find("pattern");
  if (it == json.end() || !it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": has no pattern object"));
  }
  if (it->contains("String")) {
    absl::StatusOr<std::string> s = JsonString(*it, "String", absl::StrCat(where, ".pattern"));
    if (!s.ok()) return s.status();
    return Pattern{false, *s};
  }
  absl::StatusOr<std::string> s = JsonString(*it, "Regex", absl::StrCat(where, ".pattern"));
  if (!s.ok()) return s.status();
  return Pattern{true, *s};
}

// ---- normalizers ----

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* n) : n_(n) {}
  void Normalize(std::string* text) const override {
    UErrorCode status = U_ZERO_ERROR;
    if (n_->isNormalizedUTF8(*text, status) || U_FAILURE(status)) return;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text->size()));
    status = U_ZERO_ERROR;
    n_->normalizeUTF8(0, *text, sink, nullptr, status);
    if (U_SUCCESS(status)) *text = std::move(out);
  }

 private:
  const icu::Normalizer2* n_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    if (pattern_.empty()) return;
    *text = absl::StrReplaceAll(*text, {{pattern_, content_}});
  }

 private:
  std::string pattern_;
  std::string content_;
};

class RegexReplaceNormalizer final : public Normalizer {
 public:
  RegexReplaceNormalizer(std::unique_ptr<RE2> re, std::string content)
      : re_(std::move(re)), rewrite_(absl::StrReplaceAll(content, {{"\\", "\\\\"}})) {}
  void Normalize(std::string* text) const override { RE2::GlobalReplace(text, *re_, rewrite_); }

 private:
  std::unique_ptr<RE2> re_;
  std::string rewrite_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  // Rust prepends only to a non-empty text; tokenizers.js never sees an empty
  // section (it skips them before normalizing).
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    while (left_ && begin < end) {
      const auto c = DecodeChar(std::string_view(*text).substr(begin));
      if (!c || !IsWhiteSpace(c->cp)) break;
      begin += c->len;
    }
    while (right_ && end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>((*text)[start]) & 0xC0) == 0x80) --start;
      const auto c = DecodeChar(std::string_view(*text).substr(start, end - start));
      if (!c || !IsWhiteSpace(c->cp)) break;
      end = start;
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void Normalize(std::string* text) const override {
    for (const auto& part : parts_) part->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---- pre-tokenizers ----

void AppendByteLevel(std::string_view piece, std::string* out) {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (const char c : piece) out->append(alphabet.CharOf(static_cast<uint8_t>(c)));
}

// tokenizers' SplitDelimiterBehavior: what becomes of the matches.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

std::optional<SplitBehavior> SplitBehaviorNamed(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return std::nullopt;
}

// Splits by a regex as tokenizers' NormalizedString::split: the piece is
// cut into the matches and the text between them, the delimiters being the
// matches (or, with `invert`, the text between them), which `behavior`
// keeps, drops or merges; empty pieces are dropped, as
// PreTokenizedString::split drops them.
class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<SplitRegex> regex, SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

  void PreTokenize(std::vector<std::string>* pieces, int) const override {
    std::vector<std::string> out;
    std::vector<std::pair<size_t, size_t>> matches;
    struct Span {
      size_t begin, end;
      bool match;
    };
    std::vector<Span> spans, kept;
    for (const std::string& piece : *pieces) {
      matches.clear();
      regex_->FindAll(piece, &matches);
      spans.clear();
      size_t prev = 0;
      for (const auto& [begin, end] : matches) {
        if (begin != prev) spans.push_back({prev, begin, invert_});
        spans.push_back({begin, end, !invert_});
        prev = end;
      }
      if (prev != piece.size()) spans.push_back({prev, piece.size(), invert_});
      auto emit = [&](const std::vector<Span>& cut) {
        for (const Span& s : cut) {
          if (s.end > s.begin) out.emplace_back(piece.substr(s.begin, s.end - s.begin));
        }
      };
      // Isolated (Llama 3's, Qwen's, DeepSeek's) and Removed keep the spans
      // as they are: no second pass on the encode path.
      if (behavior_ == SplitBehavior::kIsolated || behavior_ == SplitBehavior::kRemoved) {
        if (behavior_ == SplitBehavior::kRemoved) {
          std::erase_if(spans, [](const Span& s) { return s.match; });
        }
        emit(spans);
        continue;
      }
      kept.clear();
      bool previous_match = false;
      if (behavior_ == SplitBehavior::kMergedWithNext) std::reverse(spans.begin(), spans.end());
      for (const Span& s : spans) {
        switch (behavior_) {
          case SplitBehavior::kRemoved:
          case SplitBehavior::kIsolated:
            break;  // above
          case SplitBehavior::kContiguous:
            if (s.match == previous_match && !kept.empty()) {
              kept.back().end = s.end;
            } else {
              kept.push_back(s);
            }
            break;
          case SplitBehavior::kMergedWithPrevious:
            if (s.match && !previous_match && !kept.empty()) {
              kept.back().end = s.end;
            } else {
              kept.push_back(s);
            }
            break;
          case SplitBehavior::kMergedWithNext:  // walked from the end
            if (s.match && !previous_match && !kept.empty()) {
              kept.back().begin = s.begin;
            } else {
              kept.push_back(s);
            }
            break;
        }
        previous_match = s.match;
      }
      if (behavior_ == SplitBehavior::kMergedWithNext) std::reverse(kept.begin(), kept.end());
      emit(kept);
    }
    *pieces = std::move(out);
  }

 private:
  std::unique_ptr<SplitRegex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's byte-level pre-tokenizer: optionally a leading space, optionally
// GPT-2's regex, then every byte written in the byte-level alphabet.
// tokenizers.js runs GPT-2's regex with JavaScript's \s (which adds U+FEFF and
// lacks U+0085); we use Oniguruma's, as the Rust crate does.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<SplitRegex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  void PreTokenize(std::vector<std::string>* pieces, int) const override {
    std::vector<std::string> out;
    std::vector<std::pair<size_t, size_t>> matches;
    std::string spaced;
    for (const std::string& piece : *pieces) {
      std::string_view text = piece;
      if (add_prefix_space_ && (text.empty() || text[0] != ' ')) {
        spaced = " ";
        spaced += text;
        text = spaced;
      }
      if (regex_ == nullptr) {
        AppendByteLevel(text, &out.emplace_back());
        continue;
      }
      matches.clear();
      regex_->FindAll(text, &matches);
      // GPT-2's pattern matches every character, so there are no gaps.
      for (const auto& [begin, end] : matches) {
        AppendByteLevel(text.substr(begin, end - begin), &out.emplace_back());
      }
    }
    *pieces = std::move(out);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitRegex> regex_;
};

// SentencePiece-style spaces: ' ' becomes the replacement ("▁"), which is also
// prepended ("always", or "first": only in the first section), and with
// `split` each piece is cut before every replacement character. tokenizers.js
// ignores `split` (it never cuts); the Rust crate cuts, and so do we.
class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}

  void PreTokenize(std::vector<std::string>* pieces, int section_index) const override {
    std::vector<std::string> out;
    for (std::string& piece : *pieces) {
      std::string text = absl::StrReplaceAll(piece, {{" ", replacement_}});
      const bool prepend =
          prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && section_index == 0);
      if (prepend && text.rfind(replacement_, 0) != 0) text.insert(0, replacement_);
      if (!split_) {
        out.push_back(std::move(text));
        continue;
      }
      size_t start = 0;
      for (size_t pos = text.find(replacement_, 1); pos != std::string::npos;
           pos = text.find(replacement_, pos + 1)) {
        if (pos > start) out.push_back(text.substr(start, pos - start));
        start = pos;
      }
      if (start < text.size()) out.push_back(text.substr(start));
    }
    *pieces = std::move(out);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<std::string>* pieces, int section_index) const override {
    for (const auto& part : parts_) part->PreTokenize(pieces, section_index);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

template <typename T, typename Parse>
absl::StatusOr<std::vector<std::unique_ptr<T>>> ParseList(const Json& json, const char* key,
                                                          const std::string& where,
                                                          const Parse& parse) {
  const auto it = json.find(key);
  if (it == json.end() || !it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": has no array '", key, "'"));
  }
  std::vector<std::unique_ptr<T>> parts;
  for (size_t i = 0; i < it->size(); ++i) {
    absl::StatusOr<std::unique_ptr<T>> part =
        parse((*it)[i], absl::StrCat(where, ".", key, "[", i, "]"));
    if (!part.ok()) return part.status();
    if (*part != nullptr) parts.push_back(*std::move(part));
  }
  return parts;
}

}  // namespace

absl::StatusOr<std::string> JsonString(const Json& object, const char* key,
                                       const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' is not a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<bool> JsonBool(const Json& object, const char* key, bool fallback,
                              const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' is not a boolean"));
  }
  return it->get<bool>();
}

std::optional<int32_t> ValidTokenId(const Json& id, int64_t limit) {
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= limit ||
      id.get<int64_t>() > INT32_MAX) {
    return std::nullopt;
  }
  return id.get<int32_t>();
}

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& json,
                                                            const std::string& where) {
  if (json.is_null()) return nullptr;
  absl::StatusOr<std::string> type = JsonString(json, "type", where);
  if (!type.ok()) return type.status();
  UErrorCode icu_status = U_ZERO_ERROR;
  if (*type == "NFC") {
    return std::make_unique<UnicodeNormalizer>(icu::Normalizer2::getNFCInstance(icu_status));
  }
  if (*type == "NFD") {
    return std::make_unique<UnicodeNormalizer>(icu::Normalizer2::getNFDInstance(icu_status));
  }
  if (*type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(icu::Normalizer2::getNFKCInstance(icu_status));
  }
  if (*type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(icu::Normalizer2::getNFKDInstance(icu_status));
  }
  if (*type == "Replace") {
    absl::StatusOr<Pattern> pattern = ParsePattern(json, where);
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<std::string> content = JsonString(json, "content", where);
    if (!content.ok()) return content.status();
    if (!pattern->is_regex) {
      return std::make_unique<ReplaceNormalizer>(pattern->text, *content);
    }
    absl::StatusOr<std::string> translated = TranslateOnigurumaToRe2(pattern->text, nullptr);
    if (!translated.ok()) return Annotate(translated.status(), where);
    RE2::Options options;
    options.set_log_errors(false);
    auto re = std::make_unique<RE2>(*translated, options);
    if (!re->ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": regex ", pattern->text,
                                                     " does not compile: ", re->error()));
    }
    return std::make_unique<RegexReplaceNormalizer>(std::move(re), *content);
  }
  if (*type == "Prepend") {
    absl::StatusOr<std::string> prepend = JsonString(json, "prepend", where);
    if (!prepend.ok()) return prepend.status();
    return std::make_unique<PrependNormalizer>(*prepend);
  }
  if (*type == "Strip") {
    absl::StatusOr<bool> left = JsonBool(json, "strip_left", false, where);
    absl::StatusOr<bool> right = JsonBool(json, "strip_right", false, where);
    if (!left.ok()) return left.status();
    if (!right.ok()) return right.status();
    return std::make_unique<StripNormalizer>(*left, *right);
  }
  if (*type == "Sequence") {
    auto parts = ParseList<Normalizer>(json, "normalizers", where, ParseNormalizer);
    if (!parts.ok()) return parts.status();
    return std::make_unique<SequenceNormalizer>(*std::move(parts));
  }
  return Unsupported("normalizer", *type, where);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                                const std::string& where) {
  if (json.is_null()) return nullptr;
  absl::StatusOr<std::string> type = JsonString(json, "type", where);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") {
    absl::StatusOr<bool> add_prefix_space = JsonBool(json, "add_prefix_space", true, where);
    absl::StatusOr<bool> use_regex = JsonBool(json, "use_regex", true, where);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    if (!use_regex.ok()) return use_regex.status();
    std::unique_ptr<SplitRegex> regex;
    if (*use_regex) {
      absl::StatusOr<std::unique_ptr<SplitRegex>> compiled = SplitRegex::Compile(kGpt2Pattern);
      if (!compiled.ok()) return compiled.status();
      regex = *std::move(compiled);
    }
    return std::make_unique<ByteLevelPreTokenizer>(*add_prefix_space, std::move(regex));
  }
  if (*type == "Split") {
    absl::StatusOr<Pattern> pattern = ParsePattern(json, where);
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<std::string> behavior = JsonString(json, "behavior", where);
    if (!behavior.ok()) return behavior.status();
    absl::StatusOr<bool> invert = JsonBool(json, "invert", false, where);
    if (!invert.ok()) return invert.status();
    const std::optional<SplitBehavior> split_behavior = SplitBehaviorNamed(*behavior);
    if (!split_behavior) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": Split behavior '", *behavior, "' is not supported"));
    }
    std::string regex_text = pattern->text;
    if (!pattern->is_regex) regex_text = RE2::QuoteMeta(pattern->text);
    absl::StatusOr<std::unique_ptr<SplitRegex>> regex = SplitRegex::Compile(regex_text);
    if (!regex.ok()) return Annotate(regex.status(), where);
    return std::make_unique<SplitPreTokenizer>(*std::move(regex), *split_behavior, *invert);
  }
  if (*type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";
    if (json.contains("replacement")) {
      absl::StatusOr<std::string> r = JsonString(json, "replacement", where);
      if (!r.ok()) return r.status();
      replacement = *r;
    }
    auto prepend = MetaspacePreTokenizer::Prepend::kAlways;
    if (json.contains("prepend_scheme")) {
      absl::StatusOr<std::string> scheme = JsonString(json, "prepend_scheme", where);
      if (!scheme.ok()) return scheme.status();
      if (*scheme == "first") {
        prepend = MetaspacePreTokenizer::Prepend::kFirst;
      } else if (*scheme == "never") {
        prepend = MetaspacePreTokenizer::Prepend::kNever;
      } else if (*scheme != "always") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": prepend_scheme '", *scheme, "' is not supported"));
      }
    } else {
      absl::StatusOr<bool> add_prefix_space = JsonBool(json, "add_prefix_space", true, where);
      if (!add_prefix_space.ok()) return add_prefix_space.status();
      if (!*add_prefix_space) prepend = MetaspacePreTokenizer::Prepend::kNever;
    }
    absl::StatusOr<bool> split = JsonBool(json, "split", true, where);
    if (!split.ok()) return split.status();
    return std::make_unique<MetaspacePreTokenizer>(replacement, prepend, *split);
  }
  if (*type == "Sequence") {
    auto parts = ParseList<PreTokenizer>(json, "pretokenizers", where, ParsePreTokenizer);
    if (!parts.ok()) return parts.status();
    return std::make_unique<SequencePreTokenizer>(*std::move(parts));
  }
  return Unsupported("pre_tokenizer", *type, where);
}

}  // namespace tandem::tokenizer::internal
