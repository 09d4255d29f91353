#include "completion_choice.h"

#include <algorithm>

namespace tandem::frontend {
namespace {

PositionLogprobs ToPosition(const ServedTokenizer& served, const TokenLogprobs& lp) {
  PositionLogprobs p{.token = {.token_id = lp.token_id,
                               .bytes = served.TokenBytes(lp.token_id),
                               .logprob = lp.logprob},
                     .rank = lp.rank};
  for (size_t i = 0; i < lp.top_token_ids.size() && i < lp.top_logprobs.size(); ++i) {
    p.top.push_back({.token_id = lp.top_token_ids[i],
                     .bytes = served.TokenBytes(lp.top_token_ids[i]),
                     .logprob = lp.top_logprobs[i]});
  }
  return p;
}

// An unscored position: the prompt's first token, or one the scheduler sent
// no logprobs for.
PositionLogprobs Unscored(const ServedTokenizer& served, int32_t token_id) {
  return {.token = {.token_id = token_id, .bytes = served.TokenBytes(token_id)}, .scored = false};
}

// The prompt's positions, scored from `scored` (GenerateResponse
// .prompt_logprobs: positions 1 .. P-1) where it has them.
std::vector<PositionLogprobs> PromptPositionsOf(const ServedTokenizer& served,
                                                const std::vector<int32_t>& prompt,
                                                const std::vector<TokenLogprobs>& scored) {
  std::vector<PositionLogprobs> out;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i > 0 && i - 1 < scored.size()) {
      out.push_back(ToPosition(served, scored[i - 1]));
    } else {
      out.push_back(Unscored(served, prompt[i]));
    }
  }
  return out;
}

}  // namespace

// The detokenizer let out `bytes` more: every token still waiting for its
// text has it now.
void ChoiceState::Detokenized(size_t bytes) {
  detok_bytes += static_cast<int64_t>(bytes);
  if (bytes == 0) return;
  for (auto it = pending_logprobs.rbegin(); it != pending_logprobs.rend() && !it->end; ++it) {
    it->end = detok_bytes;
  }
}

ChoiceDelta ChoiceState::Take(const GenerateResponse& msg, const CompletionRequest& request,
                              const ServedTokenizer& served) {
  ChoiceDelta out;
  const bool final = msg.finish_reason != FinishReason::kNone;
  if (PromptLogprobsToAsk(request) && !has_prompt_logprobs &&
      (!msg.token_ids.empty() || !msg.prompt_logprobs.empty())) {
    prompt_logprobs = PromptPositionsOf(served, call_request.prompt_token_ids, msg.prompt_logprobs);
    has_prompt_logprobs = true;
  }
  auto stop = [&](const StopStringMatcher::Step& step) {
    out.text += step.text;
    if (!step.stopped) return false;
    if (request.include_stop_str_in_output) out.text += step.matched;
    finish = FinishReason::kStop;
    stop_reason = step.matched;
    stop_token.reset();
    return true;
  };
  for (size_t k = 0; k < msg.token_ids.size() && !done; ++k) {
    const int32_t t = msg.token_ids[k];
    produced = true;
    token_ids.push_back(t);
    out.ids.push_back(t);
    ++completion_tokens;
    if (request.logprobs) {
      pending_logprobs.push_back({.position = k < msg.logprobs.size()
                                                  ? ToPosition(served, msg.logprobs[k])
                                                  : Unscored(served, t),
                                  .start = detok_bytes});
    }
    const bool last = k + 1 == msg.token_ids.size();
    // The EOS or stop token that ended the request: counted and returned,
    // its text left out (vLLM's detokenizer skips it unless
    // include_stop_str_in_output). A scheduler older than last_token_stops
    // sends no EOS and marks no stop token.
    const bool in_stop_ids = std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(),
                                       t) != request.stop_token_ids.end();
    if (final && last && msg.finish_reason == FinishReason::kStop &&
        (msg.last_token_stops || in_stop_ids)) {
      if (in_stop_ids) stop_token = t;  // stop_reason: the id; null for EOS
      if (!request.include_stop_str_in_output) continue;
    }
    absl::StatusOr<std::string> piece = detok->Push(t);
    if (!piece.ok()) continue;  // outside the tokenizer's vocabulary: no text
    Detokenized(piece->size());
    // vLLM's min_tokens: no stop string ends one of the first min_tokens.
    if (stop(stops->Push(*piece, completion_tokens > request.min_tokens))) {
      done = true;
      out.stopped = true;  // the scheduler frees its blocks
    }
  }
  if (final && !done) {
    const std::string rest = detok->Finish();
    Detokenized(rest.size());
    if (!stop(stops->Push(rest, completion_tokens > request.min_tokens))) {
      out.text += stops->Finish();
      finish = msg.finish_reason;
    }
    done = true;
    completion_tokens = msg.usage ? msg.usage->output_tokens : 0;
  }
  // Fixed from the first token on (the scheduler sends them with every
  // message), so a choice a stop string ends keeps them.
  if (msg.usage) {
    cached_tokens = int64_t{msg.usage->cached_tokens_local} + msg.usage->cached_tokens_external;
  }
  out_bytes += static_cast<int64_t>(out.text.size());
  if (request.logprobs) ReleaseLogprobs();
  return out;
}

// A token's logprobs are released once the stop-string matcher has let out
// its text. When a stop string ends the choice, the tokens whose text starts
// before the cut are reported (the one that holds the stop string's start
// too: its text is partly out; with include_stop_str_in_output the cut is
// after the stop string) and those after it are not, as their text is not.
// EOS, a stop token and length report every token (EOS and a stop token
// with their empty text), as vLLM does.
void ChoiceState::ReleaseLogprobs() {
  const bool cut = done && finish == FinishReason::kStop && !stop_reason.empty();
  while (!pending_logprobs.empty()) {
    PendingLogprobs& p = pending_logprobs.front();
    if (!done && (!p.end || *p.end > out_bytes)) break;
    if (!cut || p.start < out_bytes) logprobs.push_back(std::move(p.position));
    pending_logprobs.pop_front();
  }
}

const std::vector<PositionLogprobs>& ChoiceState::PromptPositions(const ServedTokenizer& served) {
  if (!has_prompt_logprobs) {
    prompt_logprobs = PromptPositionsOf(served, call_request.prompt_token_ids, {});
  }
  return prompt_logprobs;
}

nlohmann::ordered_json ChoiceState::RenderLogprobs(const CompletionRequest& request,
                                                   const ServedTokenizer& served, bool first) {
  if (!request.logprobs) return nullptr;
  std::vector<PositionLogprobs> positions;
  if (first && request.echo) {
    PromptPositions(served);
    positions = std::move(prompt_logprobs);
  }
  positions.insert(positions.end(), std::make_move_iterator(logprobs.begin()),
                   std::make_move_iterator(logprobs.end()));
  logprobs.clear();
  const bool as_ids = request.return_tokens_as_token_ids.value_or(false);
  if (request.endpoint == Endpoint::kChat) {
    return ChatLogprobs(positions, *request.logprobs, as_ids);
  }
  if (request.endpoint == Endpoint::kResponses) {
    nlohmann::ordered_json chat = ChatLogprobs(positions, *request.logprobs, as_ids);
    return std::move(chat["content"]);
  }
  return CompletionLogprobs(positions, *request.logprobs, &text_offset, as_ids);
}

}  // namespace tandem::frontend
