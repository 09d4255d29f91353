// Private: a Hugging Face config.json (+ generation_config.json) read into a
// ModelConfig, never silently wrong:
//  - "architectures" / "model_type" pick a family the loader knows; any other
//    is refused by name;
//  - every key either is implemented, is on an explicit list of keys known
//    not to change the math, or is refused by name;
//  - both layouts: transformers 4.x (rope_theta + rope_scaling) and 5.x
//    (rope_parameters holding rope_theta, rope_type and the scaling fields);
//  - defaults that config.json leaves out are the family's config class's
//    (transformers 5), e.g. Gemma's head_dim 256 and tied embeddings.
//  - sliding windows as transformers applies them (ModelConfig::layer_window):
//    Mistral and Phi-3 slide every layer, Qwen2/3 the layers layer_types or
//    use_sliding_window / max_window_layers name. Llama and Gemma, whose
//    transformers code reads no window, are served with the context capped at
//    one (sliding_window_cap; where a window and none agree), and the cap is
//    logged.
//  - multimodal checkpoints whose text part is a supported causal LM
//    (Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration):
//    text_config read as that model's config, the vision tower and
//    projector left unloaded (requests with images are refused by the
//    frontend), in both the Hub's layout (language_model.model.*) and
//    transformers 5's (model.language_model.*);
//  - RoPE scaling of types default, linear, llama3, yarn and longrope as
//    transformers 5 computes it; longrope with its short factors and the
//    context capped at original_max_position_embeddings (rope_context_cap,
//    logged), where transformers never switches to the long ones; Phi3's
//    partial_rotary_factor (ModelConfig::rotary_dim).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/model/model.h"

namespace tandem::model::internal {

struct HfConfig {
  ModelConfig config;
  bool tied_embeddings = false;
  std::string architecture;  // e.g. "LlamaForCausalLM"
  // Where the language model's tensors are: "model." and "lm_head.weight"
  // for a *ForCausalLM. A multimodal checkpoint served as text (see
  // ReadHfConfig) lists its layouts' names, the first found wins, and the
  // prefixes of the parts Tandem does not serve (vision tower, projector).
  std::vector<std::string> text_prefixes = {"model."};
  std::vector<std::string> head_names = {"lm_head.weight"};
  std::vector<std::string> unserved_prefixes;
  // The causal LM whose math this is, when `architecture` wraps it
  // (Gemma3ForConditionalGeneration's Gemma3ForCausalLM); else empty.
  std::string text_architecture;
  std::string torch_dtype;   // as config.json names it ("" when absent)
  // Set when a sliding window capped max_seq_len (for the log).
  int32_t sliding_window_cap = 0;
  // Set when longrope capped max_seq_len at its short factors' context.
  int32_t rope_context_cap = 0;
  // Set when longrope serves its long factors (LoadOptions::max_model_len).
  bool rope_long_factors = false;
};

// Reads dir/config.json and, when present, dir/generation_config.json.
// options.disable_sliding_window (vLLM's --disable-sliding-window): every
// family takes the cap instead of its windows; options.max_model_len past a
// longrope model's original context: its long factors (rope_long_factors).
absl::StatusOr<HfConfig> ReadHfConfig(const std::string& dir, const LoadOptions& options = {});

}  // namespace tandem::model::internal
