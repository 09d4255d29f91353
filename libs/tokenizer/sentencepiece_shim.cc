#include "sentencepiece_shim.h"

#include <sentencepiece_processor.h>

namespace tandem::tokenizer::internal {

namespace {

class SentencePieceModelImpl final : public SentencePieceModel {
 public:
  bool Load(const std::string& path, std::string* error) {
    const sentencepiece::util::Status status = sp.Load(path);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }

  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const override {
    const sentencepiece::util::Status status = sp.Encode(text, ids);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }

  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const override {
    const sentencepiece::util::Status status = sp.Decode(ids, text);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }

  bool DecodeSurfaces(const std::vector<int>& ids, std::vector<std::string>* surfaces,
                      std::string* error) const override {
    // The immutable-proto API reports no status: an empty result for ids
    // that are not empty means it failed.
    const sentencepiece::ImmutableSentencePieceText spt = sp.DecodeIdsAsImmutableProto(ids);
    if (spt.pieces_size() != ids.size()) {
      *error = "libsentencepiece could not decode the ids";
      return false;
    }
    surfaces->clear();
    for (int i = 0; i < static_cast<int>(spt.pieces_size()); ++i) {
      surfaces->push_back(spt.pieces(i).surface());
    }
    return true;
  }

  int size() const override { return sp.GetPieceSize(); }
  const std::string& IdToPiece(int id) const override { return sp.IdToPiece(id); }
  int PieceToId(std::string_view piece) const override {
    const int id = sp.PieceToId(piece);
    // PieceToId answers unk_id for a piece it does not know.
    return sp.IdToPiece(id) == piece ? id : -1;
  }
  bool IsControl(int id) const override { return sp.IsControl(id); }
  bool IsUnknown(int id) const override { return sp.IsUnknown(id); }
  bool IsUnused(int id) const override { return sp.IsUnused(id); }
  bool IsByte(int id) const override { return sp.IsByte(id); }
  int bos_id() const override { return sp.bos_id(); }
  int eos_id() const override { return sp.eos_id(); }
  int unk_id() const override { return sp.unk_id(); }
  int pad_id() const override { return sp.pad_id(); }

 private:
  sentencepiece::SentencePieceProcessor sp;
};

}  // namespace

}  // namespace tandem::tokenizer::internal

extern "C" __attribute__((visibility("default")))
tandem::tokenizer::internal::SentencePieceModel* tandem_sentencepiece_load(
    const std::string& path, std::string* error) {
  auto model = std::make_unique<tandem::tokenizer::internal::SentencePieceModelImpl>();
  if (!model->Load(path, error)) return nullptr;
  return model.release();
}
