#include "hf_tokenizer.h"

#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "hf_bpe.h"
#include "hf_components.h"
#include "hf_decoder.h"
#include "tandem/common/status.h"
#include "utf8.h"

namespace tandem::tokenizer::internal {
namespace {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// Finds added tokens in text: at each position the longest one, scanning left
// to right (tokenizers.js's DictionarySplitter, Rust's leftmost-longest
// Aho-Corasick).
class AddedTokenMatcher {
 public:
  void Add(std::string_view content, int index) {
    if (content.empty()) return;
    int node = 0;
    for (const char c : content) {
      const auto key = static_cast<uint8_t>(c);
      auto it = nodes_[node].next.find(key);
      if (it == nodes_[node].next.end()) {
        it = nodes_[node].next.emplace(key, static_cast<int>(nodes_.size())).first;
        nodes_.emplace_back();
      }
      node = it->second;
    }
    nodes_[node].token = index;
    first_byte_[static_cast<uint8_t>(content[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }

  // Calls on_text(text) and on_token(index) in order.
  template <typename OnText, typename OnToken>
  void Split(std::string_view text, const OnText& on_text, const OnToken& on_token) const {
    size_t start = 0, i = 0;
    while (i < text.size()) {
      if (!first_byte_[static_cast<uint8_t>(text[i])]) {
        ++i;
        continue;
      }
      int node = 0, found = -1;
      size_t found_len = 0;
      for (size_t j = i; j < text.size(); ++j) {
        const auto it = nodes_[node].next.find(static_cast<uint8_t>(text[j]));
        if (it == nodes_[node].next.end()) break;
        node = it->second;
        if (nodes_[node].token >= 0) {
          found = nodes_[node].token;
          found_len = j + 1 - i;
        }
      }
      if (found < 0) {
        ++i;
        continue;
      }
      if (i > start) on_text(text.substr(start, i - start));
      on_token(found);
      i += found_len;
      start = i;
    }
    if (start < text.size()) on_text(text.substr(start));
  }

 private:
  struct Node {
    absl::flat_hash_map<uint8_t, int> next;
    int token = -1;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
  bool first_byte_[256] = {};
  bool empty_ = true;
};

// One part of a text cut at added tokens: text, or an added token.
struct Section {
  std::string text;
  int added = -1;  // index into added_tokens_, or -1
};

bool IsWhiteSpaceCp(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

void TrimEnd(std::string* s) {
  size_t end = s->size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<uint8_t>((*s)[start]) & 0xC0) == 0x80) --start;
    const auto c = DecodeChar(std::string_view(*s).substr(start, end - start));
    if (!c || !IsWhiteSpaceCp(c->cp)) break;
    end = start;
  }
  s->resize(end);
}

void TrimStart(std::string* s) {
  size_t begin = 0;
  while (begin < s->size()) {
    const auto c = DecodeChar(std::string_view(*s).substr(begin));
    if (!c || !IsWhiteSpaceCp(c->cp)) break;
    begin += c->len;
  }
  s->erase(0, begin);
}

class HfTokenizer final : public Tokenizer {
 public:
  TokenizerKind kind() const override { return TokenizerKind::kHuggingFace; }
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view input,
                                              const EncodeOptions& options) const override {
    const std::string_view text = input;
    if (const std::optional<size_t> bad = FindInvalidUtf8(text)) {
      return absl::InvalidArgumentError(
          absl::StrCat("text is not valid UTF-8 (byte offset ", *bad, ")"));
    }
    std::vector<int32_t> ids;
    if (options.add_special_tokens) ids = post_prefix_;
    const AddedTokenMatcher& raw =
        options.parse_special_tokens ? raw_matcher_ : raw_matcher_no_special_;
    std::vector<Section> sections = CutAtAddedTokens(text, raw);
    std::vector<std::string> pieces;
    for (size_t index = 0; index < sections.size(); ++index) {
      Section& section = sections[index];
      if (section.added >= 0) {
        ids.push_back(added_tokens_[section.added].id);
        continue;
      }
      if (section.text.empty()) continue;
      if (normalizer_ != nullptr) normalizer_->Normalize(&section.text);
      if (section.text.empty()) continue;
      const AddedTokenMatcher& normalized =
          options.parse_special_tokens ? normalized_matcher_ : normalized_matcher_no_special_;
      const std::vector<Section> parts = normalized.empty()
                                             ? std::vector<Section>{std::move(section)}
                                             : CutAtAddedTokens(section.text, normalized);
      for (const Section& part : parts) {
        if (part.added >= 0) {
          ids.push_back(added_tokens_[part.added].id);
          continue;
        }
        if (part.text.empty()) continue;
        pieces.clear();
        pieces.push_back(part.text);
        if (pre_tokenizer_ != nullptr) {
          pre_tokenizer_->PreTokenize(&pieces, static_cast<int>(index));
        }
        for (const std::string& piece : pieces) model_->Tokenize(piece, &ids);
      }
    }
    if (options.add_special_tokens) ids.insert(ids.end(), post_suffix_.begin(), post_suffix_.end());
    return ids;
  }

  absl::StatusOr<std::string> IdToPiece(int32_t id) const override {
    if (absl::Status s = CheckId(id); !s.ok()) return s;
    return tokens_[id];
  }
  std::optional<int32_t> PieceToId(std::string_view input) const override {
    const std::string_view piece = input;
    if (const auto it = added_by_content_.find(AV(piece)); it != added_by_content_.end()) {
      return added_tokens_[it->second].id;
    }
    return model_->TokenToId(piece);
  }
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() && is_special_[id];
  }

