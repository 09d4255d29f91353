// The OpenAI HTTP API of tandem-frontend, as plain data: request bodies
// parsed and validated into CompletionRequest, errors as OpenAI's error
// object, and the JSON of responses and stream chunks. No sockets, no gRPC
// (services/frontend is the adapter), so every rule here has an in-process
// test (tests/frontend/openai_test.cc).
//
// A change to DESIGN §1: libs/frontend is a library the table there does not
// list (frontend protocol and routing policy, depending on Abseil,
// nlohmann_json and tandem::common's plain types only); services/frontend is
// the HTTP + gRPC adapter, the way the other services adapt their libraries.
//
// Field by field it follows OpenAI's documented API and vLLM's extensions
// (https://platform.openai.com/docs/api-reference/completions,
// vLLM's protocol.py):
//   /v1/completions       prompt: string | [string] | [int] | [[int]]; echo
//                         (with max_tokens 0: the prompt alone, scored);
//                         max_tokens defaults to 16 (vLLM's and OpenAI's)
//   /v1/chat/completions  messages (rendered by the model's chat template,
//                         with chat_template_kwargs as more variables);
//                         max_tokens defaults to the rest of the context
//   both: model, max_tokens / max_completion_tokens, temperature, top_p, min_p,
//   top_k, min_tokens (no EOS, stop token or stop string ends one of the
//   first min_tokens, as in vLLM; more than max_tokens, or than the context
//   leaves, is a 400), seed, n, stop (string or list, matched on text, left
//   out of the output unless include_stop_str_in_output), stop_token_ids,
//   vLLM's allowed_token_ids and bad_words, ignore_eos, stream, stream_options.include_usage and
//   vLLM's stream_options.continuous_usage_stats, user, add_special_tokens, skip_special_tokens,
//   and vLLM's include_stop_str_in_output, truncate_prompt_tokens (the last N prompt tokens; -1 =
//   max_model_len; 0, < -1 and > max_model_len refused), priority (forwarded to the scheduler;
//   lower = more important; a scheduler without --scheduling-policy priority refuses a non-zero
//   one, as vLLM does) and return_token_ids (choices carry `token_ids`; `prompt_token_ids` is in
//   each completions choice and beside chat's choices, in a stream with a choice's first chunk, as
//   vLLM puts them: the documented way to see the ids). Log-probabilities (the scheduler's, vLLM's
//   raw_logprobs: log-softmax of the raw logits, before temperature, top-k, top-p and min-p), each
//   count in [0, the scheduler's --max-logprobs] (400 naming the field and the limit otherwise):
//   completions' logprobs N (with echo the prompt's tokens come first, the first one unscored),
//   chat's logprobs + top_logprobs N (top_logprobs > 0 without logprobs is a 400, as in vLLM), and
//   vLLM's prompt_logprobs N (refused with stream, as vLLM does; a list per completions choice, one
//   list on the chat response, as vLLM puts them). See the rendering functions below for the shapes
//   and where vLLM and OpenAI differ.
// Text is the prompt-primed decode: Decode(prompt + output) minus
// Decode(prompt), so the first word keeps its leading space as in vLLM.
// Every other field of vLLM's CompletionRequest and ChatCompletionRequest
// is refused with a 400 that names it unless it has its neutral value
// (absent, null, or the value that changes nothing; vllm_fields_test walks
// vLLM's lists): logits_processors, best_of > 1, use_beam_search,
// length_penalty, guided_* / structural_tag / structured_outputs and response_format other than
// JSON, a choice, a regex or a grammar, suffix, prompt_embeds, tool_choice "auto" without a tool
// parser (the tools are rendered into the chat prompt, and an assistant turn's tool_calls arguments
// parsed into objects, as vLLM does; "required" and a named tool constrain the output to calls),
// reasoning_effort, include_reasoning false without a reasoning parser, a
// spaces_between_special_tokens false, kv_transfer_params, vllm_xargs, mm_processor_kwargs and
// media_io_kwargs; of OpenAI's chat fields beyond vLLM's, those that change the answer: functions,
// function_call, audio, modalities other than ["text"], web_search_options
// and verbosity; stream_options.include_obfuscation true. OpenAI's fields
// that do not change the answer (prediction, store, metadata, service_tier,
// prompt_cache_key, safety_identifier) and unknown fields are ignored, as
// OpenAI's SDKs send fields a server may not know.
//
// temperature, top_p, top_k, min_p and repetition_penalty a request leaves
// unset (absent or null) take the served model's default from its
// generation_config.json, as vLLM's --generation-config auto does, and only
// without one OpenAI's default (EffectiveSampling). presence_penalty,
// frequency_penalty and repetition_penalty are vLLM's (SamplingParams).
//
// Choice i of n with a seed s uses seed s + i, so that n > 1 gives n
// different samples that are each reproducible alone (vLLM seeds them from
// one generator; its exact sequences are not reproducible here).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "tandem/common/finish_reason.h"
#include "tandem/common/sampling_params.h"
#include "tandem/frontend/reasoning.h"
#include "tandem/frontend/tool_calls.h"

