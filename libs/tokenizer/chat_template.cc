#include "tandem/tokenizer/chat_template.h"

#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "chat_template_ast.h"
#include "chat_template_content.h"
#include "chat_template_eval.h"
#include "chat_template_lexer.h"
#include "chat_template_parser.h"
#include "chat_template_value.h"
#include "tandem/common/status.h"

namespace tandem::tokenizer {
namespace {

using internal::jinja::TemplateError;

// The text continue_final_message continues (transformers'
// apply_chat_template): the final message's content, or the last of its
// parts that has a "text".
absl::StatusOr<std::string> FinalMessageText(const ChatTemplateInputs& inputs) {
  if (inputs.add_generation_prompt) {
    return absl::InvalidArgumentError(
        "continue_final_message and add_generation_prompt are not compatible: "
        "continue_final_message continues the final message, add_generation_prompt starts a "
        "new assistant message");
  }
  const nlohmann::ordered_json* content = nullptr;
  if (inputs.messages.is_array() && !inputs.messages.empty() &&
      inputs.messages.back().is_object()) {
    auto it = inputs.messages.back().find("content");
    if (it != inputs.messages.back().end()) content = &*it;
  }
  if (content != nullptr && content->is_string()) return content->get<std::string>();
  if (content != nullptr && content->is_array()) {
    for (auto part = content->rbegin(); part != content->rend(); ++part) {
      auto text = part->is_object() ? part->find("text") : part->end();
      if (part->is_object() && text != part->end() && text->is_string()) {
        return text->get<std::string>();
      }
    }
  }
  return absl::InvalidArgumentError(
      "continue_final_message is set but the final message has no text to continue");
}

// Cuts `rendered` after the final message's text, as transformers does: at
// the last occurrence of the stripped text, keeping trailing whitespace of
// the message only where the template kept it.
absl::Status CutAfterFinalMessage(const std::string& final_message, std::string* rendered) {
  const std::string stripped = internal::jinja::Strip(final_message, true, true, std::nullopt);
  const std::string lstripped = internal::jinja::Strip(final_message, true, false, std::nullopt);
  const size_t at = rendered->rfind(stripped);
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template (the template changes part of it)");
  }
  if (rendered->compare(at, lstripped.size(), final_message) == 0) {
    rendered->resize(at + lstripped.size());
  } else {
    rendered->resize(at + stripped.size());
  }
  return absl::OkStatus();
}

// Built-in templates: the chat_template strings the models ship.
constexpr std::string_view kLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
constexpr std::string_view kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% "
    "endif %}";
constexpr std::string_view kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}"
    "{% endif %}";

}  // namespace

std::string_view ChatTemplate::BuiltinSource(std::string_view name) {
  if (name == "llama-2") return kLlama2;
  if (name == "llama-3") return kLlama3;
  if (name == "chatml") return kChatml;
  return {};
}

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  try {
    auto root = std::make_shared<Node>();
    root->bodies.push_back(internal::jinja::ParseTemplate(internal::jinja::Lex(source)));
    const ContentFormat format = internal::jinja::DetectContentFormat(root->bodies[0]);
    return ChatTemplate(std::move(root), format);
  } catch (const TemplateError& e) {
    return absl::Status(e.code, e.message);
  }
}

absl::StatusOr<ChatTemplate> ChatTemplate::Builtin(std::string_view name) {
  const std::string_view source = BuiltinSource(name);
  if (source.empty()) {
    return absl::NotFoundError(absl::StrCat("no built-in chat template '", std::string(name),
                                            "' (llama-2, llama-3, chatml)"));
  }
  return Parse(source);
}

absl::StatusOr<ChatTemplate> ChatTemplate::Select(std::string_view choice,
                                                  const Tokenizer& tokenizer) {
  constexpr char kHint[] = "; pass --chat-template llama-2|llama-3|chatml or a Jinja file";
  if (!BuiltinSource(choice).empty()) return Builtin(choice);
  std::string source, where;
  if (!choice.empty()) {
    std::ifstream in{std::string(choice), std::ios::binary};
    if (!in) {
      return absl::NotFoundError(absl::StrCat("--chat-template ", std::string(choice),
                                              ": neither a built-in template (llama-2, llama-3, "
                                              "chatml) nor a readable file"));
    }
    source.assign(std::istreambuf_iterator<char>(in), {});
    where = std::string(choice);
  } else if (tokenizer.chat_template()) {
    source = *tokenizer.chat_template();
    where = "the tokenizer's chat template (chat_template.jinja or tokenizer_config.json)";
  } else {
    return absl::FailedPreconditionError(absl::StrCat("the tokenizer has no chat_template", kHint));
  }
  absl::StatusOr<ChatTemplate> t = Parse(source);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(where, ": ", t.status().message(),
                                                        choice.empty() ? kHint : ""));
  }
  return t;
}

absl::StatusOr<std::optional<ChatTemplate>> ChatTemplate::SelectToolUse(
    std::string_view choice, const Tokenizer& tokenizer) {
  if (!choice.empty() || !tokenizer.tool_use_chat_template()) return std::nullopt;
  absl::StatusOr<ChatTemplate> t = Parse(*tokenizer.tool_use_chat_template());
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat("the tokenizer's tool_use chat template: ",
                                                        t.status().message()));
  }
  return std::optional<ChatTemplate>(*std::move(t));
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  try {
    std::optional<std::string> final_message;
    if (inputs.continue_final_message) {
      TANDEM_ASSIGN_OR_RETURN(final_message, FinalMessageText(inputs));
    }
    std::string rendered = internal::jinja::RenderTemplate(root_->bodies[0], inputs);
    if (final_message) TANDEM_RETURN_IF_ERROR(CutAfterFinalMessage(*final_message, &rendered));
    return rendered;
  } catch (const TemplateError& e) {
    return absl::Status(e.code, e.message);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

}  // namespace tandem::tokenizer
