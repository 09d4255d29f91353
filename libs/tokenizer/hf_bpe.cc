#include "hf_bpe.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "merge.h"
#include "utf8.h"

namespace tandem::tokenizer::internal {
namespace {

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Parse(const Json& model,
                                                          const std::string& where) {
  auto bpe = std::make_unique<BpeModel>();
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": 'vocab' is not an object"));
  }
  int32_t max_id = -1;
  bpe->vocab_.reserve(vocab->size());
  const int64_t id_limit = static_cast<int64_t>(vocab->size()) + kTokenIdSlack;
  for (const auto& [token, id] : vocab->items()) {
    const std::optional<int32_t> value = ValidTokenId(id, id_limit);
    if (!value) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": vocab entry \"", token, "\" has no valid id (an integer from 0 to ",
          id_limit - 1, ": the entries' count plus ", kTokenIdSlack, ")"));
    }
    bpe->vocab_[token] = *value;
    max_id = std::max(max_id, *value);
  }
  bpe->tokens_.resize(max_id + 1);
  bpe->has_token_.resize(max_id + 1, false);
  for (const auto& [token, id] : bpe->vocab_) {
    if (bpe->has_token_[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": id ", id, " is given to two vocab entries"));
    }
    bpe->tokens_[id] = token;
    bpe->has_token_[id] = true;
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": BPE ", key, " is not supported"));
    }
  }
  if (const auto it = model.find("dropout");
      it != model.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": BPE dropout is not supported"));
  }
  auto flag = [&](const char* key, bool* out) -> absl::Status {
    absl::StatusOr<bool> v = JsonBool(model, key, false, where);
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  };
  for (auto [key, out] : {std::pair{"byte_fallback", &bpe->byte_fallback_},
                          std::pair{"fuse_unk", &bpe->fuse_unk_},
                          std::pair{"ignore_merges", &bpe->ignore_merges_}}) {
    if (absl::Status s = flag(key, out); !s.ok()) return s;
  }
  if (const auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'unk_token' is not a string"));
    }
    const auto unk = bpe->vocab_.find(it->get<std::string>());
    if (unk == bpe->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unk_token \"",
                                                     it->get<std::string>(),
                                                     "\" is not in the vocab"));
    }
    bpe->unk_id_ = unk->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = bpe->vocab_.find(absl::StrFormat("<0x%02X>", b));
    bpe->byte_ids_[b] = it == bpe->vocab_.end() ? -1 : it->second;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": 'merges' is not an array"));
  }
  bpe->merges_.reserve(merges->size());
  std::string left, right;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& m = (*merges)[rank];
    if (m.is_string()) {  // "a b"
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": merges[", rank, "] \"", s, "\" is not two tokens"));
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": merges[", rank, "] is neither \"a b\" nor [a, b]"));
    }
    const auto a = bpe->vocab_.find(left);
    const auto b = bpe->vocab_.find(right);
    const auto merged = bpe->vocab_.find(left + right);
    if (a == bpe->vocab_.end() || b == bpe->vocab_.end() || merged == bpe->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": merges[", rank, "] (\"", left, "\", \"", right, "\") uses a token not in the vocab"));
    }
    bpe->merges_.insert_or_assign(PairKey(a->second, b->second),
                                  MergeInfo{static_cast<int32_t>(rank), merged->second});
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  const auto it = vocab_.find(AV(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(AV(word)); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  bool last_was_unk = false;
  for (size_t i = 0; i < word.size();) {
    const std::optional<DecodedChar> c = DecodeChar(word.substr(i));
    const size_t len = c ? c->len : 1;  // the caller passes valid UTF-8
    const std::string_view ch = word.substr(i, len);
    i += len;
    if (const auto it = vocab_.find(AV(ch)); it != vocab_.end()) {
      symbols.push_back(it->second);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char b : ch) all = all && byte_ids_[static_cast<uint8_t>(b)] >= 0;
      if (all) {
        for (const char b : ch) symbols.push_back(byte_ids_[static_cast<uint8_t>(b)]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && last_was_unk)) symbols.push_back(*unk_id_);
      last_was_unk = true;
    }
  }
  MergePairs<int32_t>(&symbols, [&](int32_t a, int32_t b) -> std::optional<Merge<int32_t>> {
    const auto it = merges_.find(PairKey(a, b));
    if (it == merges_.end()) return std::nullopt;
    return Merge<int32_t>{it->second.rank, it->second.merged};
  });
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

}  // namespace tandem::tokenizer::internal
