// tandem-frontend end to end: the real worker, scheduler and frontend
// binaries on loopback, driven by the npm `openai` SDK (a client we did not
// write) and by plain HTTP.
//   - random32k with the Llama 2 tokenizer: every reference case, streamed
//     and not, gives the reference ids and SentencePiece's text of them,
//     and the same ids as the gRPC path;
//   - every error case has its status and OpenAI error body, and a stream
//     running beside them is unaffected;
//   - /v1/responses, read by the SDK's three ways, answers as chat does;
//   - --model DIR alone gives the tokenizer and chat template
//     (chat_template.jinja) of the directory; --chat-template overrides;
//   - vLLM's cache_salt keeps cached prefixes within the salt.
// Client connections (hang-ups, late and slow readers, pipelining, the
// connections to a replica) are in frontend_connections_test.cc, several
// replicas in frontend_replicas_test.cc; all three build one frontend_test.
// tools/test.sh also runs it against binaries built with ThreadSanitizer;
// there the frontends read tokenizer.bin (kLlama2Tokenizer) and the
// randomized test runs fewer clients.
#include <filesystem>
#include <fstream>
#include <thread>

#include "frontend_test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

// The text of `output` generated after `prompt`: Decode(prompt + output)
// minus Decode(prompt), as vLLM's detokenizer gives it (the first word
// keeps its leading space).
std::string Continuation(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  const std::string whole = tok.Decode(all, {.skip_special_tokens = true}).value();
  const std::string head = tok.Decode(prompt, {.skip_special_tokens = true}).value();
  EXPECT_EQ(whole.substr(0, head.size()), head);
  return whole.substr(head.size());
}

