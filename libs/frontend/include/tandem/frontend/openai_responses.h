// OpenAI's Responses API (POST /v1/responses) for a text model, as vLLM
// serves it without its response store: the request runs as a chat request
// (instructions as the system message, then the input's messages), and the
// answer is one assistant message in OpenAI's response object, or in its
// stream of typed events.
//
// Request (https://platform.openai.com/docs/api-reference/responses/create):
//   input: a string (one user message) or a list of items: messages
//   ({"role", "content"}, "type": "message" optional; role user, assistant,
//   system or developer, handed to the chat template as vLLM hands them;
//   content a string or a list of input_text / output_text parts),
//   function_call items (a call the model made: chat's tool_calls on the
//   assistant turn, joined to the assistant turn before it) and
//   function_call_output items (chat's tool message), and reasoning items
//   sent back (their reasoning_text goes with the assistant turn after
//   them as reasoning_content, which chat templates that show thinking
//   read; a summary or encrypted_content is dropped). instructions,
//   max_output_tokens (the chat's max_tokens: default the rest of the
//   context), temperature and top_p (unset: the model's generation_config
//   defaults, as chat), stream, metadata, user; and vLLM's extras that chat
//   takes too (top_k, min_p, seed, stop, ignore_eos, min_tokens,
//   repetition/presence/frequency penalties, logit_bias, priority,
//   skip_special_tokens, include_stop_str_in_output) and chat_template_kwargs
//   (Qwen3's enable_thinking).
//   tools: function tools ({"type": "function", "name", "description",
//   "parameters"}), as chat's tools with tool_choice "auto" (under
//   --enable-auto-tool-choice, whose parser reads the calls out of the
//   answer) or "none" (rendered into the prompt only); other kinds of tools
//   and forced tool choices are refused as chat refuses them.
//   store: accepted, and nothing is stored (vLLM's default: its store is
//   off unless VLLM_ENABLE_RESPONSES_API_STORE); the response says
//   "store": false. So previous_response_id is a 404 (no response is ever
//   found, as in vLLM) and background mode a 400.
//   include: message.output_text.logprobs (then each token's logprob and
//   top_logprobs alternatives, chat's shape, in the text part and in each
//   delta), and what asks for items never produced here (reasoning,
//   hosted tools, images), which adds nothing.
//   Refused by name: text.format other than text (structured outputs),
//   reasoning settings, other include entries, truncation "auto", prompt templates,
//   conversation, images, files and audio in the input, and other input
//   items (item references, hosted tools' calls). Unknown fields are ignored, as chat
//   does.
// Response: {"id": "resp_...", "object": "response", "status": "completed"
// (or "incomplete" with incomplete_details {"reason": "max_output_tokens"}
// when max_output_tokens ended it), "output": [the message with one
// output_text part (left out when the answer only called tools), then a
// function_call item per call: {"id": "fc_...", "call_id", "name",
// "arguments"}], "usage": {input_tokens, input_tokens_details
// {cached_tokens}, output_tokens, output_tokens_details {reasoning_tokens},
// total_tokens}, and the request's settings: temperature, top_p and
// max_output_tokens as run}. Streams are OpenAI's: "event: TYPE" and
// "data: {...}" lines; response.created, response.in_progress,
// response.output_item.added, response.content_part.added, a
// response.output_text.delta per piece of text, then
// response.output_text.done, response.content_part.done,
// response.output_item.done, each call's item events, and
// response.completed (response.incomplete when cut at max_output_tokens, as
// OpenAI ends it; vLLM sends completed), with one msg_ id throughout and
// sequence numbers from 0; no [DONE]. A stream holds back text that may be
// a tool call as chat's does (ToolCallStream), so it carries exactly the
// answer not streamed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "tandem/frontend/openai.h"
#include "tandem/frontend/tool_calls.h"

namespace tandem::frontend {

// Parses a /v1/responses body into the request it runs as (endpoint
// kResponses, messages built from instructions and input, `responses` set).
// On error returns the error naming the Responses field; `out` is then
// unspecified.
[[nodiscard]] std::optional<ApiError> ParseResponsesRequest(std::string_view body,
                                                            CompletionRequest* out);

// How the response ran, for its settings fields.
struct ResponsesRun {
  std::string message_id;    // "msg_..."
  std::string reasoning_id;  // "rs_...": the thinking's item (--reasoning-parser)
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t max_output_tokens = 0;  // the max_tokens the choice ran with
};

// The answer: its text and the calls it made (under
// --enable-auto-tool-choice, the parser's), its finish and usage.
struct ResponsesOutput {
  std::string text;
  std::vector<ToolCall> calls;
  FinishReason finish = FinishReason::kNone;
  Usage usage;
  // With include message.output_text.logprobs: chat's logprobs content
  // list (token, logprob, bytes, top_logprobs), for the text.
  nlohmann::ordered_json logprobs = nlohmann::ordered_json::array();
  // Under --reasoning-parser: the thinking, a reasoning item before the
  // message (which is left out when the answer is only thinking).
  std::optional<std::string> reasoning;
};

// The response object; `output` null: in progress (no output, usage null).
[[nodiscard]] nlohmann::ordered_json ResponsesObject(const CompletionRequest& request,
                                                     const ResponseHead& head,
                                                     const ResponsesRun& run,
                                                     const ResponsesOutput* output);

// A stream's events, in order; keeps the sequence number and the text.
class ResponsesEvents {
 public:
  ResponsesEvents(const CompletionRequest& request, const ResponseHead& head, ResponsesRun run);
  // response.created and response.in_progress.
  [[nodiscard]] std::string Start();
  // Under --reasoning-parser: response.reasoning_text.delta (after the
  // reasoning item's output_item.added and content_part.added, with its
  // first text); "" for an empty piece, or once the message has begun.
  [[nodiscard]] std::string ReasoningDelta(std::string_view text);
  // response.output_text.delta (after the reasoning item's done events and
  // the message's output_item.added and
  // content_part.added, with its first text); "" for an empty piece.
  // `logprobs` (a list, or null) are the text's tokens'; kept for the done
  // events also when the text is held back.
  [[nodiscard]] std::string Delta(std::string_view text,
                                  const nlohmann::ordered_json& logprobs = nullptr);
  // The message's done events (its added ones too when it had no text and
  // nothing was called), each call's item (output_item.added, one
  // function_call_arguments.delta with all of them, .done,
  // output_item.done), and response.completed (response.incomplete at
  // max_output_tokens) with `usage`.
  [[nodiscard]] std::string Finish(FinishReason finish, const Usage& usage,
                                   const std::vector<ToolCall>& calls = {});
  // OpenAI's error event, for a stream that cannot finish.
  [[nodiscard]] std::string Error(const ApiError& error);

 private:
  std::string Event(std::string_view type, nlohmann::ordered_json data);
  std::string StartMessage();
  std::string EndReasoning();

  const CompletionRequest& request_;
  const ResponseHead& head_;
  ResponsesRun run_;
  std::string text_;
  nlohmann::ordered_json logprobs_ = nlohmann::ordered_json::array();
  std::optional<std::string> reasoning_;
  int32_t next_index_ = 0;  // the next output item's index
  int32_t reasoning_index_ = -1;
  int32_t message_index_ = -1;
  bool reasoning_done_ = false;
  int64_t sequence_ = 0;
};

}  // namespace tandem::frontend
