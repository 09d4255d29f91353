// ChatTemplate on hand-checked cases; reference_test.cc compares it with
// @huggingface/jinja on the models' templates.
#include "tandem/tokenizer/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>

#include "test_util.h"

namespace tandem::tokenizer::testing {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> Render(std::string_view source, Json messages = Json::array(),
                                   bool add_generation_prompt = false, Json extra = nullptr,
                                   int64_t max_steps = ChatTemplateInputs().max_steps) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render({.messages = std::move(messages),
                    .add_generation_prompt = add_generation_prompt,
                    .bos_token = "<s>",
                    .eos_token = "</s>",
                    .extra_context = std::move(extra),
                    .max_steps = max_steps});
}

const Json kChat = Json::parse(R"([{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": " hi "},
                                   {"role": "assistant", "content": "hello"}])");

// make_references.mjs renders data/chat_templates/*.jinja as the built-ins.
TEST(ChatTemplateTest, BuiltinSourcesEqualTheFilesTheReferenceRenders) {
  for (const char* name : {"llama-2", "llama-3", "chatml"}) {
    std::ifstream in(TestData(std::string("chat_templates/") + name + ".jinja"), std::ios::binary);
    const std::string file(std::istreambuf_iterator<char>(in), {});
    EXPECT_EQ(ChatTemplate::BuiltinSource(name), file) << name;
    EXPECT_TRUE(ChatTemplate::Builtin(name).ok()) << name;
  }
  const auto unknown = ChatTemplate::Builtin("vicuna");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("llama-2, llama-3, chatml"));
}

TEST(ChatTemplateTest, RendersLlama2WithTheSystemPromptInTheFirstTurn) {
  auto t = ChatTemplate::Builtin("llama-2");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(
      *t->Render({.messages = kChat, .bos_token = "<s>", .eos_token = "</s>"}),
      "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n hi [/INST] hello </s>");  // strip() sees the
                                                                            // whole content
}

TEST(ChatTemplateTest, AddsTheGenerationPromptOnlyWhenAsked) {
  auto t = ChatTemplate::Builtin("chatml");
  ASSERT_TRUE(t.ok());
  const Json user = Json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(*t->Render({.messages = user}), "<|im_start|>user\nx<|im_end|>\n");
  EXPECT_EQ(*t->Render({.messages = user, .add_generation_prompt = true}),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

// transformers' continue_final_message (apply_chat_template), cases checked
// by hand against its code: the text ends after the last occurrence of the
// final message's stripped text, with the message's trailing whitespace only
// where the template kept it.
TEST(ChatTemplateTest, ContinueFinalMessageEndsTheTextInTheFinalMessage) {
  auto continued = [](std::string_view source, const char* messages,
                      bool add_generation_prompt = false) -> absl::StatusOr<std::string> {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Builtin(source);
    if (!t.ok()) t = ChatTemplate::Parse(source);
    if (!t.ok()) return t.status();
    return t->Render({.messages = Json::parse(messages),
                      .add_generation_prompt = add_generation_prompt,
                      .continue_final_message = true,
                      .bos_token = "<s>",
                      .eos_token = "</s>"});
  };
  // ChatML writes the content as sent: its trailing space stays.
  EXPECT_EQ(*continued("chatml", R"([{"role": "user", "content": "Once"},
                                     {"role": "assistant", "content": "Once upon "}])"),
            "<|im_start|>user\nOnce<|im_end|>\n<|im_start|>assistant\nOnce upon ");
  // The last occurrence, not the first.
  EXPECT_EQ(*continued("chatml", R"([{"role": "user", "content": "Yes"},
                                     {"role": "assistant", "content": "Yes"}])"),
            "<|im_start|>user\nYes<|im_end|>\n<|im_start|>assistant\nYes");
  // Llama 2's template strips the content: the newline it dropped is not
  // given back, and the space it writes before </s> is cut.
  EXPECT_EQ(*continued("llama-2", R"([{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "Once upon\n"}])"),
            "<s>[INST] hi [/INST] Once upon");
  // A list of parts: its last text.
  EXPECT_EQ(*continued("{% for m in messages %}{% for p in m['content'] %}{{ p['text'] }}|"
                       "{% endfor %}{% endfor %}",
                       R"([{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                           {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                             {"type": "text", "text": "b c"}]}])"),
            "hi|a|b c");
  // Refused as transformers refuses them.
  const auto both = continued("chatml", R"([{"role": "assistant", "content": "x"}])", true);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(both.status().message(), HasSubstr("add_generation_prompt"));
  const auto changed = continued("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}",
                                 R"([{"role": "assistant", "content": "Once upon"}])");
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(changed.status().message(), HasSubstr("does not appear"));
  const auto no_text = continued("chatml", R"([{"role": "assistant", "content": null}])");
  EXPECT_EQ(no_text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_text.status().message(), HasSubstr("no text to continue"));
}

