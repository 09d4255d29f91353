// The fields of vLLM's requests, and of OpenAI's that change the answer,
// that Tandem does not build: each is refused with a 400 naming it unless it
// has its neutral value (vllm_fields_test walks vLLM's and OpenAI's lists
// against this table).
#include "absl/strings/str_cat.h"
#include "openai_parse.h"

namespace tandem::frontend::internal {
namespace {

struct Unbuilt {
  const char* name;
  Json neutral;
  const char* why;
};
const std::vector<Unbuilt>& UnbuiltFields(Endpoint endpoint) {
  static const char* kNoGuided =
      "vLLM's guided_* fields are not read; use response_format or structured_outputs (json, "
      "json_object, choice, regex, grammar)";
  static const auto* common = new std::vector<Unbuilt>{
      {"best_of", Json(1), "use n"},
      {"use_beam_search", Json(false), "beam search is not implemented"},
      {"length_penalty", Json(1), "beam search is not implemented"},
      {"logits_processors", Json::array(), "not implemented"},
      {"spaces_between_special_tokens", Json(true),
       "special tokens decode as the tokenizer's decoder writes them"},
      {"guided_json", Json(nullptr), kNoGuided},
      {"guided_regex", Json(nullptr), kNoGuided},
      {"guided_choice", Json(nullptr), kNoGuided},
      {"guided_grammar", Json(nullptr), kNoGuided},
      {"guided_decoding_backend", Json(nullptr), kNoGuided},
      {"guided_whitespace_pattern", Json(nullptr), kNoGuided},
      {"structural_tag", Json(nullptr), kNoGuided},
      {"kv_transfer_params", Json(nullptr), "disaggregated serving is not implemented"},
      {"vllm_xargs", Json(nullptr), "no extensions read it"},
      {"mm_processor_kwargs", Json(nullptr), "no multimodal models are served"},
      {"media_io_kwargs", Json(nullptr), "no multimodal models are served"},
  };
  static const auto* completions = [] {
    auto* v = new std::vector<Unbuilt>(*common);
    v->push_back({"suffix", Json(""), "no insertion models are served"});
    v->push_back({"prompt_embeds", Json(nullptr), "prompts are text or token ids"});
    return v;
  }();
  static const auto* chat = [] {
    auto* v = new std::vector<Unbuilt>(*common);
    v->push_back({"reasoning_effort", Json(nullptr), "no served model takes a reasoning effort"});
    // OpenAI's chat fields beyond vLLM's that change the answer (vLLM
    // ignores them with a warning; the model would answer without them).
    static const char* kNoFunctions =
        "the deprecated functions API is not implemented; use tools (with tool_choice \"none\")";
    v->push_back({"functions", Json(nullptr), kNoFunctions});
    v->push_back({"function_call", Json(nullptr), kNoFunctions});
    v->push_back({"audio", Json(nullptr), "audio output is not implemented"});
    v->push_back({"modalities", Json::array({"text"}), "the served models write text only"});
    v->push_back({"web_search_options", Json(nullptr), "web search is not implemented"});
    v->push_back({"verbosity", Json(nullptr), "not implemented"});
    return v;
  }();
  return endpoint == Endpoint::kCompletions ? *completions : *chat;
}

}  // namespace

std::optional<ApiError> ParseUnsupported(const Reader& r, Endpoint endpoint) {
  for (const Unbuilt& f : UnbuiltFields(endpoint)) {
    if (auto e = r.OnlyNeutral(f.name, f.neutral, f.why)) return e;
  }
  return std::nullopt;
}

}  // namespace tandem::frontend::internal
