#include "llama2c_tokenizer.h"

#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "merge.h"
#include "utf8.h"

namespace tandem::tokenizer::internal {
namespace {

constexpr int32_t kUnk = 0;
constexpr int32_t kBos = 1;
constexpr int32_t kEos = 2;
constexpr int32_t kFirstByteToken = 3;  // run.c: byte b is token b + 3
constexpr float kNoMergeScore = -1e10f;  // run.c's initial best_score

// "<0xXX>" -> the byte, as run.c's sscanf("<0x%02hhX>") reads it.
std::optional<uint8_t> ParseByteToken(std::string_view piece) {
  if (piece.size() < 4 || piece.substr(0, 3) != "<0x") return std::nullopt;
  int value = 0, digits = 0;
  for (size_t i = 3; i < piece.size() && digits < 2; ++i, ++digits) {
    const int d = HexDigitValue(piece[i]);
    if (d < 0) break;
    value = value * 16 + d;
  }
  if (digits == 0) return std::nullopt;
  return static_cast<uint8_t>(value);
}

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    for (int32_t id = 0; id < static_cast<int32_t>(pieces_.size()); ++id) {
      ids_.try_emplace(pieces_[id], id);  // run.c's bsearch finds one of equal pieces
    }
    byte_of_.resize(pieces_.size());
    for (size_t id = 0; id < pieces_.size(); ++id) byte_of_[id] = ParseByteToken(pieces_[id]);
    special_ids_ = {.bos = kBos, .eos = kEos, .unk = kUnk, .pad = std::nullopt};
    bos_token_ = pieces_[kBos];
    eos_token_ = pieces_[kEos];
  }

  TokenizerKind kind() const override { return TokenizerKind::kLlama2c; }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view input,
                                              const EncodeOptions& options) const override {
    const std::string_view text = input;
    std::vector<int32_t> tokens;
    tokens.reserve(text.size() + 2);
    if (!text.empty()) tokens.push_back(dummy_prefix_);
    std::string buffer;
    size_t i = 0;
    while (i < text.size()) {
      // run.c: a byte and the continuation bytes after it, at most 4 in all.
      size_t len = 1;
      while (len < 4 && i + len < text.size() &&
             (static_cast<uint8_t>(text[i + len]) & 0xC0) == 0x80) {
        ++len;
      }
      const std::string_view unit = text.substr(i, len);
      const auto it = unit.find('\0') == std::string_view::npos ? ids_.find(AV(unit)) : ids_.end();
      if (it != ids_.end()) {
        tokens.push_back(it->second);
      } else {
        for (const char c : unit) tokens.push_back(static_cast<uint8_t>(c) + kFirstByteToken);
      }
      i += len;
    }
    MergePairs<float>(&tokens, [&](int32_t a, int32_t b) -> std::optional<Merge<float>> {
      buffer.assign(pieces_[a]);
      buffer.append(pieces_[b]);
      const auto it = ids_.find(buffer);
      if (it == ids_.end() || !(scores_[it->second] > kNoMergeScore)) return std::nullopt;
      return Merge<float>{-scores_[it->second], it->second};
    });
    if (options.add_special_tokens) tokens.insert(tokens.begin(), kBos);
    return tokens;
  }

  absl::StatusOr<std::string> IdToPiece(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")"));
    }
    return pieces_[id];
  }
  std::optional<int32_t> PieceToId(std::string_view input) const override {
    const std::string_view piece = input;
    const auto it = ids_.find(AV(piece));
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  bool IsSpecial(int32_t id) const override { return id == kUnk || id == kBos || id == kEos; }

  std::unique_ptr<DecodeStream> NewDecodeStream(const DecodeOptions& options) const override;

  absl::Status Init(const std::string& name) {
    const auto it = ids_.find(" ");
    if (it == ids_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": has no \" \" piece (run.c's dummy prefix)"));
    }
    dummy_prefix_ = it->second;
    return absl::OkStatus();
  }

 private:
  friend class Llama2cDecodeStream;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<std::optional<uint8_t>> byte_of_;
  absl::flat_hash_map<std::string, int32_t> ids_;
  int32_t dummy_prefix_ = 0;
};

