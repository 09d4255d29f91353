// JSON Schema's `format` as xgrammar (vLLM's default backend) holds it:
// internal to libs/grammar (json_schema.cc).
#pragma once

#include <string>
#include <string_view>

namespace tandem::grammar::internal {

struct FormatRule {
  enum Kind {
    kHeld,        // the string's value matches `regex` whole
    kRefused,     // xgrammar's regex admits raw text that is not JSON: `why`
    kAnnotation,  // a format xgrammar does not know: the value is any string
  };
  Kind kind = kAnnotation;
  std::string regex;
  std::string why;
};

// What `format` constrains.
FormatRule JsonFormat(std::string_view format);

}  // namespace tandem::grammar::internal
