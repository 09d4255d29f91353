// Structured outputs in OpenAI's and vLLM's request fields: response_format
// (OpenAI's, vLLM's ResponseFormat) and structured_outputs (vLLM's
// StructuredOutputsParams), of which the grammar holds JSON (json_schema,
// json_object, and structured_outputs' json and json_object),
// structured_outputs' choice, its regex and its grammar (xgrammar's EBNF),
// its disable_any_whitespace for JSON, and its disable_additional_properties
// and disable_fallback (what the schema compiler and the one matcher do
// anyway). Its structural_tag is refused by name. tool_choice
// "required" and a named tool are structured outputs too: the calls' JSON
// (vLLM's _get_json_schema_from_tool).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "openai_parse.h"
#include "tandem/common/sampling_params.h"
#include "tandem/grammar/ebnf.h"
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

// structured_outputs.choice: a non-empty list of non-empty strings.
std::optional<ApiError> Choices(const Json& choice, std::vector<std::string>* out) {
  const char* param = "structured_outputs.choice";
  if (!choice.is_array()) {
    return BadRequest("'structured_outputs.choice' must be a list of strings", param);
  }
  for (const Json& c : choice) {
    if (!c.is_string()) {
      return BadRequest("'structured_outputs.choice' must be a list of strings", param);
    }
    out->push_back(c.get<std::string>());
  }
  if (auto compiled = grammar::CompileChoices(*out); !compiled.ok()) {
    return BadRequest(absl::StrCat("'", param, "': ", compiled.status().message()), param);
  }
  return std::nullopt;
}

// structured_outputs.regex (a pattern grammar/regex.h holds) or
// structured_outputs.grammar (a grammar grammar/ebnf.h holds): `key`'s text,
// compiled so that what is refused is a 400 naming the field.
std::optional<ApiError> Text(const Json& text, const char* key, std::string* out) {
  const std::string param = absl::StrCat("structured_outputs.", key);
  if (!text.is_string() || text.get<std::string>().empty()) {
    return BadRequest(absl::StrCat("'", param, "' must be a non-empty string"), param);
  }
  const std::string& value = text.get_ref<const std::string&>();
  const absl::Status compiled = std::string_view(key) == "regex"
                                    ? grammar::CompileRegex(value).status()
                                    : grammar::CompileEbnfDocument(value).status();
  if (!compiled.ok()) {
    return BadRequest(absl::StrCat("'", param, "': ", compiled.message()), param);
  }
  *out = value;
  return std::nullopt;
}

