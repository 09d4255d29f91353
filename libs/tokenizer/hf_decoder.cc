#include "hf_decoder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "byte_level.h"
#include "utf8.h"

namespace tandem::tokenizer::internal {
namespace {

// Emits the parts of one logical token, marking the first one.
class PartWriter {
 public:
  void Begin() { started_ = false; }
  void Emit(std::string text, bool last, std::vector<DecoderPart>* out, bool added = false) {
    if (text.empty() && !last) return;
    out->push_back(DecoderPart{std::move(text), added, !started_, last});
    started_ = !last;
  }

 private:
  bool started_ = false;
};

// Replace with a String pattern, per logical token. Within a token split in
// parts, the longest tail that could begin a match waits for the next part.
class ReplaceStage final : public DecoderStage {
 public:
  ReplaceStage(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}

  void Push(DecoderPart part, std::vector<DecoderPart>* out) override {
    if (part.first) writer_.Begin();
    std::string text = std::move(carry_);
    carry_.clear();
    text += part.text;
    if (!part.last) {
      for (size_t k = std::min(text.size(), pattern_.size() - 1); k > 0; --k) {
        if (std::string_view(text).substr(text.size() - k) ==
            std::string_view(pattern_).substr(0, k)) {
          carry_ = text.substr(text.size() - k);
          text.resize(text.size() - k);
          break;
        }
      }
    }
    writer_.Emit(absl::StrReplaceAll(text, {{pattern_, content_}}), part.last, out, part.added);
  }
  void Finish(std::vector<DecoderPart>* out) override {
    if (!carry_.empty()) writer_.Emit(std::exchange(carry_, ""), true, out);
  }

 private:
  std::string pattern_, content_;
  std::string carry_;
  PartWriter writer_;
};

// The text of each run of tokens that a stage turns into bytes, as one
// logical token.
class ByteRun {
 public:
  void Bytes(std::string_view bytes, std::vector<DecoderPart>* out) {
    if (!open_) {
      open_ = true;
      writer_.Begin();
    }
    std::string text;
    repair_.Push(bytes, &text);
    writer_.Emit(std::move(text), /*last=*/false, out);
  }
  void Close(std::vector<DecoderPart>* out) {
    if (!open_) return;
    open_ = false;
    std::string text;
    repair_.Finish(&text);
    writer_.Emit(std::move(text), /*last=*/true, out);
  }

 private:
  bool open_ = false;
  Utf8Repairer repair_{Utf8Repairer::Policy::kMaximalSubpart};
  PartWriter writer_;
};

// "<0xE6>" -> 0xE6, for whole tokens of exactly that shape.
std::optional<uint8_t> ByteToken(const DecoderPart& part) {
  const std::string& t = part.text;
  if (!part.first || !part.last || t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') {
    return std::nullopt;
  }
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const int d = HexDigitValue(t[i]);
    if (d < 0) return std::nullopt;
    value = value * 16 + d;
  }
  return static_cast<uint8_t>(value);
}

class ByteFallbackStage final : public DecoderStage {
 public:
  void Push(DecoderPart part, std::vector<DecoderPart>* out) override {
    if (const std::optional<uint8_t> byte = ByteToken(part)) {
      const char c = static_cast<char>(*byte);
      run_.Bytes(std::string_view(&c, 1), out);
      return;
    }
    run_.Close(out);
    out->push_back(std::move(part));
  }
  void Finish(std::vector<DecoderPart>* out) override { run_.Close(out); }

 private:
  ByteRun run_;
};

class ByteLevelStage final : public DecoderStage {
 public:
  void Push(DecoderPart part, std::vector<DecoderPart>* out) override {
    if (part.added) {
      run_.Close(out);
      out->push_back(std::move(part));
      return;
    }
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
    std::string bytes;
    std::string_view text = part.text;
    bool all_mapped = true;
    for (size_t i = 0; i < text.size();) {
      const std::optional<DecodedChar> c = DecodeChar(text.substr(i));
      const std::optional<uint8_t> b = c ? alphabet.ByteOf(c->cp) : std::nullopt;
      if (!b) {
        all_mapped = false;
        break;
      }
      bytes.push_back(static_cast<char>(*b));
      i += c->len;
    }
    // A token with a character outside the alphabet passes as its own bytes
    // (Rust's rule).
    run_.Bytes(all_mapped ? std::string_view(bytes) : text, out);
  }
  void Finish(std::vector<DecoderPart>* out) override { run_.Close(out); }

 private:
  ByteRun run_;
};

class FuseStage final : public DecoderStage {
 public:
  void Push(DecoderPart part, std::vector<DecoderPart>* out) override {
    writer_.Emit(std::move(part.text), /*last=*/false, out);
  }
  void Finish(std::vector<DecoderPart>* out) override { writer_.Emit("", /*last=*/true, out); }