TEST(ChatTemplateTest, TrimsBlocksAndHonoursWhitespaceControl) {
  // trim_blocks, lstrip_blocks, and one trailing newline of the source dropped.
  EXPECT_EQ(*Render("{% if true %}\n  a\n    {% endif %}\nb\n"), "  a\nb");
  EXPECT_EQ(*Render("x  {{- ' y ' -}}  \n z"), "x y z");
  EXPECT_EQ(*Render("a {#- comment -#} b"), "ab");
}

TEST(ChatTemplateTest, EvaluatesLoopsNamespacesSlicesAndFilters) {
  EXPECT_EQ(*Render("{% for m in messages[1:] %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}"
                    "{{ ',' if not loop.last }}{% endfor %}",
                    kChat),
            "1/2:user,2/2:assistant");
  EXPECT_EQ(*Render("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                    "{% set leaked = 1 %}{% endfor %}{{ ns.n }}{{ leaked is defined }}",
                    kChat),
            "3false");
  EXPECT_EQ(*Render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content')"
                    " | join('|') }}{{ messages[-1]['content'] | upper }}{{ (7 // 2) ~ (-7 % 3) }}",
                    kChat),
            " hi HELLO32");
  EXPECT_EQ(*Render("{% for k, v in tools[0].items() %}{{ k }}={{ v | tojson }};{% endfor %}",
                    Json::array(), false,
                    Json::parse(R"({"tools": [{"a": [1, "é"], "b": {"c": null}}]})")),
            "a=[1, \"é\"];b={\"c\": null};");
}

// Python's str: code points, not bytes (nor JavaScript's UTF-16 units).
TEST(ChatTemplateTest, MeasuresIndexesAndSlicesStringsByCharacter) {
  EXPECT_EQ(*Render("{{ '😀é' | length }}{{ '😀é'[0] }}{{ 'a😀é'[1:] }}{{ '😀é' | reverse }}"
                    "{{ 'a😀é'[-1] }}{% for c in 'é😀' %}<{{ c }}>{% endfor %}"),
            "2😀😀éé😀é<é><😀>");
}

TEST(ChatTemplateTest, RaiseExceptionFailsTheRender) {
  const auto s =
      Render("{% if messages | length == 0 %}{{ raise_exception('no messages') }}{% endif %}");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("no messages"));
  EXPECT_FALSE(
      ChatTemplate::Builtin("llama-2")
          ->Render({.messages = Json::parse(
                        R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])")})
          .ok());
}

// transformers and vLLM give templates strftime_now (datetime.now()
// .strftime): Llama 3.2's asks whether it is defined before it dates its
// system prompt, and fell back to "26 Jul 2024" here.
TEST(ChatTemplateTest, StrftimeNowIsTheLocalTimeAndDefined) {
  EXPECT_EQ(*Render("{% if strftime_now is defined %}A{% else %}B{% endif %}"), "A");
  EXPECT_EQ(*Render("{{ raise_exception is defined }}|{{ strftime_now is undefined }}"),
            "true|false");
  EXPECT_EQ(*Render("{% set strftime_now = 1 %}{{ strftime_now + 1 }}"), "2")
      << "a variable hides it";
  auto today = [] {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[64];
    return std::string(buf, std::strftime(buf, sizeof(buf), "%d %b %Y", &local));
  };
  const std::string before = today();
  const std::string got = *Render("{{ strftime_now('%d %b %Y') }}");
  EXPECT_TRUE(got == before || got == today()) << got;
  EXPECT_FALSE(Render("{{ strftime_now() }}").ok());
}