namespace tandem::frontend {

// An error the way OpenAI returns it: HTTP status plus
// {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault; "" = null
  std::string code;   // e.g. "model_not_found"; "" = null

  [[nodiscard]] std::string ToJson() const;
};

[[nodiscard]] ApiError BadRequest(std::string message, std::string param = "");

// kResponses: /v1/responses, run as a chat request (openai_responses.h).
enum class Endpoint { kCompletions, kChat, kResponses };

// /v1/responses: the request's settings its response object repeats.
struct ResponsesFields {
  nlohmann::ordered_json instructions;  // a string or null
  nlohmann::ordered_json metadata;      // an object or null
  nlohmann::ordered_json user;          // a string or null
  nlohmann::ordered_json max_tool_calls;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // as given
  nlohmann::ordered_json tool_choice = "auto";                     // as given
  bool parallel_tool_calls = true;
  int32_t top_logprobs = 0;
  bool include_logprobs = false;  // include: message.output_text.logprobs
  std::string service_tier = "auto";
};

// One prompt of a completions request: text, or token ids as given.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> token_ids;  // when !text
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                      // "" when the client sent none
  std::vector<PromptInput> prompts;       // completions: one or more
  nlohmann::ordered_json messages;        // chat: the conversation
  bool add_generation_prompt = true;      // chat
  // chat: vLLM's continue_final_message, the template rendered up to the end
  // of the last message's text (transformers' rule, ChatTemplateInputs);
  // add_generation_prompt left out is then false, sent true a 400.
  bool continue_final_message = false;
  // chat: the answer's role, as vLLM's get_chat_request_role: "assistant"
  // with add_generation_prompt, else the last message's role.
  std::string response_role = "assistant";
  // chat echo (vLLM's): the last message's content (non-empty parts joined
  // by "\n") goes before the answer's content when that message's role is
  // the answer's, "" otherwise; nullopt without echo.
  std::optional<std::string> chat_echo;
  // nullopt: kDefaultCompletionsMaxTokens on /v1/completions (vLLM's
  // default), up to max_model_len on chat; either way at most what the
  // context leaves after the prompt.
  std::optional<int32_t> max_tokens;
  // The prefix-cache salt the scheduler gets (Frontend::Handle): the
  // caller's tenant's, from the API key (FrontendOptions::tenants), and the
  // body's cache_salt within it (never the tenant's from the body).
  std::string cache_salt;
  // vLLM's cache_salt as the body sent it: requests share cached prefixes
  // only with requests of the same salt (and tenant). Not empty when sent.
  std::optional<std::string> client_cache_salt;
  // nullopt: the request left it unset (see EffectiveSampling).
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;  // 0 = off (vLLM's -1 accepted too)
  std::optional<float> min_p;    // [0, 1]; 0 = off
  std::optional<float> presence_penalty;    // [-2, 2]
  std::optional<float> frequency_penalty;   // [-2, 2]
  std::optional<float> repetition_penalty;  // > 0
  // OpenAI's logit_bias, sorted by id, biases clamped to [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's bad_words, as sent; PreparePrompts tokenizes them.
  std::vector<std::string> bad_words;
  int32_t min_tokens = 0;
  std::optional<int64_t> seed;
  int32_t n = 1;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  // vLLM's allowed_token_ids: not empty when sent (an empty list is a 400).
  std::vector<int32_t> allowed_token_ids;
  // Structured outputs (SamplingParams::json_schema): the JSON text of the
  // schema every choice is a document of, from response_format or vLLM's
  // structured_outputs; "" when the request has none.
  std::string json_schema;
  // vLLM's structured_outputs.choice (SamplingParams::choice): each choice is
  // exactly one of these strings; empty when the request has none.
  std::vector<std::string> choice;
  // vLLM's structured_outputs.regex (SamplingParams::regex): each choice is
  // text the pattern matches whole; "" when the request has none.
  std::string regex;
  // vLLM's structured_outputs.grammar (SamplingParams::grammar): each choice
  // is text of this grammar (xgrammar's EBNF); "" when the request has none.
  std::string grammar;
  // vLLM's structured_outputs.disable_any_whitespace, with json_schema only
  // (SamplingParams::disable_any_whitespace).
  bool disable_any_whitespace = false;
  std::string json_schema_field;  // the request's field any of them came from
  bool HasGrammar() const {
    return !json_schema.empty() || !choice.empty() || !regex.empty() || !grammar.empty();
  }
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage
  // stream_options.continuous_usage_stats (vLLM's): every chunk carries its
  // choice's usage so far. It implies include_usage unless that is false, as
  // include_usage defaults to true in vLLM's stream_options.
  bool continuous_usage = false;
  std::string user;
  // vLLM's request id (completions and chat): the response's id is the
  // endpoint's prefix and it ("chatcmpl-<id>"), taken from the X-Request-Id
  // header, else the body's request_id (Frontend::Handle); nullopt: a random
  // id. The scheduler's ids stay the frontend's own, random and unique.
  std::optional<std::string> request_id;
  bool echo = false;                      // completions only
  std::optional<bool> add_special_tokens; // nullopt: true (completions), false (chat)
  bool skip_special_tokens = true;
  bool return_token_ids = false;
  // vLLM's return_tokens_as_token_ids: each token of the logprobs
  // (completions' and chat's) reads "token_id:<id>"; nullopt: the server's
  // --return-tokens-as-token-ids decides (Frontend::ApplyServerOptions).
  std::optional<bool> return_tokens_as_token_ids;
  // vLLM's: the stop string (or stop_token_ids token) that ended a choice
  // stays in its text.
  bool include_stop_str_in_output = false;
  // vLLM's: keep only the last N tokens of each prompt (-1: max_model_len;
  // more than max_model_len is a 400 when the model is known).
  std::optional<int32_t> truncate_prompt_tokens;
  // vLLM's: the scheduler's priority (lower = more important); it matters
  // under --scheduling-policy priority.
  int32_t priority = 0;
  // Chat: more variables for the chat template (e.g. enable_thinking); an
  // object, or null.
  nlohmann::ordered_json chat_template_kwargs;
  // Chat: vLLM's per-request template source (chat_template_kwargs'
  // chat_template over the body's chat_template, as vLLM merges them); the
  // server takes it only under --trust-request-chat-template.
  std::optional<std::string> chat_template;
  // Chat with tool_choice "none": the tools, as vLLM passes them to the
  // template (each {"type": "function", "function": {"name", "description",
  // "parameters"}}); null when the request has none.
  nlohmann::ordered_json tools;
  // Chat: vLLM's documents (RAG templates such as Granite's and Command R's
  // read them): a list of objects of strings, as sent; null when none.
  nlohmann::ordered_json documents;
  // Chat with tools: "none" (rendered into the prompt only), "auto"
  // (vLLM's default when tools are given), "required" or "named" (the
  // output constrained to calls: forced_tool); "" without tools.
  std::string tool_choice;
  // tool_choice "required" or a named tool: json_schema holds the calls'
  // JSON, read back by ExtractForcedToolCalls (tool_calls.h).
  std::optional<ForcedToolChoice> forced_tool;
  // Set by the server, not the body: tool_choice "auto" under
  // --enable-auto-tool-choice; the answer's tool calls are parsed out of its
  // text by this parser (tool_calls.h).
  std::optional<ToolParser> tool_parser;
  // parallel_tool_calls: false keeps an answer's first tool call only
  // (vLLM's maybe_filter_parallel_tool_calls; the model is not constrained).
  bool parallel_tool_calls = true;
  // Set by the server, not the body: chat and /v1/responses under
  // --reasoning-parser; the answer's thinking is split out of its text
  // (reasoning.h).
  std::optional<ReasoningParser> reasoning_parser;
  // vLLM's include_reasoning (chat): false leaves the thinking out of the
  // answer; only with a reasoning_parser (the server refuses it otherwise).
  bool include_reasoning = true;
  // Log-probabilities of each output token and of its N most likely
  // alternatives: completions' `logprobs`, chat's `top_logprobs` (0 when
  // absent) when `logprobs` is true. nullopt: none.
  std::optional<int32_t> logprobs;
  // vLLM's prompt_logprobs: the same for each prompt token after the first.
  std::optional<int32_t> prompt_logprobs;
  // Set on /v1/responses.
  std::optional<ResponsesFields> responses;
};

