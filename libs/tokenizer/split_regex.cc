#include "split_regex.h"

#include <re2/re2.h>

#include "absl/strings/str_cat.h"
#include "utf8.h"

namespace tandem::tokenizer::internal {
namespace {

// Unicode White_Space, which Oniguruma's \s matches.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
constexpr std::string_view kLookaheadPair = "\\s+(?!\\S)|\\s+";

absl::Status Unsupported(std::string_view what, size_t offset, std::string_view pattern) {
  return absl::InvalidArgumentError(absl::StrCat("regex construct ", AV(what), " at offset ",
                                                 offset, " is not supported (pattern: ",
                                                 AV(pattern), ")"));
}

}  // namespace

absl::StatusOr<std::string> TranslateOnigurumaToRe2(std::string_view pattern,
                                                    bool* lookahead_group) {
  std::string out;
  bool in_class = false;
  bool after_quantifier = false;
  if (lookahead_group != nullptr) *lookahead_group = false;
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    const bool was_quantifier = after_quantifier;
    after_quantifier = false;
    if (!in_class && pattern.substr(i, kLookaheadPair.size()) == kLookaheadPair) {
      if (lookahead_group == nullptr || *lookahead_group) {
        return Unsupported("(?!\\S)", i + 3, pattern);
      }
      *lookahead_group = true;
      absl::StrAppend(&out, "([", AV(kWhiteSpace), "]+)|[", AV(kWhiteSpace), "]+");
      i += kLookaheadPair.size();
      after_quantifier = true;
      continue;
    }
    if (c == '\\') {
      if (i + 1 >= pattern.size()) return Unsupported("trailing \\", i, pattern);
      const char e = pattern[i + 1];
      if (e == 's') {
        absl::StrAppend(&out, in_class ? "" : "[", AV(kWhiteSpace), in_class ? "" : "]");
      } else if (e == 'S') {
        if (in_class) return Unsupported("\\S inside a character class", i, pattern);
        absl::StrAppend(&out, "[^", AV(kWhiteSpace), "]");
      } else if (e == 'd') {
        out += "\\p{Nd}";
      } else if (e == 'D') {
        out += "\\P{Nd}";
      } else if (e == 'w' || e == 'W' || e == 'b' || e == 'B' || e == 'h' || e == 'H' ||
                 e == 'G' || e == 'Z' || e == 'K' || e == 'R' || e == 'X') {
        return Unsupported(absl::StrCat("\\", std::string(1, e)), i, pattern);
      } else if ((e == 'p' || e == 'P' || e == 'x') && i + 2 < pattern.size() &&
                 pattern[i + 2] == '{') {
        const size_t close = pattern.find('}', i);
        if (close == std::string_view::npos) return Unsupported("unclosed \\p{", i, pattern);
        out.append(pattern.substr(i, close + 1 - i));
        i = close + 1;
        continue;
      } else {
        out.append(pattern.substr(i, 2));
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == '[') {
        if (pattern.substr(i, 2) == "[:") {
          const size_t close = pattern.find(":]", i + 2);
          if (close == std::string_view::npos) return Unsupported("[:", i, pattern);
          out.append(pattern.substr(i, close + 2 - i));
          i = close + 2;
          continue;
        }
        return Unsupported("nested character class", i, pattern);
      }
      if (c == '&' && pattern.substr(i, 2) == "&&") {
        return Unsupported("class intersection &&", i, pattern);
      }
      if (c == ']') in_class = false;
      out.push_back(c);
      ++i;
      continue;
    }
    switch (c) {
      case '[':
        in_class = true;
        out.push_back(c);
        // A ']' right after '[' or '[^' is a literal in both engines.
        if (pattern.substr(i + 1, 1) == "^") out.push_back(pattern[++i]);
        if (pattern.substr(i + 1, 1) == "]") out.push_back(pattern[++i]);
        ++i;
        continue;
      case '(':
        if (pattern.substr(i, 2) != "(?") {
          out += "(?:";  // group 1 is reserved for the lookahead rewrite
          ++i;
          continue;
        }
        if (pattern.substr(i, 3) != "(?:" && pattern.substr(i, 3) != "(?i") {
          return Unsupported(absl::StrCat(AV(pattern.substr(i, 3)), "..."), i, pattern);
        }
        break;
      case '*':
      case '+':
      case '?':
        if (was_quantifier && c == '+') return Unsupported("possessive quantifier", i, pattern);
        after_quantifier = c != '?' || !was_quantifier;
        break;
      case '{': {
        const size_t close = pattern.find('}', i);
        if (close != std::string_view::npos) {
          out.append(pattern.substr(i, close + 1 - i));
          i = close + 1;
          after_quantifier = true;
          continue;
        }
        break;
      }
      default:
        break;
    }
    out.push_back(c);
    ++i;
  }
  if (in_class) return Unsupported("unclosed [", pattern.size(), pattern);
  return out;
}

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(std::string_view pattern) {
  std::unique_ptr<SplitRegex> regex(new SplitRegex());
  absl::StatusOr<std::string> translated =
      TranslateOnigurumaToRe2(pattern, &regex->has_lookahead_group_);
  if (!translated.ok()) return translated.status();
  regex->translated_ = *std::move(translated);
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(64 << 20);
  regex->re_ = std::make_unique<RE2>(regex->translated_, options);
  if (!regex->re_->ok()) {
    return absl::InvalidArgumentError(absl::StrCat("regex ", AV(pattern), " does not compile (as ",
                                                   regex->translated_,
                                                   "): ", regex->re_->error()));
  }
  return regex;
}

SplitRegex::~SplitRegex() = default;

void SplitRegex::FindAll(std::string_view text,
                         std::vector<std::pair<size_t, size_t>>* matches) const {
  const re2::StringPiece input(text.data(), text.size());
  re2::StringPiece groups[2];
  const int num_groups = has_lookahead_group_ ? 2 : 1;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!re_->Match(input, pos, text.size(), RE2::UNANCHORED, groups, num_groups)) break;
    size_t begin = groups[0].data() - text.data();
    size_t end = begin + groups[0].size();
    if (end == begin) {  // an empty match: step over one character
      pos = end + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (has_lookahead_group_ && groups[1].data() != nullptr && end < text.size()) {
      // `\s+(?!\S)`: give the last whitespace character back.
      size_t last = end - 1;
      while (last > begin && (static_cast<uint8_t>(text[last]) & 0xC0) == 0x80) --last;
      if (last > begin) end = last;
    }
    matches->emplace_back(begin, end);
    pos = end;
  }
}

}  // namespace tandem::tokenizer::internal