TEST_F(FrontendTest, OpenAiSdkGetsTheReferenceTokensAndTextStreamedOrNot) {
#ifdef TANDEM_SANITIZER_BUILD
  GTEST_SKIP() << "compares with libsentencepiece, which a sanitizer build cannot load";
#endif
  const std::string npm = std::string(TANDEM_BINARY_DIR) + "/frontend_npm";
  const std::string out = dir_ + "/openai_cases.json";
  std::string log;
  const int rc = RunCommand(
      {"/usr/bin/env", "NODE_PATH=" + npm + "/node_modules", "node", npm + "/openai_cases.mjs",
       "http://" + frontend_.address() + "/v1", kModels + "/random32k.reference.json", out},
      &log, std::chrono::seconds(300));
  ASSERT_EQ(rc, 0) << log << "\nfrontend log: " << frontend_.log_path;
  const Json got = ReadJson(out);
  auto tok = tokenizer::LoadTokenizer(kModels + "/tokenizer.model");  // libsentencepiece
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto stub = GenerationStub(scheduler_.address());
  ASSERT_EQ(got["cases"].size(), reference_.size());
  for (size_t i = 0; i < reference_.size(); ++i) {
    const Json& ref = reference_[i];
    const Json& c = got["cases"][i];
    const std::vector<int32_t> expected = ref["expected_output_token_ids"];
    const std::string text = Continuation(*tok.value(), ref["prompt_token_ids"], expected);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + ref["prompt_text"].get<std::string>());
    EXPECT_EQ(c["nonstream"]["prompt_token_ids"], ref["prompt_token_ids"]);
    EXPECT_EQ(c["stream"]["prompt_token_ids"], Json::array({ref["prompt_token_ids"]}));
    EXPECT_EQ(c["nonstream"]["token_ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(c["stream"]["token_ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(c["nonstream"]["text"], text);
    EXPECT_EQ(c["stream"]["text"], text);
    EXPECT_EQ(c["nonstream"]["usage"]["completion_tokens"], expected.size());
    EXPECT_EQ(c["stream"]["usage"]["completion_tokens"], expected.size());
    EXPECT_EQ(c["nonstream"]["usage"]["prompt_tokens"], ref["prompt_token_ids"].size());
    // The gRPC path gives the same ids.
    const GenerateResult direct =
        RunGenerate(stub.get(), MakeRequest(ref["prompt_token_ids"], ref["max_tokens"]));
    ASSERT_TRUE(direct.status.ok()) << direct.status.error_message();
    EXPECT_EQ(direct.tokens, expected);
  }
  const Json& chat = got["chat"];
  EXPECT_EQ(chat["nonstream"]["role"], "assistant");
  EXPECT_EQ(chat["stream"]["roles"], Json::array({"assistant"}));
  EXPECT_EQ(chat["stream"]["token_ids"], chat["nonstream"]["token_ids"]);
  EXPECT_EQ(chat["stream"]["prompt_token_ids"],
            Json::array({chat["nonstream"]["prompt_token_ids"]}));
  EXPECT_EQ(chat["stream"]["text"], chat["nonstream"]["text"]);
  const std::vector<int32_t> chat_ids = chat["nonstream"]["token_ids"];
  EXPECT_EQ(chat["nonstream"]["text"],
            Continuation(*tok.value(), chat["nonstream"]["prompt_token_ids"], chat_ids));
  // Llama 2's template: "<s>[INST] prompt [/INST]", BOS as the id.
  const std::vector<int32_t> prompt = chat["nonstream"]["prompt_token_ids"];
  const std::vector<int32_t> rendered =
      tok.value()
          ->Encode("[INST] " + reference_[0]["prompt_text"].get<std::string>() + " [/INST]")
          .value();
  EXPECT_EQ(prompt, rendered);

  // /v1/responses with the same user message runs the same chat prompt: the
  // chat answer's text and counts, however the SDK reads it.
  const Json& responses = got["responses"];
  const Json& nonstream = responses["nonstream"];
  const bool cut_at_max = chat["nonstream"]["finish_reason"] == "length";
  const std::string status = cut_at_max ? "incomplete" : "completed";
  EXPECT_EQ(nonstream["object"], "response");
  EXPECT_EQ(nonstream["id"].get<std::string>().rfind("resp_", 0), 0u) << nonstream["id"];
  EXPECT_EQ(nonstream["status"], status);
  EXPECT_EQ(nonstream["output_text"], chat["nonstream"]["text"]);
  EXPECT_EQ(nonstream["item_text"], chat["nonstream"]["text"]);
  EXPECT_EQ(nonstream["model"], got["model"]);
  EXPECT_EQ(nonstream["usage"]["input_tokens"], chat["nonstream"]["usage"]["prompt_tokens"]);
  EXPECT_EQ(nonstream["usage"]["output_tokens"], chat["nonstream"]["usage"]["completion_tokens"]);
  const Json& streamed = responses["stream"];
  EXPECT_EQ(streamed["deltas"], chat["nonstream"]["text"]);
  EXPECT_EQ(streamed["final_text"], chat["nonstream"]["text"]);
  EXPECT_EQ(streamed["final_status"], status);
  EXPECT_EQ(streamed["usage"], nonstream["usage"]);
  const Json& events = streamed["events"];
  ASSERT_GE(events.size(), 9u);
  EXPECT_EQ(events[0]["type"], "response.created");
  EXPECT_EQ(events[events.size() - 1]["type"], "response." + status);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    if (!events[i]["item_id"].is_null()) {
      EXPECT_EQ(events[i]["item_id"], streamed["message_id"]);
    }
  }
  EXPECT_EQ(responses["helper"]["text"], chat["nonstream"]["text"]);
  // The SDK's stream helper takes the final object from response.completed
  // only; after response.incomplete it keeps its in-progress snapshot.
  EXPECT_EQ(responses["helper"]["status"], cut_at_max ? "in_progress" : "completed");
  EXPECT_EQ(responses["parts"]["text"], chat["nonstream"]["text"]);
  // Cut at max_output_tokens: incomplete, as OpenAI says it.
  EXPECT_EQ(responses["cut"]["status"], "incomplete");
  EXPECT_EQ(responses["cut"]["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(responses["cut"]["usage"]["output_tokens"], 2);
  EXPECT_EQ(chat["nonstream"]["text"].get<std::string>().rfind(
                responses["cut"]["text"].get<std::string>(), 0),
            0u);
  // include message.output_text.logprobs: chat's logprobs for the same
  // message, whole and over the stream's deltas.
  const Json& logprobs = responses["logprobs"];
  ASSERT_EQ(logprobs["chat"].size(), 4u) << logprobs.dump();
  EXPECT_EQ(logprobs["chat"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(logprobs["whole"], logprobs["chat"]);
  EXPECT_EQ(logprobs["stream"], logprobs["chat"]);
  EXPECT_EQ(responses["refused"]["status"], 400);
  EXPECT_EQ(responses["refused"]["param"], "tools");
}

// `tandem bench --http` (tools/bench_frontend's default HTTP client) reads
// every streamed token through the frontend and reports the server's errors.
// vLLM's vllm:request_params_n comes from the frontend, the one part that
// sees a request's n (it fans the choices out): one observation of n per
// prompt of an accepted request, with vLLM's buckets and labels; a refused
// request observes nothing, also one refused once its prompts were prepared.
TEST_F(FrontendTest, VllmRequestParamsNObservesEachPromptsN) {
  httplib::Client client("http://" + frontend_.address());
  auto two_prompts = client.Post(
      "/v1/completions", Json({{"prompt", {"Once", "upon"}}, {"max_tokens", 2}, {"n", 3}}).dump(),
      "application/json");
  ASSERT_TRUE(two_prompts);
  ASSERT_EQ(two_prompts->status, 200) << two_prompts->body;
  const std::string model = Json::parse(two_prompts->body)["model"];
  auto chat = client.Post(
      "/v1/chat/completions",
      Json({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}}).dump(),
      "application/json");
  ASSERT_TRUE(chat);
  ASSERT_EQ(chat->status, 200) << chat->body;
  auto refused =
      client.Post("/v1/completions", Json({{"prompt", "x"}, {"n", 0}}).dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  // Refused after its prompts were tokenized (the job existed): not observed.
  auto too_long = client.Post("/v1/completions",
                              Json({{"prompt", "x"}, {"max_tokens", 1 << 20}, {"n", 2}}).dump(),
                              "application/json");
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  const std::string labels = "{engine=\"0\",model_name=\"" + model + "\"";
  auto series = [&](const std::string& name, const std::string& extra = "") {
    const std::string text = Get(frontend_.address(), "/metrics");
    const std::string prefix = "vllm:request_params_n" + name + labels + extra + "} ";
    const size_t at = text.find(prefix);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + prefix.size()));
  };
  // The jobs end just after their responses: wait for the third.
  ASSERT_TRUE(WaitFor([&] { return series("_count") == 3; }))
      << Get(frontend_.address(), "/metrics");
  EXPECT_EQ(series("_sum"), 3 + 3 + 1);
  EXPECT_EQ(series("_bucket", ",le=\"1\""), 1);
  EXPECT_EQ(series("_bucket", ",le=\"2\""), 1);
  EXPECT_EQ(series("_bucket", ",le=\"5\""), 3);
  EXPECT_EQ(series("_bucket", ",le=\"20\""), 3);
  EXPECT_NE(Get(frontend_.address(), "/metrics").find("# TYPE vllm:request_params_n histogram"),
            std::string::npos);
}

TEST_F(FrontendTest, BenchOverHttpCountsEveryStreamedTokenAndReportsErrors) {
  const std::string tandem = BinaryPath("tools/cli/tandem");
  const std::string json_path = dir_ + "/bench_http.json";
  std::string out;
  ASSERT_EQ(RunCommand({tandem, "bench", "--server", scheduler_.address(), "--http",
                        "http://" + frontend_.address(), "--concurrency", "4", "--num-requests",
                        "8", "--prompt-len", "12", "--output-len", "7", "--json", json_path},
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("concurrency=4 requests=8 failed=0 prompt_len=12 output_len=7 "
                     "shared_prefix=0 wrong_token_count=0 via=http"),
            std::string::npos)
      << out;
  const Json result = ReadJson(json_path);
  EXPECT_EQ(result["via"], "http");
  EXPECT_EQ(result["output_tokens"], 8 * 7);
  EXPECT_GT(result["p50_ttft_ms"].get<double>(), 0.0);
  EXPECT_GT(result["p50_itl_ms"].get<double>(), 0.0);

  // A wrong base path: every request fails with the server's 404 and body.
  ASSERT_EQ(RunCommand({tandem, "bench", "--server", scheduler_.address(), "--http",
                        "http://" + frontend_.address() + "/nope", "--concurrency", "1",
                        "--num-requests", "2", "--output-len", "3"},
                       &out),
            1)
      << out;
  EXPECT_NE(out.find("failed=2"), std::string::npos) << out;
  EXPECT_NE(out.find("first error: HTTP 404: {\"error\""), std::string::npos) << out;

  // --vocab-size: the prompts need no scheduler; without it the bench asks one.
  const std::vector<std::string> no_scheduler = {tandem,           "bench",
                                                 "--server",       "127.0.0.1:1",
                                                 "--http",         "http://" + frontend_.address(),
                                                 "--concurrency",  "1",
                                                 "--num-requests", "1",
                                                 "--output-len",   "2"};
  EXPECT_EQ(RunCommand(no_scheduler, &out), 1) << out;
  EXPECT_NE(out.find("GetModelInfo"), std::string::npos) << out;
  std::vector<std::string> with_vocab = no_scheduler;
  with_vocab.insert(with_vocab.end(), {"--vocab-size", "512"});
  EXPECT_EQ(RunCommand(with_vocab, &out), 0) << out;
}

TEST_F(FrontendTest, ErrorsHaveTheirStatusAndBodyAndLeaveAConcurrentStreamAlone) {
  const Json& ref = reference_[0];
  Streamed stream;
  std::thread streamer([&] {
    const HttpResult r = Post(frontend_.address(), "/v1/completions",
                              {{"prompt", ref["prompt_text"]},
                               {"max_tokens", ref["max_tokens"]},
                               {"temperature", 0},
                               {"stream", true},
                               {"return_token_ids", true}});
    EXPECT_EQ(r.status, 200);
    stream = ParseSse(r.raw);
  });
  struct Case {
    Json body;
    int status;
    std::string param;
    std::string code;
  };
  Json too_long = Json::array();
  for (int i = 0; i < 300; ++i) too_long.push_back(100);
  const std::vector<Case> cases = {
      {{{"prompt", "x"}, {"n", 0}}, 400, "n", ""},
      {{{"prompt", "x"}, {"temperature", -1}}, 400, "temperature", ""},
      {{{"prompt", "x"}, {"model", "no-such-model"}}, 404, "model", "model_not_found"},
      {{{"prompt", too_long}}, 400, "prompt", "context_length_exceeded"},
      {{{"prompt", "x"}, {"max_tokens", 100000}}, 400, "max_tokens", "context_length_exceeded"},
      {{{"prompt", {1, 99999}}}, 400, "prompt", ""},
      {{{"prompt", "x"}, {"logprobs", 100000}}, 400, "logprobs", ""},  // above max_logprobs
      {{{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}, 400, "stream_options", ""},
  };
  for (const Case& c : cases) {
    const HttpResult r = Post(frontend_.address(), "/v1/completions", c.body);
    SCOPED_TRACE(c.body.dump());
    EXPECT_EQ(r.status, c.status) << r.raw;
    ASSERT_TRUE(r.body.contains("error")) << r.raw;
    EXPECT_FALSE(r.body["error"]["message"].get<std::string>().empty());
    EXPECT_EQ(r.body["error"]["param"], c.param.empty() ? Json() : Json(c.param));
    EXPECT_EQ(r.body["error"]["code"], c.code.empty() ? Json() : Json(c.code));
  }
  httplib::Client client("http://" + frontend_.address());
  auto bad_json = client.Post("/v1/chat/completions", "{not json", "application/json");
  ASSERT_TRUE(bad_json);
  EXPECT_EQ(bad_json->status, 400);
  auto wrong_method = client.Get("/v1/completions");
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->status, 405);
  auto no_route = client.Get("/v2/nothing");
  ASSERT_TRUE(no_route);
  EXPECT_EQ(no_route->status, 404);
  streamer.join();
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(stream.ids, ref["expected_output_token_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(stream.finish_reason, "length");
}

TEST_F(FrontendTest, ApiKeyDnsTargetsAndNoReplica) {
  const std::string key_file = dir_ + "/key";
  std::ofstream(key_file) << "sk-test-123\n";
  Service keyed =
      StartFrontend(dir_, "keyed", {scheduler_.address()},
                    {"--tokenizer", kLlama2Tokenizer, "--api-key-file", key_file});
  const Json body = {{"prompt", "Once"}, {"max_tokens", 2}, {"temperature", 0}};
  HttpResult r = Post(keyed.address(), "/v1/completions", body);
  EXPECT_EQ(r.status, 401);
  // tandem bench --http sends --api-key as the Bearer token.
  std::string out;
  const std::vector<std::string> bench = {BinaryPath("tools/cli/tandem"),
                                          "bench",
                                          "--server",
                                          scheduler_.address(),
                                          "--http",
                                          "http://" + keyed.address(),
                                          "--concurrency",
                                          "1",
                                          "--num-requests",
                                          "1",
                                          "--output-len",
                                          "2"};
  EXPECT_EQ(RunCommand(bench, &out), 1) << out;
  EXPECT_NE(out.find("first error: HTTP 401"), std::string::npos) << out;
  std::vector<std::string> keyed_bench = bench;
  keyed_bench.insert(keyed_bench.end(), {"--api-key", "sk-test-123"});
  EXPECT_EQ(RunCommand(keyed_bench, &out), 0) << out;
  EXPECT_EQ(r.body["error"]["code"], "invalid_api_key");
  r = Post(keyed.address(), "/v1/completions", body, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(r.status, 401);
  r = Post(keyed.address(), "/v1/completions", body, {{"Authorization", "Bearer sk-test-123"}});
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(HttpGetStatus(keyed.address(), "/health"), 200);  // not behind the key

  // dns:///name:port: every address the name resolves to is a replica
  // (localhost: 127.0.0.1, and ::1 where the host has it, which stays not
  // serving: the scheduler listens on 127.0.0.1 only).
  Service by_dns =
      StartFrontend(dir_, "by_dns", {"dns:///localhost:" + std::to_string(scheduler_.port)},
                    {"--tokenizer", kLlama2Tokenizer});
  r = Post(by_dns.address(), "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_NE(Get(by_dns.address(), "/metrics")
                .find("tandem_frontend_replica_serving{replica=\"127.0.0.1:" +
                      std::to_string(scheduler_.port) + "\"} 1"),
            std::string::npos);

  // A frontend whose only replica is not there: 503 and /health 503.
  Service lonely =
      StartFrontend(dir_, "lonely", {"127.0.0.1:1"}, {"--tokenizer", kLlama2Tokenizer},
                    /*wait_for_serving=*/false);
  EXPECT_EQ(HttpGetStatus(lonely.address(), "/health"), 503);
  EXPECT_EQ(HttpGetStatus(lonely.address(), "/health?live=1"), 200);
  r = Post(lonely.address(), "/v1/completions", body);
  EXPECT_EQ(r.status, 503) << r.raw;
  EXPECT_EQ(r.body["error"]["type"], "server_error");
}

// `vllm serve DIR`'s defaults: with --model DIR and no --tokenizer, the
// tokenizer and the chat template are the directory's (here a
// chat_template.jinja, as transformers >= 4.43 saves it, and no
// tokenizer_config.json); --chat-template still overrides the template.
TEST_F(FrontendTest, ModelDirectoryGivesTheTokenizerAndTheChatTemplate) {
  const std::string model_dir = dir_ + "/hf_model";
  std::filesystem::create_directories(model_dir);
  const std::filesystem::path tokenizer(kLlama2Tokenizer);
  std::filesystem::copy_file(tokenizer, model_dir + "/" + tokenizer.filename().string());
  std::filesystem::copy_file(
      std::string(TANDEM_SOURCE_DIR) + "/tests/tokenizer/data/chat_templates/chatml.jinja",
      model_dir + "/chat_template.jinja");
  Service from_model =
      StartFrontend(dir_, "from_model", {scheduler_.address()}, {"--model", model_dir});
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                     {"max_tokens", 2},
                     {"temperature", 0},
                     {"return_token_ids", true}};
  const HttpResult chatml = Post(from_model.address(), "/v1/chat/completions", chat);
  ASSERT_EQ(chatml.status, 200) << chatml.raw;
  ASSERT_FALSE(chatml.body["prompt_token_ids"].empty()) << chatml.raw;
  // chatml.jinja's rendering, tokenized as the chat prompt is (no BOS added).
  const HttpResult want =
      Post(from_model.address(), "/tokenize",
           {{"prompt", "<|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n"},
            {"add_special_tokens", false}});
  ASSERT_EQ(want.status, 200) << want.raw;
  EXPECT_EQ(chatml.body["prompt_token_ids"], want.body["tokens"]);
  EXPECT_EQ(chatml.body["usage"]["prompt_tokens"], want.body["count"]);

  // --chat-template overrides: llama-2 renders as on the fixture's frontend
  // (--tokenizer, --chat-template llama-2).
  Service overridden = StartFrontend(dir_, "overridden", {scheduler_.address()},
                                     {"--model", model_dir, "--chat-template", "llama-2"});
  const HttpResult llama2 = Post(overridden.address(), "/v1/chat/completions", chat);
  ASSERT_EQ(llama2.status, 200) << llama2.raw;
  const HttpResult fixture = Post(frontend_.address(), "/v1/chat/completions", chat);
  ASSERT_EQ(fixture.status, 200) << fixture.raw;
  EXPECT_EQ(llama2.body["prompt_token_ids"], fixture.body["prompt_token_ids"]);
  EXPECT_NE(llama2.body["prompt_token_ids"], chatml.body["prompt_token_ids"]);

  // vLLM names the model by --model as given: without --served-model-name
  // that path is served too, after the schedulers' name; with one, only the
  // names given are.
  const Json models = Json::parse(Get(from_model.address(), "/v1/models"));
  ASSERT_EQ(models["data"].size(), 2u) << models.dump();
  EXPECT_EQ(models["data"][0]["id"], models["data"][0]["root"]);
  EXPECT_EQ(models["data"][1]["id"], model_dir);
  Json by_path = {{"prompt", "Once upon a time"}, {"max_tokens", 2}, {"model", model_dir}};
  const HttpResult served = Post(from_model.address(), "/v1/completions", by_path);
  ASSERT_EQ(served.status, 200) << served.raw;
  EXPECT_EQ(served.body["model"], model_dir);
  Service named = StartFrontend(dir_, "named", {scheduler_.address()},
                                {"--model", model_dir, "--served-model-name", "tiny"});
  EXPECT_EQ(Post(named.address(), "/v1/completions", by_path).status, 404);
  EXPECT_EQ(Json::parse(Get(named.address(), "/v1/models"))["data"].size(), 1u);

  // A --model that is no directory, or holds no tokenizer, stops the start
  // with its path; neither flag at all names both.
  const std::string binary = BinaryPath("services/frontend/tandem-frontend");
  const std::string not_a_dir = model_dir + "/chat_template.jinja";
  const std::string no_tokenizer = dir_ + "/no_tokenizer";
  std::filesystem::create_directories(no_tokenizer);
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--model", not_a_dir}, "--model " + not_a_dir + " is not a directory"},
           {{"--model", no_tokenizer}, no_tokenizer + ": holds no tokenizer.json"},
           {{}, "--model (a Hugging Face model directory) or --tokenizer is required"}}) {
    std::vector<std::string> argv = {binary, "--scheduler", scheduler_.address()};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::string out;
    EXPECT_EQ(RunCommand(argv, &out), 2) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
  }
}

// --metrics-from (tandem serve's relay of the scheduler's /metrics; its
// success is serve_test's): a URL it cannot use stops the start naming it,
// and an upstream that does not answer leaves /metrics with the frontend's
// own series and tandem_frontend_metrics_from_up 0.
// vLLM's cache_salt: a request shares cached prefix blocks only with
// requests of the same salt (usage.prompt_tokens_details.cached_tokens
// counts them), and its tokens are the same. The scheduler takes the salt
// from the frontend only as it is configured to (here
// --allow-request-cache-salt); one that would not answers a 400 naming it.
TEST_F(FrontendTest, CacheSaltSharesCachedPrefixesOnlyWithinTheSalt) {
  Json body = {
      {"prompt", Json::array()}, {"max_tokens", 4}, {"temperature", 0}, {"cache_salt", "a"}};
  for (int32_t id = 100; id < 140; ++id) body["prompt"].push_back(id);  // two full blocks
  const HttpResult refused = Post(frontend_.address(), "/v1/completions", body);
  EXPECT_EQ(refused.status, 400) << refused.raw;
  EXPECT_NE(refused.raw.find("cache_salt is not accepted here"), std::string::npos) << refused.raw;

  Service worker = StartWorker(dir_, "salt-worker", {"--model", kModels + "/random32k.bin"});
  Service scheduler =
      StartScheduler(dir_, "salt-scheduler", worker.address(), {"--allow-request-cache-salt"});
  Service frontend = StartFrontend(dir_, "salt-frontend", {scheduler.address()},
                                   {"--tokenizer", kLlama2Tokenizer});
  std::vector<int32_t> first_tokens;
  auto cached = [&](const Json& salt) {
    Json b = body;
    b["cache_salt"] = salt;
    b["return_token_ids"] = true;
    const HttpResult r = Post(frontend.address(), "/v1/completions", b);
    EXPECT_EQ(r.status, 200) << r.raw;
    if (r.status != 200) return -1;
    const std::vector<int32_t> tokens = r.body["choices"][0]["token_ids"];
    if (first_tokens.empty()) first_tokens = tokens;
    EXPECT_EQ(tokens, first_tokens);
    return r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  EXPECT_EQ(cached("a"), 0);
  EXPECT_EQ(cached("a"), 32);
  EXPECT_EQ(cached("b"), 0);
  EXPECT_EQ(cached(nullptr), 0);  // no salt: the shared namespace
  EXPECT_EQ(cached("b"), 32);

  for (const Json& bad : {Json(""), Json(5)}) {
    Json b = body;
    b["cache_salt"] = bad;
    const HttpResult r = Post(frontend.address(), "/v1/completions", b);
    EXPECT_EQ(r.status, 400) << r.raw;
    EXPECT_EQ(r.body["error"]["param"], "cache_salt") << r.raw;
  }
}

TEST_F(FrontendTest, MetricsFromRefusesBadUrlsAndSurvivesADeadUpstream) {
  const std::string binary = BinaryPath("services/frontend/tandem-frontend");
  struct Case {
    std::string url;
    std::string message;
  };
  for (const Case& c :
       std::vector<Case>{{"https://127.0.0.1:1/metrics", "only plain http:// is supported"},
                         {"http://127.0.0.1/metrics", "no host:port"},
                         {"http://127.0.0.1:99999/metrics", "the port is not 1..65535"}}) {
    std::string out;
    EXPECT_EQ(RunCommand({binary, "--scheduler", scheduler_.address(), "--tokenizer",
                          kLlama2Tokenizer, "--metrics-from", c.url},
                         &out),
              2)
        << out;
    EXPECT_NE(out.find("--metrics-from '" + c.url + "': " + c.message), std::string::npos) << out;
  }
  Service relay = StartFrontend(
      dir_, "relay", {scheduler_.address()},
      {"--tokenizer", kLlama2Tokenizer, "--metrics-from", "http://127.0.0.1:1/metrics"});
  const std::string text = Get(relay.address(), "/metrics");
  EXPECT_NE(text.find("\ntandem_frontend_metrics_from_up 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE tandem_frontend_prompt_tokens_total counter"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace tandem::testing