// max_tokens of a /v1/completions request that sends none, as vLLM's
// CompletionRequest (and OpenAI's) default.
inline constexpr int32_t kDefaultCompletionsMaxTokens = 16;

// Limits the parser enforces.
inline constexpr int32_t kMaxN = 16;
inline constexpr int32_t kMaxPrompts = 64;     // prompts in one completions request
inline constexpr int32_t kMaxStopStrings = 16;
// JSON nested deeper than this (a request body, a tool call's arguments) is
// a 400 before it is parsed: Python's json, which vLLM reads bodies with,
// gives up about as deep, and nlohmann's copies, comparisons and dumps
// recurse (100,000 brackets ran the frontend out of stack).
inline constexpr int kMaxJsonNesting = 1000;
// Whether `text` opens more than `limit` arrays and objects inside one
// another (brackets in strings do not count): one pass, no recursion.
[[nodiscard]] bool JsonNestedDeeperThan(std::string_view text, int limit = kMaxJsonNesting);
// The 400 for such a body.
[[nodiscard]] ApiError TooDeeplyNested(std::string_view what, std::string param = "");

// Parses and validates a request body. On error returns the 400 that names
// the field; `out` is then unspecified.
[[nodiscard]] std::optional<ApiError> ParseCompletionRequest(std::string_view body,
                                                             Endpoint endpoint,
                                                             CompletionRequest* out);

