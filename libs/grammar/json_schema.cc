#include "tandem/grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "json_formats.h"
#include "json_numbers.h"
#include "tandem/common/nesting.h"
#include "tandem/common/status.h"
#include "tandem/grammar/ebnf.h"

namespace tandem::grammar {

using Json = nlohmann::ordered_json;
using Kind = SchemaNode::Kind;

uint64_t Schema::NextId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

namespace {

// Deeper schemas are refused: each level is a frame of Compile's recursion.
constexpr int kMaxDepth = 128;

constexpr std::array<std::string_view, 10> kAnnotations = {
    "title", "description", "default",    "examples", "$schema",
    "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};

bool IsAnnotation(std::string_view key) {
  for (std::string_view a : kAnnotations) {
    if (key == a) return true;
  }
  return key == "$defs" || key == "definitions";  // read through $ref only
}

constexpr std::array<const char*, 4> kNumericBounds = {"minimum", "maximum", "exclusiveMinimum",
                                                       "exclusiveMaximum"};

bool IsNumericBound(std::string_view key) {
  return std::find(kNumericBounds.begin(), kNumericBounds.end(), key) != kNumericBounds.end();
}

// The type keywords each supported keyword belongs to ("" = any type).
std::string_view KeywordType(std::string_view key) {
  if (key == "properties" || key == "required" || key == "additionalProperties") return "object";
  if (key == "items" || key == "minItems" || key == "maxItems") return "array";
  if (key == "minLength" || key == "maxLength" || key == "pattern" || key == "format") {
    return "string";
  }
  if (IsNumericBound(key)) return "number";  // an integer's too
  if (key == "type" || key == "enum" || key == "const" || key == "anyOf" || key == "allOf" ||
      key == "$ref") {
    return "";
  }
  return "unsupported";
}

std::string Pointer(const std::string& where) { return where.empty() ? "the schema" : where; }

std::string JsonTypeName(const Json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_boolean()) return "boolean";
  return v.type_name();
}

bool OfType(const Json& v, std::string_view type) {
  const std::string t = JsonTypeName(v);
  return t == type || (type == "number" && t == "integer");
}

// A literal node's texts sorted by their bytes and distinct: those that share
// a prefix are a range, which the matcher reads as one (json_matcher.cc).
void SortLiterals(SchemaNode* node) {
  std::sort(node->literals.begin(), node->literals.end());
  node->literals.erase(std::unique(node->literals.begin(), node->literals.end()),
                       node->literals.end());
}

}  // namespace

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& doc, bool any_whitespace = true)
      : doc_(doc), schema_(std::make_shared<Schema>()) {
    schema_->any_whitespace_ = any_whitespace;
  }

  absl::StatusOr<std::shared_ptr<const Schema>> Run() {
    TANDEM_ASSIGN_OR_RETURN(schema_->root_, Compile(doc_, ""));
    TANDEM_RETURN_IF_ERROR(NoUnionCycles());
    return std::shared_ptr<const Schema>(std::move(schema_));
  }

  // Any JSON value: a union of the six kinds, objects and arrays of any.
  int32_t Any() {
    if (any_ >= 0) return any_;
    any_ = Add({.kind = Kind::kUnion});
    const int32_t object = Add({.kind = Kind::kObject, .first_required = {0}, .additional = any_});
    const int32_t array = Add({.kind = Kind::kArray, .items = any_});
    std::vector<int32_t> alts = {object, array};
    for (Kind k : {Kind::kString, Kind::kNumber, Kind::kBoolean, Kind::kNull}) {
      alts.push_back(Add({.kind = k}));
    }
    schema_->nodes_[static_cast<size_t>(any_)].alternatives = std::move(alts);
    return any_;
  }

  void SetRoot(int32_t root) { schema_->root_ = root; }
  std::shared_ptr<const Schema> Take() { return std::move(schema_); }

  int32_t Add(SchemaNode node) {
    schema_->nodes_.push_back(std::move(node));
    return static_cast<int32_t>(schema_->nodes_.size() - 1);
  }

 private:
  // A union that reaches itself through unions alone ({"$ref": "#"}, an
  // anyOf holding its own $ref) stands for no value: refused, as a document
  // of it could never begin.
  absl::Status NoUnionCycles() const {
    const std::vector<SchemaNode>& nodes = schema_->nodes_;
    std::vector<uint8_t> state(nodes.size(), 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<int32_t, size_t>> path;
    for (size_t start = 0; start < nodes.size(); ++start) {
      if (nodes[start].kind != Kind::kUnion || state[start] != 0) continue;
      path.push_back({static_cast<int32_t>(start), 0});
      state[start] = 1;
      while (!path.empty()) {
        auto& [n, next] = path.back();
        const std::vector<int32_t>& alts = nodes[static_cast<size_t>(n)].alternatives;
        if (next == alts.size()) {
          state[static_cast<size_t>(n)] = 2;
          path.pop_back();
          continue;
        }
        const int32_t alt = alts[next++];
        if (nodes[static_cast<size_t>(alt)].kind != Kind::kUnion) continue;
        if (state[static_cast<size_t>(alt)] == 1) {
          return absl::InvalidArgumentError(
              "JSON schema: a $ref or anyOf that refers to itself with no value in between");
        }
        if (state[static_cast<size_t>(alt)] == 0) {
          state[static_cast<size_t>(alt)] = 1;
          path.push_back({alt, 0});
        }
      }
    }
    return absl::OkStatus();
  }

  static absl::Status Refuse(const std::string& where, std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON schema: ", std::string(what), " at ", Pointer(where)));
  }

  absl::StatusOr<int64_t> Count(const Json& s, const char* key, const std::string& where) {
    const Json& v = s.at(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      return Refuse(where, absl::StrCat("'", key, "' must be a non-negative integer"));
    }
    return v.get<int64_t>();
  }

  // A minimum and maximum count (minItems/maxItems, minLength/maxLength)
  // where the schema gives them; the maximum stays -1 (unbounded) without.
  absl::Status Bounds(const Json& s, const char* min_key, const char* max_key,
                      const std::string& where, int64_t* min, int64_t* max) {
    if (s.contains(min_key)) {
      TANDEM_ASSIGN_OR_RETURN(*min, Count(s, min_key, where));
    }
    if (s.contains(max_key)) {
      TANDEM_ASSIGN_OR_RETURN(*max, Count(s, max_key, where));
    }
    if (*max >= 0 && *max < *min) {
      return Refuse(where, absl::StrCat("'", max_key, "' below '", min_key, "'"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> Compile(const Json& s, const std::string& where) {
    Nesting nesting(depth_);
    if (depth_ > kMaxDepth) return Refuse(where, absl::StrCat("nesting deeper than ", kMaxDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return Any();
      return Refuse(where, "the schema false (which no value matches)");
    }
    if (!s.is_object()) return Refuse(where, "a schema that is not an object or a boolean");
    // Which keywords constrain the value, and of which types.
    std::vector<std::string_view> implied;  // types implied by type-specific keywords
    int constraining = 0;
    for (const auto& [key, value] : s.items()) {
      if (IsAnnotation(key)) continue;
      const std::string_view type = KeywordType(key);
      if (type == "unsupported") {
        return Refuse(where, absl::StrCat("keyword '", key, "' is not supported"));
      }
      ++constraining;
      if (!type.empty() && std::find(implied.begin(), implied.end(), type) == implied.end()) {
        implied.push_back(type);
      }
    }
    for (const char* alone : {"$ref", "anyOf", "allOf"}) {
      if (s.contains(alone) && constraining > 1) {
        return Refuse(where,
                      absl::StrCat("'", alone, "' beside other keywords that constrain the value"));
      }
    }
    if (s.contains("$ref")) return Ref(s.at("$ref"), where + "/$ref");
    if (s.contains("allOf")) {
      const Json& all = s.at("allOf");
      if (!all.is_array() || all.size() != 1) {
        return Refuse(where, "'allOf' other than a list of one schema");
      }
      return Compile(all[0], where + "/allOf/0");
    }
    if (s.contains("anyOf")) {
      const Json& any = s.at("anyOf");
      if (!any.is_array() || any.empty()) return Refuse(where, "'anyOf' must be a non-empty list");
      SchemaNode node{.kind = Kind::kUnion};
      for (size_t i = 0; i < any.size(); ++i) {
        TANDEM_ASSIGN_OR_RETURN(int32_t alt, Compile(any[i], absl::StrCat(where, "/anyOf/", i)));
        node.alternatives.push_back(alt);
      }
      return Add(std::move(node));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s.at("type");
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& e : t) {
          if (!e.is_string()) return Refuse(where, "'type' lists a value that is not a string");
          types.push_back(e.get<std::string>());
        }
      } else {
        return Refuse(where, "'type' must be a string or a non-empty list of strings");
      }
      for (const std::string& type : types) {
        if (type != "object" && type != "array" && type != "string" && type != "number" &&
            type != "integer" && type != "boolean" && type != "null") {
          return Refuse(where, absl::StrCat("unknown type '", type, "'"));
        }
      }
    }
    if (s.contains("enum") || s.contains("const")) return Literals(s, types, where);
    if (types.empty()) {
      if (implied.empty()) return Any();
      for (std::string_view t : implied) types.emplace_back(t);
    }
    for (std::string_view t : implied) {
      const auto listed = [&](std::string_view type) {
        return std::find(types.begin(), types.end(), type) != types.end();
      };
      if (!listed(t) && !(t == "number" && listed("integer"))) {
        return Refuse(where, absl::StrCat("keywords of type ", std::string(t),
                                          " in a schema of type ", absl::StrJoin(types, " or ")));
      }
    }
    SchemaNode node{.kind = Kind::kUnion};
    for (const std::string& type : types) {
      TANDEM_ASSIGN_OR_RETURN(int32_t one, OfOneType(s, type, where));
      node.alternatives.push_back(one);
    }
    if (node.alternatives.size() == 1) return node.alternatives[0];
    return Add(std::move(node));
  }

  absl::StatusOr<int32_t> OfOneType(const Json& s, const std::string& type,
                                    const std::string& where) {
    if (type == "object") return Object(s, where);
    if (type == "array") {
      SchemaNode node{.kind = Kind::kArray};
      if (s.contains("items")) {
        TANDEM_ASSIGN_OR_RETURN(node.items, Compile(s.at("items"), where + "/items"));
      } else {
        node.items = Any();
      }
      TANDEM_RETURN_IF_ERROR(
          Bounds(s, "minItems", "maxItems", where, &node.min_items, &node.max_items));
      return Add(std::move(node));
    }
    if (type == "string" && s.contains("format")) {
      TANDEM_ASSIGN_OR_RETURN(std::optional<int32_t> held, Format(s, where));
      if (held) return *held;
    }
    if (type == "string" && s.contains("pattern")) return Pattern(s, where);
    if (type == "string") {
      SchemaNode node{.kind = Kind::kString};
      TANDEM_RETURN_IF_ERROR(
          Bounds(s, "minLength", "maxLength", where, &node.min_length, &node.max_length));
      return Add(std::move(node));
    }
    if (type == "integer" || type == "number") {
      for (const char* key : kNumericBounds) {
        if (s.contains(key)) return Numeric(s, type, where);
      }
    }
    const Kind kind = type == "number"    ? Kind::kNumber
                      : type == "integer" ? Kind::kInteger
                      : type == "boolean" ? Kind::kBoolean
                                          : Kind::kNull;
    return Add({.kind = kind});
  }

  // A number or an integer within the schema's bounds (minimum, maximum and
  // the exclusive ones, the strictest of each side), as xgrammar holds it:
  // the values in the range as json_numbers.h writes them.
  absl::StatusOr<int32_t> Numeric(const Json& s, const std::string& type,
                                  const std::string& where) {
    if (type == "number") return NumberRange(s, where);
    std::optional<int64_t> lo, hi;
    for (const char* key : kNumericBounds) {
      if (!s.contains(key)) continue;
      const Json& v = s.at(key);
      const std::string name = absl::StrCat("'", key, "'");
      if (!v.is_number()) return Refuse(where, absl::StrCat(name, " must be a number"));
      int64_t bound = 0;
      if (v.is_number_float()) {
        // A whole number written with a fraction or an exponent (1.0, 1e3).
        const double d = v.get<double>();
        if (d != std::floor(d)) {
          return Refuse(where, absl::StrCat(name, " of an integer must be a whole number"));
        }
        if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
          return Refuse(where, absl::StrCat(name, " is beyond 64-bit integers"));
        }
        bound = static_cast<int64_t>(d);
      } else if (v.is_number_unsigned() &&
                 v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Refuse(where, absl::StrCat(name, " is beyond 64-bit integers"));
      } else {
        bound = v.get<int64_t>();
      }
      const std::string_view k = key;
      if (k == "exclusiveMinimum") {
        if (bound == std::numeric_limits<int64_t>::max()) {
          return Refuse(where, "'exclusiveMinimum' leaves no 64-bit integer above it");
        }
        ++bound;
      } else if (k == "exclusiveMaximum") {
        if (bound == std::numeric_limits<int64_t>::min()) {
          return Refuse(where, "'exclusiveMaximum' leaves no 64-bit integer below it");
        }
        --bound;
      }
      if (k == "minimum" || k == "exclusiveMinimum") {
        lo = lo ? std::max(*lo, bound) : bound;
      } else {
        hi = hi ? std::min(*hi, bound) : bound;
      }
    }
    if (lo && hi && *lo > *hi) {
      return Refuse(where, absl::StrCat("bounds that no integer meets (at least ", *lo,
                                        ", at most ", *hi, ")"));
    }
    return RangeNode(internal::IntegerRangeRegex(lo, hi), where);
  }

  absl::StatusOr<int32_t> NumberRange(const Json& s, const std::string& where) {
    std::optional<internal::NumberBound> lo, hi;
    for (const char* key : kNumericBounds) {
      if (!s.contains(key)) continue;
      const Json& v = s.at(key);
      if (!v.is_number()) return Refuse(where, absl::StrCat("'", key, "' must be a number"));
      const double d = v.get<double>();
      if (!(std::fabs(d) < 9223372036854775808.0)) {
        return Refuse(where, absl::StrCat("'", key, "' is beyond 2^63 in magnitude"));
      }
      const std::string_view k = key;
      const internal::NumberBound bound{.value = d, .exclusive = k.starts_with("exclusive")};
      // The stricter of two bounds on a side; on a tie the exclusive one.
      if (k == "minimum" || k == "exclusiveMinimum") {
        if (!lo || d > lo->value || (d == lo->value && bound.exclusive)) lo = bound;
      } else if (!hi || d < hi->value || (d == hi->value && bound.exclusive)) {
        hi = bound;
      }
    }
    const std::string regex = internal::NumberRangeRegex(lo, hi);
    if (regex.empty()) {
      return Refuse(where,
                    "bounds that no number of at most six fraction digits meets (xgrammar's)");
    }
    return RangeNode(regex, where);
  }

  // A value that the range regex `regex` matches whole.
  absl::StatusOr<int32_t> RangeNode(const std::string& regex, const std::string& where) {
    auto dfa = CompileRegex(regex, RegexDialect::kText);
    if (!dfa.ok()) {
      return Refuse(where, absl::StrCat("the range's automaton: ", dfa.status().message()));
    }
    return Add({.kind = Kind::kRegex, .regex = *std::move(dfa)});
  }

  // A string of a `format` xgrammar holds (json_formats.cc), whose value
  // matches the format's regex whole; nullopt for a format xgrammar does not
  // know, which is an annotation (the string's other keywords apply).
  absl::StatusOr<std::optional<int32_t>> Format(const Json& s, const std::string& where) {
    const Json& format = s.at("format");
    if (!format.is_string()) return Refuse(where, "'format' must be a string");
    const internal::FormatRule rule = internal::JsonFormat(format.get<std::string>());
    if (rule.kind == internal::FormatRule::kAnnotation) return std::nullopt;
    if (rule.kind == internal::FormatRule::kRefused) {
      return Refuse(where, absl::StrCat("'format' ", format.dump(), ": ", rule.why));
    }
    return RegexString(s, "format", rule.regex, {"pattern", "minLength", "maxLength"}, where);
  }

  // A string whose value matches `pattern` whole, read as xgrammar reads
  // it (regex.h's RegexDialect::kJsonStringPattern).
  absl::StatusOr<int32_t> Pattern(const Json& s, const std::string& where) {
    const Json& pattern = s.at("pattern");
    if (!pattern.is_string()) return Refuse(where, "'pattern' must be a string");
    return RegexString(s, "pattern", pattern.get<std::string>(), {"minLength", "maxLength"}, where);
  }

  // A string whose value `regex` (from `keyword`) matches whole, read as
  // RegexDialect::kJsonStringPattern; refused beside `others`: xgrammar holds
  // the regex alone, and both would need an automaton of their own.
  absl::StatusOr<int32_t> RegexString(const Json& s, const char* keyword, const std::string& regex,
                                      std::initializer_list<const char*> others,
                                      const std::string& where) {
    for (const char* key : others) {
      if (s.contains(key)) {
        return Refuse(where, absl::StrCat("'", keyword, "' beside '", key, "'"));
      }
    }
    auto dfa = CompileRegex(regex, RegexDialect::kJsonStringPattern);
    if (!dfa.ok()) return Refuse(where, absl::StrCat("'", keyword, "': ", dfa.status().message()));
    return Add({.kind = Kind::kRegex, .regex = *std::move(dfa)});
  }

  absl::StatusOr<int32_t> Object(const Json& s, const std::string& where) {
    SchemaNode node{.kind = Kind::kObject};
    absl::flat_hash_map<std::string, size_t> index;
    if (s.contains("properties")) {
      const Json& props = s.at("properties");
      if (!props.is_object()) return Refuse(where, "'properties' must be an object");
      for (const auto& [name, sub] : props.items()) {
        index[name] = node.properties.size();
        node.properties.push_back({.name = name, .key = Json(name).dump()});
      }
      // Compiled after the list is complete: node indices of the properties'
      // schemas may not be known before their names are.
      size_t i = 0;
      for (const auto& [name, sub] : props.items()) {
        TANDEM_ASSIGN_OR_RETURN(node.properties[i].node,
                                Compile(sub, absl::StrCat(where, "/properties/", name)));
        ++i;
      }
    }
    if (s.contains("required")) {
      const Json& required = s.at("required");
      if (!required.is_array()) return Refuse(where, "'required' must be a list of names");
      for (const Json& r : required) {
        if (!r.is_string()) return Refuse(where, "'required' lists a value that is not a string");
        const auto it = index.find(r.get<std::string>());
        if (it == index.end()) {
          // A required member the grammar cannot write is never there.
          return Refuse(where, absl::StrCat("required property '", r.get<std::string>(),
                                            "' is not in 'properties'"));
        }
        node.properties[it->second].required = true;
      }
    }
    if (s.contains("additionalProperties")) {
      const Json& extra = s.at("additionalProperties");
      if (!(extra.is_boolean() && !extra.get<bool>())) {
        TANDEM_ASSIGN_OR_RETURN(node.additional, Compile(extra, where + "/additionalProperties"));
      }
    }
    node.first_required.assign(node.properties.size() + 1, 0);
    int32_t next = static_cast<int32_t>(node.properties.size());
    for (size_t j = node.properties.size() + 1; j-- > 0;) {
      if (j < node.properties.size() && node.properties[j].required) next = static_cast<int32_t>(j);
      node.first_required[j] = next;
    }
    return Add(std::move(node));
  }

  absl::StatusOr<int32_t> Literals(const Json& s, const std::vector<std::string>& types,
                                   const std::string& where) {
    for (const auto& [key, value] : s.items()) {
      if (!IsAnnotation(key) && key != "enum" && key != "const" && key != "type") {
        return Refuse(where, absl::StrCat("'", key, "' beside 'enum' or 'const'"));
      }
    }
    if (s.contains("enum") && s.contains("const")) return Refuse(where, "both 'enum' and 'const'");
    std::vector<Json> values;
    if (s.contains("const")) {
      values.push_back(s.at("const"));
    } else {
      const Json& e = s.at("enum");
      if (!e.is_array() || e.empty()) return Refuse(where, "'enum' must be a non-empty list");
      values.assign(e.begin(), e.end());
    }
    SchemaNode node{.kind = Kind::kLiteral};
    for (size_t i = 0; i < values.size(); ++i) {
      if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& t) {
            return OfType(values[i], t);
          })) {
        return Refuse(where, absl::StrCat("value ", i, " of 'enum'/'const' (", values[i].dump(),
                                          ") is not of type ", absl::StrJoin(types, " or ")));
      }
      node.literals.push_back(values[i].dump(-1, ' ', false, Json::error_handler_t::strict));
    }
    SortLiterals(&node);
    return Add(std::move(node));
  }

  absl::StatusOr<int32_t> Ref(const Json& ref, const std::string& where) {
    if (!ref.is_string()) return Refuse(where, "'$ref' must be a string");
    const std::string target = ref.get<std::string>();
    if (const auto it = refs_.find(target); it != refs_.end()) return it->second;
    const Json* resolved = nullptr;
    if (target == "#") {
      resolved = &doc_;
    } else {
      for (const char* defs : {"#/$defs/", "#/definitions/"}) {
        const std::string_view prefix(defs);
        if (target.rfind(prefix, 0) != 0) continue;
        const std::string name = target.substr(prefix.size());
        const std::string section(prefix.substr(2, prefix.size() - 3));
        if (doc_.is_object() && doc_.contains(section) && doc_.at(section).is_object() &&
            doc_.at(section).contains(name)) {
          resolved = &doc_.at(section).at(name);
        }
      }
    }
    if (resolved == nullptr) {
      return Refuse(where, absl::StrCat("'$ref' \"", target,
                                        "\" (only \"#\", \"#/$defs/NAME\" and "
                                        "\"#/definitions/NAME\" of this schema resolve)"));
    }
    // A one-way union stands for the target while it compiles, so that a
    // recursive reference finds it.
    const int32_t self = Add({.kind = Kind::kUnion});
    refs_[target] = self;
    TANDEM_ASSIGN_OR_RETURN(int32_t node, Compile(*resolved, target));
    schema_->nodes_[static_cast<size_t>(self)].alternatives = {node};
    return self;
  }

  const Json& doc_;
  std::shared_ptr<Schema> schema_;
  absl::flat_hash_map<std::string, int32_t> refs_;
  int32_t any_ = -1;
  int depth_ = 0;
};