std::optional<ApiError> StructuredOutputs(const Json& params, std::string* out,
                                          std::vector<std::string>* choice, std::string* regex,
                                          std::string* ebnf, bool* compact) {
  if (!params.is_object()) {
    return BadRequest("'structured_outputs' must be an object", "structured_outputs");
  }
  int kinds = 0;
  for (const auto& [key, value] : params.items()) {
    const std::string param = absl::StrCat("structured_outputs.", key);
    if (key == "json" || key == "json_object" || key == "choice" || key == "regex" ||
        key == "grammar") {
      kinds += value.is_null() ? 0 : 1;
      continue;
    }
    // The boolean flags. disable_any_whitespace is xgrammar's
    // any_whitespace=False, held for a JSON document (a regex's, a
    // grammar's or a choice's text has no JSON whitespace, so it changes nothing there, as
    // in vLLM). For the other two either value is exact:
    // disable_additional_properties writes additionalProperties false into
    // each object that lists properties and leaves it out (vLLM's guidance
    // backend), which the schema compiler holds already (xgrammar's strict
    // mode); disable_fallback: there is no second backend, and what the one
    // cannot hold is refused, as true asks.
    if (key == "disable_any_whitespace" || key == "disable_additional_properties" ||
        key == "disable_fallback") {
      if (!value.is_boolean()) {
        return BadRequest(absl::StrCat("'", param, "' must be a boolean"), param);
      }
      if (key == "disable_any_whitespace") *compact = value.get<bool>();
      continue;
    }
    if (value.is_null()) continue;
    return BadRequest(absl::StrCat("'", param,
                                   "' is not supported: structured outputs hold JSON (json, "
                                   "json_object), choice, regex and grammar only"),
                      param);
  }
  if (kinds > 1) {
    return BadRequest(
        "'structured_outputs' takes one of json, json_object, choice, regex and grammar",
        "structured_outputs");
  }
  if (const auto c = params.find("choice"); c != params.end() && !c->is_null()) {
    return Choices(*c, choice);
  }
  if (const auto re = params.find("regex"); re != params.end() && !re->is_null()) {
    return Text(*re, "regex", regex);
  }
  if (const auto g = params.find("grammar"); g != params.end() && !g->is_null()) {
    return Text(*g, "grammar", ebnf);
  }
  const auto json = params.find("json");
  const auto object = params.find("json_object");
  const bool has_json = json != params.end() && !json->is_null();
  const bool has_object = object != params.end() && !object->is_null();
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

// A tool's parameters as the grammar holds them: none (null or {}) is an
// object without members, as vLLM writes it for "required" (named, vLLM
// leaves such a tool's output free; here its arguments are "{}" too).
Json ParametersOf(const Json& tool) {
  const Json& parameters = tool["function"]["parameters"];
  if (parameters.is_null() || (parameters.is_object() && parameters.empty())) {
    return {{"type", "object"}, {"properties", Json::object()}};
  }
  return parameters;
}

// Whether `schema` has a "$ref" to "#": under "required" the document's root
// is the list of calls, not the tool's parameters.
bool RefersToRoot(const Json& schema) {
  if (schema.is_object()) {
    for (const auto& [key, value] : schema.items()) {
      if ((key == "$ref" && value == "#") || RefersToRoot(value)) return true;
    }
  } else if (schema.is_array()) {
    for (const Json& e : schema) {
      if (RefersToRoot(e)) return true;
    }
  }
  return false;
}

// vLLM's _get_json_schema_from_tool for "required": a non-empty list of
// {"name": <a tool's name>, "parameters": <its parameters>}, every tool's
// $defs (and definitions) moved to the root, where their $refs point.
std::optional<ApiError> RequiredSchema(const Json& tools, Json* out) {
  Json alternatives = Json::array();
  Json defs = Json::object();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = absl::StrCat("tools[", i, "].function.parameters");
    Json parameters = ParametersOf(tools[i]);
    if (!parameters.is_object()) {
      return BadRequest(absl::StrCat("'", param, "' must be a JSON schema (an object)"), param);
    }
    if (auto compiled = grammar::CompileJsonSchema(parameters); !compiled.ok()) {
      return BadRequest(absl::StrCat("'", param, "': ", compiled.status().message()), param);
    }
    if (RefersToRoot(parameters)) {
      return BadRequest(absl::StrCat("'", param, "' refers to itself with \"$ref\": \"#\", ",
                                     "which tool_choice \"required\" cannot hold (its document ",
                                     "is the list of calls); use $defs"),
                        param);
    }
    for (const char* key : {"$defs", "definitions"}) {
      auto it = parameters.find(key);
      if (it == parameters.end()) continue;
      if (!defs.contains(key)) defs[key] = Json::object();
      for (const auto& [name, def] : it->items()) {
        if (defs[key].contains(name) && defs[key][name] != def) {
          return BadRequest(absl::StrCat("'", param, "': the definition '", name,
                                         "' differs from another tool's of the same name, "
                                         "which tool_choice \"required\" cannot hold"),
                            param);
        }
        defs[key][name] = def;
      }
      parameters.erase(it);
    }
    alternatives.push_back(
        {{"type", "object"},
         {"properties",
          {{"name", {{"type", "string"}, {"enum", {tools[i]["function"]["name"]}}}},
           {"parameters", std::move(parameters)}}},
         {"required", {"name", "parameters"}}});
  }
  *out = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", std::move(alternatives)}}}};
  out->update(defs);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseForcedToolChoice(const Json& choice, CompletionRequest* out) {
  Json schema;
  std::string param = "tool_choice";
  ForcedToolChoice forced;
  if (choice == "required") {
    if (auto e = RequiredSchema(out->tools, &schema)) return e;
  } else {
    const auto function = choice.find("function");
    if (choice.value("type", Json()) != "function" || function == choice.end() ||
        !function->is_object() || !function->contains("name") || !(*function)["name"].is_string()) {
      return BadRequest(
          "a named 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": "
          "...}}",
          "tool_choice");
    }
    forced.name = (*function)["name"].get<std::string>();
    const auto tool = std::find_if(out->tools.begin(), out->tools.end(), [&](const Json& t) {
      return t["function"]["name"] == *forced.name;
    });
    if (tool == out->tools.end()) {
      return BadRequest(absl::StrCat("Tool '", *forced.name, "' has not been passed in `tools`."),
                        "tool_choice");
    }
    param = absl::StrCat("tools[", tool - out->tools.begin(), "].function.parameters");
    schema = ParametersOf(*tool);
    if (!schema.is_object()) {
      return BadRequest(absl::StrCat("'", param, "' must be a JSON schema (an object)"), param);
    }
  }
  if (auto e = Compiled(schema, param, &out->json_schema)) return e;
  out->forced_tool = std::move(forced);
  out->json_schema_field = "tool_choice";
  return std::nullopt;
}

std::optional<ApiError> ParseStructuredOutput(const Reader& r, CompletionRequest* out) {
  std::string from_format, from_params;
  std::vector<std::string> choice;
  std::string regex, ebnf;
  bool compact = false;
  if (const Json* format = r.Find("response_format")) {
    if (auto e = ResponseFormat(*format, &from_format)) return e;
  }
  if (const Json* params = r.Find("structured_outputs")) {
    if (auto e = StructuredOutputs(*params, &from_params, &choice, &regex, &ebnf, &compact)) {
      return e;
    }
  }
  const bool has_params =
      !from_params.empty() || !choice.empty() || !regex.empty() || !ebnf.empty();
  if (!from_format.empty() && has_params) {
    return BadRequest(
        "'response_format' and 'structured_outputs' both constrain the output; send one",
        "structured_outputs");
  }
  if (!from_format.empty() || has_params) {
    const char* field = !from_format.empty() ? "response_format" : "structured_outputs";
    if (out->forced_tool) {
      return BadRequest(absl::StrCat("'", field, "' and 'tool_choice' ",
                                     out->forced_tool->name ? "(a named tool)" : "\"required\"",
                                     " both constrain the output; send one"),
                        field);
    }
    out->json_schema = !from_format.empty() ? from_format : from_params;
    // With response_format's schema too: vLLM sets that schema on the
    // request's structured_outputs, flags and all.
    out->disable_any_whitespace = compact && !out->json_schema.empty();
    out->choice = std::move(choice);
    out->regex = std::move(regex);
    out->grammar = std::move(ebnf);
    out->json_schema_field = field;
  }
  if (out->HasGrammar()) {
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