class Llama2cDecodeStream final : public DecodeStream {
 public:
  Llama2cDecodeStream(const Llama2cTokenizer& tok, const DecodeOptions& options)
      : tok_(tok), options_(options) {}

  absl::Status Push(int32_t id, std::string* out) override {
    if (id < 0 || id >= tok_.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id,
                                                     " is outside the vocabulary [0, ",
                                                     tok_.vocab_size(), ")"));
    }
    const int32_t prev = prev_;
    prev_ = id;
    if (options_.skip_special_tokens && tok_.IsSpecial(id)) return absl::OkStatus();
    std::string_view piece = tok_.pieces_[id];
    if (prev == kBos && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    if (const std::optional<uint8_t> byte = tok_.byte_of_[id]) {
      const char c = static_cast<char>(*byte);
      bytes_.Push(std::string_view(&c, 1), out);
      return absl::OkStatus();
    }
    bytes_.Finish(out);
    // Pieces are text; repair one that is not UTF-8 on its own.
    Utf8Repairer piece_repair(Utf8Repairer::Policy::kPerByte);
    piece_repair.Push(piece, out);
    piece_repair.Finish(out);
    return absl::OkStatus();
  }

  void Finish(std::string* out) override { bytes_.Finish(out); }

 private:
  const Llama2cTokenizer& tok_;
  DecodeOptions options_;
  int32_t prev_ = -1;
  Utf8Repairer bytes_{Utf8Repairer::Policy::kPerByte};
};

std::unique_ptr<DecodeStream> Llama2cTokenizer::NewDecodeStream(
    const DecodeOptions& options) const {
  return std::make_unique<Llama2cDecodeStream>(*this, options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& name,
                                                                std::string_view bytes) {
  size_t offset = 0;
  auto read_i32 = [&](int32_t* v) {
    std::memcpy(v, bytes.data() + offset, 4);
    offset += 4;
  };
  if (bytes.size() < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": truncated at offset 0: ", bytes.size(), " bytes, need 4 for max_token_length"));
  }
  int32_t max_token_length;
  read_i32(&max_token_length);
  if (max_token_length <= 0 || max_token_length > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": max_token_length ", max_token_length, " at offset 0 is not valid"));
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  while (offset < bytes.size()) {
    const size_t piece_offset = offset;
    const size_t index = pieces.size();
    if (bytes.size() - offset < 8) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: truncated at offset %d in piece %d: %d bytes left, need 8 for its score and length",
          name, offset, index, bytes.size() - offset));
    }
    float score;
    std::memcpy(&score, bytes.data() + offset, 4);
    offset += 4;
    int32_t len;
    read_i32(&len);
    if (len < 0 || len > max_token_length) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: piece %d at offset %d has length %d, outside [0, %d]", name, index,
                          piece_offset, len, max_token_length));
    }
    if (bytes.size() - offset < static_cast<size_t>(len)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: truncated at offset %d in piece %d: %d bytes left, its length says %d", name,
          offset, index, bytes.size() - offset, len));
    }
    pieces.emplace_back(bytes.substr(offset, len));
    scores.push_back(score);
    offset += len;
  }
  constexpr size_t kMinPieces = kFirstByteToken + 256;
  if (pieces.size() < kMinPieces) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": has ", pieces.size(), " pieces; llama2.c needs at least ",
                     kMinPieces, " (<unk>, BOS, EOS and 256 byte tokens)"));
  }
  for (int b = 0; b < 256; ++b) {
    const std::string& piece = pieces[kFirstByteToken + b];
    const std::optional<uint8_t> parsed = ParseByteToken(piece);
    if (!parsed || *parsed != b) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: piece %d is \"%s\"; run.c's byte fallback needs <0x%02X> there", name,
          kFirstByteToken + b, absl::CHexEscape(piece), b));
    }
  }
  auto tok = std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores));
  if (absl::Status s = tok->Init(name); !s.ok()) return s;
  return tok;
}

}  // namespace tandem::tokenizer::internal
