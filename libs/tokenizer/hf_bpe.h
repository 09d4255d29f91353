// tokenizer.json's BPE model (private).
//
// A pre-token is split into characters, each looked up in the vocabulary (a
// character that is not there becomes its bytes as <0xXX> tokens with
// byte_fallback, else the unknown token, consecutive ones fused with
// fuse_unk), then adjacent pairs are merged lowest merge rank first,
// leftmost among equal ranks. With ignore_merges a pre-token that is itself
// in the vocabulary is that token (Llama 3). Dropout, a
// continuing_subword_prefix and an end_of_word_suffix are not supported
// (generation models do not use them).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "hf_components.h"

namespace tandem::tokenizer::internal {

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Parse(const Json& model,
                                                         const std::string& where);

  // Appends the ids of one pre-token.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  // id -> token, for ids 0 .. max id (holes are empty and absent from
  // has_token).
  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<bool>& has_token() const { return has_token_; }
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<int32_t> unk_id() const { return unk_id_; }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t merged;
  };
  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, MergeInfo> merges_;
  std::vector<std::string> tokens_;
  std::vector<bool> has_token_;
  std::optional<int32_t> unk_id_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> ids, -1 when absent
};

}  // namespace tandem::tokenizer::internal
