// JSON schemas compiled to byte automata, and the token masks they give.
// The npm check (grammar_npm_check, README.md here) holds the same automata
// to ajv and json-schema-faker.
#include "tandem/grammar/json_matcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grammar_test_util.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/grammar/token_mask.h"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

constexpr const char* kPerson = R"({
  "type": "object",
  "title": "Person",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 4},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 1, null]}, "maxItems": 2},
    "score": {"type": ["number", "null"]}
  },
  "required": ["name", "score"]
})";

TEST(JsonSchemaTest, RefusesWhatItCannotHoldByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"x({"type": "string", "pattern": "a(?=b)"})x", "'pattern': regex: lookaround"},
      {R"({"type": "string", "pattern": "a+", "maxLength": 3})", "'pattern' beside 'maxLength'"},
      {R"({"type": "string", "pattern": ["a"]})", "'pattern' must be a string"},
      {"{\"type\": \"string\", \"pattern\": \"\xC3\xA9+\"}", "other than printable ASCII"},
      {R"({"type": "string", "pattern": "a]"})", "a ']' without its opening bracket"},
      {R"({"type": "string", "pattern": "\\U0001F600"})", "\\U in a JSON schema's pattern"},
      {R"({"type": "string", "pattern": "[\"\\\\]"})", "no string matches"},
      {R"({"type": "number", "minimum": 1e300})", "'minimum' is beyond 2^63 in magnitude"},
      {R"({"type": "integer", "multipleOf": 2})", "keyword 'multipleOf' is not supported"},
      {R"({"type": "integer", "minimum": 1.5})", "'minimum' of an integer must be a whole number"},
      {R"({"type": "integer", "maximum": "9"})", "'maximum' must be a number"},
      {R"({"type": "integer", "minimum": 1e30})", "'minimum' is beyond 64-bit integers"},
      {R"({"type": "integer", "maximum": 9223372036854775808})", "beyond 64-bit integers"},
      {R"({"type": "integer", "minimum": 3, "exclusiveMaximum": 3})",
       "bounds that no integer meets (at least 3, at most 2)"},
      {R"({"type": "integer", "exclusiveMinimum": 9223372036854775807})",
       "leaves no 64-bit integer above it"},
      {R"({"type": "string", "maximum": 3})", "keywords of type number in a schema of type string"},
      {R"({"oneOf": [{"type": "string"}]})", "keyword 'oneOf'"},
      {R"({"$ref": "https://example.com/s.json"})", "'$ref' \"https://example.com/s.json\""},
      {R"({"$ref": "#/$defs/Missing", "$defs": {}})", "'$ref' \"#/$defs/Missing\""},
      {R"({"enum": []})", "'enum' must be a non-empty list"},
      {"false", "the schema false"},
      {R"({"type": "object", "properties": {}, "required": ["x"]})",
       "required property 'x' is not in 'properties'"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})", "'allOf' other than a list of one"},
      {R"({"type": "strin"})", "unknown type 'strin'"},
      {R"({"type": "string", "minItems": 1})", "keywords of type array in a schema of type string"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "'maxItems' below 'minItems'"},
      {R"({"type": "string", "enum": ["a", 1]})", "value 1 of 'enum'/'const' (1) is not of type"},
      {R"({"anyOf": [{"type": "string"}], "type": "string"})", "'anyOf' beside other keywords"},
      {R"({"type": "string", "maxLength": -1})", "'maxLength' must be a non-negative integer"},
      {R"({"$ref": "#"})", "refers to itself with no value in between"},
      {R"({"$defs": {"A": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/A"}]}},
           "$ref": "#/$defs/A"})",
       "refers to itself with no value in between"},
  };
  for (const auto& [schema, message] : cases) {
    auto compiled = CompileJsonSchema(Json::parse(schema));
    ASSERT_FALSE(compiled.ok()) << schema;
    EXPECT_EQ(compiled.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(compiled.status().message()), HasSubstr(message)) << schema;
  }
}

