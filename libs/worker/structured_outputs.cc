#include "tandem/worker/structured_outputs.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::worker {
namespace {

// Schemas kept compiled; past it the cache starts again (each request
// compiles its schema once anyway: its matcher holds it).
constexpr size_t kMaxCached = 256;

bool Contains(std::span<const int32_t> ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
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
                                     std::vector<int32_t> eos_token_ids)
    : vocabulary_(std::move(vocabulary)), eos_token_ids_(std::move(eos_token_ids)) {}

std::shared_ptr<const grammar::Schema> StructuredOutputs::Compile(const std::string& text) {
  if (auto it = schemas_.find(text); it != schemas_.end()) return it->second;
  const auto json = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto compiled = grammar::CompileJsonSchema(json);
  if (!compiled.ok()) return nullptr;  // the scheduler refuses these at admission
  if (schemas_.size() >= kMaxCached) schemas_.clear();
  schemas_.emplace(text, *compiled);
  return *compiled;
}

void StructuredOutputs::Ban(const std::string& id, const SamplingParams& params,
                            std::span<const int32_t> output, GrammarState* state,
                            std::vector<int32_t>* banned) {
  const grammar::TokenVocabulary& vocab = *vocabulary_;
  const bool follows = state->matcher && state->fed.size() <= output.size() &&
                       std::equal(state->fed.begin(), state->fed.end(), output.begin());
  if (!follows) {
    state->fed.clear();
    state->broken = false;
    state->matcher.reset();
    if (std::shared_ptr<const grammar::Schema> schema = Compile(params.json_schema)) {
      state->matcher.emplace(std::move(schema));
    } else {
      state->broken = true;
      TANDEM_LOG(ERROR) << "request " << id << ": its json_schema does not compile on the worker; "
                        << "it is ended";
    }
  }
  for (size_t k = state->fed.size(); k < output.size() && !state->broken; ++k) {
    const int32_t t = output[k];
    const bool in_vocab = t >= 0 && t < vocab.size() && !vocab.bytes(t).empty();
    if (!in_vocab || !state->matcher->Accept(vocab.bytes(t))) {
      state->broken = true;
      TANDEM_LOG(ERROR) << "request " << id << ": output token " << k << " (id " << t
                        << ") is not one its json_schema allows; it is ended";
      break;
    }
    state->fed.push_back(t);
  }
  int32_t allowed = 0;
  bool complete = false;
  if (!state->broken) {
    allowed = grammar::AllowedTokens(*state->matcher, vocab, &mask_);
    complete = state->matcher->Complete();
    if (allowed == 0 && !complete) {
      state->broken = true;
      TANDEM_LOG(ERROR) << "request " << id << ": no token can go on with its document of "
                        << output.size() << " tokens (its schema's readings passed "
                        << grammar::kMaxAlternatives << " at once); it is ended";
    }
  }
  const bool may_end = complete || state->broken;
  for (int32_t t = 0; t < vocab.size(); ++t) {
    if (!state->broken && allowed > 0 && grammar::MaskAllows(mask_, t)) continue;
    if (may_end && (Contains(eos_token_ids_, t) || Contains(params.stop_token_ids, t))) continue;
    banned->push_back(t);
  }
}

}  // namespace tandem::worker
