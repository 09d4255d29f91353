#include "tandem/worker/structured_outputs.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/clock.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::worker {
namespace {

void Break(const std::string& id, std::string error, GrammarState* state) {
  TANDEM_LOG(WARNING) << "request " << id << ": " << error << "; it is ended with an error";
  state->error = std::move(error);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> LoadVocabulary(
    const std::string& path, int32_t vocab_size) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                          tokenizer::LoadTokenizer(path));
  if (tok->vocab_size() > vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tokenizer at ", path, " has ", tok->vocab_size(),
                     " ids but the model's vocabulary only ", vocab_size));
  }
  std::vector<std::string> bytes = tokenizer::VocabularyBytes(*tok);
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    if (tok->IsSpecial(id)) bytes[static_cast<size_t>(id)].clear();
  }
  bytes.resize(static_cast<size_t>(vocab_size));
  return std::make_shared<const grammar::TokenVocabulary>(std::move(bytes));
}

StructuredOutputs::StructuredOutputs(std::shared_ptr<const grammar::TokenVocabulary> vocabulary,
                                     std::vector<int32_t> eos_token_ids, size_t mask_cache_bytes)
    : vocabulary_(vocabulary),
      eos_token_ids_(std::move(eos_token_ids)),
      masks_(std::move(vocabulary), mask_cache_bytes) {}

std::shared_ptr<const grammar::Schema> StructuredOutputs::Compile(const SamplingParams& params) {
  auto compiled = grammar::CompileGrammarKept(params);
  return compiled.ok() ? *compiled : nullptr;  // the scheduler refuses these at admission
}

StructuredOutputs::Stats StructuredOutputs::stats() const {
  const grammar::TokenMaskCache::Stats cache = masks_.stats();
  return {.masks_kept = cache.hits,
          .masks_walked = cache.misses,
          .mask_seconds = mask_seconds_,
          .cache_bytes = cache.bytes};
}

void StructuredOutputs::Warm(const SamplingParams& params) {
  std::shared_ptr<const grammar::Schema> schema = Compile(params);
  if (schema == nullptr) return;  // Mask reports it
  const int64_t start = MonotonicNanos();
  grammar::TokenMask mask;
  masks_.Allowed(grammar::JsonMatcher(std::move(schema)), &mask);
  mask_seconds_ += static_cast<double>(MonotonicNanos() - start) * 1e-9;
}

void StructuredOutputs::Mask(const std::string& id, const SamplingParams& params,
                             std::span<const int32_t> output, GrammarState* state,
                             grammar::TokenMask* allowed) {
  allowed->clear();
  const grammar::TokenVocabulary& vocab = *vocabulary_;
  if (params.json_schema_after_token) {
    // The document starts after the token (the thinking's end); up to it
    // nothing is banned.
    const auto after = std::find(output.begin(), output.end(), *params.json_schema_after_token);
    if (after == output.end()) return;
    output = output.subspan(static_cast<size_t>(after - output.begin()) + 1);
  }
  const bool follows = state->matcher && state->fed.size() <= output.size() &&
                       std::equal(state->fed.begin(), state->fed.end(), output.begin());
  if (!follows) {
    state->fed.clear();
    state->error.clear();
    state->matcher.reset();
    if (std::shared_ptr<const grammar::Schema> schema = Compile(params)) {
      state->matcher.emplace(std::move(schema));
    } else {
      Break(id, absl::StrCat("its ", params.GrammarField(), " does not compile on the worker"),
            state);
    }
  }
  for (size_t k = state->fed.size(); k < output.size() && !state->broken(); ++k) {
    const int32_t t = output[k];
    const bool in_vocab = t >= 0 && t < vocab.size() && !vocab.bytes(t).empty();
    if (!in_vocab || !state->matcher->Accept(vocab.bytes(t))) {
      Break(id,
            absl::StrCat("output token ", k, " (id ", t, ") is not one its ", params.GrammarField(),
                         " allows"),
            state);
      break;
    }
    state->fed.push_back(t);
  }
  bool complete = false;
  if (!state->broken()) {
    const int64_t start = MonotonicNanos();
    const int32_t count = masks_.Allowed(*state->matcher, allowed);
    mask_seconds_ += static_cast<double>(MonotonicNanos() - start) * 1e-9;
    complete = state->matcher->Complete();
    if (count == 0 && !complete) {
      Break(id,
            absl::StrCat(
                "structured outputs: no token can go on with the document after ", output.size(),
                " tokens: the ", params.GrammarField(), "'s readings passed ",
                grammar::kMaxAlternatives, " at once (anyOf branches that stay alike for long)",
                params.grammar.empty()
                    ? ""
                    : absl::StrCat(" or its rules nested deeper than ", grammar::kMaxGrammarDepth)),
            state);
    }
  }
  // The ids that end the request join the mask where it may end.
  if (state->broken()) allowed->assign((static_cast<size_t>(vocab.size()) + 31) / 32, 0);
  if (complete || state->broken()) {
    for (std::span<const int32_t> ends : {std::span<const int32_t>(eos_token_ids_),
                                          std::span<const int32_t>(params.stop_token_ids)}) {
      for (int32_t t : ends) {
        if (t < 0) continue;
        const size_t word = static_cast<size_t>(t) / 32;  // an id past the vocabulary too
        if (word >= allowed->size()) allowed->resize(word + 1, 0);
        (*allowed)[word] |= 1u << (t % 32);
      }
    }
  }
}

}  // namespace tandem::worker