  std::unique_ptr<DecodeStream> NewDecodeStream(const DecodeOptions& options) const override;

  absl::Status CheckId(int32_t id) const {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")"));
    }
    if (!has_token_[id]) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " has no vocabulary entry"));
    }
    return absl::OkStatus();
  }

  absl::Status Init(const std::string& name, const Json& json, const TokenizerConfig* config);

 private:
  friend class HfDecodeStream;

  std::vector<Section> CutAtAddedTokens(std::string_view text,
                                        const AddedTokenMatcher& matcher) const {
    std::vector<Section> sections;
    matcher.Split(
        text, [&](std::string_view t) { sections.push_back(Section{std::string(t), -1}); },
        [&](int index) { sections.push_back(Section{"", index}); });
    // tokenizers.js trims the neighbours of lstrip/rstrip tokens.
    for (size_t i = 0; i < sections.size(); ++i) {
      if (sections[i].added < 0) continue;
      const AddedToken& token = added_tokens_[sections[i].added];
      if (token.lstrip && i > 0 && sections[i - 1].added < 0) TrimEnd(&sections[i - 1].text);
      if (token.rstrip && i + 1 < sections.size() && sections[i + 1].added < 0) {
        TrimStart(&sections[i + 1].text);
      }
    }
    return sections;
  }

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<DecoderSpec> decoder_;
  std::vector<AddedToken> added_tokens_;
  absl::flat_hash_map<std::string, int> added_by_content_;
  AddedTokenMatcher raw_matcher_, raw_matcher_no_special_;
  AddedTokenMatcher normalized_matcher_, normalized_matcher_no_special_;
  std::vector<int32_t> post_prefix_, post_suffix_;
  // Indexed by id.
  std::vector<std::string> tokens_;
  std::vector<bool> has_token_;
  std::vector<bool> is_added_content_;
  std::vector<bool> is_special_;
  bool clean_up_ = false;
};

class HfDecodeStream final : public DecodeStream {
 public:
  HfDecodeStream(const HfTokenizer& tok, const DecodeOptions& options)
      : tok_(tok),
        skip_special_(options.skip_special_tokens),
        clean_up_(options.clean_up_tokenization_spaces.value_or(tok.clean_up_)),
        pipeline_(*tok.decoder_) {}

