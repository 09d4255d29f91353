// JSON Schemas compiled for structured outputs: the nodes JsonMatcher
// (json_matcher.h) walks a byte at a time.
//
// The language a schema compiles to is xgrammar's (vLLM's default backend)
// in its default strict mode, for the keywords below:
// - properties appear in the order the schema lists them; an optional one may
//   be left out, a required one may not; `additionalProperties` absent counts
//   as false (xgrammar's strict mode); true or a schema lets members with any
//   other key follow the listed ones (keys are not checked against the
//   listed names, nor for repeats);
// - `enum` and `const` values are matched as their compact JSON text
//   (compact, objects' keys in the order given);
// - `integer` is 0|-?[1-9][0-9]* (xgrammar's: no "-0"), `number` is
//   RFC 8259's, -?(0|[1-9][0-9]*) with a fraction and an exponent; an
//   integer's minimum, maximum, exclusiveMinimum and exclusiveMaximum
//   (whole numbers within 64 bits) hold it to the integers between them,
//   and a number's (below 2^63 in magnitude) to the decimals of at most six
//   fraction digits and no exponent between them, as xgrammar's range
//   regexes do (json_numbers.h); multipleOf is refused;
// - strings are RFC 8259's, valid UTF-8; minLength/maxLength count
//   characters and escapes as one each; a string with `pattern` is one
//   whose value the pattern matches whole, with no escape in it
//   (xgrammar's reading: regex.h's RegexDialect::kJsonStringPattern), and
//   not with minLength or maxLength; a `format` xgrammar knows holds the
//   value to xgrammar's regex for it (date, time, date-time, duration,
//   ipv4, ipv6, hostname, uuid, uri, uri-reference, uri-template; not with
//   pattern, minLength or maxLength), email and the JSON pointers are
//   refused (xgrammar's regexes admit text that is not JSON), and any other
//   format is an annotation, as in xgrammar and JSON Schema's default;
// - whitespace (space, tab, LF: xgrammar's [ \n\t], no CR) is allowed
//   between the tokens of objects and arrays, none before or after the whole
//   document; with any_whitespace false (xgrammar's any_whitespace=False,
//   vLLM's disable_any_whitespace) there is none at all outside strings but
//   the space of ", " between members and items and of ": " after a key, as
//   Python's json.dumps writes them.
// Every other keyword that constrains a value is refused by name (minimum,
// oneOf, ...), never ignored; annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly) are ignored. `$ref` resolves "#", "#/$defs/NAME" and
// "#/definitions/NAME" (recursion allowed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tandem/common/sampling_params.h"
#include "tandem/grammar/regex.h"

namespace tandem::grammar {

struct SchemaNode {
  enum class Kind : uint8_t {
    kObject,
    kArray,
    kString,
    kNumber,
    kInteger,
    kBoolean,
    kNull,
    kLiteral,  // enum / const: one of `literals`
    kUnion,    // anyOf, a list of types, or any value: one of `alternatives`
    kRegex,    // text `regex` reads (structured_outputs.regex; a string's pattern)
    // A grammar's (ebnf.h): `elements` one after the other.
    kSequence,
    // A grammar's: `items` between min_items and max_items times.
    kRepeat,
  };
  struct Property {
    std::string name;
    std::string key;  // its JSON text with the quotes, as the key is written
    int32_t node = -1;
    bool required = false;
  };
  Kind kind = Kind::kUnion;
  // kObject. first_required[j]: the first required property at index >= j
  // (properties.size() when none); properties.size() + 1 entries.
  std::vector<Property> properties;
  std::vector<int32_t> first_required;
  int32_t additional = -1;  // node of other members' values; -1: none
  // kArray (and kRepeat)
  int32_t items = -1;
  int64_t min_items = 0;
  int64_t max_items = -1;  // -1: unbounded
  // kString
  int64_t min_length = 0;
  int64_t max_length = -1;  // -1: unbounded
  // kLiteral: compact JSON texts (or choices), each non-empty, sorted by
  // their bytes and distinct.
  std::vector<std::string> literals;
  // kUnion
  std::vector<int32_t> alternatives;
  // kRegex
  std::shared_ptr<const RegexDfa> regex;
  // kSequence
  std::vector<int32_t> elements;
  // Set by the grammar compiler (ebnf.h) on its kSequence, kUnion and
  // kRepeat nodes, and true of every other node but a regex (whose
  // automaton says): whether the node matches the empty text, whether some
  // text of it begins with a byte, and (kSequence) the first element from
  // which every element matches the empty text.
  bool nullable = false;
  bool opens = true;
  int32_t nullable_from = 0;
};

// Whether `n` matches the empty text, and whether some text of it begins
// with a byte.
inline bool NodeNullable(const SchemaNode& n) {
  return n.kind == SchemaNode::Kind::kRegex ? n.regex->Accepting(n.regex->start()) : n.nullable;
}
inline bool NodeOpens(const SchemaNode& n) {
  return n.kind == SchemaNode::Kind::kRegex ? n.regex->Open(n.regex->start()) : n.opens;
}

// A grammar's kSequence, kUnion and kRepeat nodes nested at one position
// before a byte is read (the grammar compiler refuses deeper ones; a JSON
// schema's unions nest a few deep).
inline constexpr int kMaxGrammarNesting = 64;
// A grammar's kSequence and kRepeat frames open at once in one reading of a
// document: past this, its bytes are refused as too ambiguous ones are
// (JsonMatcher::overflowed), so a recursive grammar cannot exhaust the
// stack.
inline constexpr int kMaxGrammarDepth = 1000;

namespace ebnf {
class EbnfCompiler;
}  // namespace ebnf

// A compiled schema: nodes by index, the document's at root().
class Schema {
 public:
  const SchemaNode& node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
  int32_t root() const { return root_; }
  size_t size() const { return nodes_.size(); }
  // This schema's number, unique within the process (TokenMaskCache keeps
  // masks by it, so a schema freed and another allocated in its place never
  // share one).
  uint64_t id() const { return id_; }
  // Whitespace between an object's or an array's tokens is free (true) or
  // only the space of ", " and ": " (false).
  bool any_whitespace() const { return any_whitespace_; }

