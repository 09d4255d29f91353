// Structured outputs in OpenAI's and vLLM's request fields: response_format
// (OpenAI's, vLLM's ResponseFormat) and structured_outputs (vLLM's
// StructuredOutputsParams), of which the grammar holds JSON: json_schema,
// json_object, and structured_outputs' json and json_object. Its regex,
// choice, grammar and structural_tag are refused by name.
#include "absl/strings/str_cat.h"
#include "openai_parse.h"
#include "tandem/common/sampling_params.h"
#include "tandem/grammar/json_schema.h"

namespace tandem::frontend::internal {
namespace {

// OpenAI's JSON mode: an object (xgrammar's builtin JSON grammar, vLLM's
// json_object, has an object or an array at its root; OpenAI's docs promise
// an object).
constexpr const char* kJsonObject = R"({"type":"object","additionalProperties":true})";

// `schema` compiled, or a 400 naming `param` with the grammar's reason.
std::optional<ApiError> Compiled(const Json& schema, const std::string& param, std::string* out) {
  if (auto compiled = grammar::CompileJsonSchema(schema); !compiled.ok()) {
    return BadRequest(absl::StrCat("'", param, "': ", compiled.status().message()), param);
  }
  *out = schema.dump(-1, ' ', false, Json::error_handler_t::replace);
  return std::nullopt;
}

std::optional<ApiError> ResponseFormat(const Json& format, std::string* out) {
  const auto type = format.is_object() ? format.find("type") : format.end();
  if (type == format.end() || !type->is_string()) {
    return BadRequest("'response_format' must be an object with a string 'type'",
                      "response_format");
  }
  if (*type == "text") return std::nullopt;
  if (*type == "json_object") {
    *out = kJsonObject;
    return std::nullopt;
  }
  if (*type != "json_schema") {
    return BadRequest(absl::StrCat("'response_format.type' ", type->dump(),
                                   " is not supported (text, json_object or json_schema)"),
                      "response_format.type");
  }
  const auto spec = format.find("json_schema");
  if (spec == format.end() || !spec->is_object()) {
    return BadRequest("'response_format.json_schema' must be an object",
                      "response_format.json_schema");
  }
  const auto schema = spec->find("schema");
  if (schema == spec->end() || !(schema->is_object() || schema->is_boolean())) {
    return BadRequest("'response_format.json_schema.schema' must be a JSON schema (an object)",
                      "response_format.json_schema.schema");
  }
  // name, description and strict do not change the output: every schema is
  // held strictly.
  return Compiled(*schema, "response_format.json_schema.schema", out);
}

std::optional<ApiError> StructuredOutputs(const Json& params, std::string* out) {
  if (!params.is_object()) {
    return BadRequest("'structured_outputs' must be an object", "structured_outputs");
  }
  for (const auto& [key, value] : params.items()) {
    const std::string param = absl::StrCat("structured_outputs.", key);
    if (key == "json" || key == "json_object") continue;
    // The flags that only fine-tune a backend, at their defaults.
    if ((key == "disable_fallback" || key == "disable_any_whitespace" ||
         key == "disable_additional_properties") &&
        value == Json(false)) {
      continue;
    }
    if (value.is_null()) continue;
    return BadRequest(absl::StrCat("'", param,
                                   "' is not supported: structured outputs hold JSON (json, "
                                   "json_object) only"),
                      param);
  }
  const auto json = params.find("json");
  const auto object = params.find("json_object");
  const bool has_json = json != params.end() && !json->is_null();
  const bool has_object = object != params.end() && !object->is_null();
  if (has_json && has_object) {
    return BadRequest("'structured_outputs' takes one of json and json_object",
                      "structured_outputs");
  }
  if (has_object) {
    if (*object != Json(true)) {
      return BadRequest("'structured_outputs.json_object' must be true",
                        "structured_outputs.json_object");
    }
    *out = kJsonObject;
    return std::nullopt;
  }
  if (!has_json) return std::nullopt;
  // vLLM takes the schema as an object or as its JSON text.
  Json schema = *json;
  if (json->is_string()) {
    schema = Json::parse(json->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) {
      return BadRequest("'structured_outputs.json' is a string that is not JSON",
                        "structured_outputs.json");
    }
  }
  if (!schema.is_object() && !schema.is_boolean()) {
    return BadRequest("'structured_outputs.json' must be a JSON schema (an object)",
                      "structured_outputs.json");
  }
  return Compiled(schema, "structured_outputs.json", out);
}

}  // namespace

std::optional<ApiError> ParseStructuredOutput(const Reader& r, CompletionRequest* out) {
  std::string from_format, from_params;
  if (const Json* format = r.Find("response_format")) {
    if (auto e = ResponseFormat(*format, &from_format)) return e;
  }
  if (const Json* params = r.Find("structured_outputs")) {
    if (auto e = StructuredOutputs(*params, &from_params)) return e;
  }
  if (!from_format.empty() && !from_params.empty()) {
    return BadRequest(
        "'response_format' and 'structured_outputs' both constrain the output; send one",
        "structured_outputs");
  }
  out->json_schema = !from_format.empty() ? from_format : from_params;
  if (!out->json_schema.empty()) {
    if (const char* name =
            JsonSchemaConflict(out->ignore_eos, out->min_tokens, !out->bad_words.empty(),
                               !out->allowed_token_ids.empty())) {
      return BadRequest(absl::StrCat("'", name, "' is not supported with structured outputs"),
                        name);
    }
  }
  return std::nullopt;
}

}  // namespace tandem::frontend::internal