// Python's (and Jinja2's) signatures: strip/trim remove Unicode whitespace
// (str.isspace) or the given characters, split takes maxsplit, replace a
// count, startswith a tuple, join an attribute, default a boolean= keyword.
// Each expected value is what Python 3 / Jinja2 give. An argument a filter
// or method does not read is refused, never dropped.
TEST(ChatTemplateTest, FiltersAndMethodsTakeTheirPythonArguments) {
  const Json content = Json::array({{{"role", "user"}, {"content", "\u3000 x \u2003"}}});
  EXPECT_EQ(*Render("[{{ messages[0].content.strip() }}]", content), "[x]");
  EXPECT_EQ(*Render("[{{ messages[0].content | trim }}]", content), "[x]");
  EXPECT_EQ(*Render("[{{ messages[0].content.lstrip() }}]", content), "[x \u2003]");
  EXPECT_EQ(*Render("{{ 'xxhixx' | trim('x') }}|{{ 'xxhixx' | trim(chars='x') }}"), "hi|hi");
  EXPECT_EQ(*Render("{{ '\u00e9a\u00e9'.strip('\u00e9') }}"), "a");
  EXPECT_EQ(*Render("{{ 'a,b,c'.split(',', 1) | length }}:{{ 'a,b,c'.split(',', 1)[1] }}"),
            "2:b,c");
  EXPECT_EQ(*Render("[{{ '  a b  c  '.split(none, 1)[1] }}]"), "[b  c  ]");
  EXPECT_EQ(*Render("{{ ' a\u3000b '.split() | length }}"), "2");
  EXPECT_EQ(*Render("{{ 'abcabc'.replace('a', 'z', 1) }}|{{ 'abcabc'.replace('a', 'z') }}"),
            "zbcabc|zbczbc");
  EXPECT_EQ(*Render("{{ 'ab'.startswith(['x', 'a']) }}{{ 'ab'.endswith(['x', 'y']) }}"),
            "truefalse");
  EXPECT_EQ(*Render("{{ [{'n': 'a'}, {'n': 'b'}] | join(', ', attribute='n') }}"), "a, b");
  EXPECT_EQ(*Render("[{{ '' | default('x') }}|{{ '' | default('x', boolean=true) }}|"
                    "{{ '' | default('x', true) }}|{{ nope | default(default_value='y') }}]"),
            "[|x|x|y]");
  for (const char* refused :
       {"{{ 'a' | lower(1) }}", "{{ 'a'.strip(chars='x') }}", "{{ [1] | join(',', foo=1) }}",
        "{{ namespace({'a': 1}) }}", "{{ 'ab'.replace('', '-') }}", "{{ 'a'.split(',', 1, 2) }}",
        "{{ 'a' | trim('x', 'y') }}", "{{ [1] | first(2) }}"}) {
    const auto r = Render(refused);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << refused << ": " << r.status();
  }
}

// Jinja2 (transformers' and vLLM's) raises on an attribute or item of an
// undefined value; a missing attribute of a defined one is undefined.
TEST(ChatTemplateTest, AnAttributeOfAnUndefinedValueFailsTheRender) {
  const Json user = Json::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(*Render("[{{ messages[0].missing }}]", user), "[]");
  EXPECT_EQ(*Render("{{ messages[0].missing is defined }}", user), "false");
  for (const char* source : {"{{ foo.bar }}", "{{ foo['bar'] }}", "{{ messages[0].missing.x }}",
                             "{% if foo.bar is defined %}{% endif %}", "{{ (foo).bar }}"}) {
    const auto r = Render(source, user);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << source << ": " << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("of an undefined value")) << source;
  }
}

