#include "sentencepiece_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "sentencepiece_shim.h"
#include "utf8.h"

namespace tandem::tokenizer::internal {
namespace {

absl::Status OutOfRange(int32_t id, size_t position, int32_t vocab_size) {
  return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at position ", position,
                                                 " is outside the vocabulary [0, ", vocab_size,
                                                 ")"));
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<SentencePieceModel> sp) : sp_(std::move(sp)) {
    auto id_or_none = [](int id) -> std::optional<int32_t> {
      if (id < 0) return std::nullopt;
      return id;
    };
    special_ids_ = {.bos = id_or_none(sp_->bos_id()),
                    .eos = id_or_none(sp_->eos_id()),
                    .unk = id_or_none(sp_->unk_id()),
                    .pad = id_or_none(sp_->pad_id())};
    if (special_ids_.bos) bos_token_ = sp_->IdToPiece(*special_ids_.bos);
    if (special_ids_.eos) eos_token_ = sp_->IdToPiece(*special_ids_.eos);
    // The stream's context piece: any normal piece whose surface is not empty.
    for (int id = 0; id < sp_->size(); ++id) {
      const std::string& piece = sp_->IdToPiece(id);
      if (!IsSpecial(id) && !sp_->IsByte(id) && !sp_->IsUnused(id) && !piece.empty() &&
          piece.rfind("\xE2\x96\x81", 0) != 0) {
        context_id_ = id;
        break;
      }
    }
  }

  TokenizerKind kind() const override { return TokenizerKind::kSentencePiece; }
  int32_t vocab_size() const override { return sp_->size(); }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view input,
                                              const EncodeOptions& options) const override {
    std::vector<int> ids;
    std::string error;
    if (!sp_->Encode(input, &ids, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("sentencepiece encode: ", error));
    }
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    if (options.add_special_tokens && special_ids_.bos) out.push_back(*special_ids_.bos);
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     const DecodeOptions& options) const override {
    std::vector<int> kept;
    kept.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size()) return OutOfRange(ids[i], i, vocab_size());
      if (!(options.skip_special_tokens && IsSpecial(ids[i]))) kept.push_back(ids[i]);
    }
    std::string text, error;
    if (!sp_->Decode(kept, &text, &error)) {
      return absl::InternalError(absl::StrCat("sentencepiece decode: ", error));
    }
    return text;
  }

  absl::StatusOr<std::string> IdToPiece(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return OutOfRange(id, 0, vocab_size());
    return sp_->IdToPiece(id);
  }
  std::optional<int32_t> PieceToId(std::string_view input) const override {
    const int id = sp_->PieceToId(input);
    if (id < 0) return std::nullopt;
    return id;
  }
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() && (sp_->IsControl(id) || sp_->IsUnknown(id));
  }

  std::unique_ptr<DecodeStream> NewDecodeStream(const DecodeOptions& options) const override;

 private:
  friend class SentencePieceDecodeStream;
  std::unique_ptr<SentencePieceModel> sp_;
  int context_id_ = -1;
};

// libsentencepiece decodes a whole sequence at once: it strips the dummy-prefix
// space of the first piece while nothing visible precedes it, and turns each
// run of byte pieces into characters (one U+FFFD per bad byte). The stream
// asks libsentencepiece for the per-piece surfaces of a short window instead
// of reimplementing that:
//   - until some text is out, the window is every id so far, decoded from the
//     start (those ids only produced empty surfaces, so this stays short);
//   - afterwards the window starts with a context piece whose surface is not
//     empty, so libsentencepiece strips nothing, and the context's surface is
//     dropped;
//   - the surfaces of the ids before a trailing run of byte pieces that ends
//     in an incomplete character are final; those ids leave the window, the
//     incomplete bytes (at most three ids) stay.
class SentencePieceDecodeStream final : public DecodeStream {
 public:
  SentencePieceDecodeStream(const SentencePieceTokenizer& tok, const DecodeOptions& options)
      : tok_(tok), options_(options) {}

  absl::Status Push(int32_t id, std::string* out) override {
    if (id < 0 || id >= tok_.vocab_size()) return OutOfRange(id, 0, tok_.vocab_size());
    if (options_.skip_special_tokens && tok_.IsSpecial(id)) return absl::OkStatus();
    window_.push_back(id);
    return Flush(/*finish=*/false, out);
  }

  void Finish(std::string* out) override { (void)Flush(/*finish=*/true, out); }

 private:
  absl::Status Flush(bool finish, std::string* out) {
    const bool with_context = emitted_any_ && tok_.context_id_ >= 0;
    std::vector<int> ids;
    ids.reserve(window_.size() + 1);
    if (with_context) ids.push_back(tok_.context_id_);
    ids.insert(ids.end(), window_.begin(), window_.end());
    std::vector<std::string> surfaces;
    std::string error;
    if (!tok_.sp_->DecodeSurfaces(ids, &surfaces, &error)) {
      return absl::InternalError(absl::StrCat("sentencepiece decode: ", error));
    }
    size_t keep = 0;  // ids at the end of the window whose surface may change
    if (!finish) {
      std::string tail_bytes;
      size_t run = 0;
      while (run < window_.size() && tok_.sp_->IsByte(window_[window_.size() - 1 - run])) ++run;
      for (size_t i = window_.size() - run; i < window_.size(); ++i) {
        const std::string& piece = tok_.sp_->IdToPiece(window_[i]);  // "<0xE6>"
        tail_bytes.push_back(static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
      }
      keep = IncompleteUtf8Suffix(tail_bytes);
    }
    std::string text;
    const size_t first = with_context ? 1 : 0;
    for (size_t i = first; i + keep < surfaces.size(); ++i) text += surfaces[i];
    if (!emitted_any_ && text.empty() && !finish) return absl::OkStatus();  // keep decoding from the start
    out->append(text);
    emitted_any_ = emitted_any_ || !text.empty();
    window_.erase(window_.begin(), window_.end() - static_cast<std::ptrdiff_t>(keep));
    return absl::OkStatus();
  }

  const SentencePieceTokenizer& tok_;
  DecodeOptions options_;
  std::vector<int> window_;
  bool emitted_any_ = false;
};

std::unique_ptr<DecodeStream> SentencePieceTokenizer::NewDecodeStream(
    const DecodeOptions& options) const {
  return std::make_unique<SentencePieceDecodeStream>(*this, options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path) {
  std::string error;
  std::unique_ptr<SentencePieceModel> sp = SentencePieceModel::Load(path, &error);
  if (sp == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a SentencePiece model (libsentencepiece: ", error, ")"));
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(sp));
}

}  // namespace tandem::tokenizer::internal
