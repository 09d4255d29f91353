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

// Implemented by the loadable module libtandem_sentencepiece.so
// (sentencepiece_shim.cc), the only code that links libsentencepiece.
//
// Why a module: Debian's libsentencepiece embeds and exports its own copy of
// protobuf-lite 3.14. Linked into a binary that also links libprotobuf 3.21
// (every gRPC service: tandem-frontend), one copy's symbols take the other's
// place and the process dies at start-up, in whichever order they are
// linked. So Load() opens the module with dlopen(RTLD_LOCAL | RTLD_DEEPBIND):
// libsentencepiece then binds to its own protobuf and nothing else sees it.
// (Sanitizer builds, whose runtimes refuse RTLD_DEEPBIND, open it without;
// they link no libprotobuf.)
class SentencePieceModel {
 public:
  // nullptr and `error` set when `path` is not a SentencePiece model or the
  // module cannot be opened. The module is looked for in
  // $TANDEM_SENTENCEPIECE_MODULE, beside the running binary, in the build
  // tree, then by the dynamic loader's search path.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  virtual ~SentencePieceModel() = default;

  virtual bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const = 0;
  // Ids must be in range.
  virtual bool Decode(const std::vector<int>& ids, std::string* text,
                      std::string* error) const = 0;
  // libsentencepiece's surface of each id in `ids`, decoded together.
  virtual bool DecodeSurfaces(const std::vector<int>& ids, std::vector<std::string>* surfaces,
                              std::string* error) const = 0;

  virtual int size() const = 0;
  virtual const std::string& IdToPiece(int id) const = 0;
  // -1 when `piece` is not in the vocabulary.
  virtual int PieceToId(std::string_view piece) const = 0;
  virtual bool IsControl(int id) const = 0;
  virtual bool IsUnknown(int id) const = 0;
  virtual bool IsUnused(int id) const = 0;
  virtual bool IsByte(int id) const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int unk_id() const = 0;
  virtual int pad_id() const = 0;
};

// The module's entry point (extern "C", looked up with dlsym).
inline constexpr char kSentencePieceLoadSymbol[] = "tandem_sentencepiece_load";
using SentencePieceLoadFn = SentencePieceModel* (*)(const std::string& path, std::string* error);

}  // namespace tandem::tokenizer::internal