TEST(ChatTemplateTest, NamesWhatIsNotSupportedAndWhereSyntaxIsWrong) {
  struct Case {
    const char* source;
    absl::StatusCode code;
    const char* message;
  };
  for (const Case& c : {
           Case{"{% macro f() %}{% endmacro %}", absl::StatusCode::kUnimplemented, "{% macro %}"},
           Case{"a\n{{ x | wordcount }}", absl::StatusCode::kUnimplemented,
                "line 2: the filter 'wordcount'"},
           Case{"{{ x is divisibleby(3) }}", absl::StatusCode::kUnimplemented,
                "the test 'divisibleby'"},
           Case{"{% if x %}a", absl::StatusCode::kInvalidArgument, "missing {% endif %}"},
           Case{"{{ x ", absl::StatusCode::kInvalidArgument, "unterminated tag"},
           Case{"{% endfor %}", absl::StatusCode::kInvalidArgument, "unexpected {% endfor %}"},
           Case{"{{ 'a' 'b' ) }}", absl::StatusCode::kInvalidArgument, "unexpected at ')'"},
       }) {
    const auto t = ChatTemplate::Parse(c.source);
    EXPECT_EQ(t.status().code(), c.code) << c.source << ": " << t.status();
    EXPECT_THAT(t.status().message(), HasSubstr(c.message)) << c.source;
  }
}

// A template from a request (--trust-request-chat-template) is untrusted
// text: its work, memory and nesting are bounded, with errors that say
// which bound, and a range larger than Jinja's sandbox takes is refused as
// the sandbox refuses it. Integers past 64 bits fail (Python's grow).
TEST(ChatTemplateTest, BoundsTheWorkMemoryAndNestingOfARender) {
  EXPECT_EQ(*Render("{{ range(100000) | length }}"), "100000");
  EXPECT_EQ(*Render("{{ range(5, -190000, -2) | length }}"), "95003");
  for (const char* big : {"{{ range(100001) | length }}", "{{ range(0, 300000, 2) | length }}",
                          "{{ range(-9223372036854775807, 9223372036854775807) | length }}"}) {
    EXPECT_THAT(Render(big).status().message(), HasSubstr("range() of more than 100000 items"))
        << big;
  }
  // 100,000 x 100,000 iterations: the step budget ends it (a small one
  // here, so that the test is quick; the default is 1,000,000).
  const std::string forever =
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
  EXPECT_THAT(Render(forever, Json::array(), false, nullptr, 20000).status().message(),
              HasSubstr("ran past 20000 steps"));
  EXPECT_EQ(*Render("{% for a in range(3) %}{% for b in range(3) %}.{% endfor %}{% endfor %}",
                    Json::array(), false, nullptr, 40),
            ".........");
  // A string doubled 40 times would be a terabyte.
  const auto doubling = Render(
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s | length }}");
  EXPECT_THAT(doubling.status().message(), HasSubstr("a value passed")) << doubling.status();
  // 1 MiB written 70 times: the rendered text's bound.
  const auto rendered = Render(
      "{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{% for i in range(70) %}{{ ns.s }}{% endfor %}");
  EXPECT_THAT(rendered.status().message(), HasSubstr("the rendered prompt passed"))
      << rendered.status();
  const auto lists = Render(
      "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}");
  EXPECT_THAT(lists.status().message(), HasSubstr("items")) << lists.status();
  // Nesting: parentheses past the tag's token bound, blocks past the depth.
  const auto parens = Render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}");
  EXPECT_THAT(parens.status().message(), HasSubstr("tokens; at most")) << parens.status();
  std::string sum = "{{ 1";
  for (int i = 0; i < 2000; ++i) sum += " + 1";
  EXPECT_THAT(Render(sum + " }}").status().message(), HasSubstr("tokens; at most"));
  std::string blocks;
  for (int i = 0; i < 10000; ++i) blocks += "{% if true %}";
  const auto deep = Render(blocks);
  EXPECT_THAT(deep.status().message(), HasSubstr("blocks nested more than")) << deep.status();
  std::string nested_ok;
  for (int i = 0; i < 60; ++i) nested_ok += "{% if true %}";
  nested_ok += "x";
  for (int i = 0; i < 60; ++i) nested_ok += "{% endif %}";
  EXPECT_EQ(*Render(nested_ok), "x");
  // 64-bit arithmetic that would overflow (undefined in C++).
  for (const char* overflow :
       {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
        "{{ 4611686018427387904 * 2 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
        "{{ -(-9223372036854775807 - 1) }}"}) {
    EXPECT_THAT(Render(overflow).status().message(), HasSubstr("does not fit in 64 bits"))
        << overflow;
  }
  EXPECT_EQ(*Render("{{ 9223372036854775806 + 1 }}"), "9223372036854775807");
}