TEST(JsonSchemaTest, RefusesNestingPastItsBound) {
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 200; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  auto compiled = CompileJsonSchema(Json::parse(deep));
  ASSERT_FALSE(compiled.ok());
  EXPECT_THAT(std::string(compiled.status().message()), HasSubstr("nesting deeper than 128"));
}

TEST(JsonMatcherTest, ObjectsHoldTheirPropertiesInOrder) {
  const auto s = Compile(kPerson);
  EXPECT_TRUE(Matches(s, R"({"name":"ab","score":1.5})"));
  EXPECT_TRUE(Matches(s, R"({"name":"ab","age":-30,"tags":["a",null],"score":null})"));
  EXPECT_TRUE(Matches(s, "{ \"name\" :\t\"ab\" ,\n\"score\": 2e-3\n}"));
  // xgrammar's whitespace is [ \n\t]: no CR, which RFC 8259 has.
  EXPECT_FALSE(Begins(s, "{\r"));
  EXPECT_FALSE(Begins(s, "{\"name\":\"ab\",\"score\":1\r"));
  // A required property cannot be left out, nor properties reordered.
  EXPECT_FALSE(Matches(s, R"({"name":"ab"})"));
  EXPECT_FALSE(Matches(s, R"({"score":1,"name":"ab"})"));
  EXPECT_FALSE(Begins(s, R"({"score")"));
  // No property the schema does not list: additionalProperties, left out,
  // is false (xgrammar's strict mode; what vLLM's
  // disable_additional_properties writes in, so the frontend takes it).
  EXPECT_FALSE(Begins(s, R"({"name":"ab","x")"));
  // Types, lengths and counts.
  EXPECT_FALSE(Matches(s, R"({"name":"","score":1})"));
  EXPECT_FALSE(Begins(s, R"({"name":"abcde)"));
  EXPECT_TRUE(Begins(s, R"({"name":"abcd)"));
  EXPECT_FALSE(Begins(s, R"({"name":"a","age":1.)"));
  EXPECT_FALSE(Begins(s, R"({"name":"a","tags":["a","b",)"));
  EXPECT_FALSE(Begins(s, R"({"name":"a","tags":["c)"));
  EXPECT_FALSE(Begins(s, R"({"name":"a","tags":[2)"));
  // No whitespace before or after the document.
  EXPECT_FALSE(Begins(s, " {"));
  EXPECT_FALSE(Begins(s, "{\"name\":\"a\",\"score\":1} "));
  EXPECT_FALSE(Begins(s, R"({"name":"a",})"));
}

TEST(JsonMatcherTest, AdditionalPropertiesFollowTheListedOnes) {
  const auto s = Compile(R"({"properties": {"a": {"type": "integer"}},
                              "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(Matches(s, R"({})"));
  EXPECT_TRUE(Matches(s, R"({"a":1,"zz":true,"y":false})"));
  EXPECT_TRUE(Matches(s, R"({"q":true})"));
  EXPECT_FALSE(Begins(s, R"({"q":1)"));
  const auto any = AnyJsonObject();
  EXPECT_TRUE(Matches(any, R"({"a":[1,{"b":null}],"c":"\u00e9\n","d":-0.5E+7})"));
  EXPECT_FALSE(Begins(any, "["));
  EXPECT_FALSE(Begins(any, "\"a\""));
}

// xgrammar's any_whitespace=False (vLLM's disable_any_whitespace): Python's
// json.dumps separators, ", " and ": ", and no other whitespace outside
// strings (the npm check feeds it json.dumps' own documents).
TEST(JsonMatcherTest, WithoutAnyWhitespaceOnlyJsonDumpsSeparators) {
  const auto compact = [](const std::string& text) {
    auto schema = CompileJsonSchema(Json::parse(text), /*any_whitespace=*/false);
    EXPECT_TRUE(schema.ok()) << schema.status();
    return schema.ok() ? *schema : nullptr;
  };
  const auto s = compact(kPerson);
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->any_whitespace());
  EXPECT_TRUE(Matches(s, R"({"name": "a b", "tags": ["a", null], "score": 1.5})"));
  EXPECT_TRUE(Matches(s, R"({"name": "ab", "tags": [], "score": null})"));
  for (const char* other :
       {R"({"name":"ab", "score": 1})", R"({"name": "ab","score": 1})",
        R"({ "name": "ab", "score": 1})", R"({"name": "ab", "score": 1 })",
        R"({"name" : "ab", "score": 1})", R"({"name":  "ab", "score": 1})",
        "{\"name\":\t\"ab\", \"score\": 1}", "{\"name\": \"ab\",\n\"score\": 1}",
        R"({"name": "ab", "tags": ["a",null], "score": 1})",
        R"({"name": "ab", "tags": [ "a"], "score": 1})"}) {
    EXPECT_FALSE(Matches(s, other)) << other;
  }
  // Any value (OpenAI's JSON mode) is written the same way all the way down.
  const auto any = compact(R"({"type": "object", "additionalProperties": true})");
  EXPECT_TRUE(Matches(any, R"({"a": [1, {"b": null, "c": {}}], "d": "x, y: z"})"));
  EXPECT_FALSE(Matches(any, R"({"a": [1, {"b":null}]})"));
  EXPECT_FALSE(Matches(any, R"({"a": [1,2]})"));
  // The same schema with any whitespace takes both; each is its own grammar.
  const auto free = Compile(R"({"type": "object", "additionalProperties": true})");
  EXPECT_TRUE(free->any_whitespace());
  EXPECT_TRUE(Matches(free, R"({"a": [1,2]})"));
  EXPECT_NE(free->id(), any->id());
}

TEST(JsonMatcherTest, StringsAreRfc8259sInValidUtf8) {
  const auto s = Compile(R"({"type": "string"})");
  EXPECT_TRUE(Matches(s, R"("a\"\\\/\b\f\n\r\t\u12aF")"));
  EXPECT_TRUE(Matches(s, "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\""));  // é € 😀
  EXPECT_FALSE(Begins(s, R"("\x)"));
  EXPECT_FALSE(Begins(s, R"("\u12g)"));
  EXPECT_FALSE(Begins(s, "\"\n"));                // a control character
  EXPECT_FALSE(Begins(s, "\"\xC0\xAF"));          // overlong
  EXPECT_FALSE(Begins(s, "\"\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(Begins(s, "\"\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(Begins(s, "\"\xE2\x82\""));        // cut short
  const auto bounded = Compile(R"({"type": "string", "minLength": 2, "maxLength": 2})");
  EXPECT_TRUE(Matches(bounded, "\"\xC3\xA9\\n\""));  // a character and an escape
  EXPECT_FALSE(Begins(bounded, "\"ab\xC3"));
  EXPECT_FALSE(Matches(bounded, "\"a\""));
}

TEST(JsonMatcherTest, NumbersAreRfc8259s) {
  const auto number = Compile(R"({"type": "number"})");
  const auto integer = Compile(R"({"type": "integer"})");
  for (const char* ok : {"0", "-0", "12", "-1.5", "0.25e10", "3E+2", "7e-01"}) {
    EXPECT_TRUE(Matches(number, ok)) << ok;
  }
  for (const char* bad : {"01", "-", "1.", ".5", "1e", "1e+", "+1", "--1", "1.5.2", "0x1"}) {
    EXPECT_FALSE(Matches(number, bad)) << bad;
  }
  EXPECT_TRUE(Matches(integer, "-120"));
  EXPECT_TRUE(Matches(integer, "0"));
  EXPECT_FALSE(Begins(integer, "-0"));  // as xgrammar: a number's "-0" is an integer's "0"
  EXPECT_FALSE(Begins(integer, "1."));
  EXPECT_FALSE(Begins(integer, "1e"));
  // A number may end the document, or go on.
  JsonMatcher m(number);
  ASSERT_TRUE(m.Accept("12"));
  EXPECT_TRUE(m.Complete());
  EXPECT_TRUE(m.Open());
}

TEST(JsonMatcherTest, EnumsAnyOfAndRecursiveReferences) {
  const auto e = Compile(R"({"enum": ["ab", "abc", 10, true, {"k": [1]}]})");
  EXPECT_TRUE(Matches(e, R"("ab")"));
  EXPECT_TRUE(Matches(e, R"("abc")"));
  EXPECT_TRUE(Matches(e, "10"));
  EXPECT_TRUE(Matches(e, "true"));
  EXPECT_TRUE(Matches(e, R"({"k":[1]})"));
  EXPECT_FALSE(Matches(e, "1"));
  EXPECT_FALSE(Begins(e, "100"));
  EXPECT_FALSE(Begins(e, R"("abd)"));
  const auto tree = Compile(R"({
    "$defs": {"Node": {"type": "object",
      "properties": {"v": {"type": "integer"},
                     "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
      "required": ["v"]}},
    "$ref": "#/$defs/Node"})");
  EXPECT_TRUE(Matches(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(Matches(tree, R"({"v":1,"kids":[{"kids":[]}]})"));
  const auto either = Compile(R"({"anyOf": [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "null"}},
     "required": ["b"]}]})");
  EXPECT_TRUE(Matches(either, R"({"a":1})"));
  EXPECT_TRUE(Matches(either, R"({"a":"x","b":null})"));
  EXPECT_TRUE(Matches(either, R"({"b":null})"));
  EXPECT_FALSE(Matches(either, R"({"a":1,"b":null})"));
  EXPECT_FALSE(Matches(either, R"({"a":"x"})"));
}

// A string's pattern holds its value whole, as xgrammar reads it: no escape
// in the value, \s a space there, and the JSON around it unchanged.
TEST(JsonMatcherTest, APatternHoldsTheStringsValueWhole) {
  const auto s = Compile(R"({"type": "object", "properties": {
      "code": {"type": "string", "pattern": "^[A-Z]{2}\\s\\d+$"},
      "any": {"type": "string", "pattern": ".+"},
      "either": {"anyOf": [{"type": "string", "pattern": "a+"}, {"type": "string", "maxLength": 1}]}},
      "required": ["code"]})");
  for (const char* doc : {R"({"code":"AB 12"})", R"({"code": "XY 0" , "any":"a"})",
                          R"({"code":"AB 1","either":"aaa"})", R"({"code":"AB 1","either":"b"})",
                          "{\"code\":\"AB 1\",\"any\":\"\xC3\xA9\"}"}) {
    EXPECT_TRUE(Matches(s, doc)) << doc;
  }
  for (const char* doc :
       {R"({"code":"AB12"})", R"({"code":"ab 12"})", R"({"code":"AB\t12"})",
        "{\"code\":\"AB\t12\"}", R"({"code":"AB 12","any":""})", R"({"code":"AB 1","any":"a\"b"})",
        R"({"code":"AB 1","any":"a\u00e9"})", R"({"code":"AB 1","any":"a\\b"})",
        R"({"code":"AB 1","either":"bb"})", R"({"code":"AB 1 "})"}) {
    EXPECT_FALSE(Matches(s, doc)) << doc;
  }
  EXPECT_TRUE(Begins(s, R"({"code":"A)"));
  EXPECT_FALSE(Begins(s, R"({"code":"A1)"));
  // The value's closing quote hands on to the object.
  JsonMatcher m(s);
  ASSERT_TRUE(m.Accept(R"({"code":"AB 7)"));
  EXPECT_FALSE(m.Complete());
  ASSERT_TRUE(m.Accept(R"(" })"));
  EXPECT_TRUE(m.Complete());
}

// A `format` xgrammar knows holds the value as its regex does; one it does
// not know is an annotation; the ones whose regex admits text that is not
// JSON are refused by name.
TEST(JsonMatcherTest, FormatsAreHeldAsXgrammarHoldsThem) {
  const auto string_of = [](const char* format) {
    return Compile(absl::StrCat(R"({"type": "string", "format": ")", format, R"("})"));
  };
  const std::vector<std::tuple<const char*, std::vector<const char*>, std::vector<const char*>>>
      cases = {
          {"date", {"2026-12-03", "0000-01-31"}, {"2026-13-01", "2026-1-01", "2026-12-32"}},
          {"time", {"23:59:60Z", "00:00:00.125+05:30"}, {"24:00:00Z", "12:00:00"}},
          {"date-time",
           {"2026-12-03T10:20:30Z", "2026-12-03T10:20:30.5-01:00"},
           {"2026-12-03 10:20:30Z", "2026-12-03T10:20Z"}},
          {"duration", {"P3DT4H", "PT5M", "P2W"}, {"P", "3D", "PT"}},
          {"ipv4", {"192.168.0.1", "0.0.0.0"}, {"256.1.1.1", "1.2.3"}},
          {"ipv6", {"::1", "2001:db8::8a2e:370:7334", "::ffff:10.0.0.1"}, {"1:2", "g::1"}},
          {"hostname", {"a-b.example", "x"}, {"-a.example", "A.example", "a..b"}},
          {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000"}},
          {"uri", {"https://example.com/a?b=c#d", "urn:isbn:0451450523"}, {"//x", "a b:c"}},
          {"uri-reference", {"../a/b?c", "//host/p", ""}, {"a b"}},
          {"uri-template", {"/users/{id}", "{+path}/x{?q,lang}"}, {"{id", "/a b"}},
          {"password", {"", "any \u00e9 text \\\" \\n"}, {}},
      };
  for (const auto& [format, good, bad] : cases) {
    const auto s = string_of(format);
    ASSERT_NE(s, nullptr) << format;
    for (const char* v : good) {
      EXPECT_TRUE(Matches(s, absl::StrCat("\"", v, "\""))) << format << ": " << v;
    }
    for (const char* v : bad) {
      EXPECT_FALSE(Matches(s, absl::StrCat("\"", v, "\""))) << format << ": " << v;
    }
  }
  for (const auto& [schema, message] : std::vector<std::pair<const char*, const char*>>{
           {R"({"type": "string", "format": "email"})", "'format' \"email\": xgrammar's email"},
           {R"({"type": "string", "format": "json-pointer"})", "'format' \"json-pointer\""},
           {R"({"type": "string", "format": "date", "pattern": "x"})", "'format' beside 'pattern'"},
           {R"({"type": "string", "format": 3})", "'format' must be a string"}}) {
    auto compiled = CompileJsonSchema(Json::parse(schema));
    ASSERT_FALSE(compiled.ok()) << schema;
    EXPECT_THAT(std::string(compiled.status().message()), HasSubstr(message)) << schema;
  }
  // An annotation leaves the string's other keywords in force.
  const auto word = Compile(R"({"type": "string", "format": "binary", "pattern": "[a-z]+"})");
  EXPECT_TRUE(Matches(word, R"("abc")"));
  EXPECT_FALSE(Matches(word, R"("ab1")"));
}

TEST(ChoicesTest, ADocumentIsExactlyOneChoiceAsRawText) {
  auto compiled = CompileChoices({"yes", "no", "yes!", "\"quoted\" {x}", "no"});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const std::shared_ptr<const Schema> s = *compiled;
  for (const char* doc : {"yes", "no", "yes!", "\"quoted\" {x}"}) {
    EXPECT_TRUE(Matches(s, doc)) << doc;
  }
  // Raw text: not the choices' JSON, no whitespace around them.
  for (const char* doc : {"\"yes\"", " yes", "yes ", "ye", "yes!!", "n", "maybe", ""}) {
    EXPECT_FALSE(Matches(s, doc)) << doc;
  }
  // "yes" may end the document or go on to "yes!"; "yes!" and "no" close it.
  JsonMatcher m(s);
  ASSERT_TRUE(m.Accept("yes"));
  EXPECT_TRUE(m.Complete());
  EXPECT_TRUE(m.Open());
  ASSERT_TRUE(m.Accept("!"));
  EXPECT_FALSE(m.Open());
  JsonMatcher no(s);
  ASSERT_TRUE(no.Accept("no"));
  EXPECT_FALSE(no.Open());
  // A token mask allows the tokens that begin or continue some choice.
  const TokenVocabulary vocab({"", "y", "ye", "yes", "s", "!", "no", "n", "\"", " ", "yes!", "x"});
  JsonMatcher begin(s);
  TokenMask mask;
  EXPECT_EQ(AllowedTokens(begin, vocab, &mask), 7);  // y ye yes no n " yes!
  EXPECT_FALSE(MaskAllows(mask, 4));
  EXPECT_FALSE(MaskAllows(mask, 9));
  EXPECT_FALSE(MaskAllows(mask, 11));
  EXPECT_EQ(AllowedTokens(m, vocab, &mask), 0);
}

TEST(ChoicesTest, RefusesWhatCannotBeADocument) {
  EXPECT_THAT(CompileChoices({}).status().message(), HasSubstr("empty"));
  EXPECT_THAT(CompileChoices({"a", ""}).status().message(), HasSubstr("choice 1 is empty"));
}

// Every string enum's values begin with '"': however many there are, they are
// one reading (a range of the sorted values), never one per value.
TEST(JsonMatcherTest, AnEnumOfThousandsOfStringsIsHeld) {
  Json values = Json::array();
  for (int i = 0; i < 3000; ++i) values.push_back("v" + std::to_string(i));
  values.push_back("v1");  // a repeat
  const auto s = CompileJsonSchema(Json{{"enum", values}}).value();
  for (const char* doc : {R"("v0")", R"("v1")", R"("v10")", R"("v299")", R"("v2999")"}) {
    EXPECT_TRUE(Matches(s, doc)) << doc;
  }
  for (const char* doc : {R"("v3000")", R"("v")", R"("w1")", R"("v01")"}) {
    EXPECT_FALSE(Matches(s, doc)) << doc;
  }
  // "v1 may end or go on to "v10".."v1999".
  JsonMatcher m(s);
  ASSERT_TRUE(m.Accept(R"("v1)"));
  EXPECT_FALSE(m.Complete());
  ASSERT_TRUE(m.Accept(R"(")"));
  EXPECT_TRUE(m.Complete());
  EXPECT_FALSE(m.Open());
  JsonMatcher prefix(s);
  ASSERT_TRUE(prefix.Accept(R"("v29)"));
  EXPECT_TRUE(prefix.Accept(R"(99")"));
  EXPECT_TRUE(prefix.Complete());
  // Ten thousand choices too.
  std::vector<std::string> choices;
  for (int i = 0; i < 10000; ++i) choices.push_back("label-" + std::to_string(i));
  const auto c = CompileChoices(choices).value();
  EXPECT_TRUE(Matches(c, "label-9999"));
  EXPECT_TRUE(Matches(c, "label-5"));
  EXPECT_FALSE(Matches(c, "label-10000"));
  const TokenVocabulary vocab({"l", "label-", "\"", "5", "55", "x"});
  JsonMatcher begin(c);
  TokenMask mask;
  EXPECT_EQ(AllowedTokens(begin, vocab, &mask), 2);
}

TEST(JsonMatcherTest, ARefusedStepChangesNothing) {
  const auto s = Compile(kPerson);
  JsonMatcher m(s);
  ASSERT_TRUE(m.Accept(R"({"name":"a)"));
  EXPECT_FALSE(m.Accept(R"(b","x)"));
  EXPECT_TRUE(m.Accept(R"(b","score":1})"));
  EXPECT_TRUE(m.Complete());
  EXPECT_FALSE(m.Open());
  EXPECT_FALSE(m.Accept(" "));
}

TEST(JsonMatcherTest, AmbiguityPastTheBoundIsRefusedNotCut) {
  // Nine anyOf levels of two identical branches: 512 ways to read "[[[...".
  std::string schema = R"({"type": "integer"})";
  for (int i = 0; i < 9; ++i) {
    schema = R"({"anyOf": [{"type": "array", "items": )" + schema +
             R"(}, {"type": "array", "items": )" + schema + "}]}";
  }
  const auto s = Compile(schema);
  JsonMatcher m(s);
  EXPECT_TRUE(m.Accept("[[[[[[["));
  EXPECT_FALSE(m.Accept("[["));
  EXPECT_TRUE(m.overflowed());
}

TEST(TokenMaskTest, TheMaskIsWhatAcceptTakesOnRandomWalks) {
  const TokenVocabulary vocab = TestVocabulary();
  const std::vector<std::shared_ptr<const Schema>> schemas = {
      Compile(kPerson), AnyJsonObject(),
      Compile(R"({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3})"),
      Compile(R"({"type": "array", "items": {"type": "string", "pattern": "[a-z]{1,3}[0-9]?"}})"),
      *CompileJsonSchema(Json::parse(kPerson), /*any_whitespace=*/false)};
  std::mt19937 rng(7);
  int walks = 0, complete = 0;
  for (const auto& schema : schemas) {
    for (int walk = 0; walk < 40; ++walk, ++walks) {
      JsonMatcher m(schema);
      std::string doc;
      for (int step = 0; step < 60 && m.Open(); ++step) {
        TokenMask mask;
        const int32_t count = AllowedTokens(m, vocab, &mask);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < vocab.size(); ++id) {
          JsonMatcher copy = m;
          const bool takes = !vocab.bytes(id).empty() && copy.Accept(vocab.bytes(id));
          ASSERT_EQ(MaskAllows(mask, id), takes)
              << "id " << id << " (" << vocab.bytes(id) << ") after " << doc;
          if (takes) allowed.push_back(id);
        }
        ASSERT_EQ(count, std::ssize(allowed));
        // A document that is not complete always has a way on.
        ASSERT_TRUE(m.Complete() || !allowed.empty()) << doc;
        if (allowed.empty() || (m.Complete() && rng() % 4 == 0)) break;
        const int32_t id = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.Accept(vocab.bytes(id)));
        doc += vocab.bytes(id);
      }
      if (m.Complete()) {
        ++complete;
        // nlohmann refuses numbers past a double's range (1e400), which
        // RFC 8259 leaves to implementations (JSON.parse gives Infinity);
        // the npm check parses every walk with JSON.parse. It refuses an
        // unpaired surrogate's escape ("\udcb4") too, which RFC 8259's
        // grammar, xgrammar's and JSON.parse take (RFC 8259 section 8.2).
        try {
          const Json parsed = Json::parse(doc);
          EXPECT_FALSE(parsed.is_discarded());
        } catch (const Json::out_of_range& e) {
          EXPECT_EQ(e.id, 406) << e.what() << " in " << doc;
        } catch (const Json::parse_error& e) {
          EXPECT_NE(std::string_view(e.what()).find("surrogate"), std::string_view::npos)
              << e.what() << " in " << doc;
        } catch (const Json::exception& e) {
          ADD_FAILURE() << e.what() << " in " << doc;
        }
      }
    }
  }
  EXPECT_GT(complete, 0);
  EXPECT_EQ(walks, 200);
}

TEST(TokenMaskTest, AClosedDocumentAllowsNoToken) {
  const TokenVocabulary vocab = TestVocabulary();
  JsonMatcher m(Compile(R"({"type": "boolean"})"));
  TokenMask mask;
  EXPECT_GT(AllowedTokens(m, vocab, &mask), 0);
  EXPECT_TRUE(MaskAllows(mask, 25));  // "true"
  EXPECT_FALSE(MaskAllows(mask, 1));  // "{"
  ASSERT_TRUE(m.Accept("true"));
  EXPECT_EQ(AllowedTokens(m, vocab, &mask), 0);
  EXPECT_TRUE(m.Complete());
}

}  // namespace
}  // namespace tandem::grammar