 private:
  PartWriter writer_;
};

// Strips up to `start` leading and `stop` trailing `content` characters of
// each logical token. Trailing ones wait until the token ends.
class StripStage final : public DecoderStage {
 public:
  StripStage(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}

  void Push(DecoderPart part, std::vector<DecoderPart>* out) override {
    if (part.first) {
      writer_.Begin();
      lead_left_ = start_;
      trailing_.clear();
      trailing_count_ = 0;
    }
    std::string_view text = part.text;
    while (lead_left_ > 0 && !text.empty()) {
      if (text.substr(0, content_.size()) != content_) {
        lead_left_ = 0;
        break;
      }
      text.remove_prefix(content_.size());
      --lead_left_;
    }
    std::string emit;
    if (stop_ == 0) {
      emit.assign(text);
    } else {
      // Everything before the trailing run of content characters is final.
      size_t end = text.size();
      int run = 0;
      while (end >= content_.size() &&
             text.substr(end - content_.size(), content_.size()) == content_) {
        end -= content_.size();
        ++run;
      }
      if (end > 0) {
        emit = std::move(trailing_);
        emit.append(text.substr(0, end));
        trailing_.clear();
        trailing_count_ = 0;
      }
      trailing_.append(text.substr(end));
      trailing_count_ += run;
      if (part.last) {
        const int drop = std::min(stop_, trailing_count_);
        emit.append(trailing_, 0, trailing_.size() - drop * content_.size());
        trailing_.clear();
        trailing_count_ = 0;
      }
    }
    writer_.Emit(std::move(emit), part.last, out, part.added);
  }
  void Finish(std::vector<DecoderPart>*) override {}

 private:
  std::string content_;
  int start_, stop_;
  int lead_left_ = 0;
  std::string trailing_;
  int trailing_count_ = 0;
  PartWriter writer_;
};

// Replaces the replacement character by a space in every token and drops the
// first token's leading space.
class MetaspaceStage final : public DecoderStage {
 public:
  MetaspaceStage(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}

  void Push(DecoderPart part, std::vector<DecoderPart>* out) override {
    if (part.first) {
      writer_.Begin();
      ++token_index_;
      seen_text_ = false;
    }
    std::string text = absl::StrReplaceAll(part.text, {{replacement_, " "}});
    if (strip_first_ && token_index_ == 0 && !seen_text_ && !text.empty() && text[0] == ' ') {
      text.erase(0, 1);
    }
    seen_text_ = seen_text_ || !part.text.empty();
    writer_.Emit(std::move(text), part.last, out, part.added);
  }
  void Finish(std::vector<DecoderPart>*) override {}

 private:
  std::string replacement_;
  bool strip_first_;
  int token_index_ = -1;
  bool seen_text_ = false;
  PartWriter writer_;
};

class JoinWithSpaceStage final : public DecoderStage {
 public:
  void Push(DecoderPart part, std::vector<DecoderPart>* out) override {
    if (part.first && any_) part.text.insert(0, " ");
    any_ = true;
    out->push_back(std::move(part));
  }
  void Finish(std::vector<DecoderPart>*) override {}

 private:
  bool any_ = false;
};

template <typename Stage, typename... Args>
class SimpleSpec final : public DecoderSpec {
 public:
  explicit SimpleSpec(Args... args) : args_(std::move(args)...) {}
  void AppendStages(std::vector<std::unique_ptr<DecoderStage>>* stages) const override {
    stages->push_back(std::apply(
        [](const auto&... a) { return std::make_unique<Stage>(a...); }, args_));
  }

 private:
  std::tuple<Args...> args_;
};

class SequenceSpec final : public DecoderSpec {
 public:
  explicit SequenceSpec(std::vector<std::unique_ptr<DecoderSpec>> parts)
      : parts_(std::move(parts)) {}
  void AppendStages(std::vector<std::unique_ptr<DecoderStage>>* stages) const override {
    for (const auto& part : parts_) part->AppendStages(stages);
  }

