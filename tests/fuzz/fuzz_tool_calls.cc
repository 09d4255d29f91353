// The tool-call parsers (tandem/frontend/tool_calls.h: hermes, llama3_json,
// pythonic, llama4_pythonic, mistral) on arbitrary model output: never a
// crash; no calls from hermes, llama3_json or pythonic means the answer is
// the content (llama4_pythonic drops its python tags first, and mistral's
// empty list keeps the text before its tag, as vLLM's do); and a stream cut
// into pieces ends with the whole answer's calls or none.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tandem/frontend/tool_calls.h"

namespace {

using tandem::frontend::ExtractedToolCalls;
using tandem::frontend::ToolParser;

bool SameCalls(const ExtractedToolCalls& a, const ExtractedToolCalls& b) {
  if (a.calls.size() != b.calls.size()) return false;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    if (a.calls[i].name != b.calls[i].name || a.calls[i].arguments != b.calls[i].arguments) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const ToolParser parser : {ToolParser::kHermes, ToolParser::kLlama3Json,
                                  ToolParser::kPythonic, ToolParser::kLlama4Pythonic,
                                  ToolParser::kMistral}) {
    const ExtractedToolCalls whole = tandem::frontend::ExtractToolCalls(parser, text);
    const bool content_is_text = parser == ToolParser::kHermes ||
                                 parser == ToolParser::kLlama3Json || parser == ToolParser::kPythonic;
    if (whole.calls.empty() && content_is_text && whole.content != std::string(text)) {
      std::abort();
    }
    tandem::frontend::ToolCallStream stream(parser);
    const size_t piece = 1 + size % 7;
    for (size_t at = 0; at < size; at += piece) (void)stream.Push(text.substr(at, piece));
    const ExtractedToolCalls end = stream.Finish();
    if (!end.calls.empty() && !SameCalls(end, whole)) std::abort();
  }
  return 0;
}