TEST(ChatTemplateTest, SelectsABuiltinAFileOrTheTokenizersOwnTemplate) {
  // tokenizer.model has no tokenizer_config.json, so no chat_template.
  auto tok = LoadTokenizer(SharedModel("tokenizer.model"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Json user = Json::parse(R"([{"role": "user", "content": "x"}])");
  auto none = ChatTemplate::Select("", **tok);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("--chat-template"));

  auto builtin = ChatTemplate::Select("chatml", **tok);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  EXPECT_EQ(*builtin->Render({.messages = user}), "<|im_start|>user\nx<|im_end|>\n");

  const std::string path = ::testing::TempDir() + "/chat_template_test.jinja";
  std::ofstream(path) << "{% for m in messages %}[{{ m.content }}]{% endfor %}\n";
  auto file = ChatTemplate::Select(path, **tok);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file->Render({.messages = user}), "[x]");

  std::ofstream(path) << "{% macro m() %}{% endmacro %}";
  auto unsupported = ChatTemplate::Select(path, **tok);
  EXPECT_EQ(unsupported.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(unsupported.status().message(), HasSubstr(path));
  EXPECT_EQ(ChatTemplate::Select("/nonexistent/t.jinja", **tok).status().code(),
            absl::StatusCode::kNotFound);
}

// vLLM's --chat-template-content-format auto: "openai" for a template that
// loops over a message's content (the message a loop variable over messages,
// or over a variable set from them, through slices, filters and tests), or
// over a variable named content; "string" for every other, and where such a
// loop or set has a target vLLM does not take (it asserts a plain name).
TEST(ChatTemplateTest, DetectsTheContentFormatAsVllmDoes) {
  auto format = [](std::string_view source) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
    EXPECT_TRUE(t.ok()) << t.status() << "\n" << source;
    return t.ok() ? t->content_format() : ContentFormat::kString;
  };
  constexpr ContentFormat kOpenAi = ContentFormat::kOpenAi, kString = ContentFormat::kString;
  for (const char* name : {"chatml", "llama-2", "llama-3"}) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Builtin(name);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->content_format(), kString) << name;
  }
  // Gemma 3's shape: loop_messages a slice of messages, content a string or
  // a list of parts.
  EXPECT_EQ(format("{%- set loop_messages = messages[1:] -%}"
                   "{%- for message in loop_messages -%}"
                   "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
                   "{%- else -%}{%- for item in message['content'] -%}"
                   "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
                   "{%- endfor -%}{%- endif -%}{%- endfor -%}"),
            kOpenAi);
  EXPECT_EQ(format("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}"
                   "{% endfor %}"),
            kOpenAi);
  EXPECT_EQ(format("{% set a = messages %}{% set b = a %}{% for m in b | reverse %}"
                   "{% for p in m['content'] | list %}{{ p.text }}{% endfor %}{% endfor %}"),
            kOpenAi);
  EXPECT_EQ(format("{% for m in messages %}{% set content = m.content %}"
                   "{% for p in content %}{{ p.text }}{% endfor %}{% endfor %}"),
            kOpenAi);
  EXPECT_EQ(format("{% for m in messages %}{% for c in m['tool_calls'] %}{{ c.id }}{% endfor %}"
                   "{{ m['content'] }}{% endfor %}"),
            kString);
  EXPECT_EQ(format("{% for m in tools %}{% for p in m['content'] %}{{ p }}{% endfor %}"
                   "{% endfor %}"),
            kString);
  EXPECT_EQ(format("{% for m in messages %}{% for k, v in m['content'] %}{{ k }}{% endfor %}"
                   "{% endfor %}"),
            kString);
}

}  // namespace
}  // namespace tandem::tokenizer::testing