  absl::Status Push(int32_t id, std::string* out) override {
    if (absl::Status s = tok_.CheckId(id); !s.ok()) return s;
    if (skip_special_ && tok_.is_special_[id]) return absl::OkStatus();
    DecoderPart part{tok_.tokens_[id], static_cast<bool>(tok_.is_added_content_[id])};
    Emit([&](std::string* text) { pipeline_.Push(std::move(part), text); }, out);
    return absl::OkStatus();
  }

  void Finish(std::string* out) override {
    Emit([&](std::string* text) { pipeline_.Finish(text); }, out);
    if (clean_up_) clean_up_stream_.Finish(out);
  }

 private:
  template <typename Decode>
  void Emit(const Decode& decode, std::string* out) {
    if (!clean_up_) {
      decode(out);
      return;
    }
    std::string text;
    decode(&text);
    clean_up_stream_.Push(text, out);
  }

  const HfTokenizer& tok_;
  bool skip_special_;
  bool clean_up_;
  DecoderPipeline pipeline_;
  CleanUpStream clean_up_stream_;
};

std::unique_ptr<DecodeStream> HfTokenizer::NewDecodeStream(const DecodeOptions& options) const {
  return std::make_unique<HfDecodeStream>(*this, options);
}

// The single-sequence template of a post-processor as ids before and after
// the text.
absl::Status ParsePostProcessor(const Json& json, const std::string& where,
                                const std::function<std::optional<int32_t>(const std::string&)>& id_of,
                                std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (json.is_null()) return absl::OkStatus();
  absl::StatusOr<std::string> type = JsonString(json, "type", where);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return absl::OkStatus();  // only moves offsets
  if (*type == "Sequence") {
    const auto it = json.find("processors");
    if (it == json.end() || !it->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": has no array 'processors'"));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      TANDEM_RETURN_IF_ERROR(ParsePostProcessor((*it)[i], absl::StrCat(where, ".processors[", i, "]"),
                                                id_of, prefix, suffix));
    }
    return absl::OkStatus();
  }
  if (*type == "TemplateProcessing") {
    const auto single = json.find("single");
    const auto specials = json.find("special_tokens");
    if (single == json.end() || !single->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": has no array 'single'"));
    }
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const Json& item = (*single)[i];
      const std::string item_where = absl::StrCat(where, ".single[", i, "]");
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const auto special = item.find("SpecialToken");
      if (special == item.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(item_where, ": neither SpecialToken nor Sequence"));
      }
      absl::StatusOr<std::string> name = JsonString(*special, "id", item_where);
      if (!name.ok()) return name.status();
      std::vector<int32_t> ids;
      if (specials != json.end() && specials->contains(*name) &&
          (*specials)[*name].contains("ids")) {
        for (const Json& id : (*specials)[*name]["ids"]) {
          if (!id.is_number_integer()) {
            return absl::InvalidArgumentError(absl::StrCat(where, ": special_tokens.", *name,
                                                           ".ids holds a non-integer"));
          }
          ids.push_back(id.get<int32_t>());
        }
      } else if (const std::optional<int32_t> id = id_of(*name)) {
        ids.push_back(*id);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(item_where, ": special token \"", *name, "\" is unknown"));
      }
      auto& target = seen_sequence ? *suffix : *prefix;
      target.insert(target.end(), ids.begin(), ids.end());
    }
    return absl::OkStatus();
  }
  if (*type == "RobertaProcessing" || *type == "BertProcessing") {
    for (const auto& [key, target] : {std::pair{"cls", prefix}, std::pair{"sep", suffix}}) {
      const auto it = json.find(key);
      if (it == json.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' is not [token, id]"));
      }
      target->push_back((*it)[1].get<int32_t>());
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": post_processor type '", *type, "' is not supported"));
}

