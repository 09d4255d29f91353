// Chat templates: turn a conversation into the prompt text a model was trained
// on, as Hugging Face's apply_chat_template does.
//
//   TANDEM_ASSIGN_OR_RETURN(ChatTemplate t, tokenizer.chat_template()
//       ? ChatTemplate::Parse(*tokenizer.chat_template())
//       : ChatTemplate::Builtin("llama-3"));
//   TANDEM_ASSIGN_OR_RETURN(std::string prompt, t.Render({
//       .messages = request["messages"], .add_generation_prompt = true,
//       .bos_token = tokenizer.bos_token(), .eos_token = tokenizer.eos_token()}));
//   // then Encode(prompt, {.add_special_tokens = false}) when the template
//   // writes bos_token itself.
//
// Templates are Jinja, rendered as transformers renders them (trim_blocks and
// lstrip_blocks on; a single trailing newline of the template dropped). The
// subset supported: text, {{ }}, {# #}, whitespace control (-), {% if/elif/
// else %}, {% for a[, b] in x [if cond] %} with loop.index/index0/first/last/
// length/revindex/revindex0 and {% else %}, {% set x = ... %} and
// {% set ns.attr = ... %} with namespace(); literals (strings, integers,
// true/false/none, lists, dicts), attribute and item access, slices, + - * /
// // % ~, comparisons, in / not in, and/or/not, `a if c else b`; the tests
// defined, undefined, none, string, number, integer, mapping, sequence,
// iterable, boolean, true, false, equalto/eq/==, ne, odd, even, in; the
// filters trim, length/count, list, first, last, lower, upper, capitalize,
// title, string, int, join, default/d, replace, reverse, tojson, items,
// selectattr, rejectattr, map(attribute=...); string methods strip/lstrip/
// rstrip/startswith/endswith/split/replace/upper/lower/title, dict methods
// items/keys/values/get; raise_exception(msg), range() and strftime_now(fmt)
// (the local time, as transformers and vLLM give it; these globals are
// `defined`). Anything else
// (macros, {% call %}, blocks, unknown filters) makes Parse fail with a
// message naming it: use a built-in template then.
//
// Values print as @huggingface/jinja prints them (true/false, none and
// undefined as nothing; Python would print True/False/None); strings are
// measured, indexed and sliced by code point, as in Python; tojson writes
// Python's json.dumps (indent= and sort_keys= supported).
//
// Checked against @huggingface/jinja rendering the models' templates, the
// built-ins and feature-by-feature templates on a set of conversations
// (tests/tokenizer/reference_test.cc, data/chat_conversations.json), and on
// hand-checked cases (tests/tokenizer/chat_template_test.cc).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::tokenizer {

struct ChatTemplateInputs {
  // The conversation: an array of objects with at least "role" and
  // "content" (a string), in order; other fields (tool_calls, name, ...)
  // are visible to the template as they are.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // End with the header of an assistant turn, for the model to continue.
  bool add_generation_prompt = false;
  // transformers' continue_final_message: the rendered text ends with the
  // final message's content (its last text part for a list), without what
  // the template writes after it (an end-of-turn marker), for the model to
  // continue that message. As transformers: the content must appear in the
  // rendered text (stripped; the last occurrence is cut after), and
  // add_generation_prompt must be false; INVALID_ARGUMENT otherwise.
  bool continue_final_message = false;
  // The tokenizer's bos_token / eos_token texts (Tokenizer::bos_token()).
  std::string bos_token;
  std::string eos_token;
  // More variables the template may read (tools, date_string, ...): an
  // object, or null for none.
  nlohmann::ordered_json extra_context;
  // The render's work budget: each tag, expression and loop iteration is a
  // step, and past it the render fails (INVALID_ARGUMENT naming it). Far
  // above a real template's: 2,000 messages take under 100,000 steps with
  // each model template of the references (about a second's work at most
  // here, for a template that would otherwise loop for hours); a template
  // from a request (--trust-request-chat-template) could otherwise loop for
  // hours. Values are bounded too (64 MiB strings, 2^20 items), and
  // range() at Jinja's sandbox's 100,000.
  int64_t max_steps = 1'000'000;
};

// How a template reads a message's content, as vLLM detects it (its
// --chat-template-content-format auto): a string (the text parts joined by
// "\n"), or the list of OpenAI parts ({"type": "text", "text": ...}) that
// templates looping over `message['content']` expect.
enum class ContentFormat { kString, kOpenAi };

class ChatTemplate {
 public:
  // Compiles `source`; INVALID_ARGUMENT for a syntax error, UNIMPLEMENTED
  // for a construct outside the subset above, each with the line.
  [[nodiscard]] static absl::StatusOr<ChatTemplate> Parse(std::string_view source);
  // A template by name, for models whose tokenizer_config.json has none (or
  // one we cannot render): "llama-2" (Llama 2 chat, [INST] <<SYS>>),
  // "llama-3" (Llama 3 instruct headers), "chatml" (<|im_start|>, as Qwen
  // writes it without a default system prompt). NOT_FOUND otherwise.
  [[nodiscard]] static absl::StatusOr<ChatTemplate> Builtin(std::string_view name);
  // What a server's --chat-template flag selects: a built-in name, else a
  // path to a Jinja file; empty: the tokenizer's own chat_template.
  // FAILED_PRECONDITION when it is empty and the tokenizer has none, and
  // Parse's errors (naming the file or the tokenizer's template), each
  // suggesting the flag.
  [[nodiscard]] static absl::StatusOr<ChatTemplate> Select(std::string_view choice,
                                                           const Tokenizer& tokenizer);
  // The template for requests with tools, as transformers' get_chat_template
  // picks it: with `choice` empty, the tokenizer's "tool_use" one when it
  // names one (nullopt otherwise: the default serves them too); Parse's
  // errors naming it.
  [[nodiscard]] static absl::StatusOr<std::optional<ChatTemplate>> SelectToolUse(
      std::string_view choice, const Tokenizer& tokenizer);
  // The source of a built-in template (empty for an unknown name).
  static std::string_view BuiltinSource(std::string_view name);

  // The prompt. INVALID_ARGUMENT when the template raises an exception
  // (raise_exception, "roles must alternate") or an expression fails (`+` of
  // a string and a list, attribute of an undefined value).
  [[nodiscard]] absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

  // Which content this template reads (found at Parse).
  [[nodiscard]] ContentFormat content_format() const { return content_format_; }

  struct Node;

 private:
  ChatTemplate(std::shared_ptr<const Node> root, ContentFormat format)
      : root_(std::move(root)), content_format_(format) {}
  std::shared_ptr<const Node> root_;
  ContentFormat content_format_;
};

}  // namespace tandem::tokenizer