 private:
  friend class SchemaCompiler;
  friend class ebnf::EbnfCompiler;
  static uint64_t NextId();
  uint64_t id_ = NextId();
  bool any_whitespace_ = true;
  std::vector<SchemaNode> nodes_;
  int32_t root_ = -1;
};

// `schema` compiled (an ordered_json: properties keep the order the client
// wrote them in). INVALID_ARGUMENT naming the keyword and where it is
// (a JSON pointer) for what is refused: an unsupported keyword, a malformed
// value, an unresolvable $ref, an empty enum, the schema `false`.
[[nodiscard]] absl::StatusOr<std::shared_ptr<const Schema>> CompileJsonSchema(
    const nlohmann::ordered_json& schema, bool any_whitespace = true);

// OpenAI's JSON mode (response_format {"type": "json_object"}): an object
// whose members may hold any JSON value.
std::shared_ptr<const Schema> AnyJsonObject();

// vLLM's structured_outputs.choice: a document that is exactly one of
// `choices`, as their bytes (raw text, not JSON; xgrammar's
// choice_as_grammar). A choice may begin another ("yes", "yes!"): the
// document may end after the shorter or go on. A repeated choice counts once;
// however many there are, the matcher reads them as one (a range of them,
// sorted). INVALID_ARGUMENT for an empty list or an empty choice.
[[nodiscard]] absl::StatusOr<std::shared_ptr<const Schema>> CompileChoices(
    const std::vector<std::string>& choices);

// vLLM's structured_outputs.regex: a document that is raw text matching
// `pattern` whole (regex.h says which patterns are held and how they read).
// INVALID_ARGUMENT for a pattern that is refused.
[[nodiscard]] absl::StatusOr<std::shared_ptr<const Schema>> CompileRegexDocument(
    std::string_view pattern);

// The grammar of a request's structured outputs (its json_schema, choice,
// regex or grammar: SamplingParams::HasGrammar; a json_schema's whitespace as its
// disable_any_whitespace says), compiled; INVALID_ARGUMENT saying what is
// refused.
[[nodiscard]] absl::StatusOr<std::shared_ptr<const Schema>> CompileGrammar(
    const SamplingParams& params);

// CompileGrammar's results, refusals included, kept for the process by the
// grammar's field, text and whitespace (the last kKeptGrammars used): the scheduler
// compiles a request's grammar on its gRPC thread as the request arrives,
// so that its engine loop's admission finds it compiled, and the worker's
// requests of one grammar share one Schema (and so its token masks).
inline constexpr size_t kKeptGrammars = 256;
[[nodiscard]] absl::StatusOr<std::shared_ptr<const Schema>> CompileGrammarKept(
    const SamplingParams& params);
struct KeptGrammarStats {
  int64_t hits = 0;
  int64_t misses = 0;
};
KeptGrammarStats KeptGrammars();

}  // namespace tandem::grammar
