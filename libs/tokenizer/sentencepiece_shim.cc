#include "sentencepiece_shim.h"

#include <sentencepiece_processor.h>

namespace tandem::tokenizer::internal {

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceModel::SentencePieceModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  auto impl = std::make_unique<Impl>();
  const sentencepiece::util::Status status = impl->sp.Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(new SentencePieceModel(std::move(impl)));
}

bool SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids,
                                std::string* error) const {
  const sentencepiece::util::Status status = impl_->sp.Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceModel::Decode(const std::vector<int>& ids, std::string* text,
                                std::string* error) const {
  const sentencepiece::util::Status status = impl_->sp.Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceModel::DecodeSurfaces(const std::vector<int>& ids,
                                        std::vector<std::string>* surfaces,
                                        std::string* error) const {
  // The immutable-proto API reports no status: an empty result for ids that
  // are not empty means it failed.
  const sentencepiece::ImmutableSentencePieceText spt = impl_->sp.DecodeIdsAsImmutableProto(ids);
  if (spt.pieces_size() != ids.size()) {
    *error = "libsentencepiece could not decode the ids";
    return false;
  }
  surfaces->clear();
  for (int i = 0; i < static_cast<int>(spt.pieces_size()); ++i) surfaces->push_back(spt.pieces(i).surface());
  return true;
}

int SentencePieceModel::size() const { return impl_->sp.GetPieceSize(); }
const std::string& SentencePieceModel::IdToPiece(int id) const { return impl_->sp.IdToPiece(id); }
int SentencePieceModel::PieceToId(std::string_view piece) const {
  const int id = impl_->sp.PieceToId(piece);
  // PieceToId answers unk_id for a piece it does not know.
  return impl_->sp.IdToPiece(id) == piece ? id : -1;
}
bool SentencePieceModel::IsControl(int id) const { return impl_->sp.IsControl(id); }
bool SentencePieceModel::IsUnknown(int id) const { return impl_->sp.IsUnknown(id); }
bool SentencePieceModel::IsUnused(int id) const { return impl_->sp.IsUnused(id); }
bool SentencePieceModel::IsByte(int id) const { return impl_->sp.IsByte(id); }
int SentencePieceModel::bos_id() const { return impl_->sp.bos_id(); }
int SentencePieceModel::eos_id() const { return impl_->sp.eos_id(); }
int SentencePieceModel::unk_id() const { return impl_->sp.unk_id(); }
int SentencePieceModel::pad_id() const { return impl_->sp.pad_id(); }

}  // namespace tandem::tokenizer::internal