// A logprobs count above the scheduler's limit (GetModelInfoResponse
// .max_logprobs): the 400 naming the field and the limit.
[[nodiscard]] std::optional<ApiError> CheckLogprobsLimit(const CompletionRequest& request,
                                                         int32_t max_logprobs);
// The count to ask the scheduler for prompt logprobs (the request's
// prompt_logprobs, and with echo its logprobs), nullopt for none.
[[nodiscard]] std::optional<int32_t> PromptLogprobsToAsk(const CompletionRequest& request);

// The sampling a request runs with.
struct RequestSampling {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;    // 0 = off
  float min_p = 0.0f;   // 0 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // 1 = off
};
// Each field: the request's own value, else `model_defaults`' (the served
// model's generation_config.json; its top_k <= 0 = off), else OpenAI's
// (temperature 1, top_p 1, top_k off, min_p off, repetition_penalty off).
// presence_penalty and frequency_penalty have no model default (0 = off).
[[nodiscard]] RequestSampling EffectiveSampling(const CompletionRequest& request,
                                                const GenerationDefaults& model_defaults);

// The error for a gRPC status from a scheduler (absl/gRPC code numbers are
// the same): INVALID_ARGUMENT 400, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503,
// DEADLINE_EXCEEDED 504, everything else 500.
[[nodiscard]] ApiError FromStatus(int code, std::string_view message);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // local + external prefix-cache tokens
  [[nodiscard]] nlohmann::ordered_json ToJson() const;
};

// Log-probabilities at one position (tandem.v1.TokenLogprobs), with each
// token's own bytes (tokenizer::PieceBytes).
struct LogprobToken {
  int32_t token_id = 0;
  std::string bytes;
  float logprob = 0;
};
struct PositionLogprobs {
  LogprobToken token;             // the sampled token, or the prompt's
  int32_t rank = 0;               // 1 = the most likely
  std::vector<LogprobToken> top;  // the most likely, most likely first
  bool scored = true;             // false: the prompt's first token (no logprob)
};

// The logprobs of /v1/completions (a choice, or one chunk of a stream), in
// OpenAI's shape as vLLM's _create_completion_logprobs writes it:
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. An unscored
// position (echo's first prompt token) has null token_logprobs and
// top_logprobs. top_logprobs[i] maps token text to logprob: the position's
// own token first, then its `num_top` most likely (one key when texts
// coincide, the later value winning, as vLLM's dict). Logprobs are clamped at
// -9999.0 (-inf has no JSON). text_offset: `*text_offset` first, each next
// the previous plus the previous token's text length in code points (as
// Python's len); `*text_offset` is left at the next one, so a stream's chunks
// continue where the last left off and add up to the non-streamed lists
// (vLLM starts each chunk at the length of the text streamed so far instead).
// With `as_token_ids` (vLLM's return_tokens_as_token_ids) every token text
// is "token_id:<id>", in the offsets' lengths too.
[[nodiscard]] nlohmann::ordered_json CompletionLogprobs(
    const std::vector<PositionLogprobs>& positions, int32_t num_top, int64_t* text_offset,
    bool as_token_ids = false);