absl::Status HfTokenizer::Init(const std::string& name, const Json& json,
                               const TokenizerConfig* config) {
  if (!json.is_object() || !json.contains("model") || !json["model"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": has no 'model' object (is it a tokenizer.json? a tokenizer_config.json is "
              "read from beside it)"));
  }
  const Json& model = json["model"];
  const std::string model_type =
      model.contains("type") && model["type"].is_string() ? model["type"].get<std::string>()
      : model.contains("merges")                         ? "BPE"
                                                         : "";
  if (model_type != "BPE") {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": model.type '", model_type, "' is not supported (only BPE is)"));
  }
  absl::StatusOr<std::unique_ptr<BpeModel>> bpe = BpeModel::Parse(model, name + ": model");
  if (!bpe.ok()) return bpe.status();
  model_ = *std::move(bpe);

  auto member = [&](const char* key) -> const Json& {
    static const Json* const kNull = new Json(nullptr);
    const auto it = json.find(key);
    return it == json.end() ? *kNull : *it;
  };
  absl::StatusOr<std::unique_ptr<Normalizer>> normalizer =
      ParseNormalizer(member("normalizer"), name + ": normalizer");
  if (!normalizer.ok()) return normalizer.status();
  normalizer_ = *std::move(normalizer);
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre_tokenizer =
      ParsePreTokenizer(member("pre_tokenizer"), name + ": pre_tokenizer");
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  pre_tokenizer_ = *std::move(pre_tokenizer);
  absl::StatusOr<std::unique_ptr<DecoderSpec>> decoder =
      ParseDecoder(member("decoder"), name + ": decoder");
  if (!decoder.ok()) return decoder.status();
  decoder_ = *std::move(decoder);

  tokens_ = model_->tokens();
  has_token_ = model_->has_token();
  const Json& added = member("added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": 'added_tokens' is not an array"));
  }
  const int64_t id_limit = static_cast<int64_t>(tokens_.size()) +
                           static_cast<int64_t>(added.is_null() ? 0 : added.size()) +
                           kTokenIdSlack;
  for (size_t i = 0; !added.is_null() && i < added.size(); ++i) {
    const std::string where = absl::StrCat(name, ": added_tokens[", i, "]");
    const Json& a = added[i];
    AddedToken token;
    const std::optional<int32_t> id =
        a.contains("id") ? ValidTokenId(a["id"], id_limit) : std::nullopt;
    if (!id) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": has no valid 'id' (an integer from 0 to ", id_limit - 1,
                       ": the model's ids and the added tokens' count plus ", kTokenIdSlack,
                       ")"));
    }
    token.id = *id;
    absl::StatusOr<std::string> content = JsonString(a, "content", where);
    if (!content.ok()) return content.status();
    token.content = *content;
    absl::StatusOr<bool> special = JsonBool(a, "special", false, where);
    absl::StatusOr<bool> lstrip = JsonBool(a, "lstrip", false, where);
    absl::StatusOr<bool> rstrip = JsonBool(a, "rstrip", false, where);
    absl::StatusOr<bool> single_word = JsonBool(a, "single_word", false, where);
    for (const auto* s : {&special, &lstrip, &rstrip, &single_word}) {
      if (!s->ok()) return s->status();
    }
    absl::StatusOr<bool> normalized = JsonBool(a, "normalized", !*special, where);
    if (!normalized.ok()) return normalized.status();
    if (*single_word) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": single_word is not supported"));
    }
    token.special = *special;
    token.lstrip = *lstrip;
    token.rstrip = *rstrip;
    token.normalized = *normalized;
    if (static_cast<size_t>(token.id) >= tokens_.size()) {
      tokens_.resize(token.id + 1);
      has_token_.resize(token.id + 1, false);
    }
    tokens_[token.id] = token.content;
    has_token_[token.id] = true;
    added_by_content_[token.content] = static_cast<int>(added_tokens_.size());
    added_tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < added_tokens_.size(); ++i) {
    const AddedToken& token = added_tokens_[i];
    const int index = static_cast<int>(i);
    if (token.normalized && normalizer_ != nullptr) {
      std::string normalized = token.content;
      normalizer_->Normalize(&normalized);
      normalized_matcher_.Add(normalized, index);
      if (!token.special) normalized_matcher_no_special_.Add(normalized, index);
    } else {
      raw_matcher_.Add(token.content, index);
      if (!token.special) raw_matcher_no_special_.Add(token.content, index);
    }
  }

  absl::flat_hash_set<std::string> special_texts;
  for (const AddedToken& token : added_tokens_) {
    if (token.special) special_texts.insert(token.content);
  }
  if (config != nullptr) {
    special_texts.insert(config->additional_special_tokens.begin(),
                         config->additional_special_tokens.end());
  }
  is_special_.assign(tokens_.size(), false);
  is_added_content_.assign(tokens_.size(), false);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    is_special_[id] = has_token_[id] && special_texts.contains(tokens_[id]);
    is_added_content_[id] = has_token_[id] && added_by_content_.contains(tokens_[id]);
  }

  auto id_of = [&](const std::string& text) { return PieceToId(text); };
  TANDEM_RETURN_IF_ERROR(ParsePostProcessor(member("post_processor"), name + ": post_processor",
                                            id_of, &post_prefix_, &post_suffix_));
  for (const int32_t id : post_prefix_) TANDEM_RETURN_IF_ERROR(Annotate(CheckId(id), name));
  for (const int32_t id : post_suffix_) TANDEM_RETURN_IF_ERROR(Annotate(CheckId(id), name));

  special_ids_.unk = model_->unk_id();
  if (config != nullptr) {
    auto lookup = [&](const std::optional<std::string>& text) -> std::optional<int32_t> {
      return text ? PieceToId(*text) : std::nullopt;
    };
    special_ids_.bos = lookup(config->bos_token);
    special_ids_.eos = lookup(config->eos_token);
    special_ids_.pad = lookup(config->pad_token);
    if (config->unk_token && lookup(config->unk_token)) special_ids_.unk = lookup(config->unk_token);
    if (config->clean_up_tokenization_spaces) clean_up_ = *config->clean_up_tokenization_spaces;
    chat_template_ = config->chat_template;
    tool_use_chat_template_ = config->tool_use_chat_template;
    if (config->names_add_bos_or_eos) {
      // transformers 5's update_post_processor: the flags replace
      // tokenizer.json's template (a flag whose token is not set adds none).
      post_prefix_.clear();
      post_suffix_.clear();
      for (const auto& [add, token, target] :
           {std::tuple{config->add_bos_token, &config->bos_token, &post_prefix_},
            std::tuple{config->add_eos_token, &config->eos_token, &post_suffix_}}) {
        if (!add || !*token) continue;
        const std::optional<int32_t> id = lookup(*token);
        if (!id) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, ": tokenizer_config.json adds \"", **token,
                           "\" to every sequence, but it is not in the vocabulary"));
        }
        target->push_back(*id);
      }
    }
  }
  if (!special_ids_.bos && !post_prefix_.empty()) special_ids_.bos = post_prefix_.front();
  if (special_ids_.bos) bos_token_ = tokens_[*special_ids_.bos];
  if (special_ids_.eos) eos_token_ = tokens_[*special_ids_.eos];
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& name,
                                                           const std::string& json_text,
                                                           const TokenizerConfig* config) {
  Json json;
  try {
    json = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not valid JSON at byte ", e.byte, ": ", e.what()));
  } catch (const Json::exception& e) {  // e.g. out_of_range: a number beyond double
    return absl::InvalidArgumentError(absl::StrCat(name, ": not valid JSON: ", e.what()));
  }
  auto tok = std::make_unique<HfTokenizer>();
  TANDEM_RETURN_IF_ERROR(tok->Init(name, json, config));
  return tok;
}

}  // namespace tandem::tokenizer::internal
