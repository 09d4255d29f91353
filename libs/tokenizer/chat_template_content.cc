// Which shape of message content a template reads, found as vLLM finds it
// (vllm/entrypoints/chat_utils.py, _detect_content_format): a template that
// loops over a message's content, `{% for part in message['content'] %}`
// where `message` is a loop variable over `messages` (or over a variable set
// from `messages`, its items or a slice), or `{% for part in content %}`,
// takes content as a list of parts ("openai"); every other template takes a
// string ("string"). The walk is vLLM's: every for loop and set anywhere in
// the template, no scopes.
#include "chat_template_content.h"

#include <deque>
#include <string>
#include <vector>

namespace tandem::tokenizer::internal::jinja {
namespace {

using Node = ChatTemplate::Node;

// vLLM stops with an assertion (and falls back to "string") where a loop or
// assignment it matches has a target other than one name.
struct NotAName {};

bool IsVarAccess(const Expr* e, const std::string& var) {
  return e != nullptr && e->kind == Expr::kName && e->name == var;
}

// var[key] with a literal key, or var.key.
bool IsAttrAccess(const Expr* e, const std::string& var, const std::string& key) {
  if (e == nullptr) return false;
  if (e->kind == Expr::kIndex) {
    const Expr* k = e->args.size() > 1 ? e->args[1].get() : nullptr;
    return IsVarAccess(e->args[0].get(), var) && k != nullptr && k->kind == Expr::kLiteral &&
           k->value.is_string() && k->value.get<std::string>() == key;
  }
  return e->kind == Expr::kAttr && IsVarAccess(e->args[0].get(), var) && e->name == key;
}

// var (or var[key], var.key with a key), through filters, tests and slices.
bool IsVarOrElemsAccess(const Expr* e, const std::string& var, const std::string* key) {
  if (e == nullptr) return false;
  if (e->kind == Expr::kFilter || e->kind == Expr::kTest || e->kind == Expr::kSlice) {
    return IsVarOrElemsAccess(e->args[0].get(), var, key);
  }
  return key != nullptr ? IsAttrAccess(e, var, *key) : IsVarAccess(e, var);
}

// Every node of `body`, depth first, in the order of the source.
void Collect(const NodeList& body, std::vector<const Node*>* out) {
  for (const auto& n : body) {
    out->push_back(n.get());
    for (const NodeList& b : n->bodies) Collect(b, out);
  }
}

// The names of `start` and of every variable set from one of them (or its
// items, or a slice), transitively.
std::vector<std::string> AssignedFrom(const std::vector<const Node*>& nodes,
                                      const std::string& start) {
  std::vector<std::string> names = {start};
  std::deque<std::string> pending = {start};
  while (!pending.empty()) {
    const std::string var = pending.front();
    pending.pop_front();
    for (const Node* n : nodes) {
      if (n->kind != Node::kSet || !IsVarOrElemsAccess(n->exprs[0].get(), var, nullptr)) continue;
      if (n->names.size() != 1) throw NotAName{};  // `set ns.attr = messages`
      names.push_back(n->names[0]);
      if (n->names[0] != var) pending.push_back(n->names[0]);
    }
  }
  return names;
}

// The loop variables of the for loops over one of `vars` (with `key`: over
// var[key] or var.key).
std::vector<std::string> LoopsOver(const std::vector<const Node*>& nodes,
                                   const std::vector<std::string>& vars, const std::string* key) {
  std::vector<std::string> targets;
  for (const Node* n : nodes) {
    if (n->kind != Node::kFor) continue;
    for (const std::string& var : vars) {
      if (!IsVarOrElemsAccess(n->exprs[0].get(), var, key)) continue;
      if (n->names.size() != 1) throw NotAName{};
      targets.push_back(n->names[0]);
      break;
    }
  }
  return targets;
}

}  // namespace

ContentFormat DetectContentFormat(const NodeList& body) {
  std::vector<const Node*> nodes;
  Collect(body, &nodes);
  try {
    const std::vector<std::string> messages = AssignedFrom(nodes, "messages");
    const std::vector<std::string> message = LoopsOver(nodes, messages, nullptr);
    const std::string content = "content";
    if (!LoopsOver(nodes, message, &content).empty()) return ContentFormat::kOpenAi;
    for (const Node* n : nodes) {
      if (n->kind == Node::kFor && IsVarAccess(n->exprs[0].get(), content)) {
        if (n->names.size() != 1) throw NotAName{};
        return ContentFormat::kOpenAi;
      }
    }
  } catch (const NotAName&) {
  }
  return ContentFormat::kString;
}

}  // namespace tandem::tokenizer::internal::jinja
