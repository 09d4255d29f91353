// The chat template's syntax tree, and the error its stages throw (private).
//
// chat_template_lexer.cc cuts the source into pieces, chat_template_parser.cc
// builds this tree from them, chat_template_eval.cc renders it with
// chat_template_value.cc's values; chat_template.cc runs the stages and turns
// a TemplateError into a Status.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/chat_template.h"

namespace tandem::tokenizer::internal::jinja {

using Json = nlohmann::ordered_json;

// Parse and render errors; caught at the public boundary and turned into a
// Status.
struct TemplateError {
  absl::StatusCode code;
  std::string message;
};
[[noreturn]] inline void Fail(int line, const std::string& message,
                              absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  throw TemplateError{code, absl::StrCat("chat template: line ", line, ": ", message)};
}
[[noreturn]] inline void Unsupported(int line, const std::string& what) {
  Fail(line, absl::StrCat(what, " is not supported (use a built-in template)"),
       absl::StatusCode::kUnimplemented);
}

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kAnd,
    kOr,
    kTernary,
    kList,
    kDict,
  } kind;
  int line = 0;
  Json value;                               // kLiteral
  std::string name;                         // kName, kAttr, kFilter, kTest, kBinary (the operator)
  bool negated = false;                     // kTest: `is not`
  std::vector<std::unique_ptr<Expr>> args;  // may hold nullptr (slice bounds)
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};
using ExprPtr = std::unique_ptr<Expr>;

}  // namespace tandem::tokenizer::internal::jinja

namespace tandem::tokenizer {

struct ChatTemplate::Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet } kind;
  int line = 0;
  std::string text;  // kText
  // kOutput, kSet: [value]; kIf: conditions; kFor: [iterable, filter]
  std::vector<internal::jinja::ExprPtr> exprs;
  std::vector<std::vector<std::unique_ptr<Node>>>
      bodies;                      // kIf: per branch (+ else); kFor: body, else
  std::vector<std::string> names;  // kFor: loop variables; kSet: target (name[, attribute])
};

}  // namespace tandem::tokenizer

namespace tandem::tokenizer::internal::jinja {

using Node = ChatTemplate::Node;
using NodeList = std::vector<std::unique_ptr<Node>>;

}  // namespace tandem::tokenizer::internal::jinja