 private:
  std::vector<std::unique_ptr<DecoderSpec>> parts_;
};

absl::StatusOr<int> JsonInt(const Json& json, const char* key, const std::string& where) {
  const auto it = json.find(key);
  if (it == json.end() || !it->is_number_integer() || it->get<int64_t>() < 0 ||
      it->get<int64_t>() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' is not a small count"));
  }
  return it->get<int>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecoderSpec>> ParseDecoder(const Json& json,
                                                          const std::string& where) {
  if (json.is_null()) return std::make_unique<SimpleSpec<JoinWithSpaceStage>>();
  absl::StatusOr<std::string> type = JsonString(json, "type", where);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return std::make_unique<SimpleSpec<ByteLevelStage>>();
  if (*type == "ByteFallback") return std::make_unique<SimpleSpec<ByteFallbackStage>>();
  if (*type == "Fuse") return std::make_unique<SimpleSpec<FuseStage>>();
  if (*type == "Replace") {
    const auto pattern = json.find("pattern");
    if (pattern == json.end() || !pattern->is_object() || !pattern->contains("String")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": Replace decoder needs a String pattern"));
    }
    absl::StatusOr<std::string> from = JsonString(*pattern, "String", where);
    absl::StatusOr<std::string> to = JsonString(json, "content", where);
    if (!from.ok()) return from.status();
    if (!to.ok()) return to.status();
    if (from->empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty pattern"));
    return std::make_unique<SimpleSpec<ReplaceStage, std::string, std::string>>(*from, *to);
  }
  if (*type == "Strip") {
    absl::StatusOr<std::string> content = JsonString(json, "content", where);
    absl::StatusOr<int> start = JsonInt(json, "start", where);
    absl::StatusOr<int> stop = JsonInt(json, "stop", where);
    if (!content.ok()) return content.status();
    if (!start.ok()) return start.status();
    if (!stop.ok()) return stop.status();
    if (!DecodeChar(*content) || DecodeChar(*content)->len != content->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": Strip content must be one character"));
    }
    return std::make_unique<SimpleSpec<StripStage, std::string, int, int>>(*content, *start, *stop);
  }
  if (*type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";
    if (json.contains("replacement")) {
      absl::StatusOr<std::string> r = JsonString(json, "replacement", where);
      if (!r.ok()) return r.status();
      replacement = *r;
    }
    bool strip_first = true;
    if (json.contains("prepend_scheme")) {
      absl::StatusOr<std::string> scheme = JsonString(json, "prepend_scheme", where);
      if (!scheme.ok()) return scheme.status();
      if (*scheme != "always" && *scheme != "first" && *scheme != "never") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": prepend_scheme '", *scheme, "' is not supported"));
      }
      strip_first = *scheme != "never";
    } else {
      absl::StatusOr<bool> add_prefix_space = JsonBool(json, "add_prefix_space", true, where);
      if (!add_prefix_space.ok()) return add_prefix_space.status();
      strip_first = *add_prefix_space;
    }
    return std::make_unique<SimpleSpec<MetaspaceStage, std::string, bool>>(replacement,
                                                                          strip_first);
  }
  if (*type == "Sequence") {
    const auto it = json.find("decoders");
    if (it == json.end() || !it->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": has no array 'decoders'"));
    }
    std::vector<std::unique_ptr<DecoderSpec>> parts;
    for (size_t i = 0; i < it->size(); ++i) {
      auto part = ParseDecoder((*it)[i], absl::StrCat(where, ".decoders[", i, "]"));
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
    }
    return std::make_unique<SequenceSpec>(std::move(parts));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": decoder type '", *type, "' is not supported"));
}

void DecoderPipeline::Run(size_t stage, std::vector<DecoderPart>& parts, std::string* out) {
  if (stage == stages_.size()) {
    for (const DecoderPart& part : parts) out->append(part.text);
    return;
  }
  std::vector<DecoderPart> next;
  for (DecoderPart& part : parts) stages_[stage]->Push(std::move(part), &next);
  Run(stage + 1, next, out);
}

void DecoderPipeline::Push(DecoderPart part, std::string* out) {
  std::vector<DecoderPart> parts;
  parts.push_back(std::move(part));
  Run(0, parts, out);
}

void DecoderPipeline::Finish(std::string* out) {
  for (size_t stage = 0; stage < stages_.size(); ++stage) {
    std::vector<DecoderPart> parts;
    stages_[stage]->Finish(&parts);
    Run(stage + 1, parts, out);
  }
}

std::string CleanUpTokenization(std::string text) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    if (text.find(from) != std::string::npos) text = absl::StrReplaceAll(text, {{AV(from), AV(to)}});
  }
  return text;
}

void CleanUpStream::Push(std::string_view text, std::string* out) {
  pending_.append(text);
  // The last cut point with three non-space bytes before it, at a character
  // boundary (the bytes before a boundary that are not spaces can be any).
  size_t cut = pending_.size();
  while (cut > 0) {
    const bool boundary =
        cut == pending_.size() || (static_cast<uint8_t>(pending_[cut]) & 0xC0) != 0x80;
    if (boundary && cut >= 3 && pending_[cut - 1] != ' ' && pending_[cut - 2] != ' ' &&
        pending_[cut - 3] != ' ') {
      break;
    }
    --cut;
  }
  if (cut == 0) return;
  out->append(CleanUpTokenization(pending_.substr(0, cut)));
  pending_.erase(0, cut);
}

void CleanUpStream::Finish(std::string* out) {
  out->append(CleanUpTokenization(std::move(pending_)));
  pending_.clear();
}

}  // namespace tandem::tokenizer::internal
