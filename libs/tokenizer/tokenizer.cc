#include "tandem/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "byte_level.h"
#include "chat_template_value.h"
#include "hf_tokenizer.h"
#include "llama2c_tokenizer.h"
#include "sentencepiece_tokenizer.h"
#include "tandem/common/status.h"
#include "tokenizer_config.h"
#include "utf8.h"

namespace tandem::tokenizer {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path.string(), ": read failed"));
  return std::move(bytes).str();
}

// What `dir` says beside the tokenizer: tokenizer_config.json, and
// chat_template.jinja, where transformers >= 4.43 saves the chat template
// instead of in tokenizer_config.json. nullopt when it holds neither.
//
// When both carry a template, chat_template.jinja wins, as in transformers
// (4.x and 5): PreTrainedTokenizerBase._from_pretrained() reads
// tokenizer_config.json first and then sets init_kwargs["chat_template"]
// from chat_template.jinja ("If independent chat template file(s) exist,
// they take priority over template entries in the tokenizer config"), and
// save_pretrained() writes the file and drops the config's key. vLLM takes
// the template from that tokenizer, so `vllm serve DIR` renders the file's.
// For a multimodal model (config.json has a vision_config) vLLM renders the
// processor's template first: chat_template.jinja, else chat_template.json's.
absl::StatusOr<std::optional<internal::TokenizerConfig>> ReadConfigIn(const fs::path& dir) {
  std::optional<internal::TokenizerConfig> config;
  std::error_code ec;
  if (const fs::path path = dir / "tokenizer_config.json"; fs::is_regular_file(path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    TANDEM_ASSIGN_OR_RETURN(config, internal::ParseTokenizerConfig(path.string(), text));
  }
  // A multimodal checkpoint's processor template (chat_template.json, as
  // gemma-3-4b-it and Mistral Small 3.1 ship it): vLLM renders a multimodal
  // model's processor template before its tokenizer's.
  if (const fs::path path = dir / "chat_template.json"; fs::is_regular_file(path, ec)) {
    const fs::path model_config = dir / "config.json";
    absl::StatusOr<std::string> model = fs::is_regular_file(model_config, ec)
                                            ? ReadFile(model_config)
                                            : absl::StatusOr<std::string>("");
    if (model.ok() && internal::IsMultimodalModelConfig(*model)) {
      TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
      TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> t,
                              internal::ParseProcessorChatTemplate(path.string(), text));
      if (t) {
        if (!config) config.emplace();
        config->chat_template = std::move(*t);
      }
    }
  }
  if (const fs::path path = dir / "chat_template.jinja"; fs::is_regular_file(path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    if (!config) config.emplace();
    config->chat_template = std::move(text);
  }
  // transformers >= 4.43 saves the named templates beside it.
  if (const fs::path path = dir / "additional_chat_templates" / "tool_use.jinja";
      fs::is_regular_file(path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    if (!config) config.emplace();
    config->tool_use_chat_template = std::move(text);
  }
  return config;
}

enum class Format { kJson, kSentencePiece, kLlama2c };

// By content: JSON starts with '{'; a SentencePiece model is a protobuf whose
// first field is a piece (tag 0x0A, then a non-zero varint length); anything
// else is read as llama2.c's tokenizer.bin (an int32 max_token_length first).
Format Sniff(std::string_view bytes) {
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && bytes[first] == '{') return Format::kJson;
  if (bytes.size() >= 4 && bytes[0] == 0x0A && !(bytes[1] == 0 && bytes[2] == 0 && bytes[3] == 0)) {
    return Format::kSentencePiece;
  }
  return Format::kLlama2c;
}

// A tokenizer's chat template and BOS/EOS texts for formats that do not carry
// them (SentencePiece, llama2.c), from tokenizer_config.json.
class WithConfig final : public Tokenizer {
 public:
  WithConfig(std::unique_ptr<Tokenizer> inner, const internal::TokenizerConfig& config)
      : inner_(std::move(inner)) {
    special_ids_ = inner_->special_ids();
    bos_token_ = config.bos_token.value_or(inner_->bos_token());
    eos_token_ = config.eos_token.value_or(inner_->eos_token());
    chat_template_ = config.chat_template;
    tool_use_chat_template_ = config.tool_use_chat_template;
  }
  TokenizerKind kind() const override { return inner_->kind(); }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view input,
                                              const EncodeOptions& options) const override {
    return inner_->Encode(input, options);
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     const DecodeOptions& options) const override {
    return inner_->Decode(ids, options);
  }
  absl::StatusOr<std::string> IdToPiece(int32_t id) const override { return inner_->IdToPiece(id); }
  std::optional<int32_t> PieceToId(std::string_view input) const override {
    return inner_->PieceToId(input);
  }
  bool IsSpecial(int32_t id) const override { return inner_->IsSpecial(id); }
  std::unique_ptr<DecodeStream> NewDecodeStream(const DecodeOptions& options) const override {
    return inner_->NewDecodeStream(options);
  }

 private:
  std::unique_ptr<Tokenizer> inner_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFile(
    const fs::path& path, const std::optional<internal::TokenizerConfig>& config) {
  TANDEM_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  std::unique_ptr<Tokenizer> tok;
  switch (Sniff(bytes)) {
    case Format::kJson:
      return internal::LoadHfTokenizer(path.string(), bytes, config ? &*config : nullptr);
    case Format::kSentencePiece: {
      TANDEM_ASSIGN_OR_RETURN(tok, internal::LoadSentencePieceTokenizer(path.string()));
      break;
    }
    case Format::kLlama2c: {
      TANDEM_ASSIGN_OR_RETURN(tok, internal::LoadLlama2cTokenizer(path.string(), bytes));
      break;
    }
  }
  if (config) return std::make_unique<WithConfig>(std::move(tok), *config);
  return tok;
}

}  // namespace

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              const DecodeOptions& options) const {
  std::unique_ptr<DecodeStream> stream = NewDecodeStream(options);
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (absl::Status s = stream->Push(ids[i], &text); !s.ok()) {
      return Annotate(s, absl::StrCat("decoding position ", i));
    }
  }
  stream->Finish(&text);
  return text;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    TANDEM_ASSIGN_OR_RETURN(std::optional<internal::TokenizerConfig> config, ReadConfigIn(p));
    for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer.bin"}) {
      if (fs::is_regular_file(p / name, ec)) return LoadFile(p / name, config);
    }
    return absl::NotFoundError(
        absl::StrCat(path, ": holds no tokenizer.json, tokenizer.model or tokenizer.bin"));
  }
  if (!fs::exists(p, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  // A file: its tokenizer_config.json and chat_template.jinja sit beside it,
  // if anywhere.
  std::optional<internal::TokenizerConfig> config;
  if (p.filename() == "tokenizer.json" || p.filename() == "tokenizer.model") {
    TANDEM_ASSIGN_OR_RETURN(config, ReadConfigIn(p.parent_path().empty() ? "." : p.parent_path()));
  }
  return LoadFile(p, config);
}

std::string PieceBytes(std::string_view piece, bool byte_level) {
  using internal::HexDigitValue;
  if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>' &&
      HexDigitValue(piece[3]) >= 0 && HexDigitValue(piece[4]) >= 0) {
    return std::string(1,
                       static_cast<char>(HexDigitValue(piece[3]) * 16 + HexDigitValue(piece[4])));
  }
  std::string out;
  if (byte_level) {
    const internal::ByteLevelAlphabet& alphabet = internal::ByteLevelAlphabet::Get();
    for (size_t i = 0; i < piece.size();) {
      const std::optional<internal::DecodedChar> c = internal::DecodeChar(piece.substr(i));
      const std::optional<uint8_t> byte = c ? alphabet.ByteOf(c->cp) : std::nullopt;
      if (!byte) return std::string(piece);  // outside the alphabet
      out.push_back(static_cast<char>(*byte));
      i += c->len;
    }
    return out;
  }
  constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // ▁
  for (size_t i = 0; i < piece.size();) {
    if (piece.substr(i, kMetaspace.size()) == kMetaspace) {
      out.push_back(' ');
      i += kMetaspace.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

std::vector<std::string> VocabularyBytes(const Tokenizer& tok) {
  const bool byte_level =
      tok.kind() == TokenizerKind::kHuggingFace && tok.PieceToId("\xC4\xA0").has_value();
  std::vector<std::string> bytes(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    absl::StatusOr<std::string> piece = tok.IdToPiece(id);
    if (piece.ok()) bytes[static_cast<size_t>(id)] = PieceBytes(*piece, byte_level);
  }
  return bytes;
}

std::string PythonLstrip(std::string_view s) {
  return internal::jinja::Strip(std::string(s), /*left=*/true, /*right=*/false, std::nullopt);
}

std::string ReplaceInvalidUtf8(std::string_view bytes) {
  internal::Utf8Repairer repairer(internal::Utf8Repairer::Policy::kMaximalSubpart);
  std::string out;
  repairer.Push(bytes, &out);
  repairer.Finish(&out);
  return out;
}

}  // namespace tandem::tokenizer
