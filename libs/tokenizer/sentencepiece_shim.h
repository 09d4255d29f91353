// A wall between libsentencepiece and Abseil (private).
//
// Debian's sentencepiece_processor.h declares `namespace absl { using
// std::string_view; }`, which collides with Debian's Abseil, whose
// std::string_view is its own class. So only sentencepiece_shim.cc includes
// that header, and this interface speaks std types only.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tokenizer::internal {

class SentencePieceModel {
 public:
  // nullptr and `error` set when `path` is not a SentencePiece model.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  ~SentencePieceModel();

  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  // Ids must be in range.
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;
  // libsentencepiece's surface of each id in `ids`, decoded together.
  bool DecodeSurfaces(const std::vector<int>& ids, std::vector<std::string>* surfaces,
                      std::string* error) const;

  int size() const;
  const std::string& IdToPiece(int id) const;
  // -1 when `piece` is not in the vocabulary.
  int PieceToId(std::string_view piece) const;
  bool IsControl(int id) const;
  bool IsUnknown(int id) const;
  bool IsUnused(int id) const;
  bool IsByte(int id) const;
  int bos_id() const;
  int eos_id() const;
  int unk_id() const;
  int pad_id() const;

 private:
  struct Impl;
  explicit SentencePieceModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::tokenizer::internal