// The logprobs of /v1/chat/completions: {"content": [{"token", "logprob",
// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}. As OpenAI:
// top_logprobs holds the `num_top` most likely, most likely first (vLLM's
// list starts with the sampled token instead); `bytes` are the token's own
// bytes, even when they are not UTF-8 alone (vLLM encodes the U+FFFD text).
// `as_token_ids`: each token "token_id:<id>", its bytes that text's.
[[nodiscard]] nlohmann::ordered_json ChatLogprobs(const std::vector<PositionLogprobs>& positions,
                                                  int32_t num_top, bool as_token_ids = false);
// vLLM's prompt_logprobs: per prompt position null (unscored) or
// {"<token id>": {"logprob", "rank", "decoded_token"}} for the prompt's token
// and then its `num_top` most likely (ranks 1..num_top).
[[nodiscard]] nlohmann::ordered_json PromptLogprobs(const std::vector<PositionLogprobs>& positions,
                                                    int32_t num_top);

// One finished choice of a non-streaming response.
struct Choice {
  int32_t index = 0;
  std::string text;
  bool content_null = false;         // chat: "content": null (tool calls and no text)
  std::vector<ToolCall> tool_calls;  // chat with a tool_parser: finish "tool_calls"
  // Chat with a reasoning_parser: the thinking ("reasoning" and
  // "reasoning_content" beside the content); nullopt: none.
  std::optional<std::string> reasoning;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;             // the stop string that ended it, if any
  std::optional<int32_t> stop_token;   // or the stop token id
  std::vector<int32_t> token_ids;      // when return_token_ids
  // Rendered CompletionLogprobs / ChatLogprobs; null when not asked.
  nlohmann::ordered_json logprobs;
  // Rendered PromptLogprobs; null when not asked. Chat puts the first
  // choice's on the response (vLLM's ChatCompletionResponse.prompt_logprobs).
  nlohmann::ordered_json prompt_logprobs;
};

// Identity shared by a response and its chunks.
struct ResponseHead {
  std::string id;        // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;   // unix seconds
  std::string model;
};

[[nodiscard]] nlohmann::ordered_json CompletionResponse(
    const CompletionRequest& request, const ResponseHead& head, const std::vector<Choice>& choices,
    const Usage& usage, const std::vector<std::vector<int32_t>>& prompt_token_ids);

// One SSE event ("data: {...}\n\n") of a stream: a text delta of choice
// `index`, with finish_reason when it is the choice's last. Chat streams
// start each choice with a delta carrying the role (first = true).
struct ChunkDelta {
  int32_t index = 0;
  std::string text;
  bool first = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;
  std::optional<int32_t> stop_token;
  std::vector<int32_t> token_ids;  // when return_token_ids
  // Chat with a reasoning_parser: thinking this chunk carries ("reasoning"
  // and "reasoning_content" in the delta); "" for none.
  std::string reasoning;
  // The choice's prompt, in its first chunk when return_token_ids.
  const std::vector<int32_t>* prompt_token_ids = nullptr;
  // The logprobs of the tokens whose text this chunk carries: rendered
  // CompletionLogprobs / ChatLogprobs; null when not asked.
  nlohmann::ordered_json logprobs;
  // Chat: the delta's tool_calls (with "index"; RenderToolCalls), null for
  // none; with them the finish reason is "tool_calls".
  nlohmann::ordered_json tool_calls;
  // The choice's usage so far, with CompletionRequest::continuous_usage.
  std::optional<Usage> usage;
};
[[nodiscard]] std::string StreamChunk(const CompletionRequest& request, const ResponseHead& head,
                                      const ChunkDelta& delta);
// The usage chunk (choices: []) sent before [DONE] with include_usage.
[[nodiscard]] std::string StreamUsageChunk(const CompletionRequest& request,
                                           const ResponseHead& head, const Usage& usage);
// An error inside a stream that has already started (HTTP status 200 is
// gone): an event carrying the error object, as vLLM sends it.
[[nodiscard]] std::string StreamErrorEvent(const ApiError& error);
inline constexpr std::string_view kStreamDone = "data: [DONE]\n\n";

// A fresh response id: prefix + 32 hex digits.
[[nodiscard]] std::string NewResponseId(std::string_view prefix);

}  // namespace tandem::frontend