absl::StatusOr<std::shared_ptr<const Schema>> CompileJsonSchema(const Json& schema,
                                                                bool any_whitespace) {
  return SchemaCompiler(schema, any_whitespace).Run();
}

namespace {

// A schema of one node, its root (choices, a regex document).
std::shared_ptr<const Schema> OneNode(SchemaNode node) {
  static const Json kNone;
  SchemaCompiler compiler(kNone);
  compiler.SetRoot(compiler.Add(std::move(node)));
  return compiler.Take();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Schema>> CompileChoices(
    const std::vector<std::string>& choices) {
  if (choices.empty()) return absl::InvalidArgumentError("the list of choices is empty");
  SchemaNode node{.kind = Kind::kLiteral};
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("choice ", i, " is empty"));
    }
    node.literals.push_back(choices[i]);
  }
  SortLiterals(&node);
  return OneNode(std::move(node));
}

absl::StatusOr<std::shared_ptr<const Schema>> CompileRegexDocument(std::string_view pattern) {
  auto dfa = CompileRegex(pattern);
  if (!dfa.ok()) return dfa.status();
  return OneNode({.kind = Kind::kRegex, .regex = *std::move(dfa)});
}

absl::StatusOr<std::shared_ptr<const Schema>> CompileGrammar(const SamplingParams& params) {
  if (!params.choice.empty()) return CompileChoices(params.choice);
  if (!params.regex.empty()) return CompileRegexDocument(params.regex);
  if (!params.grammar.empty()) {
    auto compiled = CompileEbnfDocument(params.grammar);
    if (!compiled.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: ", compiled.status().message()));
    }
    return compiled;
  }
  const auto schema =
      nlohmann::ordered_json::parse(params.json_schema, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("json_schema is not valid JSON");
  return CompileJsonSchema(schema, !params.disable_any_whitespace);
}

std::shared_ptr<const Schema> AnyJsonObject() {
  static const Json kNone;
  SchemaCompiler compiler(kNone);
  const int32_t any = compiler.Any();
  // The any-value union's first alternative is its any-member object.
  compiler.SetRoot(any + 1);
  return compiler.Take();
}

}  // namespace tandem::grammar
